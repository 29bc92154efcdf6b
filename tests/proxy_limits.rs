//! End-to-end limit_req behaviour of the `weir` binary: real weir process, real upstream,
//! real sockets on loopback.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::admin;
use support::concurrent::{self, Burst};
use support::config::{memory_with_app, with_app};
use support::http::{self, statuses, summaries, Conn, Request, Response};
use support::metrics::scrape_until;
use support::ratelimit::{retry_after, sf_param};
use support::upstream::Upstream;
use support::weir::Weir;

/// The checks every rejection must pass (contract: Retry-After, RateLimit-Policy, RateLimit,
/// short JSON body with "error" and "retry_after").
fn assert_rejection(r: &Response, status: u16, zone: &str) {
    let ctx = r.summary();
    assert_eq!(r.status, status, "rejection status: {ctx}");

    let ra = retry_after(r);
    assert!(ra >= 1, "Retry-After must be >= 1: {ctx}");

    let policy = r.header("ratelimit-policy").unwrap_or_else(|| panic!("no RateLimit-Policy: {ctx}"));
    assert!(policy.contains(&format!("\"{zone}\"")), "RateLimit-Policy names zone {zone:?}: {ctx}");
    assert!(sf_param(&policy, "q").is_some(), "RateLimit-Policy has q=: {ctx}");
    assert!(sf_param(&policy, "w").is_some(), "RateLimit-Policy has w=: {ctx}");

    let rl = r.header("ratelimit").unwrap_or_else(|| panic!("no RateLimit: {ctx}"));
    assert!(rl.contains(&format!("\"{zone}\"")), "RateLimit names zone {zone:?}: {ctx}");
    assert_eq!(sf_param(&rl, "r"), Some(0), "RateLimit r=0 on rejection: {ctx}");
    let t = sf_param(&rl, "t").unwrap_or_else(|| panic!("RateLimit has t=: {ctx}"));
    assert!(t >= 1, "RateLimit t >= 1 on rejection: {ctx}");

    let ct = r.header("content-type").unwrap_or_else(|| panic!("no content-type: {ctx}"));
    assert!(ct.starts_with("application/json"), "content-type application/json: {ctx}");
    let body = r.json();
    assert!(body.get("error").is_some(), "JSON has \"error\": {ctx}");
    let jra = body
        .get("retry_after")
        .and_then(|v| v.as_f64())
        .unwrap_or_else(|| panic!("JSON has numeric \"retry_after\": {ctx}"));
    assert!((jra - ra as f64).abs() <= 1.0, "JSON retry_after {jra} agrees with Retry-After {ra}: {ctx}");
}

#[test]
fn burst_nodelay_passes_b_plus_1_then_rejects_with_headers() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 5, nodelay = true } ]
"#,
    ));

    let rs: Vec<Response> = (0..8).map(|_| http::get(w.addr, "/api/x")).collect();
    assert_eq!(
        statuses(&rs),
        vec![200, 200, 200, 200, 200, 200, 429, 429],
        "rate 1r/m burst 5 nodelay: 6 pass then reject; responses: {:#?}",
        summaries(&rs)
    );
    for r in &rs[..6] {
        assert_eq!(r.text(), "/api/x", "proxied body: {}", r.summary());
        assert!(r.has_header("ratelimit"), "passed response has RateLimit: {}", r.summary());
        assert!(r.has_header("ratelimit-policy"), "passed response has RateLimit-Policy: {}", r.summary());
    }
    // Remaining quota counts down on passed responses, never negative.
    let remaining: Vec<i64> =
        rs[..6].iter().map(|r| sf_param(&r.header("ratelimit").unwrap(), "r").expect("r= on RateLimit")).collect();
    assert!(remaining.iter().all(|&r| r >= 0), "remaining: {remaining:?}");
    assert!(remaining.windows(2).all(|p| p[1] <= p[0]), "remaining decreases: {remaining:?}");
    assert_eq!(remaining[5], 0, "after b+1 passes nothing remains: {remaining:?}");

    for r in &rs[6..] {
        assert_rejection(r, 429, "per_ip");
        let ra = retry_after(r);
        // 1r/m: the next request is admitted after one emission interval, 60 s.
        assert!(ra <= 61, "Retry-After at most one interval (60 s): {}", r.summary());
        let policy = r.header("ratelimit-policy").unwrap();
        assert_eq!(sf_param(&policy, "q"), Some(6), "q = burst + 1: {policy}");
    }
    assert_eq!(up.hits(), 6, "upstream saw exactly the passed requests");
}

#[test]
fn limit_req_status_overrides_rejection_status() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "z503"
key = "ip"
rate = "1r/m"

[[route]]
name = "svc"
path_prefix = "/svc/"
upstream = "app"
limit_req = [ { zone = "z503", burst = 0, nodelay = true } ]
limit_req_status = 503
"#,
    ));
    let a = http::get(w.addr, "/svc/a");
    assert_eq!(a.status, 200, "{}", a.summary());
    let b = http::get(w.addr, "/svc/a");
    assert_rejection(&b, 503, "z503");
    assert_eq!(up.hits(), 1);
}

#[test]
fn unlimited_route_and_unknown_path() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[route]]
name = "limited"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 0, nodelay = true } ]

[[route]]
name = "free"
path_prefix = "/free/"
upstream = "app"
"#,
    ));
    // Exhaust the limited route for this IP: the free route must not care.
    assert_eq!(http::get(w.addr, "/api/1").status, 200);
    assert_eq!(http::get(w.addr, "/api/2").status, 429);

    // Many requests on one keep-alive connection.
    let mut c = Conn::connect(w.addr).unwrap();
    for i in 0..30 {
        let path = format!("/free/{i}");
        let r = c.send(&Request::get(&path)).unwrap();
        assert_eq!(r.status, 200, "request {i} on the unlimited route: {}", r.summary());
        assert_eq!(r.text(), path);
    }
    assert_eq!(up.hits_with_prefix("/free/"), 30);

    let before = up.hits();
    for p in ["/nope", "/", "/apix", "/fre"] {
        let r = http::get(w.addr, p);
        assert_eq!(r.status, 404, "no route for {p}: {}", r.summary());
    }
    assert_eq!(up.hits(), before, "404s are not proxied");
}

#[test]
fn route_precedence_exact_then_longest_prefix_then_regex_in_file_order() {
    let e = Upstream::start_named("exact");
    let short = Upstream::start_named("short");
    let long = Upstream::start_named("long");
    let rx1 = Upstream::start_named("rx1");
    let rx2 = Upstream::start_named("rx2");
    let m = Upstream::start_named("method");
    let h = Upstream::start_named("host");
    let cfg = format!(
        r#"[server]
listen = ["$LISTEN"]
threads = 2

[store]
kind = "memory"

[[upstream]]
name = "exact"
servers = ["{e}"]
[[upstream]]
name = "short"
servers = ["{short}"]
[[upstream]]
name = "long"
servers = ["{long}"]
[[upstream]]
name = "rx1"
servers = ["{rx1}"]
[[upstream]]
name = "rx2"
servers = ["{rx2}"]
[[upstream]]
name = "method"
servers = ["{m}"]
[[upstream]]
name = "host"
servers = ["{h}"]

# Regexes first in the file: they must still lose to exact and prefix routes.
[[route]]
name = "rx-first"
path_regex = "^/r[0-9]+/"
upstream = "rx1"
[[route]]
name = "rx-catch-p"
path_regex = "^/(p|r)"
upstream = "rx2"
[[route]]
name = "short"
path_prefix = "/p/"
upstream = "short"
[[route]]
name = "long"
path_prefix = "/p/long/"
upstream = "long"
[[route]]
name = "exact"
path = "/p/exact"
upstream = "exact"
[[route]]
name = "get-only"
path = "/m"
methods = ["GET"]
upstream = "method"
[[route]]
name = "host-only"
path_prefix = "/h/"
host = "a.example"
upstream = "host"
"#,
        e = e.addr_str(),
        short = short.addr_str(),
        long = long.addr_str(),
        rx1 = rx1.addr_str(),
        rx2 = rx2.addr_str(),
        m = m.addr_str(),
        h = h.addr_str(),
    );
    let w = Weir::start(&cfg);
    let which = |path: &str| {
        let r = http::get(w.addr, path);
        assert_eq!(r.status, 200, "{path}: {}", r.summary());
        r.header("x-upstream").unwrap_or_default()
    };
    assert_eq!(which("/p/exact"), "exact", "exact path wins");
    assert_eq!(which("/p/exact/more"), "short", "exact path is exact");
    assert_eq!(which("/p/long/x"), "long", "longest prefix wins");
    assert_eq!(which("/p/other"), "short");
    assert_eq!(which("/r7/x"), "rx1", "first regex in file order");
    assert_eq!(which("/rz"), "rx2", "second regex when the first does not match");

    let r = http::get(w.addr, "/m");
    assert_eq!(r.header("x-upstream").as_deref(), Some("method"), "{}", r.summary());
    let r = http::must_send(w.addr, &Request::new("POST", "/m").body(b"x"));
    assert_eq!(r.status, 404, "methods = [GET] does not match POST: {}", r.summary());

    let r = http::must_send(w.addr, &Request::get("/h/1").header("Host", "a.example"));
    assert_eq!(r.header("x-upstream").as_deref(), Some("host"), "{}", r.summary());
    let r = http::must_send(w.addr, &Request::get("/h/1").header("Host", "b.example"));
    assert_eq!(r.status, 404, "host mismatch: {}", r.summary());
}

#[test]
fn header_keys_have_separate_buckets_and_missing_header_is_not_limited() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "by_key"
key = "header:X-Api-Key"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "by_key", burst = 1, nodelay = true } ]
"#,
    ));
    let with = |k: &str| http::get_with(w.addr, "/api/k", &[("X-Api-Key", k)]).status;
    assert_eq!([with("alpha"), with("alpha"), with("alpha")], [200, 200, 429]);
    assert_eq!([with("beta"), with("beta"), with("beta")], [200, 200, 429], "beta has its own bucket");
    assert_eq!(with("alpha"), 429, "alpha is still limited");
    // Header names are case-insensitive.
    assert_eq!(http::get_with(w.addr, "/api/k", &[("x-api-key", "alpha")]).status, 429);
    for i in 0..12 {
        let r = http::get(w.addr, "/api/k");
        assert_eq!(r.status, 200, "request {i} without the key header is not limited: {}", r.summary());
    }
    assert_eq!(up.hits(), 4 + 12);
}

#[test]
fn dry_run_never_rejects_nor_delays() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[limit_req_zone]]
name = "per_ip_delay"
key = "ip"
rate = "1r/m"

[[route]]
name = "dry"
path_prefix = "/dry/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 0, nodelay = true } ]
dry_run = true

[[route]]
name = "dry-delay"
path_prefix = "/dryd/"
upstream = "app"
limit_req = [ { zone = "per_ip_delay", burst = 5 } ]
dry_run = true
"#,
    ));
    for i in 0..10 {
        let r = http::get(w.addr, "/dry/x");
        assert_eq!(r.status, 200, "dry_run request {i}: {}", r.summary());
    }
    // Without dry_run the 2nd..6th would wait a minute each; 7th rejected.
    let t0 = Instant::now();
    for i in 0..8 {
        let r = http::get(w.addr, "/dryd/x");
        assert_eq!(r.status, 200, "dry_run delay-route request {i}: {}", r.summary());
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "dry_run must not delay: took {:?}", t0.elapsed());
    assert_eq!(up.hits(), 18);
}

#[test]
fn two_zones_are_all_or_nothing() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
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
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 3, nodelay = true }, { zone = "per_key", burst = 0, nodelay = true } ]
"#,
    ));
    let with = |k: &str| {
        let r = http::get_with(w.addr, "/api/z", &[("X-Api-Key", k)]);
        (r.status, r)
    };
    assert_eq!(with("a").0, 200);
    // Rejected by per_key: per_ip must not be charged for it.
    let (s, r) = with("a");
    assert_eq!(s, 429, "{}", r.summary());
    assert_eq!(with("b").0, 200);
    assert_eq!(with("c").0, 200);
    assert_eq!(with("d").0, 200, "per_ip allows 4 (burst 3) and was not charged for the rejection");
    let (s, r) = with("e");
    assert_eq!(s, 429, "per_ip exhausted: {}", r.summary());
    assert_eq!(up.hits(), 4);
}

/// Sends `reqs` to `addr` at once (see [`concurrent::start`]).
fn send_at_once(addr: SocketAddr, reqs: Vec<Request>) -> Burst {
    concurrent::start(reqs.into_iter().map(|req| (addr, req)).collect())
}

/// (status, completion offset from the release) for each request, in sending order.
fn join_all(burst: Burst) -> Vec<(u16, Duration)> {
    burst.join().into_iter().map(|(r, at)| (r.status, at)).collect()
}

#[test]
fn delay_without_nodelay_spreads_excess_at_the_rate() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "slow"
key = "ip"
rate = "2r/s"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "slow", burst = 3 } ]
"#,
    ));
    let burst = send_at_once(w.addr, (0..3).map(|_| Request::get("/api/d")).collect());
    let t0 = burst.released();
    let mut done = join_all(burst);
    done.sort_by_key(|d| d.1);
    assert!(done.iter().all(|d| d.0 == 200), "all pass: {done:?}");
    assert!(done[0].1 < Duration::from_millis(500), "one answers at once: {done:?}");
    assert!(done[1].1 >= Duration::from_millis(500), "2nd delayed by 1/R = 500 ms: {done:?}");
    assert!(done[2].1 >= Duration::from_millis(1000), "3rd delayed by 2/R = 1000 ms: {done:?}");
    assert!(done[2].1 < Duration::from_secs(5), "bounded: {done:?}");

    // The upstream saw them at the same pace.
    let seen: Vec<Duration> = up.seen().iter().map(|s| s.at.duration_since(t0)).collect();
    assert_eq!(seen.len(), 3);
    assert!(seen[1] >= Duration::from_millis(500), "upstream arrivals: {seen:?}");
    assert!(seen[2] >= Duration::from_millis(1000), "upstream arrivals: {seen:?}");
}

#[test]
fn delay_threshold_passes_d_plus_1_then_delays_then_rejects() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "z"
key = "ip"
rate = "2r/s"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "z", burst = 4, delay = 2 } ]
"#,
    ));
    let done = join_all(send_at_once(w.addr, (0..6).map(|_| Request::get("/api/t")).collect()));
    let mut ok: Vec<Duration> = done.iter().filter(|d| d.0 == 200).map(|d| d.1).collect();
    let rejected: Vec<Duration> = done.iter().filter(|d| d.0 == 429).map(|d| d.1).collect();
    ok.sort();
    assert_eq!((ok.len(), rejected.len()), (5, 1), "b+1 = 5 pass, 1 rejected: {done:?}");
    for (i, t) in ok[..3].iter().enumerate() {
        assert!(*t < Duration::from_millis(500), "first d+1 = 3 pass at once (#{i}): {done:?}");
    }
    assert!(ok[3] >= Duration::from_millis(500), "4th delayed by 1/R: {done:?}");
    assert!(ok[4] >= Duration::from_millis(1000), "5th delayed by 2/R: {done:?}");
    assert!(ok[4] < Duration::from_secs(5), "bounded: {done:?}");
    assert!(rejected[0] < Duration::from_millis(500), "rejection is not delayed: {done:?}");
    assert_eq!(up.hits(), 5);
}

#[test]
fn delayed_requests_do_not_block_other_requests() {
    let up = Upstream::start();
    let w = Weir::start(&with_app(
        admin::LISTEN,
        "[store]\nkind = \"memory\"",
        up.addr(),
        r#"
[[limit_req_zone]]
name = "by_key"
key = "header:X-Api-Key"
rate = "1r/s"

[[route]]
name = "slow"
path_prefix = "/slow/"
upstream = "app"
limit_req = [ { zone = "by_key", burst = 5 } ]

[[route]]
name = "free"
path_prefix = "/free/"
upstream = "app"
"#,
    ));
    // Key "a": delays 0, 1, 2, 3, 4 s — more delayed requests than weir has threads.
    let reqs = (0..5).map(|_| Request::get("/slow/a").header("X-Api-Key", "a")).collect();
    let burst = send_at_once(w.addr, reqs);
    let t0 = burst.released();
    assert!(up.wait_hits(1, Duration::from_secs(5)), "first slow request reached upstream");
    // The four others are in their delays: each is counted in the delay histogram as it starts.
    let waiting = scrape_until(admin::addr(&w), Duration::from_secs(5), Duration::from_millis(10), |s| {
        s.value_or_zero("weir_limit_req_delay_seconds_count", &[("route", "slow")]) >= 4.0
    });
    assert!(waiting.is_ok(), "4 requests of key a delayed: {}", waiting.unwrap_or_else(|s| s).filtered());

    // Meanwhile: another route, and another key on the same route, answer at once.
    let mut quick = Vec::new();
    for i in 0..3 {
        let r = http::get(w.addr, &format!("/free/{i}"));
        assert_eq!(r.status, 200, "{}", r.summary());
        quick.push(t0.elapsed());
    }
    let r = http::get_with(w.addr, "/slow/b", &[("X-Api-Key", "b")]);
    assert_eq!(r.status, 200, "{}", r.summary());
    quick.push(t0.elapsed());

    let mut slow = join_all(burst);
    slow.sort_by_key(|d| d.1);
    assert!(slow.iter().all(|d| d.0 == 200), "{slow:?}");
    assert!(slow[1].1 >= Duration::from_secs(1), "2nd of key a delayed 1 s: {slow:?}");
    assert!(slow[4].1 >= Duration::from_secs(4), "5th of key a delayed 4 s: {slow:?}");
    assert!(slow[4].1 < Duration::from_secs(12), "bounded: {slow:?}");
    let last_quick = *quick.last().unwrap();
    assert!(last_quick < slow[1].1, "other requests finished ({quick:?}) before the delayed ones ({slow:?})");
}

#[test]
fn run_subcommand_and_several_listen_addresses() {
    let up = Upstream::start();
    let cfg = memory_with_app(
        up.addr(),
        r#"
[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
"#,
    )
    .replace(r#"listen = ["$LISTEN"]"#, r#"listen = ["$LISTEN", "$LISTEN2"]"#);
    let w = Weir::start_with_args(&["run"], &cfg);
    assert_eq!(w.addrs.len(), 2);
    for a in &w.addrs {
        let r = http::get(*a, "/x");
        assert_eq!(r.status, 200, "listener {a}: {}", r.summary());
        assert_eq!(r.text(), "/x");
    }
}

#[test]
fn sigterm_exits_promptly() {
    let up = Upstream::start();
    let mut w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
"#,
    ));
    // Leave an idle keep-alive connection open: shutdown must not wait for it.
    let mut c = Conn::connect(w.addr).unwrap();
    assert_eq!(c.send(&Request::get("/a")).unwrap().status, 200);
    match w.terminate(Duration::from_secs(15)) {
        Some((_st, took)) => {
            assert!(took < Duration::from_secs(5), "SIGTERM should stop weir within ~3 s, took {took:?}")
        }
        None => panic!("weir still running 15 s after SIGTERM\n--- stderr ---\n{}", w.stderr()),
    }
    drop(c);
}
