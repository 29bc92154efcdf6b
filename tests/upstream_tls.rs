//! HTTPS and HTTP/2 upstreams, against real processes: Weir → nginx with `ssl` (certificates from
//! a CA generated in the test with rcgen), and Weir → a Python grpcio server over h2c. nginx
//! echoes what it saw of the connection in response headers (`$ssl_server_name`,
//! `$server_protocol`, `$http2`, `$connection`, `$ssl_client_verify`).

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use support::certs::{install, Ca};
use support::config::with_server;
use support::http::{get, get_with, Response};
use support::nginx::Nginx;
use support::poll::wait_until;
use support::weir::{check_config, Weir};

const TIMEOUT: Duration = Duration::from_secs(10);

/// The inside of nginx's `server {}`: TLS with `cert`/`key`, `extra` directives, and every
/// request answered `ok` with what nginx saw of the connection.
fn nginx_tls(listen: &str, cert: &(PathBuf, PathBuf), extra: &str) -> String {
    format!(
        r#"        listen $HOST:$PORT {listen};
        ssl_certificate {cert};
        ssl_certificate_key {key};
        {extra}
        location / {{
            add_header X-SNI "$ssl_server_name" always;
            add_header X-Proto "$server_protocol" always;
            add_header X-H2 "$http2" always;
            add_header X-Conn "$connection" always;
            add_header X-Conn-Requests "$connection_requests" always;
            add_header X-Client-Verify "$ssl_client_verify" always;
            return 200 "ok\n";
        }}"#,
        cert = cert.0.display(),
        key = cert.1.display()
    )
}

/// A CA, a temp dir, the CA's PEM there, and an `a.test` (+ 127.0.0.1) pair it signed.
struct Pki {
    ca: Ca,
    dir: tempfile::TempDir,
    ca_file: PathBuf,
    server: (PathBuf, PathBuf),
}

fn pki() -> Pki {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let server = install(dir.path(), "a", &ca.leaf(&["a.test", "127.0.0.1"], "a.test", 30));
    Pki { ca, dir, ca_file, server }
}

/// A Weir config: `upstreams` (TOML `[[upstream]]` tables) and one route per upstream, `/<name>/`.
fn config(server_extra: &str, upstreams: &[(&str, String)]) -> String {
    let mut rest = String::from("[store]\nkind = \"memory\"\n\n");
    for (name, body) in upstreams {
        rest.push_str(&format!("[[upstream]]\nname = \"{name}\"\n{body}\n\n"));
    }
    for (name, _) in upstreams {
        rest.push_str(&format!("[[route]]\nname = \"{name}\"\npath_prefix = \"/{name}/\"\nupstream = \"{name}\"\n\n"));
    }
    with_server(server_extra, &rest)
}

fn tls_upstream(addr: std::net::SocketAddr, extra: &str) -> String {
    format!("servers = [\"{addr}\"]\ntls = true\n{extra}")
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

fn header(r: &Response, name: &str) -> String {
    r.header(name).unwrap_or_default()
}

/// Over sequential requests: the upstream connections nginx saw them on, and the most requests
/// one connection had carried. (A request that comes while the previous one's connection is being
/// put back in the pool may open another: reuse is asserted, not a single connection.)
fn reuse(rs: &[Response]) -> (std::collections::BTreeSet<String>, usize) {
    let conns = rs.iter().map(|r| header(r, "x-conn")).collect();
    let most = rs.iter().filter_map(|r| header(r, "x-conn-requests").parse().ok()).max().unwrap_or(0);
    (conns, most)
}

/// Weir's JSON `error`, or "" for an upstream's answer.
fn error_of(r: &Response) -> String {
    let body: Option<serde_json::Value> = serde_json::from_slice(&r.body).ok();
    body.and_then(|v| v["error"].as_str().map(str::to_string)).unwrap_or_default()
}

#[test]
fn a_verified_https_upstream_gets_the_sni_and_its_connection_is_reused() {
    let p = pki();
    let nginx = Nginx::start(&nginx_tls("ssl", &p.server, ""));
    let ca = path_str(&p.ca_file);
    let w = Weir::start(&config(
        "",
        &[
            ("named", tls_upstream(nginx.addr, &format!("sni = \"a.test\"\nca_file = \"{ca}\""))),
            // No sni: the server's host, here an IP, which the certificate names (no SNI is sent
            // for an IP address, as in browsers).
            ("by_ip", tls_upstream(nginx.addr, &format!("ca_file = \"{ca}\""))),
            ("plain_h1", tls_upstream(nginx.addr, &format!("sni = \"a.test\"\nca_file = \"{ca}\"\nprotocol = \"h1\""))),
            ("no_reuse", tls_upstream(nginx.addr, &format!("sni = \"a.test\"\nca_file = \"{ca}\"\nkeepalive = 0"))),
        ],
    ));
    let rs: Vec<Response> = (0..10).map(|_| get(w.addr, "/named/x")).collect();
    for r in &rs {
        assert_eq!((r.status, r.text().as_str()), (200, "ok\n"), "{}", r.summary());
        assert_eq!(header(r, "x-sni"), "a.test", "SNI sent: {}", r.summary());
        assert_eq!(header(r, "x-proto"), "HTTP/1.1");
    }
    // TLS connections (handshakes) carry many requests.
    let (conns, most) = reuse(&rs);
    assert!(conns.len() <= 3 && most >= 4, "10 requests on {conns:?}, at most {most} on one");

    let r = get(w.addr, "/by_ip/x");
    assert_eq!(r.status, 200, "{}", r.summary());
    assert_eq!(header(&r, "x-sni"), "", "no SNI for an IP address");
    // Another upstream (other settings) never shares the first one's pooled connection.
    assert!(!conns.contains(&header(&r, "x-conn")), "{}", r.summary());
    let r = get(w.addr, "/plain_h1/x");
    assert_eq!((r.status, header(&r, "x-proto").as_str()), (200, "HTTP/1.1"));
    assert!(!conns.contains(&header(&r, "x-conn")), "upstreams do not share pooled connections");

    // keepalive = 0: a connection (and a handshake) per request, however fast they come.
    let fresh: Vec<String> = (0..3).map(|_| header(&get(w.addr, "/no_reuse/x"), "x-conn")).collect();
    let distinct: std::collections::BTreeSet<&String> = fresh.iter().collect();
    assert_eq!(distinct.len(), 3, "{fresh:?}");
}

#[test]
fn a_server_that_does_not_verify_is_a_502_and_a_log_line_naming_the_upstream() {
    let p = pki();
    let nginx = Nginx::start(&nginx_tls("ssl", &p.server, ""));
    let other_ca = Ca::new();
    let other_ca_file = p.dir.path().join("other-ca.pem");
    std::fs::write(&other_ca_file, other_ca.pem()).unwrap();
    let w = Weir::start(&config(
        "",
        &[
            (
                "wrong_ca",
                tls_upstream(nginx.addr, &format!("sni = \"a.test\"\nca_file = \"{}\"", path_str(&other_ca_file))),
            ),
            (
                "wrong_name",
                tls_upstream(nginx.addr, &format!("sni = \"b.test\"\nca_file = \"{}\"", path_str(&p.ca_file))),
            ),
            // Without ca_file the system's roots are used: a private CA is unknown there too.
            ("system_roots", tls_upstream(nginx.addr, "sni = \"a.test\"")),
        ],
    ));
    // (The two test CAs share their name: rustls finds the wrong one and reports a bad signature.)
    let reasons = [
        ("wrong_ca", "invalid peer certificate: BadSignature"),
        ("wrong_name", "invalid peer certificate: certificate not valid for name \"b.test\""),
        ("system_roots", "invalid peer certificate: UnknownIssuer"),
    ];
    for (name, reason) in reasons {
        let r = get(w.addr, &format!("/{name}/x"));
        assert_eq!(r.status, 502, "{name}: {}", r.summary());
        assert_eq!(error_of(&r), "upstream_tls_error", "{name}: {}", r.summary());
        assert_eq!(r.json()["upstream"], name, "{name}: the body names the upstream");
        let logged = wait_until(TIMEOUT, Duration::from_millis(20), || {
            w.stderr().lines().any(|l| {
                l.contains("upstream TLS handshake failed")
                    && l.contains(&format!("upstream={name}"))
                    && l.contains(reason)
            })
        });
        assert!(logged.is_some(), "{name}: a log line naming the upstream and {reason}:\n{}", w.stderr());
    }
}

#[test]
fn mutual_tls_a_server_that_requires_a_client_certificate_gets_one() {
    let p = pki();
    let client = install(p.dir.path(), "weir-client", &p.ca.leaf(&["weir"], "weir", 30));
    let ca = path_str(&p.ca_file);
    let nginx = Nginx::start(&nginx_tls(
        "ssl",
        &p.server,
        &format!("ssl_client_certificate {ca};\n        ssl_verify_client on;"),
    ));
    let w = Weir::start(&config(
        "",
        &[
            ("anonymous", tls_upstream(nginx.addr, &format!("sni = \"a.test\"\nca_file = \"{ca}\""))),
            (
                "with_cert",
                tls_upstream(
                    nginx.addr,
                    &format!(
                        "sni = \"a.test\"\nca_file = \"{ca}\"\nclient_cert = \"{}\"\nclient_key = \"{}\"",
                        path_str(&client.0),
                        path_str(&client.1)
                    ),
                ),
            ),
        ],
    ));
    // nginx finishes the handshake and refuses the request itself: "No required SSL certificate
    // was sent".
    let r = get(w.addr, "/anonymous/x");
    assert_eq!(r.status, 400, "{}", r.summary());
    assert!(r.text().contains("No required SSL certificate was sent"), "{}", r.summary());
    let r = get(w.addr, "/with_cert/x");
    assert_eq!((r.status, r.text().as_str()), (200, "ok\n"), "{}", r.summary());
    assert_eq!(header(&r, "x-client-verify"), "SUCCESS");
}

#[test]
fn verify_false_accepts_a_certificate_of_another_name_and_check_warns() {
    let p = pki();
    let stranger = Ca::new();
    let other = install(p.dir.path(), "other", &stranger.leaf(&["other.example"], "other.example", 30));
    let nginx = Nginx::start(&nginx_tls("ssl", &other, ""));
    let text = config("", &[("lax", tls_upstream(nginx.addr, "sni = \"a.test\"\nverify = false"))]);
    let w = Weir::start(&text);
    let r = get(w.addr, "/lax/x");
    assert_eq!((r.status, r.text().as_str()), (200, "ok\n"), "{}", r.summary());
    assert_eq!(header(&r, "x-sni"), "a.test");

    let out = check(&text);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(
        out.stderr.contains("weir: warning: ") && out.stderr.contains("upstream \"lax\": verify = false"),
        "{}",
        out.describe()
    );
}

#[test]
fn http2_over_tls_to_nginx_is_negotiated_with_alpn() {
    let p = pki();
    let nginx = Nginx::start(&nginx_tls("ssl http2", &p.server, ""));
    let ca = path_str(&p.ca_file);
    let w = Weir::start(&config(
        "",
        &[
            ("h2", tls_upstream(nginx.addr, &format!("sni = \"a.test\"\nca_file = \"{ca}\"\nprotocol = \"h2\""))),
            ("h1", tls_upstream(nginx.addr, &format!("sni = \"a.test\"\nca_file = \"{ca}\""))),
        ],
    ));
    let rs: Vec<Response> = (0..10).map(|_| get_with(w.addr, "/h2/x", &[("X-Test", "h2")])).collect();
    for r in &rs {
        assert_eq!(r.status, 200, "{}", r.summary());
        assert_eq!((header(r, "x-proto").as_str(), header(r, "x-h2").as_str()), ("HTTP/2.0", "h2"), "{}", r.summary());
    }
    let (conns, _) = reuse(&rs);
    assert!(conns.len() <= 3, "h2 connections are reused: 10 requests on {conns:?}");
    // The default stays HTTP/1.1, even to a server that offers h2.
    let r = get(w.addr, "/h1/x");
    assert_eq!((header(&r, "x-proto").as_str(), header(&r, "x-h2").as_str()), ("HTTP/1.1", ""));
}

/// A Python grpcio server (Debian's python3-grpcio, generic handlers, raw bytes: no stubs) on a
/// free loopback port, cleartext HTTP/2. Stops when its stdin closes or on drop.
struct GrpcServer {
    child: Child,
    port: u16,
}

const GRPC_SERVER: &str = r#"
import sys, grpc
from concurrent import futures
def say(req, ctx):
    md = dict(ctx.invocation_metadata())
    return b"hello " + req + b" (x-key " + md.get("x-key", "").encode() + b")"
def count(req, ctx):
    for i in range(3):
        yield str(i).encode() + b":" + req
server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("demo.Greeter", {
    "SayHello": grpc.unary_unary_rpc_method_handler(say),
    "Count": grpc.unary_stream_rpc_method_handler(count),
}),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
sys.stdin.read()
server.stop(0)
"#;

impl GrpcServer {
    fn start() -> GrpcServer {
        let mut child = Command::new("/usr/bin/python3")
            .args(["-c", GRPC_SERVER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("/usr/bin/python3 with grpcio (apt-get install python3-grpcio; scripts/setup.sh does)");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(TIMEOUT).unwrap_or_default();
        let port = line.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("the gRPC server did not print its port: {line:?}")
        });
        GrpcServer { child, port }
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.flush();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One unary and one server-streaming call through `target` (argv 2: the CA file for TLS to
/// Weir as `a.test`, or `-` for h2c); one line per message received, or `CODE|details`.
const GRPC_CLIENT: &str = r#"
import sys, grpc
target, ca = sys.argv[1], sys.argv[2]
if ca == "-":
    channel = grpc.insecure_channel(target)
else:
    creds = grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read())
    channel = grpc.secure_channel(target, creds, options=(("grpc.ssl_target_name_override", "a.test"),))
try:
    print(channel.unary_unary("/demo.Greeter/SayHello")(b"weir", timeout=5, metadata=(("x-key", "k1"),)).decode())
    for m in channel.unary_stream("/demo.Greeter/Count")(b"s", timeout=5):
        print(m.decode())
except grpc.RpcError as e:
    print(e.code().name + "|" + (e.details() or ""))
"#;

/// gRPC end to end: a grpcio client over h2c and over h2 with TLS to Weir, Weir over h2c to a
/// grpcio server; the reply, the streamed messages and the trailers (`grpc-status: 0`, else the
/// client reports an error) come back.
#[test]
fn a_real_grpc_server_behind_an_h2c_upstream_answers_unary_and_streaming_calls() {
    let p = pki();
    let grpc = GrpcServer::start();
    let listener_tls = format!(
        "h2c = true\nlisten_tls = [\"$LISTEN2\"]\n\n[[server.tls]]\ncert = \"{}\"\nkey = \"{}\"",
        path_str(&p.server.0),
        path_str(&p.server.1)
    );
    let w = Weir::start(&config(
        &listener_tls,
        &[("demo.Greeter", format!("servers = [\"127.0.0.1:{}\"]\nprotocol = \"h2c\"", grpc.port))],
    ));
    let ca = path_str(&p.ca_file);
    for (target, ca) in [(w.addrs[0].to_string(), "-"), (w.addrs[1].to_string(), ca.as_str())] {
        let out = Command::new("/usr/bin/python3")
            .args(["-c", GRPC_CLIENT, &target, ca])
            .output()
            .expect("/usr/bin/python3 with grpcio");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            lines,
            ["hello weir (x-key k1)", "0:s", "1:s", "2:s"],
            "client CA {ca}: {out:?}\n--- weir ---\n{}",
            w.stderr()
        );
    }
}

/// `weir check` on a config made by [`config`].
fn check(text: &str) -> support::weir::RunOutput {
    check_config("weir.toml", &text.replace("$LISTEN", "127.0.0.1:1"), TIMEOUT)
}

/// `weir check` refuses what a handshake would fail on, naming the file and the fix.
#[test]
fn check_refuses_bad_upstream_tls_settings_with_the_reason() {
    let p = pki();
    let leaf = path_str(&p.server.0);
    let key = path_str(&p.server.1);
    let other_key = install(p.dir.path(), "b", &p.ca.leaf(&["b.test"], "b.test", 30)).1;
    let ca = path_str(&p.ca_file);
    let cases = [
        (format!("ca_file = \"{leaf}\""), "is not a CA certificate"),
        (format!("ca_file = \"{}\"", p.dir.path().join("missing.pem").display()), "cannot read"),
        (format!("ca_file = \"{key}\""), "holds no certificate"),
        (format!("client_cert = \"{leaf}\"\nclient_key = \"{}\"", other_key.display()), "does not match"),
        (format!("client_cert = \"{leaf}\""), "give both, or neither"),
        ("sni = \"\"".to_string(), "sni: \"\" is not a DNS name"),
        ("protocol = \"h2c\"".to_string(), "with tls = true use \"h2\""),
        ("protocol = \"h3\"".to_string(), "expected \"h1\", \"h2\" or \"h2c\""),
    ];
    for (extra, needle) in cases {
        let text = config("", &[("app", format!("servers = [\"127.0.0.1:9\"]\ntls = true\n{extra}"))]);
        let out = check(&text);
        assert_eq!(out.code, Some(1), "{extra}: {}", out.describe());
        assert!(out.stderr.contains("upstream \"app\""), "{extra}: {}", out.describe());
        assert!(out.stderr.contains(needle), "{extra}: expected {needle:?}: {}", out.describe());
    }
    for (extra, needle) in [
        (format!("ca_file = \"{ca}\""), "ca_file: only applies with tls = true"),
        ("protocol = \"h2\"".to_string(), "add tls = true"),
    ] {
        let text = config("", &[("app", format!("servers = [\"127.0.0.1:9\"]\n{extra}"))]);
        let out = check(&text);
        assert_eq!(out.code, Some(1), "{extra}: {}", out.describe());
        assert!(out.stderr.contains(needle), "{extra}: expected {needle:?}: {}", out.describe());
    }
    // A good one passes, with no warning.
    let text = config(
        "",
        &[("app", format!("servers = [\"127.0.0.1:9\"]\ntls = true\nca_file = \"{ca}\"\nprotocol = \"h2\""))],
    );
    let out = check(&text);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(!out.stderr.contains("warning"), "{}", out.describe());
}

#[test]
fn an_http_health_check_of_a_tls_upstream_verifies_like_requests_do() {
    let p = pki();
    let nginx = Nginx::start(&nginx_tls("ssl", &p.server, ""));
    let other_ca = Ca::new();
    let other_ca_file = p.dir.path().join("other-ca.pem");
    std::fs::write(&other_ca_file, other_ca.pem()).unwrap();
    let check = "[upstream.health_check]\npath = \"/\"\ninterval = \"100ms\"\nrise = 1\nfall = 1";
    let w = Weir::start(&config(
        "",
        &[
            (
                "good",
                tls_upstream(nginx.addr, &format!("sni = \"a.test\"\nca_file = \"{}\"\n{check}", path_str(&p.ca_file))),
            ),
            (
                "bad",
                tls_upstream(
                    nginx.addr,
                    &format!("sni = \"a.test\"\nca_file = \"{}\"\n{check}", path_str(&other_ca_file)),
                ),
            ),
        ],
    ));
    // The good upstream's checks reach nginx over TLS (the port speaks nothing else) and pass ...
    let checked = wait_until(TIMEOUT, Duration::from_millis(20), || {
        nginx
            .access_log()
            .lines()
            .filter(|l| l.contains("\"GET / HTTP/1.1\" 200") && l.contains("weir-health-check"))
            .count()
            >= 3
    });
    assert!(checked.is_some(), "TLS health checks answered 200:\n{}", nginx.access_log());
    // ... the bad one's fail the handshake and take its server out.
    let down =
        wait_until(TIMEOUT, Duration::from_millis(20), || error_of(&get(w.addr, "/bad/x")) == "no_healthy_upstream");
    assert!(down.is_some(), "the bad upstream's server is taken out by its check:\n{}", w.stderr());
    let r = get(w.addr, "/good/x");
    assert_eq!((r.status, r.text().as_str()), (200, "ok\n"), "{}", r.summary());
}

#[test]
fn a_replaced_ca_file_is_applied_by_a_reload() {
    let p = pki();
    let nginx = Nginx::start(&nginx_tls("ssl", &p.server, ""));
    let live = p.dir.path().join("live-ca.pem");
    std::fs::write(&live, Ca::new().pem()).unwrap();
    let w = Weir::start(&config(
        "",
        &[("app", tls_upstream(nginx.addr, &format!("sni = \"a.test\"\nca_file = \"{}\"", path_str(&live))))],
    ));
    let r = get(w.addr, "/app/x");
    assert_eq!((r.status, error_of(&r).as_str()), (502, "upstream_tls_error"), "{}", r.summary());

    // The config text stays the same; the CA file's content is what changed.
    let tmp = p.dir.path().join("live-ca.tmp");
    std::fs::write(&tmp, p.ca.pem()).unwrap();
    std::fs::rename(&tmp, &live).unwrap();
    w.signal(libc::SIGHUP);
    let ok = wait_until(TIMEOUT, Duration::from_millis(50), || get(w.addr, "/app/x").status == 200);
    assert!(ok.is_some(), "the new CA verifies the server after the reload:\n{}", w.stderr());
    assert!(w.stderr().contains("config reloaded"), "{}", w.stderr());
}

#[test]
fn each_server_of_an_https_upstream_is_health_checked_under_its_own_name() {
    let p = pki();
    // Two servers, each with a certificate for its own address only.
    let one = install(p.dir.path(), "one", &p.ca.leaf(&["127.0.0.1"], "one", 30));
    let two = install(p.dir.path(), "two", &p.ca.leaf(&["127.0.0.2"], "two", 30));
    let n1 = Nginx::start(&nginx_tls("ssl", &one, ""));
    let n2 = Nginx::start_at("127.0.0.2", &nginx_tls("ssl", &two, ""));
    let upstream = format!(
        "servers = [\"{}\", \"{}\"]\ntls = true\nca_file = \"{}\"\n\n[upstream.health_check]\npath = \"/\"\ninterval = \"100ms\"\nrise = 1\nfall = 1",
        n1.addr,
        n2.addr,
        path_str(&p.ca_file)
    );
    let w = Weir::start(&config("", &[("pair", upstream)]));
    let passed =
        |n: &Nginx| n.access_log().lines().filter(|l| l.contains("\" 200 ") && l.contains("weir-health-check")).count();
    let both = wait_until(TIMEOUT, Duration::from_millis(20), || passed(&n1) >= 3 && passed(&n2) >= 3);
    assert!(both.is_some(), "both servers pass their checks:\n{}\n---\n{}", n1.access_log(), n2.access_log());
    // And both take requests (round robin), verified under their own names.
    let rs: Vec<Response> = (0..4).map(|_| get(w.addr, "/pair/x")).collect();
    assert!(rs.iter().all(|r| r.status == 200), "{:?}", rs.iter().map(Response::summary).collect::<Vec<_>>());
    assert!(w.stderr().lines().all(|l| !l.contains("unhealthy")), "{}", w.stderr());
}
