//! A fleet: three `weir` processes sharing one `redis-server` enforce one limit together, as one
//! nginx-style limiter would, and leave no key behind once their buckets have drained.
//! Real weir processes, real Redis, real upstream, real sockets.

use crate::support;

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use support::config::{redis_store, with_app, NO_ACCESS_LOG};
use support::http::{self, Conn, KeepAlive, Request};
use support::poll::poll;
use support::redis_cmd::scan_keys;
use support::redis_server::RedisServer;
use support::upstream::Upstream;
use support::weir::Weir;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The limit state in Redis: every `weir:` key but the instances' shared top-keys views
/// (`weir:{top}:…`, docs/top.md), which live while an instance has rows to show.
fn limit_keys(conn: &mut redis::Connection) -> Vec<String> {
    scan_keys(conn, "weir:*").into_iter().filter(|k| !k.starts_with("weir:{top}:")).collect()
}

/// One member of the fleet: Redis store at `url` (default clock "redis", deny cache on), a zone
/// keyed by the `X-Key` header at `rate` for route `/api/` with `limit`, and a zone at 2r/s, same
/// key, for route `/slow/` (one request there leaves a key that drains in 500 ms).
fn member(up: &Upstream, url: &str, rate: &str, limit: &str) -> Weir {
    let sections = format!("{NO_ACCESS_LOG}\n\n{}", redis_store(url, "timeout = \"1s\""));
    let zones_and_routes = format!(
        r#"[[limit_req_zone]]
name = "fleet"
key = "header:X-Key"
rate = "{rate}"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ {limit} ]

[[limit_req_zone]]
name = "slow"
key = "header:X-Key"
rate = "2r/s"

[[route]]
name = "slow"
path_prefix = "/slow/"
upstream = "app"
limit_req = [ {{ zone = "slow", burst = 5, nodelay = true }} ]
"#
    );
    Weir::start(&with_app("", &sections, up.addr(), &zones_and_routes))
}

/// One request as the client saw it.
struct Sample {
    instance: usize,
    sent: Instant,
    done: Instant,
    reply: Result<(u16, String), String>,
}

impl Sample {
    fn status(&self) -> Option<u16> {
        self.reply.as_ref().ok().map(|r| r.0)
    }
}

/// `threads` client threads, each round robin over `addrs` on keep-alive connections, `key` in
/// `X-Key`, sleeping `pace` between requests, until `keep_going` says stop (it gets the number of
/// requests this thread sent). All threads start together.
fn hammer(
    addrs: &[SocketAddr],
    key: &str,
    threads: usize,
    pace: Duration,
    keep_going: impl Fn(usize) -> bool + Send + Sync + 'static,
) -> Vec<Sample> {
    let keep_going = Arc::new(keep_going);
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (addrs, keep_going, barrier) = (addrs.to_vec(), keep_going.clone(), barrier.clone());
            let req = Request::get("/api/x").header("X-Key", key);
            thread::spawn(move || {
                let mut conns: Vec<KeepAlive> = addrs.iter().map(|a| KeepAlive::new(*a, REQUEST_TIMEOUT)).collect();
                let mut samples = Vec::new();
                barrier.wait();
                let mut i = 0;
                while keep_going(i) {
                    let k = (t + i) % addrs.len();
                    i += 1;
                    let sent = Instant::now();
                    let result = conns[k].send(&req);
                    let done = Instant::now();
                    let reply = match result {
                        Ok(r) => Ok((r.status, r.summary())),
                        Err(e) => Err(format!("{:?}: {e}", e.kind())),
                    };
                    samples.push(Sample { instance: k, sent, done, reply });
                    if !pace.is_zero() {
                        thread::sleep(pace);
                    }
                }
                samples
            })
        })
        .collect();
    let mut all: Vec<Sample> = handles.into_iter().flat_map(|h| h.join().expect("client thread")).collect();
    all.sort_by_key(|s| s.sent);
    all
}

/// Panics unless every request got 200 or 429 (no transport error, no 5xx).
fn assert_only_200_and_429(samples: &[Sample]) {
    let bad: Vec<String> = samples
        .iter()
        .filter(|s| !matches!(s.status(), Some(200 | 429)))
        .take(10)
        .map(|s| format!("instance {}: {:?}", s.instance, s.reply))
        .collect();
    assert!(bad.is_empty(), "requests other than 200/429:\n{}", bad.join("\n"));
}

#[test]
fn three_instances_under_concurrent_load_admit_what_one_limiter_would() {
    let (rate, burst) = (20.0, 10.0);
    let up = Upstream::start();
    let redis = RedisServer::start();
    let fleet: Vec<Weir> = (0..3)
        .map(|_| member(&up, &redis.url(), "20r/s", "{ zone = \"fleet\", burst = 10, nodelay = true }"))
        .collect();
    let addrs: Vec<SocketAddr> = fleet.iter().map(|w| w.addr).collect();

    let load_for = Duration::from_secs(3);
    let start = Instant::now();
    let samples = hammer(&addrs, "shared", 6, Duration::from_millis(1), move |_| start.elapsed() < load_for);
    let traffic_end = Instant::now();
    assert_only_200_and_429(&samples);

    let admitted: Vec<&Sample> = samples.iter().filter(|s| s.status() == Some(200)).collect();
    let n = admitted.len() as f64;
    // Each admission happened in Redis at some moment between its send and its answer, so the
    // span from the first to the last admission lies between these two.
    let first_sent = admitted.iter().map(|s| s.sent).min().unwrap();
    let first_done = admitted.iter().map(|s| s.done).min().unwrap();
    let last_sent = admitted.iter().map(|s| s.sent).max().unwrap();
    let last_done = admitted.iter().map(|s| s.done).max().unwrap();
    let span_min = last_sent.saturating_duration_since(first_done).as_secs_f64();
    let span_max = last_done.duration_since(first_sent).as_secs_f64();
    // A leaky bucket under constant demand: level = admitted - rate × span stays in (burst,
    // burst + 1] right after each admission, so admitted = burst + 1 + rate × span, ±1 for the
    // span's measurement.
    let (lo, hi) = (burst + rate * span_min - 1.0, burst + 1.0 + rate * span_max + 1.0);
    let per_instance: Vec<usize> = (0..3).map(|i| admitted.iter().filter(|s| s.instance == i).count()).collect();
    println!(
        "fleet of 3, 20r/s burst 10: {} requests in {:?}, {n} admitted {per_instance:?}, first-to-last admission \
         {span_min:.3}..{span_max:.3} s, expected {lo:.1}..={hi:.1}; one limiter over the whole load: {:.0}",
        samples.len(),
        load_for,
        burst + 1.0 + rate * load_for.as_secs_f64()
    );
    assert!(samples.len() >= 1000, "too little load: {} requests", samples.len());
    assert!(span_max > 2.5, "admissions throughout the load: {span_min:.3}..{span_max:.3} s");
    assert!((lo..=hi).contains(&n), "admitted {n}, one limiter admits {lo:.1}..={hi:.1} ({per_instance:?})");
    assert!(per_instance.iter().filter(|&&c| c > 0).count() >= 2, "admissions spread over the fleet: {per_instance:?}");
    assert_eq!(up.hits(), admitted.len(), "upstream saw exactly the admitted requests");

    // Key TTLs: one more key per client on the slow zone, then everything drains and expires.
    // Each client's key is looked at right after its request: it lives only 500 ms, so 30 requests
    // in a row on a loaded machine may outlast the first ones.
    let mut conns: Vec<Conn> = addrs.iter().map(|a| Conn::connect_timeout(*a, REQUEST_TIMEOUT).unwrap()).collect();
    let mut conn = redis.connection();
    for k in 0..30 {
        let r = conns[k % 3].send(&Request::get("/slow/x").header("X-Key", &format!("client-{k}"))).unwrap();
        assert_eq!(r.status, 200, "{}", r.summary());
        let key = format!("weir:slow:{{client-{k}}}");
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        assert!((1..=552).contains(&pttl), "one key per client on the slow zone: {key} right after: PTTL {pttl} ms");
    }
    let keys = limit_keys(&mut conn);
    assert!(keys.len() <= 31, "only the slow keys and the shared one: {keys:?}");
    // A full bucket of the load's zone (burst + 1 = 11) drains in 11 / 20 r/s = 550 ms, one
    // request on the slow zone in 1 / 2 r/s = 500 ms: no TTL is longer.
    let drain = Duration::from_millis(550);
    for key in &keys {
        let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).unwrap();
        assert!(pttl == -2 || (1..=drain.as_millis() as i64 + 2).contains(&pttl), "{key}: PTTL {pttl} ms");
    }
    let traffic_stopped = Instant::now();
    // Redis expires keys on access (SCAN) and in its background cycle: a small margin suffices.
    let left =
        poll(drain + Duration::from_millis(500), Duration::from_millis(20), || limit_keys(&mut conn), Vec::is_empty)
            .unwrap_or_else(|left| left);
    println!(
        "key TTLs: {} keys, all gone {:?} after the traffic (drain time {drain:?}; main load ended {:?} before)",
        keys.len(),
        traffic_stopped.elapsed(),
        traffic_stopped - traffic_end
    );
    assert!(left.is_empty(), "keys still in Redis {:?} after the traffic: {left:?}", traffic_stopped.elapsed());
}

#[test]
fn three_instances_without_refill_admit_exactly_burst_plus_one() {
    let up = Upstream::start();
    let redis = RedisServer::start();
    let fleet: Vec<Weir> =
        (0..3).map(|_| member(&up, &redis.url(), "1r/m", "{ zone = \"fleet\", burst = 5, nodelay = true }")).collect();
    let addrs: Vec<SocketAddr> = fleet.iter().map(|w| w.addr).collect();
    // 6 threads × 30 requests, all at once, over the three instances.
    let samples = hammer(&addrs, "shared", 6, Duration::ZERO, |i| i < 30);
    assert_only_200_and_429(&samples);
    let admitted = samples.iter().filter(|s| s.status() == Some(200)).count();
    println!("fleet of 3, 1r/m burst 5: {} requests, {admitted} admitted", samples.len());
    assert_eq!(samples.len(), 180);
    assert_eq!(admitted, 6, "burst 5 + 1 across the whole fleet, not per instance");
    assert_eq!(up.hits(), 6);
    // Once Redis has rejected a key, every instance answers 429 with the time left.
    for w in &fleet {
        let r = http::get_with(w.addr, "/api/x", &[("X-Key", "shared")]);
        assert_eq!(r.status, 429, "{}", r.summary());
        let retry: u64 = r.header("retry-after").and_then(|v| v.parse().ok()).unwrap_or(0);
        assert!((50..=60).contains(&retry), "Retry-After {retry}: {}", r.summary());
    }
}

/// Whether `[t0, t1]` (µs since the epoch) crosses a boundary of epoch-aligned windows of `window_us`.
fn crosses_window(t0: Duration, t1: Duration, window_us: u128) -> bool {
    t0.as_micros() / window_us != t1.as_micros() / window_us
}

/// Every algorithm, two instances on one Redis, one key hammered concurrently: the fleet admits
/// exactly what the model admits for one limiter with no refill during the test — 5 — not 5 per
/// instance.
#[test]
fn two_instances_admit_what_the_model_admits_for_every_algorithm() {
    let up = Upstream::start();
    let redis = RedisServer::start();
    // (algorithm, rate, reference, window for the boundary check): each admits 5 with no refill
    // within a few seconds.
    let cases = [
        ("leaky_bucket", "1r/h", "{ zone = \"fleet\", burst = 4, nodelay = true }", None),
        ("token_bucket", "1r/h", "{ zone = \"fleet\", burst = 4 }", None),
        ("fixed_window", "5r/h", "{ zone = \"fleet\" }", Some(3_600_000_000u128)),
        ("sliding_log", "5r/h", "{ zone = \"fleet\" }", None),
        // The previous hour's count weighs in: a fresh key has none.
        ("sliding_window", "5r/h", "{ zone = \"fleet\" }", None),
    ];
    for (algorithm, rate, reference, window) in cases {
        let sections = format!("{NO_ACCESS_LOG}\n\n{}", redis_store(&redis.url(), "timeout = \"1s\""));
        let rest = format!(
            "[[limit_req_zone]]\nname = \"fleet\"\nkey = \"header:X-Key\"\nrate = \"{rate}\"\nalgorithm = \"{algorithm}\"\n\n\
             [[route]]\nname = \"api\"\npath_prefix = \"/api/\"\nupstream = \"app\"\nlimit_req = [ {reference} ]\n"
        );
        let config = with_app("", &sections, up.addr(), &rest);
        let fleet = [Weir::start(&config), Weir::start(&config)];
        let addrs: Vec<SocketAddr> = fleet.iter().map(|w| w.addr).collect();
        let hits_before = up.hits();
        let t0 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        // 4 threads × 15 requests at once over both instances, on a key of its own.
        let samples = hammer(&addrs, algorithm, 4, Duration::ZERO, |i| i < 15);
        let t1 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        assert_only_200_and_429(&samples);
        let admitted = samples.iter().filter(|s| s.status() == Some(200)).count();
        println!("{algorithm}: 2 instances, {} requests, {admitted} admitted", samples.len());
        if window.is_some_and(|w| crosses_window(t0, t1, w)) {
            // A new window opened mid-test (once an hour at most): the model then allows 5 more.
            assert!((5..=10).contains(&admitted), "{algorithm} across a window boundary: {admitted}");
        } else {
            assert_eq!(admitted, 5, "{algorithm}: the model admits 5 for the whole fleet, not 5 per instance");
        }
        assert_eq!(up.hits() - hits_before, admitted, "{algorithm}: only admitted requests reach the upstream");
    }
}
