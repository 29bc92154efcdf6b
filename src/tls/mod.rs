//! Listener TLS on rustls (ring provider; no OpenSSL anywhere in the build).
//!
//! * [`load_pair`] reads one certificate chain and its key from PEM files and checks them: both
//!   parse, the key matches the leaf certificate. Config compilation (`weir check`, every
//!   reload) and the certificate watcher share it, so a pair that is served was always checked.
//! * [`CertResolver`] picks the certificate by SNI among the configured pairs (exact names, then
//!   `*.example.com` wildcards, from each certificate's SAN); no SNI, or no match, gets the first
//!   pair. The pairs sit in an `ArcSwap`: a renewed file is swapped in for new handshakes while
//!   open connections keep theirs.
//! * [`server_config`] builds the rustls `ServerConfig` of the TLS listeners: protocol versions
//!   from `min_tls`, ALPN `h2` + `http/1.1` (or `http/1.1` only).

mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub use watch::CertWatcher;

/// A certificate expiring sooner than this is reported by `weir check` and at every load.
pub const EXPIRY_WARNING_DAYS: i64 = 14;

/// The lowest TLS version a listener accepts (`server.min_tls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MinTls {
    #[default]
    Tls12,
    Tls13,
}

impl MinTls {
    pub fn as_str(self) -> &'static str {
        match self {
            MinTls::Tls12 => "1.2",
            MinTls::Tls13 => "1.3",
        }
    }
}

/// One `[[server.tls]]` entry: where its files are, and what they held when last loaded.
#[derive(Clone)]
pub struct CertEntry {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    pub loaded: Arc<LoadedCert>,
}

impl std::fmt::Debug for CertEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertEntry")
            .field("cert", &self.cert_path)
            .field("key", &self.key_path)
            .field("names", &self.loaded.names)
            .field("not_after", &self.loaded.not_after)
            .finish()
    }
}

/// A checked certificate chain and key, ready to serve.
pub struct LoadedCert {
    pub key: Arc<CertifiedKey>,
    /// DNS names of the leaf's subjectAltName (lowercase; `*.example.com` kept as written), or
    /// its subject CN when it has no DNS SAN.
    pub names: Vec<String>,
    /// The leaf's notAfter, Unix seconds.
    pub not_after: i64,
    /// The files' bytes, to tell whether a change event really changed them.
    pub fingerprint: Vec<u8>,
}

impl LoadedCert {
    /// Days until the leaf expires (negative once expired).
    pub fn days_left(&self, now_unix: i64) -> i64 {
        (self.not_after - now_unix).div_euclid(86_400)
    }

    /// A warning when the certificate expires within [`EXPIRY_WARNING_DAYS`] (or has expired).
    pub fn expiry_warning(&self, cert_path: &Path, now_unix: i64) -> Option<String> {
        let days = self.days_left(now_unix);
        let names = self.names.join(", ");
        if self.not_after <= now_unix {
            Some(format!("certificate {} ({names}) has expired", cert_path.display()))
        } else if days < EXPIRY_WARNING_DAYS {
            Some(format!(
                "certificate {} ({names}) expires in {days} day{} (less than {EXPIRY_WARNING_DAYS})",
                cert_path.display(),
                if days == 1 { "" } else { "s" }
            ))
        } else {
            None
        }
    }
}

pub fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Makes `ring` the process's default rustls provider, for clients that do not take one
/// explicitly (redis-rs's `rediss://`). Idempotent.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The crypto provider of every TLS object Weir makes: rustls on `ring`, as in Pingora's build.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads and checks a certificate chain (PEM, leaf first) and its private key (PEM: PKCS#8,
/// PKCS#1 or SEC1). The error says which file and what is wrong with it.
pub fn load_pair(cert_path: &Path, key_path: &Path) -> Result<LoadedCert, String> {
    let cert_pem =
        std::fs::read(cert_path).map_err(|e| format!("cannot read the certificate {}: {e}", cert_path.display()))?;
    let key_pem = std::fs::read(key_path).map_err(|e| format!("cannot read the key {}: {e}", key_path.display()))?;
    parse_pair(cert_path, cert_pem, key_path, &key_pem)
}

/// [`load_pair`] on bytes already read (the paths name them in errors).
pub fn parse_pair(cert_path: &Path, cert_pem: Vec<u8>, key_path: &Path, key_pem: &[u8]) -> Result<LoadedCert, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate chain: {e}", cert_path.display()))?;
    let Some(leaf) = chain.first() else {
        return Err(format!("{}: no certificate found (expected PEM \"BEGIN CERTIFICATE\")", cert_path.display()));
    };
    let (names, not_after) = leaf_facts(leaf).map_err(|e| format!("{}: {e}", cert_path.display()))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
        format!("{}: no private key found (expected PEM \"BEGIN PRIVATE KEY\"): {e}", key_path.display())
    })?;
    let certified = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => format!(
            "the key {} does not match the certificate {} (a key of another certificate?)",
            key_path.display(),
            cert_path.display()
        ),
        other => format!("{}: unusable private key: {other}", key_path.display()),
    })?;
    let mut fingerprint = cert_pem;
    fingerprint.extend_from_slice(key_pem);
    Ok(LoadedCert { key: Arc::new(certified), names, not_after, fingerprint })
}

/// The leaf's DNS names and notAfter, read with `x509-parser`.
fn leaf_facts(leaf: &CertificateDer<'_>) -> Result<(Vec<String>, i64), String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let (_, cert) = X509Certificate::from_der(leaf.as_ref()).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(dns) => names.push(dns.to_ascii_lowercase()),
                GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).ok().map(|b| std::net::IpAddr::from(b).to_string()),
                        16 => <[u8; 16]>::try_from(*bytes).ok().map(|b| std::net::IpAddr::from(b).to_string()),
                        _ => None,
                    };
                    names.extend(ip);
                }
                _ => {}
            }
        }
    }
    if names.is_empty() {
        names.extend(cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok()).map(str::to_ascii_lowercase));
    }
    Ok((names, cert.validity().not_after.timestamp()))
}

/// Whether a certificate name (`api.example.com`, `*.example.com`) covers an SNI host name.
fn name_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        // A wildcard covers exactly one label: `a.example.com`, not `example.com` or `a.b.example.com`.
        Some(suffix) => {
            host.split_once('.').is_some_and(|(label, rest)| !label.is_empty() && rest.eq_ignore_ascii_case(suffix))
        }
        None => pattern.eq_ignore_ascii_case(host),
    }
}

/// Picks the certificate for a handshake by SNI; see the module docs.
#[derive(Debug)]
pub struct CertResolver {
    entries: ArcSwap<Vec<CertEntry>>,
}

impl CertResolver {
    pub fn new(entries: Vec<CertEntry>) -> Self {
        Self { entries: ArcSwap::from_pointee(entries) }
    }

    /// The entries now served.
    pub fn entries(&self) -> Arc<Vec<CertEntry>> {
        self.entries.load_full()
    }

    /// Serves `entries` to new handshakes from now on; open connections are unaffected.
    pub fn store(&self, entries: Vec<CertEntry>) {
        self.entries.store(Arc::new(entries));
    }

    /// The certificate for an SNI name: an exact name first, then a wildcard, else the first entry.
    pub fn pick(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let entries = self.entries.load();
        let chosen = sni.and_then(|host| {
            let exact =
                entries.iter().find(|e| e.loaded.names.iter().any(|n| !n.starts_with("*.") && name_matches(n, host)));
            exact.or_else(|| entries.iter().find(|e| e.loaded.names.iter().any(|n| name_matches(n, host))))
        });
        chosen.or(entries.first()).map(|e| e.loaded.key.clone())
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.pick(hello.server_name())
    }
}

/// The rustls config of the TLS listeners.
pub fn server_config(resolver: Arc<CertResolver>, min_tls: MinTls, http2: bool) -> Result<ServerConfig, String> {
    let versions: &[&rustls::SupportedProtocolVersion] = match min_tls {
        MinTls::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        MinTls::Tls13 => &[&rustls::version::TLS13],
    };
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = if http2 { vec![b"h2".to_vec(), b"http/1.1".to_vec()] } else { vec![b"http/1.1".to_vec()] };
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_cover_one_label() {
        assert!(name_matches("api.example.com", "API.example.com"));
        assert!(name_matches("*.example.com", "a.example.com"));
        assert!(!name_matches("*.example.com", "example.com"));
        assert!(!name_matches("*.example.com", "a.b.example.com"));
        assert!(!name_matches("*.example.com", ".example.com"));
        assert!(!name_matches("api.example.com", "www.example.com"));
    }
}
