//! HTTPS and HTTP/2 to the servers of an upstream, on Pingora's own rustls connector.
//!
//! Files (`ca_file`, `client_cert`, `client_key`) are read and checked once, when the config is
//! compiled (`weir check`, start, every reload): [`load_ca`] and [`load_client`] return the
//! parsed objects Pingora's connector wants, behind `Arc`s. [`peer_template`] builds one
//! `HttpPeer` per server address when the pool's membership is (re)built; a request clones it,
//! so no file is read and no certificate parsed on the request path.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pingora::upstreams::peer::HttpPeer;
use pingora_core::protocols::tls::CaType;
use pingora_core::utils::tls::{CertKey, WrappedX509};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::{ServerSpec, UpstreamSpec};

/// Concurrent streams Weir opens on one HTTP/2 connection to a server. Pingora's default is 1,
/// which would make every in-flight request a connection of its own.
pub const H2_STREAMS_PER_CONNECTION: usize = 100;

/// How Weir speaks HTTP to the servers (`protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// HTTP/1.1 (over TLS: ALPN `http/1.1`).
    #[default]
    H1,
    /// HTTP/2 over TLS, negotiated with ALPN `h2`.
    H2,
    /// Cleartext HTTP/2 with prior knowledge (gRPC backends without TLS).
    H2c,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::H1 => "h1",
            Protocol::H2 => "h2",
            Protocol::H2c => "h2c",
        }
    }
}

/// `tls = true` and its settings, as compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamTls {
    /// The name sent in SNI and verified; `None`: each server's own host (name or IP).
    pub sni: Option<String>,
    /// Verify the server's certificate chain and name (`verify = false` turns both off).
    pub verify: bool,
    /// `ca_file`: the only roots trusted; `None`: the system's roots.
    pub ca: Option<Arc<CaBundle>>,
    /// `client_cert` + `client_key`: presented when the server asks (mutual TLS).
    pub client: Option<Arc<ClientCert>>,
}

/// The certificates of a `ca_file`, parsed for Pingora.
pub struct CaBundle {
    pub path: PathBuf,
    pub certs: Arc<CaType>,
    /// Subject CNs, for messages.
    pub names: Vec<String>,
    /// Earliest notAfter of the bundle, Unix seconds.
    pub not_after: i64,
    pem: Vec<u8>,
}

impl std::fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaBundle").field("path", &self.path).field("names", &self.names).finish()
    }
}

impl CaBundle {
    /// The file's bytes as read.
    pub fn pem(&self) -> &[u8] {
        &self.pem
    }
}

/// Same file and same bytes: a reload that re-reads an unchanged file changes nothing.
impl PartialEq for CaBundle {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && self.pem == other.pem
    }
}

/// A client certificate chain and its key, parsed for Pingora.
pub struct ClientCert {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    pub cert_key: Arc<CertKey>,
    pub loaded: crate::tls::LoadedCert,
}

impl std::fmt::Debug for ClientCert {
    // Paths only: the key never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCert").field("cert", &self.cert_path).field("key", &self.key_path).finish()
    }
}

impl PartialEq for ClientCert {
    fn eq(&self, other: &Self) -> bool {
        self.cert_path == other.cert_path
            && self.key_path == other.key_path
            && self.loaded.fingerprint == other.loaded.fingerprint
    }
}

/// Checks a `ca_file`'s bytes: PEM certificates, each a CA (basicConstraints CA:TRUE) that
/// rustls accepts as a trust anchor. The error names the file and what is wrong with it.
pub fn parse_ca(path: &Path, pem: &[u8]) -> Result<CaBundle, String> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let ders: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate bundle: {e}", path.display()))?;
    if ders.is_empty() {
        return Err(format!("{} holds no certificate (expected PEM \"BEGIN CERTIFICATE\")", path.display()));
    }
    let mut names = Vec::new();
    let mut not_after = i64::MAX;
    let mut roots = rustls::RootCertStore::empty();
    for (i, der) in ders.iter().enumerate() {
        let (_, cert) = X509Certificate::from_der(der.as_ref())
            .map_err(|e| format!("{}: certificate {} is not X.509: {e}", path.display(), i + 1))?;
        let name = cert.subject().to_string();
        let is_ca = cert.basic_constraints().ok().flatten().is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(format!(
                "{}: certificate {} ({name}) is not a CA certificate (no basicConstraints CA:TRUE): \
                 give the certificate of the CA that signed the servers' certificates",
                path.display(),
                i + 1
            ));
        }
        roots.add(der.clone()).map_err(|e| format!("{}: certificate {} ({name}): {e}", path.display(), i + 1))?;
        not_after = not_after.min(cert.validity().not_after.timestamp());
        names.push(name);
    }
    let certs: Vec<WrappedX509> =
        ders.iter().map(|d| WrappedX509::new(d.as_ref().to_vec(), pingora_core::utils::tls::parse_x509)).collect();
    Ok(CaBundle { path: path.to_path_buf(), certs: Arc::from(certs), names, not_after, pem: pem.to_vec() })
}

/// Reads a client certificate chain and its key (see [`crate::tls::load_pair`]), in the form
/// Pingora's connector takes (DER chain, DER key).
pub fn parse_client(cert_path: &Path, cert_pem: &[u8], key_path: &Path, key_pem: &[u8]) -> Result<ClientCert, String> {
    let loaded = crate::tls::parse_pair(cert_path, cert_pem.to_vec(), key_path, key_pem)?;
    let chain: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(cert_pem)
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate chain: {e}", cert_path.display()))?;
    // Pingora parses each certificate and the key again when it connects, and panics on what
    // it cannot read: make sure here that it can.
    for (i, der) in chain.iter().enumerate() {
        use x509_parser::prelude::{FromDer, X509Certificate};
        X509Certificate::from_der(der)
            .map_err(|e| format!("{}: certificate {} is not X.509: {e}", cert_path.display(), i + 1))?;
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| format!("{}: no private key found: {e}", key_path.display()))?;
    let key_der = key.secret_der().to_vec();
    PrivateKeyDer::try_from(key_der.clone())
        .map_err(|e| format!("{}: unsupported private key encoding: {e}", key_path.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate found", cert_path.display()));
    }
    Ok(ClientCert {
        cert_path: cert_path.to_path_buf(),
        key_path: key_path.to_path_buf(),
        cert_key: Arc::new(CertKey::new(chain, key_der)),
        loaded,
    })
}

/// The host part of a server entry (`api.internal:443` → `api.internal`, `[::1]:443` → `::1`):
/// the default SNI and verified name.
pub fn host_of(target: &str) -> &str {
    let host = target.rsplit_once(':').map_or(target, |(host, _)| host);
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

/// Pooled connections are reused only by peers with the same key. Pingora's own key covers the
/// address, SNI, client certificate and verify flags but neither the CA nor the protocol: without
/// this, an upstream could reuse a connection that another upstream (or the config before a
/// reload) verified against another CA, or an HTTP/1.1 connection for h2.
fn group_key(spec: &UpstreamSpec) -> u64 {
    let mut h = DefaultHasher::new();
    spec.name.hash(&mut h);
    spec.protocol.as_str().hash(&mut h);
    if let Some(tls) = &spec.tls {
        tls.verify.hash(&mut h);
        tls.ca.as_ref().map(|ca| &ca.pem).hash(&mut h);
        tls.client.as_ref().map(|c| &c.loaded.fingerprint).hash(&mut h);
    }
    h.finish()
}

/// The peer of one server address: TLS settings, protocol and timeouts. Built when the pool's
/// membership is; each request clones it.
pub fn peer_template(spec: &UpstreamSpec, server: &ServerSpec, addr: SocketAddr) -> HttpPeer {
    let sni = match &spec.tls {
        Some(UpstreamTls { sni: Some(sni), .. }) => sni.clone(),
        Some(_) => host_of(&server.target).to_string(),
        None => String::new(),
    };
    let mut peer = match &server.unix {
        // The path was checked when the config was compiled (absolute, fits sun_path).
        #[cfg(unix)]
        Some(path) => HttpPeer::new_uds(path, spec.tls.is_some(), sni.clone())
            .unwrap_or_else(|_| HttpPeer::new(addr, spec.tls.is_some(), sni)),
        _ => HttpPeer::new(addr, spec.tls.is_some(), sni),
    };
    apply_options(&mut peer, spec);
    let t = spec.timeouts;
    peer.options.connection_timeout = Some(t.connect);
    peer.options.read_timeout = Some(t.read);
    peer.options.write_timeout = Some(t.send);
    peer.options.idle_timeout = Some(if spec.keepalive { t.idle } else { Duration::ZERO });
    peer
}

/// TLS and protocol settings on a peer (also the health check's).
pub fn apply_options(peer: &mut HttpPeer, spec: &UpstreamSpec) {
    if let Some(tls) = &spec.tls {
        peer.options.verify_cert = tls.verify;
        peer.options.verify_hostname = tls.verify;
        peer.options.ca = tls.ca.as_ref().map(|ca| ca.certs.clone());
        peer.client_cert_key = tls.client.as_ref().map(|c| c.cert_key.clone());
    }
    match spec.protocol {
        Protocol::H1 => peer.options.set_http_version(1, 1),
        Protocol::H2 | Protocol::H2c => {
            peer.options.set_http_version(2, 2);
            peer.options.max_h2_streams = H2_STREAMS_PER_CONNECTION;
        }
    }
    peer.group_key = group_key(spec);
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn hosts() {
        assert_eq!(host_of("api.internal:443"), "api.internal");
        assert_eq!(host_of("10.0.0.1:8443"), "10.0.0.1");
        assert_eq!(host_of("[::1]:443"), "::1");
    }
}
