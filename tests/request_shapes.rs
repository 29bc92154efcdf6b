//! Issue 22, rows 2-7: request shapes an upstream reads as a limited host, path, method or key
//! while Weir did not. The rule: Weir decides on what the upstream will understand and forwards
//! exactly what it decided on; anything ambiguous is normalised (and forwarded normalised) or
//! refused with 400. Each test sends the shape to the real binary and reads what the upstream
//! received (`Upstream::seen`), since "forwarded as sent" was the defect.

use crate::support;

use std::net::SocketAddr;

use support::config::memory_with_app;
use support::http::{self, Request};
use support::upstream::Upstream;
use support::weir::Weir;

/// One request a minute per client on a host, a path, a method and a key; nothing elsewhere.
fn limited(up: SocketAddr, server_extra: &str) -> String {
    let config = memory_with_app(
        up,
        r#"
[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[limit_req_zone]]
name = "per_key"
key = "header:X-Api-Key"
rate = "1r/m"

[[route]]
name = "api_host"
host = "api.example.com"
path_prefix = "/"
upstream = "app"
limit_req = [ { zone = "per_ip", nodelay = true } ]

[[route]]
name = "login"
path = "/login"
upstream = "app"
limit_req = [ { zone = "per_ip", nodelay = true } ]

[[route]]
name = "put_items"
path = "/items"
methods = ["PUT"]
upstream = "app"
limit_req = [ { zone = "per_ip", nodelay = true } ]

[[route]]
name = "keyed"
path = "/keyed"
upstream = "app"
limit_req = [ { zone = "per_key", nodelay = true } ]

[[route]]
name = "default"
path_prefix = "/"
upstream = "app"
"#,
    );
    // `[server]` extras go right after the `[server]` table header the helper writes.
    config.replacen("[server]\n", &format!("[server]\n{server_extra}\n"), 1)
}

fn raw(w: &Weir, bytes: &str) -> http::Response {
    http::send_raw(w.addr, bytes.as_bytes()).expect("an answer").expect("a response, not a silent close")
}

#[test]
fn a_host_with_extra_port_parts_is_refused_and_a_spelled_host_counts_as_the_host() {
    let up = Upstream::start();
    let w = Weir::start(&limited(up.addr(), ""));
    assert_eq!(raw(&w, "GET /a HTTP/1.1\r\nHost: api.example.com\r\n\r\n").status, 200);
    // nginx reads the host up to the first ':' and serves this as api.example.com.
    for bad in ["api.example.com:1:1", "api.example.com:x", "api..example.com", "api.example.com/x", ":80"] {
        let r = raw(&w, &format!("GET /a HTTP/1.1\r\nHost: {bad}\r\n\r\n"));
        assert_eq!(r.status, 400, "Host: {bad}: {}", r.summary());
    }
    // Case, a trailing dot and a port: the same host, limited, and forwarded in the decided form.
    for same in ["API.Example.COM", "api.example.com.", "api.example.com:8080", "API.example.com.:80"] {
        let r = raw(&w, &format!("GET /a HTTP/1.1\r\nHost: {same}\r\n\r\n"));
        assert_eq!(r.status, 429, "Host: {same}: {}", r.summary());
    }
    assert_eq!(up.hits(), 1);
    assert_eq!(raw(&w, "GET /b HTTP/1.1\r\nHost: API.Other.Example.:81\r\n\r\n").status, 200);
    assert_eq!(up.seen()[1].header("host").as_deref(), Some("api.other.example:81"));
}

#[test]
fn an_absolute_form_target_names_the_host_and_is_forwarded_in_origin_form() {
    let up = Upstream::start();
    let w = Weir::start(&limited(up.addr(), ""));
    let r = raw(&w, "GET http://api.example.com/x?q=1 HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 200, "{}", r.summary());
    let seen = up.seen();
    assert_eq!(seen[0].path, "/x?q=1", "origin form upstream");
    assert_eq!(seen[0].header("host").as_deref(), Some("api.example.com"));
    let r = raw(&w, "GET http://API.EXAMPLE.COM./z HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 429, "{}", r.summary());
    let r = raw(&w, "GET http://api.example.com/z HTTP/1.1\r\nHost: api.example.com\r\n\r\n");
    assert_eq!(r.status, 429, "{}", r.summary());
    // A Host header naming another host than the target: nginx takes the target's, Pingora
    // refuses the pair; either way no upstream reads the other one.
    for (target, host) in [("http://api.example.com/y", "elsewhere.test"), ("http://other.test/w", "api.example.com")] {
        let r = raw(&w, &format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n"));
        assert_eq!(r.status, 400, "{target} with Host {host}: {}", r.summary());
    }
    assert_eq!(up.hits(), 1);
}

#[test]
fn a_target_without_a_leading_slash_or_with_a_backslash_is_refused() {
    let up = Upstream::start();
    let w = Weir::start(&limited(up.addr(), ""));
    assert_eq!(http::get(w.addr, "/login").status, 200);
    for target in ["login", "%2flogin", "%2Flogin", "./login", "/x\\..\\login", "/login\\", "\\login"] {
        let r = raw(&w, &format!("GET {target} HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert_eq!(r.status, 400, "{target}: {}", r.summary());
    }
    assert_eq!(up.hits(), 1, "nothing but the first /login was forwarded");
    // With encoded slashes kept, a raw backslash is forwarded as the escape an upstream keeps.
    let up = Upstream::start();
    let w = Weir::start(&limited(up.addr(), "encoded_slashes = \"keep\""));
    let r = raw(&w, "GET /x\\..\\login HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(r.status, 200, "{}", r.summary());
    assert_eq!(up.seen()[0].path, "/x%5C..%5Clogin");
}

#[test]
fn header_names_with_underscores_are_dropped_or_refused() {
    let up = Upstream::start();
    let w = Weir::start(&limited(up.addr(), ""));
    assert_eq!(http::get_with(w.addr, "/keyed", &[("X-Api-Key", "k1")]).status, 200);
    assert_eq!(http::get_with(w.addr, "/keyed", &[("X-Api-Key", "k1")]).status, 429);
    // Werkzeug reads X_Api_Key as X-Api-Key: like nginx (underscores_in_headers off), the header
    // never reaches the upstream, so it cannot authenticate k1 there.
    let r = http::get_with(w.addr, "/keyed", &[("X_Api_Key", "k1"), ("X-Other_Thing", "v")]);
    assert_eq!(r.status, 200, "{}", r.summary());
    let seen = up.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen[1].headers.iter().all(|(n, _)| !n.contains('_')), "{:?}", seen[1].headers);
    let up = Upstream::start();
    let w = Weir::start(&limited(up.addr(), "underscores_in_headers = \"reject\""));
    let r = http::get_with(w.addr, "/keyed", &[("X_Api_Key", "k1")]);
    assert_eq!(r.status, 400, "{}", r.summary());
    assert!(r.text().contains("underscore"), "{}", r.text());
    assert_eq!(up.hits(), 0);
}

#[test]
fn methods_are_case_sensitive_and_overrides_never_pass_unseen() {
    let up = Upstream::start();
    let w = Weir::start(&limited(up.addr(), ""));
    assert_eq!(http::send(w.addr, &Request::new("PUT", "/items")).unwrap().status, 200);
    assert_eq!(http::send(w.addr, &Request::new("PUT", "/items")).unwrap().status, 429);
    // nginx refuses a method that is not upper case; Flask would serve `put` as PUT.
    for method in ["put", "Put", "P-UT1"] {
        let r = http::send(w.addr, &Request::new(method, "/items")).unwrap();
        assert_eq!(r.status, 400, "{method}: {}", r.summary());
    }
    // Default `strip`: the upstream sees the POST that was decided on, without the override.
    let override_put = || Request::new("POST", "/items").header("X-HTTP-Method-Override", "PUT").body(b"x");
    let r = http::send(w.addr, &override_put()).unwrap();
    assert_eq!(r.status, 200, "{}", r.summary());
    let seen = up.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].method, "POST");
    assert_eq!(seen[1].header("x-http-method-override"), None);
    for name in ["X-HTTP-Method", "X-Method-Override"] {
        let r = http::send(w.addr, &Request::new("POST", "/items").header(name, "put").body(b"x")).unwrap();
        assert_eq!(r.status, 200, "{}", r.summary());
        assert_eq!(up.seen().last().and_then(|s| s.header(name)), None, "{name}");
    }

    // `honour`: routed and limited as the method the upstream will run, and forwarded with it.
    let up = Upstream::start();
    let w = Weir::start(&limited(up.addr(), "method_override = \"honour\""));
    assert_eq!(http::send(w.addr, &Request::new("PUT", "/items")).unwrap().status, 200);
    let r = http::send(w.addr, &override_put()).unwrap();
    assert_eq!(r.status, 429, "{}", r.summary());
    let lower = Request::new("POST", "/items").header("X-HTTP-Method-Override", "put").body(b"x");
    assert_eq!(http::send(w.addr, &lower).unwrap().status, 429, "Express upper-cases the override");
    // Only a POST is overridden (Express's and Rack's rule): a GET with the header is a GET.
    let get = Request::new("GET", "/items").header("X-HTTP-Method-Override", "PUT");
    assert_eq!(http::send(w.addr, &get).unwrap().status, 200);

    // `reject`: a 400 for any request that carries one.
    let up = Upstream::start();
    let w = Weir::start(&limited(up.addr(), "method_override = \"reject\""));
    assert_eq!(http::send(w.addr, &override_put()).unwrap().status, 400);
    assert_eq!(up.hits(), 0);
}
