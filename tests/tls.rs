//! TLS listeners, HTTP/2 and gRPC rejections, against a real `weir` process. Certificates come
//! from a CA generated in the test (rcgen); HTTPS clients are rustls (verifying against that CA)
//! and curl (`--http2`, `--http2-prior-knowledge`).

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use support::certs::{install, Ca};
use support::config::{line_of, memory_with_app};
use support::poll::{poll, wait_until};
use support::upstream::Upstream;
use support::weir::{check_config, Weir};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A rustls client connection that trusts only the test CA.
struct TlsConn {
    stream: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
}

impl TlsConn {
    fn connect(
        addr: SocketAddr,
        sni: &str,
        ca_pem: &str,
        version: &'static rustls::SupportedProtocolVersion,
    ) -> Result<TlsConn, String> {
        let mut roots = rustls::RootCertStore::empty();
        let ca = rustls::pki_types::pem::PemObject::from_pem_slice(ca_pem.as_bytes()).unwrap();
        roots.add(ca).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from(sni.to_string()).unwrap();
        let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
        let tcp = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| e.to_string())?;
        tcp.set_read_timeout(Some(TIMEOUT)).unwrap();
        let mut stream = rustls::StreamOwned::new(conn, tcp);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock).map_err(|e| e.to_string())?;
        }
        Ok(TlsConn { stream })
    }

    fn leaf(&self) -> CertificateDer<'static> {
        self.stream.conn.peer_certificates().unwrap()[0].clone().into_owned()
    }

    fn version(&self) -> Option<rustls::ProtocolVersion> {
        self.stream.conn.protocol_version()
    }

    /// A keep-alive HTTP/1.1 GET; returns the status and the body.
    fn get(&mut self, host: &str, path: &str) -> std::io::Result<(u16, String)> {
        write!(self.stream, "GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n")?;
        self.stream.flush()?;
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            if self.stream.read(&mut byte)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&buf).into_owned();
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let len: usize = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body)?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// The subject CN of a DER certificate.
/// A test CA, a temp dir holding one `a.test` pair it signed (valid 90 days), and the CA's PEM
/// written there for clients. Keep `dir` alive for as long as the files are used.
struct OneCert {
    ca: Ca,
    dir: tempfile::TempDir,
    a: (PathBuf, PathBuf),
    ca_file: PathBuf,
}

fn one_cert() -> OneCert {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let a = install(dir.path(), "a", &ca.leaf(&["a.test"], "a.test", 90));
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    OneCert { ca, dir, a, ca_file }
}

fn common_name(der: &CertificateDer<'_>) -> String {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der.as_ref()).unwrap();
    let cn = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).unwrap_or("").to_string();
    cn
}

fn tls_config(up: SocketAddr, server_extra: &str, certs: &[(PathBuf, PathBuf)], rest: &str) -> String {
    let entries: String = certs
        .iter()
        .map(|(c, k)| format!("[[server.tls]]\ncert = \"{}\"\nkey = \"{}\"\n\n", c.display(), k.display()))
        .collect();
    let config = memory_with_app(up, &format!("{entries}{rest}"));
    config.replacen("threads = 2", &format!("threads = 2\nlisten_tls = [\"$LISTEN2\"]\n{server_extra}"), 1)
}

const ROUTES: &str = r#"
[[limit_req_zone]]
name = "per_key"
key = "header:X-Key"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_key", burst = 2, nodelay = true } ]

[[route]]
name = "plain"
path_prefix = "/plain/"
upstream = "app"
limit_req = [ { zone = "per_key", burst = 2, nodelay = true } ]
grpc_rejections = false

[[route]]
name = "open"
path_prefix = "/"
upstream = "app"
"#;

#[test]
fn https_sni_tls12_and_13_and_certificates_reload_without_dropping_connections() {
    let up = Upstream::start();
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let a = install(dir.path(), "a", &ca.leaf(&["a.test"], "a.test v1", 90));
    let b = install(dir.path(), "b", &ca.leaf(&["*.b.test", "b.test"], "b.test", 90));
    let w = Weir::start(&tls_config(up.addr(), "", &[a.clone(), b.clone()], ROUTES));
    let tls_addr = w.addrs[1];

    // SNI picks the certificate, over TLS 1.3 and 1.2; the rustls client verifies it against the CA.
    let mut first = TlsConn::connect(tls_addr, "a.test", &ca.pem(), &rustls::version::TLS13).unwrap();
    assert_eq!(common_name(&first.leaf()), "a.test v1");
    assert_eq!(first.version(), Some(rustls::ProtocolVersion::TLSv1_3));
    assert_eq!(first.get("a.test", "/x").unwrap().0, 200);
    let mut wild = TlsConn::connect(tls_addr, "api.b.test", &ca.pem(), &rustls::version::TLS12).unwrap();
    assert_eq!(common_name(&wild.leaf()), "b.test");
    assert_eq!(wild.version(), Some(rustls::ProtocolVersion::TLSv1_2));
    assert_eq!(wild.get("api.b.test", "/x").unwrap().0, 200);
    // An unknown name gets the first certificate (which then fails verification for that name).
    let unknown = TlsConn::connect(tls_addr, "c.test", &ca.pem(), &rustls::version::TLS13);
    assert!(unknown.is_err_and(|e| e.contains("NotValidForName") || e.contains("name")), "default cert for c.test");

    // The files are replaced: new connections get the new certificate...
    install(dir.path(), "a", &ca.leaf(&["a.test"], "a.test v2", 90));
    let served = poll(
        TIMEOUT,
        Duration::from_millis(100),
        || TlsConn::connect(tls_addr, "a.test", &ca.pem(), &rustls::version::TLS13).map(|c| common_name(&c.leaf())),
        |cn| cn.as_deref() == Ok("a.test v2"),
    );
    assert!(served.is_ok(), "new certificate not served: {served:?}\n{}", w.stderr());
    // ... while the connection opened before keeps working.
    assert_eq!(first.get("a.test", "/after-reload").unwrap().0, 200);
    assert_eq!(common_name(&first.leaf()), "a.test v1");

    // A broken renewal (key of another certificate) is refused and logged; v2 keeps serving.
    let other = ca.leaf(&["a.test"], "a.test v3", 90);
    let bad = ca.leaf(&["a.test"], "mismatch", 90);
    install(dir.path(), "a", &(other.0, bad.1));
    assert!(
        wait_until(TIMEOUT, Duration::from_millis(100), || w.stderr().contains("certificate reload refused")).is_some(),
        "{}",
        w.stderr()
    );
    assert!(w.stderr().contains("does not match"), "{}", w.stderr());
    let still = TlsConn::connect(tls_addr, "a.test", &ca.pem(), &rustls::version::TLS13).unwrap();
    assert_eq!(common_name(&still.leaf()), "a.test v2");
}

#[test]
fn min_tls_13_refuses_tls12_clients_and_http2_false_keeps_http11() {
    let up = Upstream::start();
    let OneCert { ca, dir, a, ca_file: _ } = one_cert();
    let w = Weir::start(&tls_config(up.addr(), "min_tls = \"1.3\"\nhttp2 = false", &[a], ROUTES));
    let tls_addr = w.addrs[1];
    assert!(TlsConn::connect(tls_addr, "a.test", &ca.pem(), &rustls::version::TLS12).is_err());
    let mut ok = TlsConn::connect(tls_addr, "a.test", &ca.pem(), &rustls::version::TLS13).unwrap();
    assert_eq!(ok.get("a.test", "/x").unwrap().0, 200);
    // http2 = false: ALPN offers only http/1.1, so an h2-capable client falls back to it.
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let resolve = format!("a.test:{}:127.0.0.1", tls_addr.port());
    let url = format!("https://a.test:{}/x", tls_addr.port());
    let (version, status, _) = curl(&["--http2", "--cacert", ca_file.to_str().unwrap(), "--resolve", &resolve, &url]);
    assert_eq!((version.as_str(), status), ("HTTP/1.1", 200));
}

/// One curl request: (HTTP version, status, lower-cased headers).
fn curl(args: &[&str]) -> (String, u16, Vec<(String, String)>) {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-D", "-", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl is installed (apt-get install curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    let status_line = lines.next().unwrap_or_else(|| panic!("no response: {args:?} {out:?}"));
    let mut parts = status_line.split_whitespace();
    let version = parts.next().unwrap_or("").to_string();
    let status = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (version, status, headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[test]
fn http2_over_tls_and_h2c_have_the_same_limits_and_headers_as_http11() {
    let up = Upstream::start();
    let OneCert { ca: _, dir: _dir, a, ca_file } = one_cert();
    let w = Weir::start(&tls_config(up.addr(), "h2c = true", &[a], ROUTES));
    let (plain, tls) = (w.addrs[0], w.addrs[1]);
    let resolve = format!("a.test:{}:127.0.0.1", tls.port());
    let https = format!("https://a.test:{}/api/x", tls.port());
    let h2c = format!("http://{plain}/api/x");
    let ca_path = ca_file.to_str().unwrap();

    let mut runs = Vec::new();
    for (key, args) in [
        ("h1", vec!["--http1.1", &h2c]),
        ("h2", vec!["--http2", "--cacert", ca_path, "--resolve", &resolve, &https]),
        ("h2c", vec!["--http2-prior-knowledge", &h2c]),
    ] {
        let key_header = format!("X-Key: {key}");
        let mut all: Vec<&str> = vec!["-H", &key_header];
        all.extend(args.iter().copied());
        let responses: Vec<_> = (0..4).map(|_| curl(&all)).collect();
        runs.push((key, responses));
    }
    let expect_version = |key: &str| if key == "h1" { "HTTP/1.1" } else { "HTTP/2" };
    for (key, responses) in &runs {
        let statuses: Vec<u16> = responses.iter().map(|r| r.1).collect();
        assert_eq!(statuses, [200, 200, 200, 429], "{key}: 1 + burst 2, then rejected");
        assert!(responses.iter().all(|r| r.0 == expect_version(key)), "{key}: {responses:?}");
    }
    // The same rate-limit fields, whatever the protocol.
    let fields = ["ratelimit-policy", "ratelimit", "retry-after", "content-type"];
    for i in 0..4 {
        let h1: Vec<_> = fields.iter().map(|f| header(&runs[0].1[i].2, f).map(str::to_string)).collect();
        for (key, responses) in &runs[1..] {
            let other: Vec<_> = fields.iter().map(|f| header(&responses[i].2, f).map(str::to_string)).collect();
            // The upstream's own Content-Type is the same too; only the date and framing differ.
            assert_eq!(other, h1, "{key} response {i}");
        }
    }
    assert!(header(&runs[0].1[3].2, "retry-after").is_some());
}

#[test]
fn grpc_requests_over_the_limit_get_resource_exhausted() {
    let up = Upstream::start();
    let OneCert { ca: _, dir: _dir, a, ca_file: _ } = one_cert();
    let w = Weir::start(&tls_config(up.addr(), "h2c = true", &[a], ROUTES));
    let grpc = |path: &str| {
        let url = format!("http://{}{path}", w.addrs[0]);
        curl(&[
            "--http2-prior-knowledge",
            "-X",
            "POST",
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "-H",
            "X-Key: grpc",
            "--data-binary",
            "",
            &url,
        ])
    };
    let responses: Vec<_> = (0..4).map(|_| grpc("/api/demo.Greeter/SayHello")).collect();
    let last = &responses[3].2;
    assert_eq!(responses[3].1, 200, "{responses:?}");
    assert_eq!(header(last, "grpc-status"), Some("8"), "{last:?}");
    assert_eq!(header(last, "content-type"), Some("application/grpc"));
    let message = header(last, "grpc-message").unwrap();
    assert!(message.starts_with("rate limited: route api, zone per_key, retry after"), "{message}");
    assert!(header(last, "retry-after").is_some() && header(last, "ratelimit").is_some(), "{last:?}");
    assert!(responses[..3].iter().all(|r| header(&r.2, "grpc-status").is_none()), "{responses:?}");

    // A route with grpc_rejections = false answers gRPC clients with the HTTP status.
    let plain: Vec<u16> = (0..1).map(|_| grpc("/plain/demo.Greeter/SayHello").1).collect();
    assert_eq!(plain, [429], "the per_key bucket is shared and empty");
}

#[test]
fn check_refuses_a_key_of_another_certificate_and_warns_of_expiry() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let good = install(dir.path(), "good", &ca.leaf(&["a.test"], "a.test", 90));
    let soon = install(dir.path(), "soon", &ca.leaf(&["soon.test"], "soon.test", 3));
    let (cert, _) = ca.leaf(&["b.test"], "b.test", 90);
    let (_, other_key) = ca.leaf(&["b.test"], "b.test", 90);
    let bad = install(dir.path(), "bad", &(cert, other_key));
    let up: SocketAddr = "127.0.0.1:9".parse().unwrap();

    let text = tls_config(up, "", &[good.clone(), bad.clone()], "").replace("$LISTEN2", "127.0.0.1:8443");
    let text = text.replace("$LISTEN", "127.0.0.1:8080");
    let out = check_config("bad.toml", &text, TIMEOUT);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let line = line_of(&text, &format!("cert = \"{}\"", bad.0.display()));
    assert!(out.stderr.contains(&format!("bad.toml:{line}: server.tls: the key")), "{}", out.describe());
    assert!(out.stderr.contains("does not match the certificate"), "{}", out.describe());

    let text = tls_config(up, "", &[good, soon.clone()], "").replace("$LISTEN2", "127.0.0.1:8443");
    let text = text.replace("$LISTEN", "127.0.0.1:8080");
    let out = check_config("soon.toml", &text, TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let line = line_of(&text, &format!("cert = \"{}\"", soon.0.display()));
    assert!(out.stderr.contains("warning: "), "{}", out.describe());
    assert!(out.stderr.contains(&format!("soon.toml:{line}: server.tls: certificate")), "{}", out.describe());
    assert!(
        out.stderr.contains("(soon.test) expires in 2 days") || out.stderr.contains("(soon.test) expires in 3 days"),
        "{}",
        out.describe()
    );
}

#[test]
fn delays_work_over_http2_and_the_head_deadline_does_not_cut_h2_connections() {
    let up = Upstream::start();
    let OneCert { ca: _, dir: _dir, a, ca_file } = one_cert();
    // 40 r/m: the second request of a key waits 1.5 s, longer than header_timeout.
    let routes = r#"
[[limit_req_zone]]
name = "per_key"
key = "header:X-Key"
rate = "40r/m"

[[route]]
name = "slow"
path_prefix = "/"
upstream = "app"
limit_req = [ { zone = "per_key", burst = 1 } ]
"#;
    let w = Weir::start(&tls_config(up.addr(), "h2c = true\nheader_timeout = \"1s\"", &[a], routes));
    let (plain, tls) = (w.addrs[0], w.addrs[1]);
    let resolve = format!("a.test:{}:127.0.0.1", tls.port());
    let https = format!("https://a.test:{}/x", tls.port());
    let h2c = format!("http://{plain}/x");
    let ca_path = ca_file.to_str().unwrap();
    for (key, args) in [
        ("h2", vec!["--http2", "--cacert", ca_path, "--resolve", &resolve, &https]),
        ("h2c", vec!["--http2-prior-knowledge", &h2c]),
    ] {
        let key_header = format!("X-Key: {key}");
        let mut all: Vec<&str> = vec!["-H", &key_header];
        all.extend(args.iter().copied());
        assert_eq!(curl(&all).1, 200, "{key}: first request");
        let started = std::time::Instant::now();
        let (version, status, _) = curl(&all);
        let waited = started.elapsed();
        assert_eq!((version.as_str(), status), ("HTTP/2", 200), "{key}: delayed, then forwarded\n{}", w.stderr());
        assert!(waited >= Duration::from_millis(1300), "{key}: answered after {waited:?}, expected the 1.5 s delay");
    }
}

#[test]
fn a_tls_handshake_must_finish_within_header_timeout() {
    let up = Upstream::start();
    let OneCert { ca: _, dir: _dir, a, ca_file: _ } = one_cert();
    let w = Weir::start(&tls_config(up.addr(), "header_timeout = \"1s\"", &[a], ROUTES));
    // A client that connects and never says hello is closed at the head deadline.
    let mut silent = TcpStream::connect(w.addrs[1]).unwrap();
    silent.set_read_timeout(Some(TIMEOUT)).unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 16];
    let read = silent.read(&mut buf);
    let waited = started.elapsed();
    assert!(matches!(read, Ok(0)) || read.is_err(), "{read:?}");
    assert!(waited >= Duration::from_millis(800) && waited < Duration::from_secs(5), "closed after {waited:?}");
    // A plain HTTP request on the TLS port is not HTTP: the handshake fails, the connection closes.
    let mut wrong = TcpStream::connect(w.addrs[1]).unwrap();
    wrong.set_read_timeout(Some(TIMEOUT)).unwrap();
    wrong.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    let _ = wrong.read_to_end(&mut answer);
    assert!(!String::from_utf8_lossy(&answer).contains("HTTP/1.1 200"), "{answer:?}");
}

#[test]
fn grpc_requests_over_a_limit_conn_cap_get_resource_exhausted_too() {
    let up = Upstream::start();
    let OneCert { ca: _, dir: _dir, a, ca_file: _ } = one_cert();
    let routes = r#"
[[limit_conn_zone]]
name = "conns"
key = "header:X-Key"

[[route]]
name = "svc"
path_prefix = "/"
upstream = "app"
limit_conn = [ { zone = "conns", max = 1 } ]
grpc_status = 14
"#;
    let w = Weir::start(&tls_config(up.addr(), "h2c = true", &[a], routes));
    up.set_sleep(Duration::from_millis(1500));
    let url = format!("http://{}/demo.Greeter/SayHello", w.addrs[0]);
    let args = |url: &str| -> Vec<String> {
        ["--http2-prior-knowledge", "-X", "POST", "-H", "content-type: application/grpc+proto", "-H", "X-Key: k"]
            .iter()
            .map(|s| s.to_string())
            .chain(["--data-binary".to_string(), String::new(), url.to_string()])
            .collect()
    };
    let first_args = args(&url);
    let first = std::thread::spawn(move || {
        let refs: Vec<&str> = first_args.iter().map(String::as_str).collect();
        curl(&refs)
    });
    assert!(up.wait_hits(1, TIMEOUT), "the first call reached the upstream");
    let second_args = args(&url);
    let refs: Vec<&str> = second_args.iter().map(String::as_str).collect();
    let (_, status, headers) = curl(&refs);
    assert_eq!(status, 200, "{headers:?}");
    assert_eq!(header(&headers, "grpc-status"), Some("14"), "the route's grpc_status: {headers:?}");
    assert_eq!(
        header(&headers, "grpc-message"),
        Some("too many concurrent requests: route svc, zone conns, max 1, retry after 1s")
    );
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    assert_eq!(first.join().unwrap().1, 200, "the call holding the place is served");
}

#[test]
fn a_config_reload_brings_new_certificates() {
    let up = Upstream::start();
    let OneCert { ca, dir, a, ca_file: _ } = one_cert();
    let w = Weir::start(&tls_config(up.addr(), "", &[a], ROUTES));
    let tls_addr = w.addrs[1];
    let before = TlsConn::connect(tls_addr, "new.test", &ca.pem(), &rustls::version::TLS13);
    assert!(before.is_err(), "new.test gets the default certificate (a.test), which does not verify");

    let (cert, key) = install(dir.path(), "new", &ca.leaf(&["new.test"], "new.test", 90));
    let text = std::fs::read_to_string(&w.config_path).unwrap();
    let text = format!("{text}\n[[server.tls]]\ncert = \"{}\"\nkey = \"{}\"\n", cert.display(), key.display());
    std::fs::write(&w.config_path, text).unwrap();
    let served = poll(
        TIMEOUT,
        Duration::from_millis(100),
        || TlsConn::connect(tls_addr, "new.test", &ca.pem(), &rustls::version::TLS13).map(|c| common_name(&c.leaf())),
        |cn| cn.as_deref() == Ok("new.test"),
    );
    assert!(served.is_ok(), "{served:?}\n{}", w.stderr());
    let a = TlsConn::connect(tls_addr, "a.test", &ca.pem(), &rustls::version::TLS13).unwrap();
    assert_eq!(common_name(&a.leaf()), "a.test");
}

#[test]
fn http2_routes_match_on_authority() {
    let up = Upstream::start();
    let OneCert { ca: _, dir: _dir, a, ca_file } = one_cert();
    let routes = r#"
[[route]]
name = "a"
host = "a.test"
path_prefix = "/"
upstream = "app"
"#;
    let w = Weir::start(&tls_config(up.addr(), "h2c = true", &[a], routes));
    let (plain, tls) = (w.addrs[0], w.addrs[1]);
    let resolve = format!("a.test:{}:127.0.0.1", tls.port());
    let https = format!("https://a.test:{}/x", tls.port());
    let h2 = curl(&["--http2", "--cacert", ca_file.to_str().unwrap(), "--resolve", &resolve, &https]);
    assert_eq!((h2.0.as_str(), h2.1), ("HTTP/2", 200));
    let connect_to = format!("a.test:80:127.0.0.1:{}", plain.port());
    let h2c = curl(&["--http2-prior-knowledge", "--connect-to", &connect_to, "http://a.test/x"]);
    assert_eq!((h2c.0.as_str(), h2c.1), ("HTTP/2", 200));
    let other = curl(&["--http2-prior-knowledge", &format!("http://{plain}/x")]);
    assert_eq!(other.1, 404, ":authority 127.0.0.1 matches no route");
    assert_eq!(up.seen().last().and_then(|s| s.header("host")).as_deref(), Some("a.test"), "the upstream gets Host");
}

/// Four unary calls of `/demo.Greeter/SayHello` with Debian's python3-grpcio (raw bytes, no
/// stubs), `x-key: py`; one line per call: `OK` or `CODE|details`.
const GRPC_CLIENT: &str = r#"
import sys, grpc
target, ca = sys.argv[1], sys.argv[2]
if ca == "-":
    channel = grpc.insecure_channel(target)
else:
    creds = grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read())
    channel = grpc.secure_channel(target, creds, options=(("grpc.ssl_target_name_override", "a.test"),))
call = channel.unary_unary("/demo.Greeter/SayHello")
for _ in range(4):
    try:
        call(b"", timeout=5, metadata=(("x-key", "py"),))
        print("OK")
    except grpc.RpcError as e:
        print(e.code().name + "|" + (e.details() or ""))
"#;

#[test]
fn a_real_grpc_client_sees_resource_exhausted_with_the_message() {
    let up = Upstream::start();
    let OneCert { ca: _, dir: _dir, a, ca_file } = one_cert();
    let routes = r#"
[[limit_req_zone]]
name = "per_key"
key = "header:X-Key"
rate = "1r/m"

[[route]]
name = "greeter"
path_prefix = "/demo.Greeter/"
upstream = "app"
limit_req = [ { zone = "per_key", burst = 2, nodelay = true } ]
"#;
    for (name, tls) in [("h2c", false), ("h2 over TLS", true)] {
        let w = Weir::start(&tls_config(up.addr(), "h2c = true", std::slice::from_ref(&a), routes));
        let target = if tls { format!("127.0.0.1:{}", w.addrs[1].port()) } else { w.addrs[0].to_string() };
        let ca_arg = if tls { ca_file.to_str().unwrap().to_string() } else { "-".to_string() };
        let out = Command::new("/usr/bin/python3")
            .args(["-c", GRPC_CLIENT, &target, &ca_arg])
            .output()
            .expect("/usr/bin/python3 with grpcio (apt-get install python3-grpcio; scripts/setup.sh does)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let calls: Vec<&str> = stdout.lines().collect();
        assert_eq!(calls.len(), 4, "{name}: {out:?}");
        // The first three pass the limit and reach the (HTTP/1.1, non-gRPC) test upstream, which
        // the client reports as some error of its own; the fourth is Weir's rejection.
        assert!(calls[..3].iter().all(|c| !c.starts_with("RESOURCE_EXHAUSTED")), "{name}: {calls:?}");
        let (code, details) = calls[3].split_once('|').unwrap_or((calls[3], ""));
        assert_eq!(code, "RESOURCE_EXHAUSTED", "{name}: {calls:?}");
        assert!(details.starts_with("rate limited: route greeter, zone per_key, retry after "), "{name}: {details}");
        assert_eq!(
            up.hits_with_prefix("/demo.Greeter/"),
            if tls { 6 } else { 3 },
            "{name}: the rejected call never reached the upstream"
        );
    }
}
