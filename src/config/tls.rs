//! `[server] listen_tls`, `min_tls`, `http2` and the `[[server.tls]]` certificates. Every pair is
//! loaded and checked here (parses, key matches), so `weir check` and a reload refuse a bad pair
//! with its file and line; certificates expiring within 14 days are reported as warnings.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::spanned::Spanned;

use super::error::{ConfigError, Source};
use super::schema;
use crate::tls::{self, CertEntry, MinTls};

pub struct TlsCompiled {
    pub listen_tls: Vec<SocketAddr>,
    pub min_tls: MinTls,
    pub http2: bool,
    pub certs: Vec<CertEntry>,
    pub warnings: Vec<String>,
}

pub fn compile_tls(
    src: &Source<'_>,
    listen_tls: Option<Spanned<Vec<Spanned<String>>>>,
    certs: Vec<Spanned<schema::TlsCert>>,
    min_tls: Option<Spanned<String>>,
    http2: Option<bool>,
    // `[rls] listen_tls` serves the same certificates.
    rls_tls: bool,
) -> Result<TlsCompiled, ConfigError> {
    let mut addrs = Vec::new();
    let listen_span = listen_tls.as_ref().map(|l| l.span());
    for addr in listen_tls.map(Spanned::into_inner).unwrap_or_default() {
        let parsed: SocketAddr = addr.get_ref().parse().map_err(|_| {
            src.error_at(&addr.span(), format!("server.listen_tls: {:?} is not an IP:port address", addr.get_ref()))
        })?;
        addrs.push(parsed);
    }
    let min_tls = match min_tls.as_ref().map(|m| (m, m.get_ref().as_str())) {
        None | Some((_, "1.2")) => MinTls::Tls12,
        Some((_, "1.3")) => MinTls::Tls13,
        Some((m, other)) => {
            return Err(src.error_at(&m.span(), format!("server.min_tls: expected \"1.2\" or \"1.3\", got {other:?}")))
        }
    };
    match (addrs.is_empty(), certs.is_empty()) {
        (false, true) => {
            return Err(src.error_at(
                &listen_span.unwrap_or_default(),
                "server.listen_tls: add at least one [[server.tls]] with cert = \"…\" and key = \"…\"",
            ))
        }
        (true, false) if !rls_tls => {
            return Err(src.error_at(
                &certs[0].span(),
                "server.tls: certificates are given but server.listen_tls has no address to serve them on",
            ))
        }
        _ => {}
    }
    let base = base_dir(src.file);
    let now = src.outside.unix_now();
    let mut entries = Vec::new();
    let mut warnings = Vec::new();
    for cert in certs {
        let schema::TlsCert { cert, key } = cert.into_inner();
        let cert_path = resolve(&base, cert.get_ref());
        let key_path = resolve(&base, key.get_ref());
        let loaded = read_pair(src, &cert_path, &key_path)
            .map_err(|e| src.error_at(&cert.span(), format!("server.tls: {e}")))?;
        if let Some(warning) = loaded.expiry_warning(&cert_path, now) {
            warnings.push(format!("{}:{}: server.tls: {warning}", src.file, src.line_of(&cert.span())));
        }
        entries.push(CertEntry { cert_path, key_path, loaded: Arc::new(loaded) });
    }
    Ok(TlsCompiled { listen_tls: addrs, min_tls, http2: http2.unwrap_or(true), certs: entries, warnings })
}

/// A certificate and its key, read through the compile's [`Outside`](super::Outside).
pub(super) fn read_pair(src: &Source<'_>, cert_path: &Path, key_path: &Path) -> Result<tls::LoadedCert, String> {
    let cert_pem =
        src.outside.read(cert_path).map_err(|e| format!("cannot read the certificate {}: {e}", cert_path.display()))?;
    let key_pem = src.outside.read(key_path).map_err(|e| format!("cannot read the key {}: {e}", key_path.display()))?;
    tls::parse_pair(cert_path, cert_pem, key_path, &key_pem)
}

/// Relative cert and key paths are read from the config file's directory, like nginx's `conf/`.
pub(super) fn base_dir(file: &str) -> PathBuf {
    match Path::new(file).parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

pub(super) fn resolve(base: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}
