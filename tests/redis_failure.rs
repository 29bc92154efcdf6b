//! The `weir` binary when its Redis fails: killed under load, paused, restarted on the same port.
//! Every failure policy (`allow`, `deny`, `local` with `fleet_size`), the decision time while
//! Redis is gone, the circuit breaker closing by itself, and the deny cache against a flood.
//! Real weir, real `redis-server` (killed and restarted), real upstream, real sockets.

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use support::admin;
use support::config::{redis_store, with_app, NO_ACCESS_LOG};
use support::http::{self, statuses, summaries, Conn, KeepAlive, Request, Response};
use support::metrics::{self, Scrape};
use support::poll::wait_until;
use support::redis_cmd::{exists, script_calls};
use support::redis_server::RedisServer;
use support::upstream::Upstream;
use support::weir::Weir;

/// Bound on one request at the client: a hang shows up as an error, never as a stuck test.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// What "fast" means for a decision bounded by a 50 ms store timeout: generous for a loaded CI box,
/// and far below the 3 s of a paused Redis.
const FAST: Duration = Duration::from_secs(1);
/// How long metrics may take to show requests already answered (they are counted in `logging`).
const SETTLE: Duration = Duration::from_secs(10);
/// How often to look again while waiting for something.
const POLL: Duration = Duration::from_millis(25);

/// `[server]` with the admin listener on `$LISTEN2`, no access log, a Redis `[store]` at `url`
/// with `store_extra` lines, one upstream "app" pointing at `up`, then `rest`.
fn config(up: &Upstream, url: &str, store_extra: &str, rest: &str) -> String {
    let sections = format!("{NO_ACCESS_LOG}\n\n{}", redis_store(url, store_extra));
    with_app(admin::LISTEN, &sections, up.addr(), rest)
}

// ---------------------------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------------------------

/// The metrics of `w` (see [`config`] for its admin listener).
fn scrape(w: &Weir) -> Scrape {
    metrics::scrape(admin::addr(w))
}

/// Scrapes until `ok` holds (bounded by [`SETTLE`]); returns the last scrape either way.
fn scrape_until(w: &Weir, ok: impl Fn(&Scrape) -> bool) -> Scrape {
    metrics::scrape_until(admin::addr(w), SETTLE, POLL, ok).unwrap_or_else(|last| last)
}

/// The scrape's `weir_` series without histogram buckets and upstream series, for assertion
/// messages.
fn brief(m: &Scrape) -> String {
    m.text
        .lines()
        .filter(|l| l.starts_with("weir_") && !l.contains("_bucket{") && !l.starts_with("weir_upstream"))
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------------------------
// Load: client threads on keep-alive connections, every request timed
// ---------------------------------------------------------------------------------------------

/// Where a load thread sends its requests (round robin over the targets).
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    path: String,
    headers: Vec<(String, String)>,
}

impl Target {
    fn new(addr: SocketAddr, path: &str) -> Target {
        Target { addr, path: path.to_string(), headers: Vec::new() }
    }

    fn header(mut self, name: &str, value: &str) -> Target {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    fn request(&self) -> Request {
        self.headers.iter().fold(Request::get(&self.path), |r, (n, v)| r.header(n, v))
    }
}

/// One request as the client saw it.
#[derive(Debug, Clone)]
struct Sample {
    /// Index into the load's targets.
    target: usize,
    sent: Instant,
    done: Instant,
    /// The response, or the transport error (reset, timeout, EOF) as text.
    reply: Result<Reply, String>,
}

#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    retry_after: Option<String>,
    /// The `"error"` field of a JSON body.
    error: Option<String>,
    summary: String,
}

impl Sample {
    fn latency(&self) -> Duration {
        self.done - self.sent
    }

    fn status(&self) -> Option<u16> {
        self.reply.as_ref().ok().map(|r| r.status)
    }

    fn describe(&self, t0: Instant) -> String {
        let at = self.sent.saturating_duration_since(t0);
        match &self.reply {
            Ok(r) => format!("target {} sent at {at:?}, took {:?}: {}", self.target, self.latency(), r.summary),
            Err(e) => format!("target {} sent at {at:?}, took {:?}: ERROR {e}", self.target, self.latency()),
        }
    }
}

fn reply_of(r: &Response) -> Reply {
    let error = serde_json::from_slice::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string));
    Reply { status: r.status, retry_after: r.header("retry-after"), error, summary: r.summary() }
}

struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<Vec<Sample>>>,
    /// (target, sent) of each answered request so far: what the test waits on instead of a time.
    answered: Arc<Mutex<Vec<(usize, Instant)>>>,
}

/// How long the load may take to produce the requests a phase of a test asks for.
const LOAD_BOUND: Duration = Duration::from_secs(15);

impl Load {
    /// `threads` client threads, each cycling over `targets` (starting at a different one) on its
    /// own keep-alive connections, sleeping `pace` between requests.
    fn start(targets: &[Target], threads: usize, pace: Duration) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answered: Arc<Mutex<Vec<(usize, Instant)>>> = Arc::default();
        let targets = Arc::new(targets.to_vec());
        let threads = (0..threads)
            .map(|t| {
                let (stop, targets, answered) = (stop.clone(), targets.clone(), answered.clone());
                thread::spawn(move || {
                    let mut conns: Vec<KeepAlive> =
                        targets.iter().map(|t| KeepAlive::new(t.addr, REQUEST_TIMEOUT)).collect();
                    let mut samples = Vec::new();
                    let mut i = t;
                    while !stop.load(Ordering::SeqCst) {
                        let k = i % targets.len();
                        i += 1;
                        let req = targets[k].request();
                        let sent = Instant::now();
                        let result = conns[k].send(&req);
                        let done = Instant::now();
                        let reply = match result {
                            Ok(r) => Ok(reply_of(&r)),
                            Err(e) => Err(format!("{:?}: {e}", e.kind())),
                        };
                        samples.push(Sample { target: k, sent, done, reply });
                        answered.lock().unwrap_or_else(|p| p.into_inner()).push((k, sent));
                        thread::sleep(pace);
                    }
                    samples
                })
            })
            .collect();
        Load { stop, threads, answered }
    }

    /// Answered requests so far that `counts` (target, sent) accepts.
    fn count(&self, counts: impl Fn(usize, Instant) -> bool) -> usize {
        self.answered.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|&&(k, sent)| counts(k, sent)).count()
    }

    /// Waits (bounded by [`LOAD_BOUND`]) until `n` answered requests are accepted by `counts`.
    fn wait_for(&self, what: &str, n: usize, counts: impl Fn(usize, Instant) -> bool) {
        let seen = wait_until(LOAD_BOUND, POLL, || self.count(&counts) >= n);
        assert!(seen.is_some(), "{what}: {} of {n} requests answered within {LOAD_BOUND:?}", self.count(&counts));
    }

    /// Stops the threads and returns every sample, in order of sending.
    fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        let mut all: Vec<Sample> = self.threads.into_iter().flat_map(|t| t.join().expect("load thread")).collect();
        all.sort_by_key(|s| s.sent);
        all
    }
}

/// The `q` quantile (0..=1) of `durations`, nearest rank.
fn quantile(durations: &[Duration], q: f64) -> Duration {
    assert!(!durations.is_empty(), "no samples");
    let mut v = durations.to_vec();
    v.sort();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn latency_report(samples: &[&Sample]) -> String {
    let l: Vec<Duration> = samples.iter().map(|s| s.latency()).collect();
    if l.is_empty() {
        return "n=0".to_string();
    }
    format!("n={} p50={:?} p99={:?} max={:?}", l.len(), quantile(&l, 0.5), quantile(&l, 0.99), l.iter().max().unwrap())
}

/// Panics with the first few offenders when any sample fails `ok`.
fn assert_all(samples: &[&Sample], t0: Instant, what: &str, ok: impl Fn(&Sample) -> bool) {
    let bad: Vec<String> = samples.iter().filter(|s| !ok(s)).map(|s| s.describe(t0)).collect();
    assert!(
        bad.is_empty(),
        "{what}: {} of {} requests fail it; first ones:\n{}",
        bad.len(),
        samples.len(),
        bad.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// Whether `key` is in Redis, on a fresh connection (Redis may have been restarted).
fn redis_exists(server: &RedisServer, key: &str) -> bool {
    exists(&mut server.connection(), key)
}

/// Sends `path` until it is forwarded (bounded): the first decision also connects to Redis and
/// loads the script, within the same timeout, which a loaded machine may miss. The statuses seen.
fn warm_up(w: &Weir, path: &str) -> Vec<u16> {
    let mut statuses = Vec::new();
    let ok = wait_until(Duration::from_secs(5), POLL, || {
        statuses.push(http::get(w.addr, path).status);
        statuses.last() == Some(&200)
    });
    assert!(ok.is_some(), "{path} never forwarded with Redis up: {statuses:?}");
    statuses
}

// ---------------------------------------------------------------------------------------------
// 1. Redis killed under load: allow, deny (custom and default status)
// ---------------------------------------------------------------------------------------------

#[test]
fn redis_killed_under_load_allow_forwards_everything_and_deny_rejects_fast() {
    let up = Upstream::start();
    let mut redis = RedisServer::start();
    // Store default "deny"; one route overrides it with "allow". The limit never rejects (1r/s with
    // a huge burst; its key lives >= 1 s, so Redis' state can be seen): every non-200 below is the
    // failure policy's.
    let w = Weir::start(&config(
        &up,
        &redis.url(),
        r#"timeout = "250ms"
on_error = "deny""#,
        r#"
[[limit_req_zone]]
name = "loose"
key = "ip"
rate = "1r/s"

[[route]]
name = "open"
path_prefix = "/open/"
upstream = "app"
on_error = "allow"
limit_req = [ { zone = "loose", burst = 1000000, nodelay = true } ]

[[route]]
name = "closed"
path_prefix = "/closed/"
upstream = "app"
limit_req_status = 503
limit_req = [ { zone = "loose", burst = 1000000, nodelay = true } ]

[[route]]
name = "closed429"
path_prefix = "/closed429/"
upstream = "app"
limit_req = [ { zone = "loose", burst = 1000000, nodelay = true } ]
"#,
    ));
    let targets =
        [Target::new(w.addr, "/open/x"), Target::new(w.addr, "/closed/x"), Target::new(w.addr, "/closed429/x")];
    // Warm-up requests on /closed/: 200, or 503 if the first decision missed its timeout.
    let warm = warm_up(&w, "/closed/x");
    let warm_denied = warm.iter().filter(|&&s| s == 503).count() as f64;
    let hits_before = up.hits();
    let t0 = Instant::now();
    let load = Load::start(&targets, 4, Duration::from_millis(2));
    // Each target answered 20 times while Redis decides.
    for target in 0..targets.len() {
        load.wait_for(&format!("target {target} with Redis up"), 20, |k, _| k == target);
    }
    assert!(redis_exists(&redis, "weir:loose:{127.0.0.1}"), "Redis decided while it was up");
    let before_kill = Instant::now();
    redis.stop();
    let killed = Instant::now();
    // Each target answered 60 times with Redis dead, and the breaker said so meanwhile.
    let opened = wait_until(LOAD_BOUND, POLL, || scrape(&w).value_or_zero("weir_store_circuit_open", &[]) == 1.0);
    assert!(opened.is_some(), "weir_store_circuit_open never 1 within {LOAD_BOUND:?} of Redis dying");
    for target in 0..targets.len() {
        load.wait_for(&format!("target {target} with Redis dead"), 60, |k, sent| k == target && sent >= killed);
    }
    let circuit_while_down = scrape(&w).value_or_zero("weir_store_circuit_open", &[]);
    let samples = load.finish();

    let all: Vec<&Sample> = samples.iter().collect();
    let on = |target: usize| -> Vec<&Sample> { samples.iter().filter(|s| s.target == target).collect() };
    let after_kill: Vec<&Sample> = samples.iter().filter(|s| s.sent >= killed).collect();
    println!(
        "redis killed under load: {} requests ({} before the kill, {} after); latency after the kill: {}",
        samples.len(),
        samples.iter().filter(|s| s.done < before_kill).count(),
        after_kill.len(),
        latency_report(&after_kill)
    );
    assert_all(&all, t0, "no transport error (reset, EOF, timeout) ever", |s| s.reply.is_ok());
    assert!(samples.iter().filter(|s| s.done < before_kill).count() >= 50, "too little load before the kill");
    assert!(after_kill.len() >= 150, "too little load after the kill: {}", after_kill.len());

    // allow: every request forwarded, Redis or not.
    assert_all(&on(0), t0, "on_error = \"allow\": every request is forwarded (200)", |s| s.status() == Some(200));
    // deny: forwarded while Redis decides, the route's status once it cannot.
    for (target, status) in [(1, 503), (2, 429)] {
        let before: Vec<&Sample> = on(target).into_iter().filter(|s| s.done < before_kill).collect();
        assert_all(&before, t0, "deny route while Redis is up: 200", |s| s.status() == Some(200));
        let after: Vec<&Sample> = on(target).into_iter().filter(|s| s.sent >= killed).collect();
        assert!(after.len() >= 50, "too few requests on target {target} after the kill");
        assert_all(&after, t0, &format!("on_error = \"deny\" with Redis dead: {status} limiter_unavailable"), |s| {
            s.reply.as_ref().is_ok_and(|r| {
                r.status == status
                    && r.retry_after.as_deref() == Some("1")
                    && r.error.as_deref() == Some("limiter_unavailable")
            })
        });
    }
    assert_all(&after_kill, t0, &format!("answered within {FAST:?} with Redis dead"), |s| s.latency() < FAST);

    // Every 200 came from the upstream, and nothing else reached it.
    let ok = samples.iter().filter(|s| s.status() == Some(200)).count();
    assert_eq!(up.hits() - hits_before, ok, "upstream hits = 200 responses");

    // The metrics tell the same story.
    assert_eq!(circuit_while_down, 1.0, "weir_store_circuit_open while Redis is dead");
    let count = |target: usize, status: u16| on(target).iter().filter(|s| s.status() == Some(status)).count() as f64;
    let (closed503, closed429) = (count(1, 503) + warm_denied, count(2, 429));
    let requests = (samples.len() + warm.len()) as f64;
    let m = scrape_until(&w, |m| m.sum("weir_requests_total", &[]) >= requests);
    let brief = brief(&m);
    assert_eq!(m.sum("weir_requests_total", &[]), requests, "{brief}");
    assert_eq!(
        m.value_or_zero("weir_requests_total", &[("route", "closed"), ("outcome", "fail_closed")]),
        closed503,
        "{brief}"
    );
    assert_eq!(
        m.value_or_zero("weir_requests_total", &[("route", "closed429"), ("outcome", "fail_closed")]),
        closed429,
        "{brief}"
    );
    assert_eq!(m.value_or_zero("weir_store_fallback_total", &[("policy", "deny")]), closed503 + closed429, "{brief}");
    let fail_open = m.value_or_zero("weir_requests_total", &[("route", "open"), ("outcome", "fail_open")]);
    let open_after = on(0).iter().filter(|s| s.sent >= killed).count() as f64;
    assert!(fail_open >= open_after, "every /open/ request after the kill is fail_open: {open_after}\n{brief}");
    assert_eq!(m.value_or_zero("weir_store_fallback_total", &[("policy", "allow")]), fail_open, "{brief}");
    assert_eq!(
        m.value_or_zero("weir_requests_total", &[("route", "open"), ("outcome", "passed")]) + fail_open,
        on(0).len() as f64,
        "{brief}"
    );
    let errors = m.sum("weir_store_errors_total", &[("store", "redis")]);
    assert_eq!(errors, fail_open + closed503 + closed429, "one store error per fallback\n{brief}");
    assert!(
        m.value_or_zero("weir_store_errors_total", &[("store", "redis"), ("cause", "circuit_open")]) > 0.0,
        "{brief}"
    );
}

// ---------------------------------------------------------------------------------------------
// 1b. Redis down: the local policy enforces this instance's share of the limit
// ---------------------------------------------------------------------------------------------

#[test]
fn redis_killed_local_policy_enforces_the_instances_share() {
    let up = Upstream::start();
    let mut redis = RedisServer::start();
    let rest = |burst: u32| {
        format!(
            r#"
[[limit_req_zone]]
name = "tight"
key = "header:X-Client"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ {{ zone = "tight", burst = {burst}, nodelay = true }} ]
"#
        )
    };
    // `on_error` left out: "local" is the default.
    let whole = Weir::start(&config(&up, &redis.url(), "timeout = \"250ms\"\nfleet_size = 1", &rest(2)));
    // A third of burst 5 is 1 (rounded down): 2 pass locally. Never talks to a live Redis.
    let third = Weir::start(&config(&up, &redis.url(), "timeout = \"250ms\"\nfleet_size = 3", &rest(5)));

    // Redis up: Redis decides (3 pass, then 429) and holds the state.
    let rs: Vec<Response> = (0..4).map(|_| http::get_with(whole.addr, "/api/x", &[("X-Client", "a")])).collect();
    assert_eq!(statuses(&rs), [200, 200, 200, 429], "{:#?}", summaries(&rs));
    assert!(redis_exists(&redis, "weir:tight:{a}"));
    assert_eq!(scrape(&whole).sum("weir_store_fallback_total", &[]), 0.0);

    redis.stop();
    let hits_before = up.hits();
    let killed = Instant::now();
    // Several threads through the outage, for a client Redis never rejected (one it did is in the
    // deny cache, see the last test): the local limit admits exactly burst + 1 = 3, then rejects
    // with the usual rate-limit response.
    let load = Load::start(&[Target::new(whole.addr, "/api/x").header("X-Client", "b")], 4, Duration::from_millis(2));
    load.wait_for("the local policy's load", 100, |_, _| true);
    let samples = load.finish();
    let all: Vec<&Sample> = samples.iter().collect();
    println!("local policy, redis dead: {} requests, latency {}", samples.len(), latency_report(&all));
    assert_all(&all, killed, "no transport error", |s| s.reply.is_ok());
    assert!(samples.len() >= 100, "too little load: {}", samples.len());
    let passed = samples.iter().filter(|s| s.status() == Some(200)).count();
    assert_eq!(passed, 3, "local limit with fleet_size 1: burst 2 + 1 pass while Redis is down");
    assert_all(&all, killed, "otherwise 429 rate_limited with Retry-After", |s| {
        s.reply.as_ref().is_ok_and(|r| {
            r.status == 200
                || (r.status == 429 && r.error.as_deref() == Some("rate_limited") && r.retry_after.is_some())
        })
    });
    assert_all(&all, killed, &format!("answered within {FAST:?}"), |s| s.latency() < FAST);
    assert_eq!(up.hits() - hits_before, 3, "upstream saw the 3 locally admitted requests");
    let m = scrape_until(&whole, |m| m.sum("weir_requests_total", &[]) >= (4 + samples.len()) as f64);
    assert_eq!(
        m.value_or_zero("weir_store_fallback_total", &[("policy", "local")]),
        samples.len() as f64,
        "{}",
        brief(&m)
    );
    assert_eq!(
        m.value_or_zero("weir_requests_total", &[("route", "api"), ("outcome", "passed")]),
        3.0 + 3.0,
        "{}",
        brief(&m)
    );

    // fleet_size = 3: rate 1r/m becomes 1 per 3 minutes, burst 5 becomes 1.
    let rs: Vec<Response> = (0..5).map(|_| http::get_with(third.addr, "/api/x", &[("X-Client", "c")])).collect();
    assert_eq!(
        statuses(&rs),
        [200, 200, 429, 429, 429],
        "fleet_size 3 gives burst 5 / 3 = 1 locally: {:#?}",
        summaries(&rs)
    );
    let ra: u64 = rs[2].header("retry-after").expect("Retry-After").parse().unwrap();
    assert!((170..=180).contains(&ra), "the local rate is 1r/m / 3 = 1 per 180 s: Retry-After {ra}");

    // Redis back on the same port: both instances return to Redis decisions by themselves, also
    // the one that never had a connection. A client the local limit rejects passes again: the new
    // Redis has a fresh bucket for it.
    redis.restart();
    let restarted = Instant::now();
    for (w, client) in [(&whole, "b"), (&third, "c")] {
        let key = format!("weir:tight:{{{client}}}");
        let took = wait_until(Duration::from_secs(5), POLL, || {
            http::get_with(w.addr, "/api/x", &[("X-Client", client)]).status == 200 && redis_exists(&redis, &key)
        });
        let took = took.unwrap_or_else(|| {
            panic!(
                "no Redis decision for {client:?} within 5 s of Redis restarting; circuit_open={}",
                scrape(w).value_or_zero("weir_store_circuit_open", &[])
            )
        });
        println!("local policy: Redis decides again {took:?} after the restart (client {client:?})");
        assert_eq!(scrape(w).value_or_zero("weir_store_circuit_open", &[]), 0.0);
    }
    assert!(restarted.elapsed() < Duration::from_secs(10));
}

// ---------------------------------------------------------------------------------------------
// 2 + 3. Decision time while Redis is dead, then recovery on its own
// ---------------------------------------------------------------------------------------------

#[test]
fn decisions_stay_within_the_timeout_while_redis_is_dead_and_redis_takes_over_again() {
    let up = Upstream::start();
    let mut redis = RedisServer::start();
    let w = Weir::start(&config(
        &up,
        &redis.url(),
        "timeout = \"50ms\"\non_error = \"deny\"",
        r#"
[[limit_req_zone]]
name = "loose"
key = "ip"
rate = "1r/s"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req_status = 503
limit_req = [ { zone = "loose", burst = 1000000, nodelay = true } ]
"#,
    ));
    let key = "weir:loose:{127.0.0.1}";
    let t0 = Instant::now();
    let load = Load::start(&[Target::new(w.addr, "/api/x")], 4, Duration::from_millis(1));
    load.wait_for("load with Redis up", 50, |_, _| true);
    assert!(redis_exists(&redis, key));
    let killing = Instant::now();
    redis.stop();
    let killed = Instant::now();
    // The circuit opens after 3 consecutive failures: note when the metrics show it.
    let opened =
        wait_until(Duration::from_secs(5), POLL, || scrape(&w).value_or_zero("weir_store_circuit_open", &[]) == 1.0)
            .expect("the circuit opens within 5 s of Redis dying");
    // Load against the open circuit (what `dead` below asserts on).
    load.wait_for("load with the circuit open", 200, |_, sent| sent >= killed + opened);

    redis.restart();
    let restarted = Instant::now();
    // Recovery: the probe closes the circuit and requests create their key in the new, empty Redis.
    let recovered = wait_until(Duration::from_secs(5), POLL, || {
        scrape(&w).value_or_zero("weir_store_circuit_open", &[]) == 0.0 && redis_exists(&redis, key)
    });
    let back = Instant::now();
    load.wait_for("load after the recovery", 20, |_, sent| sent >= back);
    let samples = load.finish();

    let all: Vec<&Sample> = samples.iter().collect();
    let up_phase: Vec<&Sample> = samples.iter().filter(|s| s.done < killed).collect();
    let dead: Vec<&Sample> = samples.iter().filter(|s| s.sent >= killed && s.done < restarted).collect();
    // In flight at the kill, or sent before the metrics showed the circuit open.
    let first_failures: Vec<&Sample> =
        samples.iter().filter(|s| s.done >= killing && s.sent < killed + opened).collect();
    // Every request that met the dead Redis (in flight at the kill included).
    let met_dead: Vec<&Sample> = samples.iter().filter(|s| s.done >= killing && s.sent < restarted).collect();
    let open_circuit: Vec<&Sample> = dead.iter().copied().filter(|s| s.sent >= killed + opened).collect();
    let after: Vec<&Sample> = samples.iter().filter(|s| s.sent >= back).collect();
    println!(
        "redis dead (timeout 50ms): circuit open seen {opened:?} after the kill; recovered {recovered:?} after restart"
    );
    println!("  redis up:                     {}", latency_report(&up_phase));
    println!("  dead, before the circuit open: {}", latency_report(&first_failures));
    println!("  dead, circuit open:            {}", latency_report(&open_circuit));
    println!("  dead, all:                     {}", latency_report(&met_dead));

    assert_all(&all, t0, "no transport error (reset, EOF, timeout) ever", |s| s.reply.is_ok());
    assert!(dead.len() >= 200, "too little load while Redis was dead: {}", dead.len());
    assert_all(&dead, t0, "Redis dead: 503 limiter_unavailable", |s| {
        s.reply.as_ref().is_ok_and(|r| r.status == 503 && r.error.as_deref() == Some("limiter_unavailable"))
    });
    let p99 = quantile(&met_dead.iter().map(|s| s.latency()).collect::<Vec<_>>(), 0.99);
    assert!(p99 < FAST, "p99 latency while Redis is dead: {p99:?}");
    assert_all(&met_dead, t0, "no request waits more than 2 s while Redis is dead", |s| {
        s.latency() < Duration::from_secs(2)
    });
    if !first_failures.is_empty() {
        let p99 = quantile(&first_failures.iter().map(|s| s.latency()).collect::<Vec<_>>(), 0.99);
        assert!(p99 < FAST, "p99 latency before the circuit opened: {p99:?}");
    }

    let recovered = recovered.unwrap_or_else(|| {
        panic!(
            "no recovery within 5 s of Redis restarting: circuit_open={}, key in Redis: {}\n{}",
            scrape(&w).value_or_zero("weir_store_circuit_open", &[]),
            redis_exists(&redis, key),
            w.stderr().lines().rev().take(20).collect::<Vec<_>>().join("\n")
        )
    });
    assert!(recovered < Duration::from_secs(5));
    // Redis decides again. With a 50 ms budget a loaded machine may miss one now and then (the
    // policy answers it, as it should), so this asks for nearly all, not all.
    let forwarded = after.iter().filter(|s| s.status() == Some(200)).count();
    println!("  after recovery: {forwarded} of {} forwarded", after.len());
    assert!(
        after.len() >= 20 && forwarded * 100 >= after.len() * 95,
        "after recovery: {forwarded} of {} forwarded",
        after.len()
    );
    assert_all(&after, t0, "after recovery: 200, or 503 limiter_unavailable on a missed budget", |s| {
        s.reply.as_ref().is_ok_and(|r| r.status == 200 || r.error.as_deref() == Some("limiter_unavailable"))
    });

    // Every decision, failed or not, stayed within its 50 ms budget (buckets: 0.05, 0.1, 0.25, 0.5).
    let m = scrape_until(&w, |m| m.sum("weir_requests_total", &[]) >= samples.len() as f64);
    let count = m.value_or_zero("weir_store_request_duration_seconds_count", &[("store", "redis")]);
    let within =
        |le: &str| m.value_or_zero("weir_store_request_duration_seconds_bucket", &[("store", "redis"), ("le", le)]);
    println!(
        "  store decisions: {count}, within 50 ms: {}, 100 ms: {}, 250 ms: {}, 500 ms: {}",
        within("0.05"),
        within("0.1"),
        within("0.25"),
        within("0.5")
    );
    assert!(count >= samples.len() as f64, "one store decision per request");
    assert_eq!(within("0.5"), count, "a store decision took over 500 ms with timeout = \"50ms\"");

    // A second outage: the breaker opens again and a new probe closes it again.
    redis.stop();
    let second = wait_until(Duration::from_secs(5), POLL, || {
        let _ = http::send(w.addr, &Request::get("/api/x"));
        scrape(&w).value_or_zero("weir_store_circuit_open", &[]) == 1.0
    });
    assert!(second.is_some(), "the circuit opens again on a second outage");
    redis.restart();
    let again = wait_until(Duration::from_secs(5), POLL, || {
        let _ = http::send(w.addr, &Request::get("/api/x"));
        scrape(&w).value_or_zero("weir_store_circuit_open", &[]) == 0.0 && redis_exists(&redis, key)
    });
    println!("  second outage: circuit open after {second:?}, Redis decides again {again:?} after the restart");
    assert!(again.is_some(), "no recovery within 5 s of the second restart");
    let r = http::get(w.addr, "/api/x");
    assert_eq!(r.status, 200, "{}", r.summary());
}

// ---------------------------------------------------------------------------------------------
// 4. A paused Redis behaves like a dead one
// ---------------------------------------------------------------------------------------------

#[test]
fn a_paused_redis_is_answered_by_the_policy_not_waited_for() {
    let up = Upstream::start();
    let redis = RedisServer::start();
    let w = Weir::start(&config(
        &up,
        &redis.url(),
        "timeout = \"250ms\"\non_error = \"deny\"",
        r#"
[[limit_req_zone]]
name = "loose"
key = "ip"
rate = "1r/s"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req_status = 503
limit_req = [ { zone = "loose", burst = 1000000, nodelay = true } ]
"#,
    ));
    let _ = warm_up(&w, "/api/x");
    let t0 = Instant::now();
    let load = Load::start(&[Target::new(w.addr, "/api/x")], 3, Duration::from_millis(2));
    load.wait_for("load with Redis serving", 30, |_, _| true);
    // On a connection of its own: Redis stops serving every client for 3 s.
    let mut control = redis.connection();
    let pause_sent = Instant::now();
    let () = redis::cmd("CLIENT").arg("PAUSE").arg(3000).arg("ALL").query(&mut control).unwrap();
    let paused = Instant::now();
    let pause_ends = pause_sent + Duration::from_millis(3000);
    // The breaker opens while Redis is paused (3 timeouts of 250 ms), and 100 requests meet it.
    let circuit_during_pause = metrics::scrape_until(admin::addr(&w), Duration::from_millis(2500), POLL, |m| {
        m.value_or_zero("weir_store_circuit_open", &[]) == 1.0
    })
    .unwrap_or_else(|last| last)
    .value_or_zero("weir_store_circuit_open", &[]);
    let surely_paused = pause_ends - Duration::from_millis(500);
    load.wait_for("load during the pause", 100, |_, sent| sent >= paused && sent < surely_paused);
    // The pause is over when Redis answers this client again (it is paused too).
    let _: String = redis::cmd("PING").query(&mut control).expect("PING once the pause is over");
    let recovered =
        wait_until(Duration::from_secs(8), POLL, || scrape(&w).value_or_zero("weir_store_circuit_open", &[]) == 0.0);
    let back = Instant::now();
    load.wait_for("load after the pause", 20, |_, sent| sent >= back);
    let samples = load.finish();

    let all: Vec<&Sample> = samples.iter().collect();
    let before: Vec<&Sample> = samples.iter().filter(|s| s.done < pause_sent).collect();
    // Sent while Redis was surely paused, with 0.5 s to spare before it resumed.
    let during: Vec<&Sample> = samples.iter().filter(|s| s.sent >= paused && s.sent < surely_paused).collect();
    let after: Vec<&Sample> = samples.iter().filter(|s| s.sent >= back).collect();
    let closed_after_pause = back.saturating_duration_since(pause_ends);
    println!(
        "paused redis (CLIENT PAUSE 3000 ALL, timeout 250ms): during the pause {}; circuit closed {:?} after the \
         pause ended",
        latency_report(&during),
        closed_after_pause
    );
    assert_all(&all, t0, "no transport error (reset, EOF, timeout) ever", |s| s.reply.is_ok());
    assert_all(&before, t0, "Redis up: 200", |s| s.status() == Some(200));
    assert!(during.len() >= 100, "too little load during the pause: {}", during.len());
    assert_all(&during, t0, "Redis paused: 503 limiter_unavailable by the policy", |s| {
        s.reply.as_ref().is_ok_and(|r| r.status == 503 && r.error.as_deref() == Some("limiter_unavailable"))
    });
    assert_all(&during, t0, &format!("Redis paused: answered within {FAST:?}, not after the pause"), |s| {
        s.latency() < FAST
    });
    let p99 = quantile(&during.iter().map(|s| s.latency()).collect::<Vec<_>>(), 0.99);
    assert!(p99 < Duration::from_millis(800), "p99 during the pause (timeout 250 ms): {p99:?}");
    assert_eq!(circuit_during_pause, 1.0, "the circuit is open while Redis is paused");
    assert!(recovered.is_some(), "the circuit closes once the pause is over");
    assert!(closed_after_pause < Duration::from_secs(5), "closed {closed_after_pause:?} after the pause ended");
    assert!(!after.is_empty());
    assert_all(&after, t0, "after the pause: forwarded again (200)", |s| s.status() == Some(200));
    // The decision lane gave up on the connection whose calls Redis left unanswered for its stall
    // limit (4 × the timeout, at least 1 s) rather than queueing behind it.
    assert!(
        w.stderr().contains("Redis left a call unanswered for 1s"),
        "no stalled decision connection dropped during the 3 s pause:\n{}",
        w.stderr()
    );
}

// ---------------------------------------------------------------------------------------------
// 5. The deny cache: a flood costs Redis a few calls, and admits exactly what Redis alone would
// ---------------------------------------------------------------------------------------------

struct FloodResult {
    statuses: Vec<u16>,
    /// Offsets from the first request of each admitted one.
    admitted_at: Vec<Duration>,
    script_calls: u64,
    deny_cache_hits: f64,
    took: Duration,
    rejections: Vec<Response>,
}

/// Requests with the same key, one every `every` (or as fast as they come back when late), on one
/// keep-alive connection, until `lasting` has passed since the first, against a weir of its own
/// with `deny_cache_size`. Ending by the clock rather than after a count keeps what is admitted
/// the same however slow a loaded machine makes the requests.
fn flood(deny_cache_size: u32, lasting: Duration, every: Duration) -> FloodResult {
    let up = Upstream::start();
    let redis = RedisServer::start();
    let w = Weir::start(&config(
        &up,
        &redis.url(),
        &format!("timeout = \"500ms\"\ndeny_cache_size = {deny_cache_size}"),
        r#"
[[limit_req_zone]]
name = "per_client"
key = "header:X-Client"
rate = "1r/s"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_client", burst = 0, nodelay = true } ]
"#,
    ));
    // Warm the connection and the script cache on another key.
    let warm = http::get_with(w.addr, "/api/warm", &[("X-Client", "warm-up")]);
    assert_eq!(warm.status, 200, "{}", warm.summary());
    let calls_before = script_calls(&mut redis.connection());
    let mut conn = Conn::connect_timeout(w.addr, REQUEST_TIMEOUT).unwrap();
    let req = Request::get("/api/flood").header("X-Client", "flooder");
    let start = Instant::now();
    let mut statuses = Vec::new();
    let mut admitted_at = Vec::new();
    let mut rejections = Vec::new();
    for i in 0.. {
        let due = start + every * i;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let sent = Instant::now();
        if sent - start >= lasting {
            break;
        }
        let r = conn.send(&req).unwrap_or_else(|e| panic!("flood request {i}: {e}"));
        if r.status == 200 {
            admitted_at.push(sent - start);
        } else if rejections.len() < 50 {
            rejections.push(r.clone());
        }
        statuses.push(r.status);
    }
    let took = start.elapsed();
    let script_calls = script_calls(&mut redis.connection()) - calls_before;
    let m = scrape_until(&w, |m| m.sum("weir_requests_total", &[]) >= (statuses.len() + 1) as f64);
    FloodResult {
        statuses,
        admitted_at,
        script_calls,
        deny_cache_hits: m.value_or_zero("weir_deny_cache_hits_total", &[]),
        took,
        rejections,
    }
}

#[test]
fn the_deny_cache_spares_redis_a_flood_and_admits_exactly_the_same() {
    // Up to 500 requests over 2.5 s at 1r/s, burst 0: admitted at 0, ~1 s and ~2 s in both runs.
    // No request is sent past 2.5 s, half a second before a fourth could pass, so the count is
    // exact however late a loaded machine answers.
    let (lasting, every) = (Duration::from_millis(2500), Duration::from_millis(5));
    let cached = thread::spawn(move || flood(10_000, lasting, every));
    let uncached = flood(0, lasting, every);
    let cached = cached.join().expect("flood with the deny cache");
    let admitted = |r: &FloodResult| r.statuses.iter().filter(|&&s| s == 200).count();
    println!(
        "deny cache flood: {} requests over {:?}: admitted {} at {:?}, {} script calls, {} cache hits; without \
         the cache ({} requests over {:?}): admitted {} at {:?}, {} script calls",
        cached.statuses.len(),
        cached.took,
        admitted(&cached),
        cached.admitted_at,
        cached.script_calls,
        cached.deny_cache_hits,
        uncached.statuses.len(),
        uncached.took,
        admitted(&uncached),
        uncached.admitted_at,
        uncached.script_calls
    );
    for r in [&cached, &uncached] {
        assert!(r.statuses.iter().all(|&s| s == 200 || s == 429), "only 200 and 429: {:?}", r.statuses);
        for rej in &r.rejections {
            let retry: u64 = rej.header("retry-after").and_then(|v| v.parse().ok()).unwrap_or(0);
            assert!(rej.status == 429 && retry == 1, "rejection: {}", rej.summary());
            assert!(rej.text().contains("\"rate_limited\""), "rejection: {}", rej.summary());
        }
        // Enough requests for the cache to matter: a run whose requests all came back late fails
        // loudly here rather than passing on a handful.
        assert!(r.statuses.len() >= 100, "only {} requests in {lasting:?}: the machine is too slow", r.statuses.len());
    }
    assert_eq!(admitted(&cached), admitted(&uncached), "the deny cache changes what is admitted");
    assert_eq!(admitted(&cached), 3, "1r/s burst 0 over 2.5 s admits at 0, 1 and 2 s: {:?}", cached.admitted_at);

    // Without the cache every request is a script call; with it about two per retry period.
    let n = uncached.statuses.len() as u64;
    assert!(
        (n..=n + 2).contains(&uncached.script_calls),
        "without the deny cache: {} script calls for {n} requests",
        uncached.script_calls
    );
    let bound = 5 + 2 * cached.took.as_secs_f64().ceil() as u64;
    assert!(cached.script_calls <= bound, "with the deny cache: {} script calls, bound {bound}", cached.script_calls);
    let n = cached.statuses.len();
    assert!(
        cached.deny_cache_hits + cached.script_calls as f64 >= n as f64,
        "every request not sent to Redis is a cache hit: {} hits + {} calls < {n}",
        cached.deny_cache_hits,
        cached.script_calls
    );
    assert_eq!(uncached.deny_cache_hits, 0.0);
}
