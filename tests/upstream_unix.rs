//! Upstreams on unix sockets (`servers = ["unix:/path/to.sock"]`, nginx's
//! `proxy_pass http://unix:/path:`): the real binary proxies to a real upstream listening on a
//! unix socket, keeps the limits in front of it, and shows the server as `unix:/path`;
//! `weir check` refuses a relative path and notes (without failing) a socket that is not there
//! yet, since the app may start after Weir.

use crate::support;

use std::time::Duration;

use support::admin;
use support::http::{self, Request};
use support::upstream::UnixUpstream;
use support::weir::{self, Weir};

/// The config `weir check` reads: the placeholders replaced by fixed addresses.
fn checked(socket: &str) -> String {
    config(socket).replace("$LISTEN2", "127.0.0.1:9091").replace("$LISTEN", "127.0.0.1:8080")
}

fn config(socket: &str) -> String {
    format!(
        r#"[server]
listen = ["$LISTEN"]
{admin}

[store]
kind = "memory"

[[upstream]]
name = "app"
servers = ["unix:{socket}"]

[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
limit_req = [ {{ zone = "per_ip", burst = 2, nodelay = true }} ]
"#,
        admin = admin::LISTEN
    )
}

#[test]
fn requests_reach_an_upstream_on_a_unix_socket_and_limits_still_apply() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("app.sock");
    let up = UnixUpstream::start(&socket);
    let w = Weir::start(&config(&socket.display().to_string()));
    for i in 0..3 {
        let r = http::must_send(w.addr, &Request::get(&format!("/hello/{i}")));
        assert_eq!(r.status, 200, "{}", r.summary());
        assert_eq!(r.header("X-Upstream").as_deref(), Some("unix"), "{}", r.summary());
        assert_eq!(r.text(), format!("/hello/{i}"));
    }
    // POST with a body goes through the same socket.
    let r = http::must_send(w.addr, &Request::new("POST", "/form").body(b"a=1"));
    assert_eq!(r.status, 429, "burst 2 + 1: the fourth is limited: {}", r.summary());
    assert_eq!(up.hits(), 3);
    let status = admin::request(admin::addr(&w), "GET", "/upstreams", None);
    assert!(status.text().contains(&format!("unix:{}", socket.display())), "{}", status.text());
}

#[test]
fn check_refuses_a_relative_socket_path_and_notes_a_missing_socket() {
    let out = weir::check_config("rel.toml", &checked("run/app.sock"), Duration::from_secs(30));
    assert!(out.code != Some(0), "{}", out.describe());
    assert!(out.stderr.contains("must be absolute"), "{}", out.describe());

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("later.sock");
    let out = weir::check_config("missing.toml", &checked(&missing.display().to_string()), Duration::from_secs(30));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(all.contains("is not a unix socket now") && all.contains("later.sock"), "{}", out.describe());

    // Once the socket is there, the note is gone.
    let _up = UnixUpstream::start(&missing);
    let out = weir::check_config("there.toml", &checked(&missing.display().to_string()), Duration::from_secs(30));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(!format!("{}{}", out.stdout, out.stderr).contains("is not a unix socket"), "{}", out.describe());
}

/// The active TCP check connects to the socket: a server whose socket goes away is marked down,
/// and requests get 502 instead of waiting on it.
#[test]
fn the_active_check_connects_to_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("checked.sock");
    let up = UnixUpstream::start(&socket);
    let text = config(&socket.display().to_string()).replace(
        "[[limit_req_zone]]",
        "[upstream.health_check]\ntype = \"tcp\"\ninterval = \"100ms\"\ntimeout = \"200ms\"\nrise = 1\nfall = 1\n\n[[limit_req_zone]]",
    );
    let w = Weir::start(&text);
    let healthy = |w: &Weir| {
        let r = admin::request(admin::addr(w), "GET", "/upstreams", None);
        r.text().contains("\"healthy\":true")
    };
    assert!(
        support::poll::wait_until(Duration::from_secs(10), Duration::from_millis(50), || healthy(&w)).is_some(),
        "the socket's server never came up"
    );
    assert_eq!(http::get(w.addr, "/up").status, 200);
    drop(up);
    assert!(
        support::poll::wait_until(Duration::from_secs(10), Duration::from_millis(50), || !healthy(&w)).is_some(),
        "a removed socket was never marked down"
    );
    assert_eq!(http::get(w.addr, "/down").status, 502);
}
