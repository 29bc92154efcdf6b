//! Certificates for tests: a CA generated with rcgen that signs leaf certificates, and pairs
//! written to disk the way certbot and Kubernetes replace them.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair};

/// A test CA that signs leaf certificates.
pub struct Ca {
    cert: Certificate,
    key: KeyPair,
}

impl Ca {
    pub fn new() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "Weir test CA");
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A leaf for `names`, with `cn` as subject CN, valid for `days` from now: (cert PEM, key PEM).
    pub fn leaf(&self, names: &[&str], cn: &str, days: i64) -> (String, String) {
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.not_before = time::OffsetDateTime::now_utc() - time::Duration::days(1);
        params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(days);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }
}

/// Writes a pair atomically (temp file + rename), as certbot and Kubernetes do.
pub fn install(dir: &Path, name: &str, pair: &(String, String)) -> (PathBuf, PathBuf) {
    let cert = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    for (path, text) in [(&key, &pair.1), (&cert, &pair.0)] {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
    (cert, key)
}
