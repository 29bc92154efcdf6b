//! End-to-end `limit_conn`, `allow`/`deny` and upstream `max_conns` of the `weir` binary: real weir
//! processes, a real redis-server, a real upstream that measures its own concurrency, real sockets
//! on loopback.
//!
//! The upstream (`support::upstream`) counts requests in flight (from the end of the request head
//! to just before the response is written) and remembers the largest count, so a cap that lets one
//! request too many through shows as a number, not as a timing guess. A request whose path
//! contains `/sleep/<ms>/` is held that long before it is answered.

use crate::support;

use std::collections::BTreeSet;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::access_log::access_lines;
use support::admin;
use support::concurrent::fire;
use support::config::{redis_store, with_app, with_server, JSON_LOG};
use support::http::{self, summaries, Conn, Request, Response};
use support::metrics;
use support::poll::{poll, wait_until};
use support::redis_cmd::{exists, time_us, zcard, zrange_scores};
use support::redis_server::RedisServer;
use support::upstream::Upstream;
use support::weir::{refusing_addr, Weir};

/// How long metrics and access-log lines may take to appear after a response was read.
const SETTLE: Duration = Duration::from_secs(5);
/// How often to look again while waiting for something.
const POLL: Duration = Duration::from_millis(20);
/// The Redis key of zone `conn_per_ip` for a client on 127.0.0.1 (default prefix `weir:`).
const LOCAL_KEY: &str = "weir:conn:conn_per_ip:{127.0.0.1}";

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// `n` copies of `GET path` to `addr`.
fn many(addr: SocketAddr, path: &str, n: usize) -> Vec<(SocketAddr, Request)> {
    (0..n).map(|_| (addr, Request::get(path))).collect()
}

/// The statuses, sorted: concurrent requests finish in any order.
fn sorted_statuses(rs: &[Response]) -> Vec<u16> {
    let mut s = http::statuses(rs);
    s.sort_unstable();
    s
}

/// A limit_conn rejection: status, `Retry-After: 1`, the concurrency policy, the JSON error.
fn assert_conn_rejection(r: &Response, status: u16, zone: &str, max: u32) {
    let ctx = r.summary();
    assert_eq!(r.status, status, "rejection status: {ctx}");
    assert_eq!(r.header("retry-after").as_deref(), Some("1"), "Retry-After: 1: {ctx}");
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(format!("\"{zone}\";q={max};qu=\"concurrent-requests\"")),
        "RateLimit-Policy of a concurrency cap: {ctx}"
    );
    let ct = r.header("content-type").unwrap_or_default();
    assert!(ct.starts_with("application/json"), "content-type application/json: {ctx}");
    let body = r.json();
    assert_eq!(body["error"], "too_many_concurrent_requests", "JSON error: {ctx}");
    assert_eq!(body["zone"], zone, "JSON zone: {ctx}");
}

fn conn_keys(conn: &mut redis::Connection) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("weir:conn:*").query(conn).expect("KEYS");
    keys.sort();
    keys
}

/// Redis' clock in ms.
fn redis_now_ms(conn: &mut redis::Connection) -> u64 {
    time_us(conn) / 1000
}

/// Waits (bounded) until `w` logged at least `n` access lines; the last ones read either way.
fn access_n(w: &Weir, n: usize) -> Vec<Value> {
    poll(SETTLE, POLL, || access_lines(w), |lines| lines.len() >= n).unwrap_or_else(|last| last)
}

fn count_conn(lines: &[Value], status: &str) -> usize {
    lines.iter().filter(|l| l["limit_conn"] == status).count()
}

/// Waits (bounded) until the metric has `want` (a series not exported yet counts as 0); the last
/// scrape in the error.
fn wait_metric(admin: SocketAddr, name: &str, labels: &[(&str, &str)], want: f64) -> Result<(), String> {
    metrics::scrape_until(admin, SETTLE, POLL, |s| s.value_or_zero(name, labels) == want).map(|_| ()).map_err(|last| {
        format!(
            "{name}{labels:?}: want {want}, got {:?}\n{}",
            last.value(name, labels),
            last.text.lines().filter(|l| l.contains("limit_conn")).collect::<Vec<_>>().join("\n")
        )
    })
}

/// A config on the shared Redis with zone `conn_per_ip` (key = ip), an admin listener ($LISTEN2),
/// JSON logs and the upstream "app" at `up`, followed by `rest`.
fn redis_config(redis: &RedisServer, up: SocketAddr, lease_ttl: &str, rest: &str) -> String {
    let store = redis_store(&redis.url(), &format!("timeout = \"2s\"\nlease_ttl = \"{lease_ttl}\""));
    let sections = format!("{JSON_LOG}\n\n{store}");
    let zone = format!(
        r#"[[limit_conn_zone]]
name = "conn_per_ip"
key = "ip"

{rest}"#
    );
    with_app(admin::LISTEN, &sections, up, &zone)
}

/// `[log]` and `[store]` of the memory-store configs: JSON logs, as the access log is read back.
const MEMORY_JSON: &str = r#"[log]
format = "json"

[store]
kind = "memory""#;

/// `[server]` with an admin listener ($LISTEN2), JSON logs and the memory store, followed by `rest`,
/// which brings its own `[[upstream]]` and zones.
fn memory_config(rest: &str) -> String {
    with_server(admin::LISTEN, &format!("{MEMORY_JSON}\n\n{rest}"))
}

/// [`memory_config`] with the upstream "app" pointing at `up`.
fn memory_config_with_app(up: &Upstream, rest: &str) -> String {
    with_app(admin::LISTEN, MEMORY_JSON, up.addr(), rest)
}

// ---------------------------------------------------------------------------------------------
// 1. One cap for the fleet
// ---------------------------------------------------------------------------------------------

#[test]
fn redis_two_instances_share_one_cap_and_the_lease_set_drains() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let route = r#"
[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_conn = [ { zone = "conn_per_ip", max = 3 } ]
"#;
    let a = Weir::start(&redis_config(&redis, up.addr(), "30s", route));
    let b = Weir::start(&redis_config(&redis, up.addr(), "30s", route));
    let mut rc = redis.connection();

    // 10 concurrent requests on one key (127.0.0.1), 5 on each instance, each held 1.5 s upstream.
    let reqs: Vec<(SocketAddr, Request)> =
        (0..10).map(|i| (if i % 2 == 0 { a.addr } else { b.addr }, Request::get("/api/sleep/1500/x"))).collect();
    let t0 = Instant::now();
    let burst = thread::spawn(move || fire(reqs));

    // While the admitted ones are held: exactly 3 leases in the one fleet-wide set.
    assert!(
        up.wait_in_flight(3, Duration::from_secs(5)),
        "3 requests reach the upstream; in flight {}",
        up.in_flight()
    );
    let keys = conn_keys(&mut rc);
    assert_eq!(keys, vec![LOCAL_KEY.to_string()], "one lease set, named <prefix>conn:<zone>:{{<key>}}");
    assert_eq!(zcard(&mut rc, LOCAL_KEY), 3, "3 leases held");
    let now = redis_now_ms(&mut rc);
    let scores: Vec<(String, f64)> =
        redis::cmd("ZRANGE").arg(LOCAL_KEY).arg(0).arg(-1).arg("WITHSCORES").query(&mut rc).unwrap();
    for (member, score) in &scores {
        let s = *score as u64;
        assert!(s > now && s <= now + 30_000 + 1000, "lease {member} expires within lease_ttl: {s} vs now {now}");
        assert!(member.contains(':'), "lease id <instance>:<counter>: {member}");
    }

    let rs = burst.join().expect("burst thread");
    let took = t0.elapsed();
    assert_eq!(
        sorted_statuses(&rs),
        vec![200, 200, 200, 503, 503, 503, 503, 503, 503, 503],
        "max = 3 across both instances: 3 pass, 7 rejected; responses:\n{:#?}",
        summaries(&rs)
    );
    for r in rs.iter().filter(|r| r.status == 200) {
        assert_eq!(r.text(), "/api/sleep/1500/x", "proxied: {}", r.summary());
    }
    for r in rs.iter().filter(|r| r.status != 200) {
        assert_conn_rejection(r, 503, "conn_per_ip", 3);
    }
    assert_eq!(up.hits(), 3, "only the admitted requests reached the upstream");
    assert_eq!(up.max_in_flight(), 3, "the upstream never had more than 3 in flight");
    assert!(took >= Duration::from_millis(1500), "the admitted requests were held 1.5 s: {took:?}");

    // Both instances logged their share: 3 PASSED, 7 REJECTED in all.
    let (la, lb) = (access_n(&a, 5), access_n(&b, 5));
    let all: Vec<Value> = la.iter().chain(&lb).cloned().collect();
    assert_eq!(count_conn(&all, "PASSED"), 3, "access log PASSED: {all:#?}");
    assert_eq!(count_conn(&all, "REJECTED"), 7, "access log REJECTED: {all:#?}");
    for w in [&a, &b] {
        let l = access_lines(w);
        let passed = count_conn(&l, "PASSED") as f64;
        let rejected = count_conn(&l, "REJECTED") as f64;
        let labels = |s| [("zone", "conn_per_ip"), ("status", s)];
        wait_metric(admin::addr(w), "weir_limit_conn_decisions_total", &labels("passed"), passed).unwrap();
        wait_metric(admin::addr(w), "weir_limit_conn_decisions_total", &labels("rejected"), rejected).unwrap();
        wait_metric(admin::addr(w), "weir_limit_conn_active_leases", &[], 0.0).unwrap();
    }

    // The set drains: every lease was released when its request ended.
    let drained = wait_until(Duration::from_secs(3), POLL, || zcard(&mut rc, LOCAL_KEY) == 0);
    assert!(drained.is_some(), "ZCARD {LOCAL_KEY} back to 0; members: {:?}", {
        let m: Vec<String> = redis::cmd("ZRANGE").arg(LOCAL_KEY).arg(0).arg(-1).query(&mut rc).unwrap();
        m
    });
    assert!(!exists(&mut rc, LOCAL_KEY), "an empty lease set is gone");

    // The slots are free again: 3 new concurrent requests over both instances all pass.
    up.reset_max();
    let again = fire(vec![
        (a.addr, Request::get("/api/sleep/300/again")),
        (b.addr, Request::get("/api/sleep/300/again")),
        (a.addr, Request::get("/api/sleep/300/again")),
    ]);
    assert_eq!(sorted_statuses(&again), vec![200, 200, 200], "after the burst: \n{:#?}", summaries(&again));
    assert_eq!(up.max_in_flight(), 3, "3 in flight together upstream, never more");
    assert!(
        wait_until(Duration::from_secs(3), POLL, || zcard(&mut rc, LOCAL_KEY) == 0).is_some(),
        "the set drains again"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. A crashed instance loses its leases after lease_ttl, not before, not never
// ---------------------------------------------------------------------------------------------

#[test]
fn redis_sigkilled_instance_leases_are_renewed_while_alive_and_expire_after_ttl() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let route = r#"
[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_conn = [ { zone = "conn_per_ip", max = 3 } ]
"#;
    let mut a = Weir::start(&redis_config(&redis, up.addr(), "3s", route));
    let b = Weir::start(&redis_config(&redis, up.addr(), "3s", route));
    let mut rc = redis.connection();

    // A holds all 3 slots on requests the upstream holds for 20 s.
    let held: Vec<_> = (0..3)
        .map(|_| {
            let addr = a.addr;
            thread::spawn(move || http::send(addr, &Request::get("/api/sleep/20000/held")))
        })
        .collect();
    assert!(up.wait_in_flight(3, Duration::from_secs(5)), "A's 3 requests in flight; got {}", up.in_flight());
    let first = zrange_scores(&mut rc, LOCAL_KEY);
    assert_eq!(first.len(), 3, "A holds 3 leases: {first:?}");
    let r = http::get(b.addr, "/api/fast/before");
    assert_conn_rejection(&r, 503, "conn_per_ip", 3);

    // A renews its leases (every ttl/3): seen, the same three members, with expiries pushed a whole
    // lease_ttl (3 s) past the latest first one, they were renewed, and outlived their first life.
    let members = |l: &[(String, f64)]| l.iter().map(|(m, _)| m.clone()).collect::<BTreeSet<_>>();
    let last_first_expiry = first.iter().map(|(_, e)| *e).fold(0.0, f64::max);
    let renewed = poll(
        Duration::from_secs(10),
        POLL,
        || zrange_scores(&mut rc, LOCAL_KEY),
        |l| members(l) == members(&first) && l.iter().all(|(_, e)| *e >= last_first_expiry + 3000.0),
    );
    assert!(renewed.is_ok(), "A's leases {first:?} were not renewed a lease_ttl on: {renewed:?}");
    let now = redis_now_ms(&mut rc);
    let live: u64 = redis::cmd("ZCOUNT").arg(LOCAL_KEY).arg(format!("({now}")).arg("+inf").query(&mut rc).unwrap();
    assert_eq!(live, 3, "past one lease_ttl after acquisition A's leases are renewed and live");
    let r = http::get(b.addr, "/api/fast/renewed");
    assert_conn_rejection(&r, 503, "conn_per_ip", 3);
    a.assert_alive("while holding leases");

    // SIGKILL: no release, no more renewals.
    let killed = Instant::now();
    a.kill();
    let r = http::get(b.addr, "/api/fast/right-after-kill");
    assert_conn_rejection(&r, 503, "conn_per_ip", 3);
    for h in held {
        // The client side of A's requests ends with A (reset or EOF), not after 20 s.
        let res = h.join().expect("held request thread");
        assert!(
            res.as_ref().map_or(true, |r| r.status != 200),
            "a request of the killed A got {:?}",
            res.map(|r| r.summary())
        );
    }

    // B polls until a slot is back.
    let mut rejected_after_kill = 1;
    let back = loop {
        let r = http::get(b.addr, "/api/fast/poll");
        if r.status == 200 {
            break killed.elapsed();
        }
        assert_conn_rejection(&r, 503, "conn_per_ip", 3);
        rejected_after_kill += 1;
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "no slot back on B 10 s after A was killed (lease_ttl 3 s)"
        );
        thread::sleep(Duration::from_millis(100));
    };
    println!("slot back on B {back:?} after SIGKILL of A ({rejected_after_kill} rejections meanwhile)");
    // Leases were renewed at most ttl/3 = 1 s before the kill, so they live at least 2 s more.
    assert!(back >= Duration::from_millis(1800), "a slot came back {back:?} after the kill: before lease_ttl - ttl/3");

    // All three of A's slots are back (no lease in the set is live on Redis' clock): B now takes
    // 3 (and only 3) at once.
    let all_back = wait_until(Duration::from_secs(5), POLL, || {
        let now = redis_now_ms(&mut rc);
        let live: u64 = redis::cmd("ZCOUNT").arg(LOCAL_KEY).arg(format!("({now}")).arg("+inf").query(&mut rc).unwrap();
        live == 0
    });
    assert!(all_back.is_some(), "A's other leases expired soon after the first");
    up.reset_max();
    let rs = fire(many(b.addr, "/api/sleep/1000/b", 4));
    assert_eq!(sorted_statuses(&rs), vec![200, 200, 200, 503], "B alone holds the 3 slots:\n{:#?}", summaries(&rs));
    let gone = wait_until(Duration::from_secs(5), POLL, || !exists(&mut rc, LOCAL_KEY));
    assert!(gone.is_some(), "the lease set vanishes once its leases are released or expired");
}

// ---------------------------------------------------------------------------------------------
// 3. A request that ends early gives its lease back at once
// ---------------------------------------------------------------------------------------------

#[test]
fn redis_client_abort_releases_the_lease_long_before_ttl() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let route = r#"
[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_conn = [ { zone = "conn_per_ip", max = 1 } ]
"#;
    let w = Weir::start(&redis_config(&redis, up.addr(), "30s", route));
    let mut rc = redis.connection();

    // The upstream holds this one 10 s; the client goes away while it is in flight (seen by the
    // upstream, its lease in Redis, a second request refused).
    let mut c = Conn::connect(w.addr).unwrap();
    c.send_raw(&Request::get("/api/sleep/10000/abort").to_bytes()).unwrap();
    assert!(up.wait_in_flight(1, Duration::from_secs(5)), "request in flight");
    assert_eq!(zcard(&mut rc, LOCAL_KEY), 1, "one lease held");
    let r = http::get(w.addr, "/api/fast/while-held");
    assert_conn_rejection(&r, 503, "conn_per_ip", 1);
    let closed = Instant::now();
    c.stream().shutdown(Shutdown::Both).unwrap();
    drop(c);

    let released = wait_until(Duration::from_secs(3), POLL, || zcard(&mut rc, LOCAL_KEY) == 0);
    assert!(
        released.is_some(),
        "lease still held {:?} after the client closed (lease_ttl 30 s, upstream answers after 10 s); ZCARD {}",
        closed.elapsed(),
        zcard(&mut rc, LOCAL_KEY)
    );
    println!("client abort: lease released {:?} after the client closed", released.unwrap());
    let r = http::get(w.addr, "/api/fast/after-abort");
    assert_eq!(r.status, 200, "the slot is free again: {}", r.summary());
    wait_metric(admin::addr(&w), "weir_limit_conn_active_leases", &[], 0.0).unwrap();
}

#[test]
fn redis_upstream_refusing_connections_releases_the_lease() {
    let redis = RedisServer::start();
    // Nothing listens there, and nothing can while `_reserved` lives.
    let (_reserved, dead) = refusing_addr();
    let route = r#"
[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_conn = [ { zone = "conn_per_ip", max = 1 } ]
"#;
    let w = Weir::start(&redis_config(&redis, dead, "30s", route));
    let mut rc = redis.connection();
    for i in 0..3 {
        let r = http::get(w.addr, &format!("/api/refused/{i}"));
        assert_eq!(
            r.status,
            502,
            "request {i}: upstream refuses, so 502 — not a 503 from a leaked lease: {}",
            r.summary()
        );
        let released = wait_until(Duration::from_secs(2), POLL, || zcard(&mut rc, LOCAL_KEY) == 0);
        assert!(released.is_some(), "request {i}: lease released after the 502; ZCARD {}", zcard(&mut rc, LOCAL_KEY));
    }
    let lines = access_n(&w, 3);
    assert_eq!(count_conn(&lines, "PASSED"), 3, "each 502 had taken (and given back) a lease: {lines:#?}");
    wait_metric(admin::addr(&w), "weir_limit_conn_active_leases", &[], 0.0).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 4. Dry run
// ---------------------------------------------------------------------------------------------

#[test]
fn dry_run_limit_conn_passes_everything_and_logs_rejected_dry_run() {
    let up = Upstream::start();
    let w = Weir::start(&memory_config_with_app(
        &up,
        r#"
[[limit_conn_zone]]
name = "shadow"
key = "ip"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_conn = [ { zone = "shadow", max = 1, dry_run = true } ]
"#,
    ));
    let rs = fire(many(w.addr, "/api/sleep/1000/dry", 3));
    assert_eq!(sorted_statuses(&rs), vec![200, 200, 200], "dry run rejects nothing:\n{:#?}", summaries(&rs));
    for r in &rs {
        assert!(!r.has_header("ratelimit-policy"), "a shadow limit adds no headers: {}", r.summary());
        assert!(!r.has_header("retry-after"), "a shadow limit adds no headers: {}", r.summary());
    }
    assert_eq!(up.max_in_flight(), 3, "all 3 were in flight together upstream");
    let lines = access_n(&w, 3);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert_eq!(count_conn(&lines, "PASSED"), 1, "one took the lease: {lines:#?}");
    assert_eq!(count_conn(&lines, "REJECTED_DRY_RUN"), 2, "two would have been rejected: {lines:#?}");
    let labels = |s| [("zone", "shadow"), ("status", s)];
    wait_metric(admin::addr(&w), "weir_limit_conn_decisions_total", &labels("rejected_dry_run"), 2.0).unwrap();
    wait_metric(admin::addr(&w), "weir_limit_conn_decisions_total", &labels("passed"), 1.0).unwrap();
    wait_metric(admin::addr(&w), "weir_limit_conn_active_leases", &[], 0.0).unwrap();
}

// ---------------------------------------------------------------------------------------------
// 5. allow / deny, real IP, upstream max_conns
// ---------------------------------------------------------------------------------------------

/// Whether the IPv6 part runs: always, and a machine without ::1 fails loudly, unless its
/// environment says so explicitly with `WEIR_TEST_NO_IPV6=1`.
fn has_v6_loopback() -> bool {
    if std::env::var_os("WEIR_TEST_NO_IPV6").is_some_and(|v| v == "1") {
        eprintln!("WEIR_TEST_NO_IPV6=1: the IPv6 part is not run");
        return false;
    }
    if let Err(e) = TcpListener::bind("[::1]:0") {
        panic!("cannot bind [::1]: {e}; on a machine without IPv6 loopback set WEIR_TEST_NO_IPV6=1");
    }
    true
}

#[test]
fn allow_deny_first_match_in_file_order_v4_and_v6() {
    let up = Upstream::start();
    let v6 = has_v6_loopback();
    let listen = if v6 { "\"$LISTEN\", \"$LISTEN6\"" } else { "\"$LISTEN\"" };
    let config = format!(
        r#"[server]
listen = [{listen}]
threads = 2

[log]
format = "json"

[[upstream]]
name = "app"
servers = ["{up}"]

[[limit_req_zone]]
name = "once"
key = "ip"
rate = "1r/m"

[[route]]
name = "deny_first"
path_prefix = "/df/"
upstream = "app"
limit_req = [ {{ zone = "once", burst = 0, nodelay = true }} ]
deny = ["127.0.0.1"]
allow = ["all"]

[[route]]
name = "allow_first"
path_prefix = "/af/"
upstream = "app"
allow = ["all"]
deny = ["127.0.0.1"]

[[route]]
name = "v4_only"
path_prefix = "/v4/"
upstream = "app"
allow = ["127.0.0.0/8"]
deny = ["all"]

[[route]]
name = "no_v6_loopback"
path_prefix = "/v6/"
upstream = "app"
deny = ["::1"]
"#,
        up = up.addr_str()
    );
    let w = Weir::start(&config);

    // deny before allow: 403, before limit_req (three denials, never a 429, nothing charged).
    for i in 0..3 {
        let r = http::get(w.addr, &format!("/df/{i}"));
        assert_eq!(r.status, 403, "deny 127.0.0.1 written first wins: {}", r.summary());
        let body = r.json();
        assert_eq!(body["error"], "forbidden", "{}", r.summary());
        assert_eq!(body["route"], "deny_first", "{}", r.summary());
    }
    // allow before deny: passes.
    for i in 0..3 {
        let r = http::get(w.addr, &format!("/af/{i}"));
        assert_eq!(r.status, 200, "allow all written first wins: {}", r.summary());
    }
    assert_eq!(http::get(w.addr, "/v4/x").status, 200, "127.0.0.1 in 127.0.0.0/8");
    assert_eq!(http::get(w.addr, "/v6/x").status, 200, "no rule matches 127.0.0.1: allowed");
    assert_eq!(up.hits(), 5, "denied requests never reach the upstream");

    if !v6 {
        return;
    }
    let v6addr = *w.addrs.last().expect("the $LISTEN6 address");
    let listening = wait_until(Duration::from_secs(10), POLL, || {
        TcpStream::connect_timeout(&v6addr, Duration::from_millis(200)).is_ok()
    });
    assert!(listening.is_some(), "weir listens on {v6addr}\n{}", w.stderr());
    let r = http::get(v6addr, "/v6/x");
    assert_eq!(r.status, 403, "deny ::1 from ::1: {}", r.summary());
    assert_eq!(r.json()["error"], "forbidden");
    let r = http::get(v6addr, "/v4/x");
    assert_eq!(r.status, 403, "::1 matches only deny all on the v4-only route: {}", r.summary());
    let r = http::get(v6addr, "/af/x");
    assert_eq!(r.status, 200, "allow all covers IPv6: {}", r.summary());
    let r = http::get(v6addr, "/df/x");
    assert_eq!(r.status, 200, "deny 127.0.0.1 does not match ::1; the later allow all does: {}", r.summary());
}

#[test]
fn allow_deny_and_limit_conn_use_the_real_ip_behind_trusted_proxies() {
    let up = Upstream::start();
    let w = Weir::start(&memory_config_with_app(
        &up,
        r#"
[real_ip]
trusted = ["127.0.0.1/32"]

[[limit_conn_zone]]
name = "conn_real"
key = "ip"

[[route]]
name = "partners"
path_prefix = "/p/"
upstream = "app"
limit_conn = [ { zone = "conn_real", max = 2 } ]
allow = ["203.0.113.0/24"]
deny = ["all"]
"#,
    ));
    let xff = |ip: &str, path: &str| Request::get(path).header("X-Forwarded-For", ip);

    let r = http::must_send(w.addr, &xff("203.0.113.5", "/p/ok"));
    assert_eq!(r.status, 200, "real IP 203.0.113.5 is allowed: {}", r.summary());
    let r = http::must_send(w.addr, &xff("198.51.100.1", "/p/no"));
    assert_eq!(r.status, 403, "real IP 198.51.100.1 is denied: {}", r.summary());
    assert_eq!(r.json()["error"], "forbidden");
    let r = http::get(w.addr, "/p/no-header");
    assert_eq!(r.status, 403, "without the header the real IP is the peer 127.0.0.1: denied: {}", r.summary());
    // Right to left: the first untrusted hop is the client; what it claims before is ignored.
    let r = http::must_send(w.addr, &xff("203.0.113.5, 198.51.100.1", "/p/spoof"));
    assert_eq!(r.status, 403, "198.51.100.1 is the real client: {}", r.summary());
    let r = http::must_send(w.addr, &xff("198.51.100.1, 203.0.113.5", "/p/chain"));
    assert_eq!(r.status, 200, "203.0.113.5 is the real client: {}", r.summary());

    // limit_conn keyed on the real IP: each client has its own max = 2. Clients that sent nothing
    // yet: a lease is given back as its request ends, which may be just after its response.
    let mut reqs = Vec::new();
    for _ in 0..3 {
        reqs.push((w.addr, xff("203.0.113.7", "/p/sleep/1000/five")));
        reqs.push((w.addr, xff("203.0.113.6", "/p/sleep/1000/six")));
    }
    up.reset_max();
    let rs = fire(reqs);
    let five: Vec<Response> = rs.iter().step_by(2).cloned().collect();
    let six: Vec<Response> = rs.iter().skip(1).step_by(2).cloned().collect();
    assert_eq!(sorted_statuses(&five), vec![200, 200, 503], "client 203.0.113.7, max 2:\n{:#?}", summaries(&five));
    assert_eq!(sorted_statuses(&six), vec![200, 200, 503], "client 203.0.113.6, max 2:\n{:#?}", summaries(&six));
    for r in rs.iter().filter(|r| r.status == 503) {
        assert_conn_rejection(r, 503, "conn_real", 2);
    }
    assert_eq!(up.max_in_flight(), 4, "2 per client in flight upstream");
}

#[test]
fn upstream_max_conns_full_gives_503_upstream_busy() {
    let up = Upstream::start();
    let w = Weir::start(&memory_config(&format!(
        r#"
[[upstream]]
name = "app"
servers = ["{}"]
max_conns = 2

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
"#,
        up.addr_str()
    )));
    let rs = fire(many(w.addr, "/api/sleep/1000/busy", 4));
    assert_eq!(sorted_statuses(&rs), vec![200, 200, 503, 503], "max_conns = 2:\n{:#?}", summaries(&rs));
    for r in rs.iter().filter(|r| r.status == 503) {
        assert_eq!(r.header("retry-after").as_deref(), Some("1"), "Retry-After: 1: {}", r.summary());
        assert_eq!(r.json()["error"], "upstream_busy", "{}", r.summary());
    }
    assert_eq!(up.max_in_flight(), 2, "never more than max_conns in flight upstream");
    assert_eq!(up.hits(), 2);
    // The places come back when the requests end — in the logging phase, just after the response
    // is written, so a client that saw its response may be a moment early: allow it to retry.
    let mut last = Vec::new();
    let back = wait_until(Duration::from_secs(3), Duration::from_millis(20), || {
        last = fire(many(w.addr, "/api/sleep/200/again", 2));
        sorted_statuses(&last) == vec![200, 200]
    });
    assert!(back.is_some(), "after the busy period:\n{:#?}", summaries(&last));
}

// ---------------------------------------------------------------------------------------------
// 6. Memory store
// ---------------------------------------------------------------------------------------------

#[test]
fn memory_store_caps_concurrency_and_frees_slots() {
    let up = Upstream::start();
    let w = Weir::start(&memory_config_with_app(
        &up,
        r#"
[[limit_conn_zone]]
name = "conn_mem"
key = "ip"

[[limit_conn_zone]]
name = "conn_429"
key = "ip"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_conn = [ { zone = "conn_mem", max = 2 } ]

[[route]]
name = "custom"
path_prefix = "/custom/"
upstream = "app"
limit_conn = [ { zone = "conn_429", max = 1 } ]
limit_conn_status = 429
"#,
    ));
    let reqs = many(w.addr, "/api/sleep/1500/mem", 4);
    let burst = thread::spawn(move || fire(reqs));
    assert!(up.wait_in_flight(2, Duration::from_secs(5)), "2 in flight");
    wait_metric(admin::addr(&w), "weir_limit_conn_active_leases", &[], 2.0).unwrap();
    let rs = burst.join().unwrap();
    assert_eq!(sorted_statuses(&rs), vec![200, 200, 503, 503], "max = 2:\n{:#?}", summaries(&rs));
    for r in rs.iter().filter(|r| r.status != 200) {
        assert_conn_rejection(r, 503, "conn_mem", 2);
    }
    assert_eq!(up.max_in_flight(), 2, "never more than 2 in flight upstream");
    wait_metric(admin::addr(&w), "weir_limit_conn_active_leases", &[], 0.0).unwrap();
    let labels = |s| [("zone", "conn_mem"), ("status", s)];
    wait_metric(admin::addr(&w), "weir_limit_conn_decisions_total", &labels("passed"), 2.0).unwrap();
    wait_metric(admin::addr(&w), "weir_limit_conn_decisions_total", &labels("rejected"), 2.0).unwrap();
    let lines = access_n(&w, 4);
    assert_eq!(count_conn(&lines, "PASSED"), 2, "{lines:#?}");
    assert_eq!(count_conn(&lines, "REJECTED"), 2, "{lines:#?}");

    // Free again.
    up.reset_max();
    let rs = fire(many(w.addr, "/api/sleep/300/again", 2));
    assert_eq!(sorted_statuses(&rs), vec![200, 200], "slots are back:\n{:#?}", summaries(&rs));

    // limit_conn_status.
    let rs = fire(many(w.addr, "/custom/sleep/1000/c", 2));
    assert_eq!(sorted_statuses(&rs), vec![200, 429], "limit_conn_status = 429:\n{:#?}", summaries(&rs));
    assert_conn_rejection(rs.iter().find(|r| r.status == 429).unwrap(), 429, "conn_429", 1);
    wait_metric(admin::addr(&w), "weir_limit_conn_active_leases", &[], 0.0).unwrap();
}
