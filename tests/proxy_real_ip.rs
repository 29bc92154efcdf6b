//! Real client IP (nginx set_real_ip_from + real_ip_header + real_ip_recursive on) as the
//! limit key, end to end. The TCP peer is always 127.0.0.1 here.

use crate::support;

use support::config::memory_with_app;
use support::http;
use support::upstream::Upstream;
use support::weir::Weir;

/// One route "/api/" limited by key "ip" at 1r/m, burst 0, nodelay; `real_ip` is pasted in.
fn config(up: &Upstream, real_ip: &str) -> String {
    memory_with_app(
        up.addr(),
        &format!(
            r#"{real_ip}

[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ {{ zone = "per_ip", burst = 0, nodelay = true }} ]
"#
        ),
    )
}

/// Status of `GET /api/ip` with the given X-Forwarded-For (None: no header).
fn xff(w: &Weir, v: Option<&str>) -> u16 {
    match v {
        Some(v) => http::get_with(w.addr, "/api/ip", &[("X-Forwarded-For", v)]).status,
        None => http::get(w.addr, "/api/ip").status,
    }
}

#[test]
fn trusted_peer_keys_on_forwarded_address_v4_and_v6() {
    let up = Upstream::start();
    let w = Weir::start(&config(
        &up,
        r#"[real_ip]
trusted = ["127.0.0.1/32"]
header = "X-Forwarded-For""#,
    ));
    assert_eq!(xff(&w, Some("198.51.100.1")), 200);
    assert_eq!(xff(&w, Some("198.51.100.1")), 429, "same client, same bucket");
    assert_eq!(xff(&w, Some("198.51.100.2")), 200, "other client, own bucket");
    assert_eq!(xff(&w, Some("2001:db8::1")), 200, "IPv6 client, own bucket");
    assert_eq!(xff(&w, Some("2001:db8::1")), 429);
    assert_eq!(xff(&w, Some("2001:db8::2")), 200);
    // Without the header, the (trusted) peer itself is the client.
    assert_eq!(xff(&w, None), 200, "peer 127.0.0.1 has its own bucket");
    assert_eq!(xff(&w, None), 429);
    assert_eq!(xff(&w, Some("198.51.100.2")), 429, "198.51.100.2 still limited");
    assert_eq!(up.hits(), 5);
}

#[test]
fn untrusted_peer_forwarded_header_is_ignored() {
    let up = Upstream::start();
    let w = Weir::start(&config(
        &up,
        r#"[real_ip]
trusted = ["10.0.0.0/8"]
header = "X-Forwarded-For""#,
    ));
    assert_eq!(xff(&w, Some("198.51.100.1")), 200);
    assert_eq!(
        xff(&w, Some("198.51.100.2")),
        429,
        "peer 127.0.0.1 is not trusted: XFF ignored, one bucket for the peer"
    );
    assert_eq!(xff(&w, Some("2001:db8::9")), 429);
    assert_eq!(xff(&w, None), 429);
    assert_eq!(up.hits(), 1);
}

#[test]
fn no_real_ip_section_keys_on_peer() {
    let up = Upstream::start();
    let w = Weir::start(&config(&up, ""));
    assert_eq!(xff(&w, Some("198.51.100.1")), 200);
    assert_eq!(xff(&w, Some("198.51.100.2")), 429, "XFF is ignored without [real_ip]");
    assert_eq!(up.hits(), 1);
}

#[test]
fn recursive_walk_skips_trusted_hops_right_to_left() {
    let up = Upstream::start();
    let w = Weir::start(&config(
        &up,
        r#"[real_ip]
trusted = ["10.0.0.0/8", "127.0.0.1/32"]
header = "X-Forwarded-For""#,
    ));
    assert_eq!(xff(&w, Some("203.0.113.9, 10.1.2.3")), 200);
    assert_eq!(xff(&w, Some("203.0.113.9")), 429, "\"203.0.113.9, 10.1.2.3\" keyed on 203.0.113.9");
    assert_eq!(
        xff(&w, Some("192.0.2.7, 203.0.113.9, 10.9.9.9, 10.1.1.1")),
        429,
        "rightmost untrusted address is 203.0.113.9; spoofed left entries do not matter"
    );
    assert_eq!(xff(&w, Some("203.0.113.10,10.1.2.3")), 200, "no space after comma");
    assert_eq!(
        xff(&w, Some("203.0.113.9, 198.51.100.77")),
        200,
        "198.51.100.77 is untrusted: it is the client, not 203.0.113.9"
    );
    assert_eq!(up.hits(), 3);
}

#[test]
fn custom_real_ip_header() {
    let up = Upstream::start();
    let w = Weir::start(&config(
        &up,
        r#"[real_ip]
trusted = ["127.0.0.1/32"]
header = "X-Real-IP""#,
    ));
    let real = |v: &str| http::get_with(w.addr, "/api/ip", &[("X-Real-IP", v)]).status;
    assert_eq!(real("198.51.100.5"), 200);
    assert_eq!(real("198.51.100.5"), 429);
    assert_eq!(real("198.51.100.6"), 200);
    // X-Forwarded-For is not the configured header: both key on the peer.
    assert_eq!(xff(&w, Some("198.51.100.7")), 200);
    assert_eq!(xff(&w, Some("198.51.100.8")), 429);
}
