//! The Redis store over TLS: `redis-server --tls-port` with a CA and certificates generated in the
//! test, requiring client certificates; Weir reaches it through `rediss://` with `tls_ca`,
//! `tls_cert` and `tls_key`. With `on_error = "deny"`, a request is answered `rate_limited` only
//! when Redis decided it, and `limiter_unavailable` when Redis could not be reached.

use crate::support;

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::certs::{install, Ca};
use support::config::redis_store;
use support::http::get_with;
use support::poll::wait_until;
use support::upstream::Upstream;
use support::weir::{free_port, Weir};

/// `redis-server` with TLS only (no cleartext port), client certificates required.
struct TlsRedis {
    child: Child,
    port: u16,
}

impl TlsRedis {
    fn start(dir: &Path, cert: &Path, key: &Path, ca: &Path) -> TlsRedis {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir", dir.to_str().unwrap()])
            .arg("--tls-cert-file")
            .arg(cert)
            .arg("--tls-key-file")
            .arg(key)
            .arg("--tls-ca-cert-file")
            .arg(ca)
            .args(["--tls-auth-clients", "yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (apt-get install redis-server)");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let up = wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        });
        assert!(up.is_some(), "redis-server with TLS did not listen on {addr}");
        TlsRedis { child, port }
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(up: SocketAddr, port: u16, ca: &Path, client: &(std::path::PathBuf, std::path::PathBuf)) -> String {
    let store = redis_store(
        &format!("rediss://127.0.0.1:{port}/"),
        &format!(
            "timeout = \"1s\"\non_error = \"deny\"\ntls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"",
            ca.display(),
            client.0.display(),
            client.1.display()
        ),
    );
    format!(
        r#"[server]
listen = ["$LISTEN"]
threads = 2

{store}

[[upstream]]
name = "app"
servers = ["{up}"]

[[limit_req_zone]]
name = "per_key"
key = "header:X-Key"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
limit_req = [ {{ zone = "per_key", burst = 1, nodelay = true }} ]
"#
    )
}

/// The `error` of Weir's JSON body; empty for an upstream's answer.
fn error_of(r: &support::http::Response) -> String {
    let body: Option<serde_json::Value> = serde_json::from_slice(&r.body).ok();
    body.and_then(|v| v["error"].as_str().map(str::to_string)).unwrap_or_default()
}

#[test]
fn the_redis_store_works_over_rediss_with_a_private_ca_and_a_client_certificate() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let server = install(dir.path(), "redis", &ca.leaf(&["127.0.0.1"], "redis", 30));
    let client = install(dir.path(), "client", &ca.leaf(&["weir"], "weir", 30));
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let redis = TlsRedis::start(dir.path(), &server.0, &server.1, &ca_file);
    let up = Upstream::start();

    let w = Weir::start(&config(up.addr(), redis.port, &ca_file, &client));
    let statuses: Vec<(u16, String)> = (0..3)
        .map(|_| {
            let r = get_with(w.addr, "/x", &[("X-Key", "k")]);
            (r.status, error_of(&r))
        })
        .collect();
    assert_eq!(
        statuses,
        [(200, String::new()), (200, String::new()), (429, "rate_limited".to_string())],
        "Redis over TLS decided (1 + burst 1, then rejected)\n{}",
        w.stderr()
    );

    // Another CA: the server's certificate is refused, the store is unavailable, `deny` answers.
    let other = Ca::new();
    let other_file = dir.path().join("other-ca.crt");
    std::fs::write(&other_file, other.pem()).unwrap();
    let w = Weir::start(&config(up.addr(), redis.port, &other_file, &client));
    let r = get_with(w.addr, "/x", &[("X-Key", "other")]);
    assert_eq!((r.status, error_of(&r)), (429, "limiter_unavailable".to_string()), "{}", w.stderr());
    let logged = wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
        w.stderr().contains("limit store failed") && w.stderr().to_lowercase().contains("certificate")
    });
    assert!(logged.is_some(), "{}", w.stderr());
}
