//! Hostile clients on the smaller front doors, with the real binary over real sockets: JWT
//! audiences, the live view (`/top`, `weir top` in tmux) fed keys that hold secrets, terminal
//! escapes and bidirectional overrides, the admin API (paths, `Host`, the page's headers), and
//! config secrets (`weir check`: redaction, size bounds, file modes, the rls listener).

use crate::support;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use ::weir::rls::proto::rate_limit_descriptor::Entry;
use ::weir::rls::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use support::admin;
use support::config::with_app;
use support::http::{self, KeepAlive, Request};
use support::poll::poll;
use support::upstream::Upstream;
use support::weir::{self, ConfigDir, Weir};
use tonic::transport::Channel;

const SECRET: &str = "jwt-shared-secret-for-the-test-0001";

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs()
}

fn hs(claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &EncodingKey::from_secret(SECRET.as_bytes()))
        .expect("sign")
}

/// Issue 34 item 3: with no `audience` configured, a token that names one (it was issued for
/// another service) is refused, as docs/keys.md says; a token without `aud` passes.
#[test]
fn without_a_configured_audience_a_token_naming_one_is_refused() {
    let up = Upstream::start();
    let dir = ConfigDir::new();
    let key = dir.write("secret.key", &format!("{SECRET}\n"));
    let w = Weir::start(&with_app(
        "",
        "[store]\nkind = \"memory\"",
        up.addr(),
        &format!(
            r#"[jwt]
key_file = "{}"
algorithm = "HS256"

[[limit_req_zone]]
name = "per_user"
key = "jwt:sub"
rate = "100r/s"

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
limit_req = [{{ zone = "per_user", burst = 10 }}]
"#,
            key.display()
        ),
    ));
    let status = |claims: Value| {
        let r =
            http::must_send(w.addr, &Request::get("/x").header("Authorization", &format!("Bearer {}", hs(&claims))));
        (r.status, r.text())
    };
    let exp = now() + 600;
    assert_eq!(status(json!({"sub": "alice", "exp": exp})).0, 200, "no aud: accepted");
    for aud in [json!("billing-service"), json!(["billing-service", "other"]), json!([])] {
        let (code, body) = status(json!({"sub": "mallory", "exp": exp, "aud": aud}));
        assert_eq!(code, 401, "aud {aud}: {body}");
        assert!(body.contains("invalid_token"), "{body}");
    }
    assert_eq!(up.hits(), 1, "only the token without an audience reached the upstream");
}

/// A key a client controls, made of what a terminal obeys: a title-setting OSC sequence, a
/// screen clear and a right-to-left override.
const HOSTILE: &str = "\u{1b}]2;pwned\u{7}\u{1b}[2J\u{202e}evil";
/// [`HOSTILE`] as a query value (`query:k`).
const HOSTILE_QUERY: &str = "%1B%5D2%3Bpwned%07%1B%5B2J%E2%80%AEevil";

fn raw_unsafe(text: &str) -> Option<char> {
    text.chars()
        .find(|c| c.is_control() && *c != '\n' || matches!(*c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
}

/// Every string in `v` (keys too).
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
        Value::Object(o) => {
            for (k, v) in o {
                out.push(k.clone());
                strings(v, out);
            }
        }
        _ => {}
    }
}

/// A proxy whose zone is keyed by a query argument, with the keys shown (`reveal_keys`): the
/// hostile key is rejected, so `/top` lists it.
fn revealing_proxy(up: &Upstream, server_extra: &str) -> Weir {
    Weir::start(&with_app(
        &format!("{}\n{server_extra}", admin::LISTEN),
        "[store]\nkind = \"memory\"\n\n[top]\nreveal_keys = true",
        up.addr(),
        r#"[[limit_req_zone]]
name = "per_k"
key = "query:k"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
limit_req = [{ zone = "per_k", burst = 0, nodelay = true }]
"#,
    ))
}

async fn rls_call(addr: SocketAddr, value: &str) {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to the rls at {addr}: {e}"));
    let mut client = RateLimitServiceClient::new(channel);
    let descriptor = RateLimitDescriptor {
        entries: vec![Entry { key: "api_key".into(), value: value.into() }],
        limit: None,
        hits_addend: None,
    };
    let request = RateLimitRequest { domain: "edge".into(), descriptors: vec![descriptor], hits_addend: 0 };
    client.should_rate_limit(request).await.unwrap_or_else(|s| panic!("ShouldRateLimit: {s:?}"));
}

/// Issue 34 item 4 and issue 38 item 4: a zone without `key` (the rate limit service's way, whose
/// descriptor values are API keys) is hashed in `/top` by default; a key with ESC and U+202E is
/// escaped in every string `/top` serves; each count says whose it is.
#[test]
fn top_hides_descriptor_values_and_escapes_what_a_terminal_would_obey() {
    // The rate limit service alone, its admin on $LISTEN2: descriptor values as keys.
    let api_key = "sk_live_4f9a7c2e1b8d";
    let rls = Weir::start(&format!(
        r#"[server]
{}

[store]
kind = "memory"

[[limit_req_zone]]
name = "per_api_key"
rate = "1r/m"

[rls]
listen = ["$LISTEN"]

[[rls.domain]]
name = "edge"

[[rls.domain.descriptor]]
key = "api_key"
zone = "per_api_key"
"#,
        admin::LISTEN
    ));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    for value in [api_key, api_key, &format!("{api_key}{HOSTILE}"), &format!("{api_key}{HOSTILE}")] {
        runtime.block_on(rls_call(rls.addr, value));
    }
    let top = poll(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || admin::request(admin::addr(&rls), "GET", "/top", None),
        |r| r.status == 200 && r.json()["zones"][0]["rejected"].as_array().is_some_and(|a| a.len() == 2),
    )
    .unwrap_or_else(|r| panic!("/top never listed both descriptor keys: {}", r.text()));
    let body = top.text();
    assert!(!body.contains("sk_live") && !body.contains("4f9a7c2e1b8d"), "a descriptor value shows: {body}");
    let zone = &top.json()["zones"][0];
    assert_eq!(zone["hashed"], true, "{zone}");
    for row in zone["rejected"].as_array().expect("rows") {
        assert!(row["key"].as_str().is_some_and(|k| k.starts_with("sha256:")), "{row}");
    }
    assert_eq!(
        top.json()["scope"],
        json!({"routes": "this instance", "decisions": "this instance", "keys": "this instance"})
    );

    // A proxy showing its keys: the hostile one is listed escaped, never raw.
    let up = Upstream::start();
    let w = revealing_proxy(&up, "");
    let mut client = KeepAlive::new(w.addr, Duration::from_secs(5));
    for _ in 0..3 {
        client.send(&Request::get(&format!("/?k={HOSTILE_QUERY}"))).expect("request");
    }
    let top = poll(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || admin::request(admin::addr(&w), "GET", "/top", None),
        |r| r.status == 200 && r.text().contains("pwned"),
    )
    .unwrap_or_else(|r| panic!("/top never listed the hostile key: {}", r.text()));
    let json = top.json();
    let mut all = Vec::new();
    strings(&json, &mut all);
    for s in &all {
        assert_eq!(raw_unsafe(s), None, "a raw control or bidi character in {s:?}");
    }
    let key = json["zones"][0]["rejected"][0]["key"].as_str().expect("the key");
    assert_eq!(key, "\\u{1b}]2;pwned\\u{7}\\u{1b}[2J\\u{202e}evil", "escaped, readable");
    assert_eq!(json["zones"][0]["scope"], "this instance");
    assert_eq!(json["routes"][0]["scope"], "this instance");
}

/// A tmux server of its own (`-L`), killed on drop (as tests/top_tui.rs).
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("tmux {args:?}: {e} (install it with scripts/setup.sh)"));
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.socket, "kill-server"]).output();
    }
}

/// `weir top` in a real terminal, fed the hostile key: the screen shows it escaped, the pane's
/// title is not what the key asked for, and no U+202E reaches the screen.
#[test]
fn weir_top_never_lets_a_key_write_to_the_terminal() {
    let up = Upstream::start();
    let w = revealing_proxy(&up, "");
    let mut client = KeepAlive::new(w.addr, Duration::from_secs(5));
    for _ in 0..3 {
        client.send(&Request::get(&format!("/?k={HOSTILE_QUERY}"))).expect("request");
    }
    let tmux = Tmux { socket: format!("weir-frontdoors-{}", std::process::id()) };
    let command = format!("{} top --admin {}", weir::bin(), admin::addr(&w));
    tmux.run(&["new-session", "-d", "-s", "top", "-x", "160", "-y", "40", &command]);
    let screen = poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        || tmux.run(&["capture-pane", "-p", "-t", "top"]),
        |s| s.contains("pwned") && s.contains("per_k"),
    )
    .unwrap_or_else(|s| panic!("the screen never showed the key:\n{s}"));
    assert!(screen.contains("\\u{1b}]2;pwned\\u{7}"), "the key shows escaped:\n{screen}");
    assert!(!screen.contains('\u{202e}'), "U+202E reached the screen:\n{screen}");
    assert!(screen.contains("top keys (this instance)") && screen.contains("routes (this instance)"), "{screen}");
    let title = tmux.run(&["display-message", "-p", "-t", "top", "#{pane_title}"]);
    assert!(!title.contains("pwned"), "the key set the terminal's title: {title:?}");
    // With escapes kept (-e), only the view's own styling sequences: no OSC from the key.
    let styled = tmux.run(&["capture-pane", "-p", "-e", "-t", "top"]);
    assert!(!styled.contains("\u{1b}]"), "an OSC sequence on the screen:\n{styled:?}");
}

/// Issue 34 item 6 and issue 38 item 4: `+` in a path is `+`, a reset says whether the key held
/// state, bad percent-encoding is a 400, a foreign `Host` is refused without a token (the probes
/// stay open), and every answer forbids framing and sniffing.
#[test]
fn admin_paths_hosts_and_headers() {
    let up = Upstream::start();
    let w = revealing_proxy(&up, "");
    let admin_addr = admin::addr(&w);
    // Two keys a lenient decoder confuses: "k+y=" (base64) and "k y=".
    for k in ["k%2By%3D", "k+y%3D"] {
        assert_eq!(http::must_send(w.addr, &Request::get(&format!("/?k={k}"))).status, 200);
    }
    let state = |key: &str| admin::request(admin_addr, "GET", &format!("/limits?zone=per_k&key={key}"), None).json();
    assert!(!state("k%2By%3D")["state"].is_null() && !state("k+y%3D")["state"].is_null(), "both keys hold state");

    let r = admin::request(admin_addr, "DELETE", "/limits/per_k/k+y%3D", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!((r.json()["key"].as_str(), r.json()["existed"].as_bool()), (Some("k+y="), Some(true)), "{}", r.text());
    assert!(state("k%2By%3D")["state"].is_null(), "the key with + was reset");
    assert!(!state("k+y%3D")["state"].is_null(), "the key with a space was not");
    let again = admin::request(admin_addr, "DELETE", "/limits/per_k/k+y%3D", None);
    assert_eq!((again.status, again.json()["existed"].as_bool()), (200, Some(false)), "{}", again.text());

    for bad in ["/limits/per_k/k%zz", "/limits/per_k/k%2", "/limits/per%/k"] {
        let r = admin::request(admin_addr, "DELETE", bad, None);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
    }
    assert!(!state("k+y%3D")["state"].is_null(), "no bad request reset anything");

    // DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends its own name.
    let with_host = |target: &str, host: &str| http::must_send(admin_addr, &Request::get(target).header("Host", host));
    for target in ["/", "/top", "/limits?zone=per_k&key=a", "/metrics", "/config"] {
        for host in ["evil.example", &format!("evil.example:{}", admin_addr.port()), "127.0.0.1.nip.io"] {
            let r = with_host(target, host);
            assert_eq!(r.status, 403, "{target} with Host {host}: {}", r.summary());
        }
        for host in ["localhost", &format!("localhost:{}", admin_addr.port()), &admin_addr.to_string(), "[::1]:1"] {
            assert_eq!(with_host(target, host).status, 200, "{target} with Host {host}");
        }
    }
    // A page anywhere may send a blind cross-site POST (no preflight): a change needs a local Origin.
    let with_origin = |method: &str, target: &str, origin: &str| {
        http::must_send(admin_addr, &Request::new(method, target).header("Origin", origin))
    };
    for origin in ["http://evil.example", "null", &format!("http://evil.example:{}", admin_addr.port())] {
        assert_eq!(with_origin("POST", "/reload", origin).status, 403, "POST /reload from {origin}");
        assert_eq!(with_origin("DELETE", "/limits/per_k/k+y%3D", origin).status, 403, "DELETE from {origin}");
        assert_eq!(with_origin("GET", "/top", origin).status, 200, "a read (its answer is the browser's to withhold)");
    }
    assert!(!state("k+y%3D")["state"].is_null(), "no cross-site request reset anything");
    let page_origin = format!("http://{admin_addr}");
    assert_eq!(with_origin("POST", "/reload", &page_origin).status, 200, "from the status page itself");
    for probe in ["/healthz", "/readyz"] {
        assert_eq!(with_host(probe, "10.0.0.7:9901").status, 200, "{probe} stays open to any Host");
    }
    let r = admin::request(admin_addr, "DELETE", "/limits/per_k/k+y%3D", None);
    assert_eq!(r.status, 200, "a loopback Host may reset");

    // The page: no framing, no sniffing, its own script only.
    let page = with_host("/", "localhost");
    assert_eq!(page.header("x-frame-options").as_deref(), Some("DENY"));
    assert_eq!(page.header("x-content-type-options").as_deref(), Some("nosniff"));
    let csp = page.header("content-security-policy").expect("a CSP");
    for part in ["default-src 'none'", "frame-ancestors 'none'", "script-src 'sha256-", "connect-src 'self'"] {
        assert!(csp.contains(part), "{part} not in {csp}");
    }
    assert!(
        !csp.contains("unsafe-eval") && !csp.contains("script-src 'unsafe-inline'") && !csp.contains("http"),
        "{csp}"
    );
    let api = with_host("/top", "localhost");
    assert_eq!(api.header("x-content-type-options").as_deref(), Some("nosniff"));
    assert!(api.header("content-security-policy").is_some_and(|c| c.contains("frame-ancestors 'none'")));
}

/// With a token, the token guards the admin listener: any `Host` (a name in front of it) is fine.
#[test]
fn with_a_token_any_host_may_ask() {
    let up = Upstream::start();
    let token = "frontdoor-token-0123456789";
    let w = revealing_proxy(&up, &format!("admin_token = \"{token}\""));
    let r = http::must_send(
        admin::addr(&w),
        &Request::get("/top").header("Host", "weir-admin.internal").header("Authorization", &format!("Bearer {token}")),
    );
    assert_eq!(r.status, 200, "{}", r.summary());
    let r = http::must_send(admin::addr(&w), &Request::get("/top").header("Host", "weir-admin.internal"));
    assert_eq!(r.status, 401, "{}", r.summary());
}

/// `weir check -c FILE` with `env`; exit code and everything it printed.
fn check(path: &std::path::Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = Command::new(weir::bin())
        .args(["check", "-c"])
        .arg(path)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run weir check");
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

const MINIMAL: &str = "[server]\nlisten = [\"127.0.0.1:18080\"]\n\n[store]\nkind = \"memory\"\n";

/// Issue 34 item 7: a secret with quotes and backslashes is hidden in every form an error quotes
/// it in; secret files are bounded and their mode checked; durations have upper bounds; a
/// network-facing rls listener is a warning.
#[test]
fn config_secrets_bounds_and_warnings() {
    let dir = ConfigDir::new();
    // The environment's secret lands in a setting that wants a number: the parser's error quotes
    // the expanded line, with the secret TOML-escaped.
    let secret = "pa\"ss\\w0rd-7f3a9c";
    let conf = dir.write("env.toml", "[server]\nlisten = [\"127.0.0.1:18080\"]\nthreads = \"${WEIR_TEST_SECRET}\"\n");
    let (code, out) = check(&conf, &[("WEIR_TEST_SECRET", secret)]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("${WEIR_TEST_SECRET}"), "the error names the variable: {out}");
    assert!(!out.contains("7f3a9c"), "the secret shows: {out}");

    // The same secret from a file, in the Redis URL (percent-encoded) of an error.
    let pw = dir.write("redis.pw", &format!("{secret}\n"));
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let conf = dir.write(
        "pw.toml",
        &MINIMAL.replace(
            "kind = \"memory\"\n",
            &format!(
                "kind = \"redis\"\nurl = \"redis://127.0.0.1:notaport/0\"\npassword_file = \"{}\"\n",
                pw.display()
            ),
        ),
    );
    let (code, out) = check(&conf, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(!out.contains("7f3a9c") && !out.contains("w0rd"), "the secret shows: {out}");

    // A secret file over 64 KiB, one that never ends, one that blocks: refused, naming the file, at once.
    let big = dir.write("big.token", &"x".repeat(64 * 1024 + 1));
    let fifo = dir.path().join("token.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success(), "mkfifo");
    for (file, why) in [
        (big.display().to_string(), "more than 65536 bytes"),
        ("/dev/zero".to_string(), "not a regular file"),
        (fifo.display().to_string(), "not a regular file"),
    ] {
        let conf = dir.write(
            "big.toml",
            &MINIMAL
                .replace("[store]", &format!("admin = \"127.0.0.1:18081\"\nadmin_token_file = \"{file}\"\n\n[store]")),
        );
        let started = std::time::Instant::now();
        let (code, out) = check(&conf, &[]);
        assert_eq!(code, Some(1), "{out}");
        assert!(out.contains(&file) && out.contains(why), "{out}");
        assert!(started.elapsed() < Duration::from_secs(10), "read without a bound");
    }

    // A token file every user may read: a warning, gone once it is 0600.
    let token = dir.write("admin.token", "a-token-of-enough-length-01234\n");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let conf = dir.write(
        "token.toml",
        &MINIMAL.replace(
            "[store]",
            &format!("admin = \"127.0.0.1:18081\"\nadmin_token_file = \"{}\"\n\n[store]", token.display()),
        ),
    );
    let (code, out) = check(&conf, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("warning") && out.contains("readable by every user") && out.contains("admin.token"), "{out}");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let (code, out) = check(&conf, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("readable by every user"), "{out}");

    // An HMAC key file anyone may read lets anyone sign tokens: a warning too.
    let hmac = dir.write("hmac.key", "an-hmac-secret-of-some-length-0123\n");
    std::fs::set_permissions(&hmac, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let conf =
        dir.write("jwt.toml", &format!("{MINIMAL}\n[jwt]\nkey_file = \"{}\"\nalgorithm = \"HS256\"\n", hmac.display()));
    let (code, out) = check(&conf, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("jwt.key_file") && out.contains("readable by every user"), "{out}");

    // tracing.timeout had no upper bound.
    let conf = dir.write(
        "trace.toml",
        &format!("{MINIMAL}\n[tracing]\nendpoint = \"http://127.0.0.1:4318/v1/traces\"\ntimeout = \"10h\"\n"),
    );
    let (code, out) = check(&conf, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("tracing.timeout") && out.contains("60s"), "{out}");

    // The rate limit service on a network address: a warning saying what to put in front.
    let rls = |listen: &str| {
        format!(
            "[store]\nkind = \"memory\"\n\n[[limit_req_zone]]\nname = \"z\"\nrate = \"1r/s\"\n\n[rls]\nlisten = [\"{listen}\"]\n\n\
             [[rls.domain]]\nname = \"d\"\n\n[[rls.domain.descriptor]]\nkey = \"k\"\nzone = \"z\"\n"
        )
    };
    let (code, out) = check(&dir.write("rls-open.toml", &rls("0.0.0.0:18082")), &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("warning") && out.contains("rls.listen") && out.contains("no authentication"), "{out}");
    assert!(out.contains("client certificates"), "says what to put in front: {out}");
    let (code, out) = check(&dir.write("rls-local.toml", &rls("127.0.0.1:18082")), &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("warning"), "{out}");
}
