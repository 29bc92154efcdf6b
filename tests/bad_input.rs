//! Malformed and hostile requests: weir must answer (or close), stay alive, keep serving, and
//! never let odd key values skip the limit.

use crate::support;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use support::config::memory_with_app;
use support::http::{self, Conn, Request};
use support::upstream::Upstream;
use support::weir::Weir;

/// A weir trusting 127.0.0.1's X-Forwarded-For, with zones keyed on a header, the IP, a query
/// parameter and a cookie (burst 0 except on the IP).
fn start(up: &Upstream) -> Weir {
    Weir::start(&memory_with_app(
        up.addr(),
        r#"[real_ip]
trusted = ["127.0.0.1/32"]
header = "X-Forwarded-For"

[[limit_req_zone]]
name = "by_key"
key = "header:X-Api-Key"
rate = "1r/m"

[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[limit_req_zone]]
name = "by_query"
key = "query:token"
rate = "1r/m"

[[limit_req_zone]]
name = "by_cookie"
key = "cookie:sid"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "by_key", burst = 0, nodelay = true } ]

[[route]]
name = "ip"
path_prefix = "/ip/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 1000, nodelay = true } ]

[[route]]
name = "q"
path_prefix = "/q/"
upstream = "app"
limit_req = [ { zone = "by_query", burst = 0, nodelay = true } ]

[[route]]
name = "c"
path_prefix = "/c/"
upstream = "app"
limit_req = [ { zone = "by_cookie", burst = 0, nodelay = true } ]

[[route]]
name = "free"
path_prefix = "/free/"
upstream = "app"
"#,
    ))
}

/// What the server did with a raw request.
#[derive(Debug)]
#[allow(dead_code)]
enum Outcome {
    Status(u16),
    Closed,
    /// No answer within the probe timeout (connection left open).
    Silent,
    /// The response could not be parsed.
    Garbled(String),
}

fn probe(addr: SocketAddr, bytes: &[u8]) -> Outcome {
    let mut c = match Conn::connect_timeout(addr, Duration::from_secs(5)) {
        Ok(c) => c,
        Err(e) => panic!("connect to weir failed: {e}"),
    };
    // The server may close while we are still writing (e.g. a huge head): that is fine.
    let _ = c.send_raw(bytes);
    match c.read_response(false) {
        Ok(Some(r)) => Outcome::Status(r.status),
        Ok(None) => Outcome::Closed,
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Outcome::Silent,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::UnexpectedEof
            ) =>
        {
            Outcome::Closed
        }
        Err(e) => Outcome::Garbled(e.to_string()),
    }
}

/// Weir still runs and still proxies a normal request.
fn assert_healthy(w: &mut Weir, after: &str) {
    w.assert_alive(&format!("after {after}"));
    let r = http::get(w.addr, "/free/health");
    assert_eq!(r.status, 200, "normal request after {after}: {}", r.summary());
    assert_eq!(r.text(), "/free/health");
    w.assert_alive(&format!("after {after}"));
}

/// A malformed request is refused with a 4xx (or 505), or the connection is closed; it is
/// never proxied and never answered 2xx/5xx.
fn assert_refused(w: &mut Weir, up: &Upstream, what: &str, bytes: &[u8]) {
    let before = up.hits();
    let o = probe(w.addr, bytes);
    match o {
        Outcome::Status(s) if (400..500).contains(&s) || s == 505 => {}
        Outcome::Closed | Outcome::Silent => {}
        other => panic!("{what}: expected 4xx or close, got {other:?}"),
    }
    assert_eq!(up.hits(), before, "{what} must not reach the upstream");
    assert_healthy(w, what);
}

#[test]
fn malformed_requests_are_refused_and_weir_survives() {
    let up = Upstream::start();
    let mut w = start(&up);
    assert_healthy(&mut w, "start");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage request line", b"GARBAGE\r\n\r\n".to_vec()),
        ("binary request line", b"\x00\x01\x02\xff / HTTP/1.1\r\n\r\n".to_vec()),
        ("request line without target", b"GET\r\nHost: a\r\n\r\n".to_vec()),
        ("header without colon", b"GET /api/x HTTP/1.1\r\nHost: a\r\nNoColonHere\r\n\r\n".to_vec()),
        ("space before colon", b"GET /api/x HTTP/1.1\r\nHost: a\r\nX-Api-Key : v\r\n\r\n".to_vec()),
        ("invalid header name", b"GET /api/x HTTP/1.1\r\nHost: a\r\nX-Ap{i}: v\r\n\r\n".to_vec()),
        ("bad content-length", b"POST /free/x HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n".to_vec()),
        (
            "conflicting content-lengths",
            b"POST /free/x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde".to_vec(),
        ),
        ("bare LF garbage", b"\n\n\n\n\x7f\x7f\n\n".to_vec()),
    ];
    for (what, bytes) in &cases {
        assert_refused(&mut w, &up, what, bytes);
    }

    // A head far over any sane limit (2 MiB header value).
    let mut huge = b"GET /free/huge HTTP/1.1\r\nHost: a\r\nX-Big: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 2 << 20));
    huge.extend_from_slice(b"\r\n\r\n");
    assert_refused(&mut w, &up, "2 MiB header", &huge);

    // Too many headers.
    let mut many = b"GET /free/many HTTP/1.1\r\nHost: a\r\n".to_vec();
    for i in 0..2000 {
        many.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert_refused(&mut w, &up, "2000 headers", &many);

    // Half a request, then the client goes away.
    {
        let mut c = Conn::connect(w.addr).unwrap();
        c.send_raw(b"GET /free/x HTTP/1.1\r\nHost: a\r\nX-Api-").unwrap();
    }
    assert_healthy(&mut w, "truncated request");
}

#[test]
fn invalid_utf8_key_is_limited_not_skipped() {
    let up = Upstream::start();
    let mut w = start(&up);
    let send = |v: &[u8]| http::must_send(w.addr, &Request::get("/api/u").raw_header(b"X-Api-Key", v));
    // Keys are bytes: an invalid-UTF-8 key is a key like any other.
    let a = send(b"\xff\xfe\x80abc");
    assert_eq!(a.status, 200, "invalid UTF-8 key, first request: {}", a.summary());
    let b = send(b"\xff\xfe\x80abc");
    assert_eq!(b.status, 429, "same invalid-UTF-8 key twice with burst 0: second must be limited, got {}", b.summary());
    assert_healthy(&mut w, "invalid UTF-8 key");
}

#[test]
fn distinct_invalid_utf8_keys_are_distinct_buckets() {
    let up = Upstream::start();
    let w = start(&up);
    let send = |v: &[u8]| http::must_send(w.addr, &Request::get("/api/u").raw_header(b"X-Api-Key", v)).status;
    assert_eq!(send(b"user-\xff"), 200, "an invalid-UTF-8 key is limited like any key");
    // A lossy conversion would map both to "user-\u{FFFD}" and let one client starve the other.
    assert_eq!(send(b"user-\xfe"), 200, "\\xfe and \\xff must not share a bucket");
    assert_eq!(send(b"user-\xef\xbf\xbd"), 200, "\\xff must not share a bucket with U+FFFD");
    assert_eq!(send(b"user-\xff"), 429, "and each is its own bucket");
}

#[test]
fn huge_header_value_key_is_limited_not_skipped() {
    let up = Upstream::start();
    let mut w = start(&up);
    let big = "k".repeat(60 * 1024);
    let send = |v: &str| http::get_with(w.addr, "/api/big", &[("X-Api-Key", v)]);
    let a = send(&big);
    assert_eq!(a.status, 200, "60 KiB key, first request: {}", a.summary());
    let b = send(&big);
    assert_eq!(b.status, 429, "60 KiB key, second request with burst 0 must be limited: {}", b.summary());
    assert_eq!(up.hits(), 1);
    // Upstream got the full value.
    let seen = up.seen();
    assert_eq!(seen[0].header("x-api-key").map(|v| v.len()), Some(60 * 1024));
    assert_healthy(&mut w, "60 KiB key");
}

#[test]
fn huge_keys_differing_only_at_the_end_are_distinct() {
    let up = Upstream::start();
    let w = start(&up);
    let send = |v: &str| http::get_with(w.addr, "/api/big", &[("X-Api-Key", v)]).status;
    let base = "k".repeat(60 * 1024);
    assert_eq!(send(&format!("{base}1")), 200);
    assert_eq!(send(&format!("{base}1")), 429);
    assert_eq!(
        send(&format!("{base}2")),
        200,
        "keys differing in their last byte must not share a bucket (no truncation)"
    );
}

#[test]
fn keys_with_braces_and_separators() {
    let up = Upstream::start();
    let mut w = start(&up);
    let send = |v: &str| http::get_with(w.addr, "/api/b", &[("X-Api-Key", v)]).status;
    for k in ["{abc}", "{", "}", "}{", "{}", "a:b", "a|b", "weir:by_key:x", "\"q\"", "%7B%7D"] {
        assert_eq!(send(k), 200, "first request with key {k:?}");
        assert_eq!(send(k), 429, "second request with key {k:?} is limited");
    }
    assert_eq!(send("{abc}x"), 200, "\"{{abc}}x\" is not \"{{abc}}\"");
    assert_eq!(send("x{abc}"), 200, "\"x{{abc}}\" is not \"{{abc}}\"");
    assert_healthy(&mut w, "brace keys");
}

#[test]
fn empty_key_is_not_limited() {
    let up = Upstream::start();
    let mut w = start(&up);
    for i in 0..6 {
        let r = http::must_send(w.addr, &Request::get("/api/e").raw_header(b"X-Api-Key", b""));
        assert_eq!(r.status, 200, "empty header value, request {i}: {}", r.summary());
    }
    for i in 0..3 {
        let raw = b"GET /api/e HTTP/1.1\r\nHost: a\r\nX-Api-Key:\r\n\r\n";
        let r = http::send_raw(w.addr, raw).unwrap().expect("a response");
        assert_eq!(r.status, 200, "header with no value at all, request {i}: {}", r.summary());
    }
    assert_healthy(&mut w, "empty keys");
}

#[test]
fn odd_query_and_cookie_keys_are_limited() {
    let up = Upstream::start();
    let mut w = start(&up);
    for q in ["/q/?token=%ff%fe", "/q/?token=%7Bx%7D", "/q/?a=1&token=t%00t&b=2", "/q/?token="] {
        let first = http::get(w.addr, q).status;
        if q.ends_with("token=") {
            // Empty value: not limited.
            assert_eq!(first, 200, "{q}");
            assert_eq!(http::get(w.addr, q).status, 200, "{q}: empty key is not limited");
        } else {
            assert_eq!(first, 200, "{q}");
            assert_eq!(http::get(w.addr, q).status, 429, "{q}: same key limited");
        }
    }
    let c = |v: &str| http::get_with(w.addr, "/c/x", &[("Cookie", v)]).status;
    assert_eq!(c("a=1; sid={s}; b=2"), 200);
    assert_eq!(c("sid={s}"), 429, "same sid cookie");
    assert_eq!(c("sid=\"quoted\""), 200);
    assert_eq!(c("sid=\"quoted\""), 429);
    assert_eq!(c("nosid=1; sidx=2"), 200, "no sid cookie: not limited");
    assert_eq!(c("nosid=1; sidx=2"), 200, "no sid cookie: not limited");
    assert_healthy(&mut w, "query/cookie keys");
}

#[test]
fn garbage_forwarded_for_values() {
    let up = Upstream::start();
    let mut w = start(&up);
    let values: Vec<String> = vec![
        "not-an-ip".into(),
        "1.2.3.4.5".into(),
        "999.1.1.1".into(),
        "[::1]:80".into(),
        "1.2.3.4:5678".into(),
        ",,,".into(),
        " , ".into(),
        "unknown, 10.0.0.1".into(),
        "2001:db8::1%eth0".into(),
        "{}".into(),
        std::iter::repeat_n("10.0.0.1", 3000).collect::<Vec<_>>().join(", "),
    ];
    for v in &values {
        let r = http::get_with(w.addr, "/ip/x", &[("X-Forwarded-For", v)]);
        assert!(
            r.status == 200 || r.status == 429 || r.status == 400,
            "XFF {:?}: {}",
            &v[..v.len().min(60)],
            r.summary()
        );
        w.assert_alive(&format!("XFF {:?}", &v[..v.len().min(60)]));
    }
    let r = http::must_send(w.addr, &Request::get("/ip/x").raw_header(b"X-Forwarded-For", b"\xff\xfe, 1.2.3.4"));
    assert!(r.status == 200 || r.status == 429 || r.status == 400, "{}", r.summary());
    assert_healthy(&mut w, "garbage XFF");
}
