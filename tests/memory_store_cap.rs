//! The memory store's zones are bounded (`max_keys`), like nginx's zone size: a flood of distinct
//! keys leaves the key count at the cap, counts its evictions, never crashes Weir, and never gives
//! a key that is being limited its burst back. A zone full of keys that are being rejected refuses
//! new keys with the route's status and counts it. Real weir, real upstream, loopback.

use crate::support;

use std::time::Duration;

use support::admin;
use support::config::with_app;
use support::http::{KeepAlive, Request};
use support::metrics::{scrape, scrape_until};
use support::upstream::Upstream;
use support::weir::Weir;

const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Metrics are updated before the response is written; allow for the scrape's own latency.
const SETTLE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(25);

fn start(up: &Upstream, zones_and_routes: &str) -> Weir {
    Weir::start(&with_app(admin::LISTEN, "[store]\nkind = \"memory\"", up.addr(), zones_and_routes))
}

fn keyed(path: &str, key: &str) -> Request {
    Request::get(path).header("X-Key", key)
}

#[test]
fn a_flood_of_new_keys_stays_within_max_keys_and_a_limited_key_stays_limited() {
    const MAX_KEYS: usize = 200;
    const FLOOD: usize = 2_000;
    let up = Upstream::start();
    let mut weir = start(
        &up,
        &format!(
            r#"
[[limit_req_zone]]
name = "per_key"
key = "header:X-Key"
rate = "1r/m"
max_keys = {MAX_KEYS}

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
limit_req = [ {{ zone = "per_key", burst = 2, nodelay = true }} ]
"#
        ),
    );
    let mut client = KeepAlive::new(weir.addr, IO_TIMEOUT);
    let mut send = |req: &Request| client.send(req).unwrap_or_else(|e| panic!("{} failed: {e}", req.target)).status;
    // The victim uses its burst (1 + 2) and is limited for a minute.
    let victim: Vec<u16> = (0..4).map(|_| send(&keyed("/v", "victim"))).collect();
    assert_eq!(victim, [200, 200, 200, 429]);

    // An attacker floods distinct keys; the victim keeps trying in between.
    let mut flood_statuses = std::collections::BTreeMap::new();
    for i in 0..FLOOD {
        *flood_statuses.entry(send(&keyed("/f", &format!("attacker-{i}")))).or_insert(0) += 1;
        if i % 100 == 99 {
            assert_eq!(send(&keyed("/v", "victim")), 429, "after {} flood keys the victim got its burst back", i + 1);
        }
    }
    assert_eq!(flood_statuses.get(&200), Some(&FLOOD), "each new key finds room: {flood_statuses:?}");
    weir.assert_alive("after the flood");
    assert_eq!(send(&keyed("/v", "victim")), 429, "the victim is still limited");

    let admin = admin::addr(&weir);
    let labels = [("zone", "per_key")];
    let s = scrape_until(admin, SETTLE, POLL, |s| {
        s.value_or_zero("weir_memory_evictions_total", &[("zone", "per_key"), ("reason", "live")]) > 0.0
    })
    .unwrap_or_else(|s| panic!("no evictions counted:\n{}", s.filtered()));
    let keys = s.must("weir_memory_keys", &labels);
    assert!(keys <= MAX_KEYS as f64 && keys >= (MAX_KEYS / 2) as f64, "keys held {keys}, cap {MAX_KEYS}");
    assert_eq!(s.must("weir_memory_max_keys", &labels), MAX_KEYS as f64);
    let evicted = s.value_or_zero("weir_memory_evictions_total", &[("zone", "per_key"), ("reason", "live")])
        + s.value_or_zero("weir_memory_evictions_total", &[("zone", "per_key"), ("reason", "expired")]);
    // 1 victim + FLOOD keys went in; at most MAX_KEYS are held.
    assert!(evicted >= (FLOOD + 1 - MAX_KEYS) as f64, "evictions {evicted}");
    assert_eq!(s.value_or_zero("weir_memory_zone_full_total", &labels), 0.0, "room was always found");
}

#[test]
fn a_zone_full_of_rejected_keys_answers_new_keys_with_the_routes_status() {
    let up = Upstream::start();
    let weir = start(
        &up,
        r#"
[[limit_req_zone]]
name = "tiny"
key = "header:X-Key"
rate = "1r/m"
max_keys = 3

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
limit_req = [ { zone = "tiny" } ]
limit_req_status = 503
"#,
    );
    let mut client = KeepAlive::new(weir.addr, IO_TIMEOUT);
    let mut send = |key: &str| client.send(&keyed("/", key)).unwrap_or_else(|e| panic!("{key}: {e}"));
    // Three keys each pass once and are then rejected: protected for their one-minute retry.
    for key in ["a", "b", "c"] {
        assert_eq!(send(key).status, 200, "{key}");
        assert_eq!(send(key).status, 503, "{key}");
    }
    let refused = send("newcomer");
    assert_eq!(refused.status, 503, "{}", refused.summary());
    assert_eq!(refused.header("retry-after").as_deref(), Some("1"));
    let admin = admin::addr(&weir);
    let s = scrape_until(admin, SETTLE, POLL, |s| {
        s.value_or_zero("weir_memory_zone_full_total", &[("zone", "tiny")]) >= 1.0
    })
    .unwrap_or_else(|s| panic!("no full zone counted:\n{}", s.filtered()));
    assert_eq!(s.must("weir_memory_zone_full_total", &[("zone", "tiny")]), 1.0);
    assert_eq!(s.must("weir_memory_keys", &[("zone", "tiny")]), 3.0);
    // The limited keys are still limited: nothing was evicted for the newcomer.
    assert_eq!(send("a").status, 503);
    assert_eq!(
        scrape(admin).value_or_zero("weir_memory_evictions_total", &[("zone", "tiny"), ("reason", "live")]),
        0.0
    );
}

#[test]
fn a_conn_zone_full_of_requests_in_flight_answers_new_keys_with_limit_conn_status() {
    let up = Upstream::start();
    up.set_sleep(Duration::from_millis(1500));
    let weir = start(
        &up,
        r#"
[[limit_conn_zone]]
name = "conns"
key = "header:X-Key"
max_keys = 1

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
limit_conn = [ { zone = "conns", max = 10 } ]
"#,
    );
    let addr = weir.addr;
    // Key "a" holds the zone's only slot while its slow request runs.
    let slow = std::thread::spawn(move || support::http::must_send(addr, &keyed("/slow", "a")).status);
    assert!(up.wait_hits(1, SETTLE), "the slow request reached the upstream");
    let refused = support::http::must_send(addr, &keyed("/", "b"));
    assert_eq!(refused.status, 503, "{}", refused.summary());
    assert_eq!(slow.join().expect("slow request"), 200);
    let admin = admin::addr(&weir);
    let s = scrape_until(admin, SETTLE, POLL, |s| s.value_or_zero("weir_memory_keys", &[("zone", "conns")]) == 0.0)
        .unwrap_or_else(|s| panic!("the finished request's key is still held:\n{}", s.filtered()));
    assert_eq!(s.must("weir_memory_zone_full_total", &[("zone", "conns")]), 1.0);
    // The slot is free again: a new key gets in.
    up.set_sleep(Duration::ZERO);
    assert_eq!(support::http::must_send(addr, &keyed("/", "b")).status, 200);
}
