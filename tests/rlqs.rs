//! Envoy's rate limit quota service (RLQS, `[[rls.domain.bucket]]`) of the real `weir` binary,
//! driven by clients that behave as Envoy's `rate_limit_quota` filter does (its
//! `global_client_impl.cc`): each keeps its own token bucket per assignment, reports allowed and
//! denied every interval on one stream, and applies assignments as Envoy does (an unchanged one
//! keeps its bucket; a changed one starts a new bucket as full as the old one was, in proportion;
//! time to live in whole seconds; DENY_ALL before the first assignment and after one expires, the
//! strict `no_assignment_behavior` docs/rlqs.md recommends). Weir on one Redis, or two on one.

use crate::support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use support::redis_server::RedisServer;
use support::weir::Weir;
use tonic::transport::Channel;
use weir::rls::proto::quota::{
    bucket_action, BlanketRule, BucketId, BucketQuotaUsage, RateLimitQuotaServiceClient, RateLimitQuotaUsageReports,
    Strategy,
};

/// The zone divided in every test: 60 r/s, burst 29 (so 30 tokens at once).
const RATE: f64 = 60.0;
const CAPACITY: f64 = 30.0;
/// The Envoys report every 2 s here (Envoy's filter: every 5 s).
const INTERVAL: Duration = Duration::from_secs(2);

fn config(redis: &RedisServer) -> String {
    format!(
        r#"[server]
admin = "$LISTEN2"

[store]
kind = "redis"
url = "{}"
timeout = "2s"

[log]
access_log = false

[[limit_req_zone]]
name = "api"
rate = "60r/s"

[rls]
listen = ["$LISTEN"]
quota_report_interval = "2s"

[[rls.domain]]
name = "edge"

[[rls.domain.bucket]]
id = {{ name = "api" }}
zone = "api"
burst = 29

[[rls.domain.bucket]]
id = {{ name = "open" }}
unlimited = true
"#,
        redis.url()
    )
}

fn bucket(name: &str) -> BucketId {
    BucketId { bucket: [("name".to_string(), name.to_string())].into_iter().collect() }
}

/// Envoy's token bucket (`AtomicTokenBucketImpl`): continuous fill, starts as told.
#[derive(Debug, Clone)]
struct Tokens {
    /// (max_tokens, tokens_per_fill, fill_interval seconds): what Envoy compares.
    config: (u32, u32, i64),
    max: f64,
    per_second: f64,
    tokens: f64,
    at: Instant,
}

impl Tokens {
    fn refill(&mut self, now: Instant) {
        self.tokens = (self.tokens + self.per_second * now.duration_since(self.at).as_secs_f64()).min(self.max);
        self.at = now;
    }
}

#[derive(Debug, Clone)]
enum Assignment {
    None,
    Allow,
    Deny,
    Bucket(Tokens),
}

/// What one simulated Envoy knows and counts.
struct EnvoyState {
    assignment: Assignment,
    expires: Option<Instant>,
    /// Since the last report.
    allowed: u64,
    denied: u64,
    /// Every admitted request's time.
    admitted: Vec<Instant>,
    /// Tokens that appeared without filling: a new bucket's initial tokens, a replaced bucket's
    /// gain (the bound's burst terms).
    minted: f64,
    /// The fill rate in force (0 without a token bucket), for the shares.
    granted: f64,
    abandoned: u32,
}

impl EnvoyState {
    fn new() -> Self {
        EnvoyState {
            assignment: Assignment::None,
            expires: None,
            allowed: 0,
            denied: 0,
            admitted: Vec::new(),
            minted: 0.0,
            granted: 0.0,
            abandoned: 0,
        }
    }

    fn expire(&mut self, now: Instant) {
        if self.expires.is_some_and(|e| now >= e) {
            // No expired_assignment_behavior: back to the no-assignment default (DENY_ALL here).
            self.assignment = Assignment::None;
            self.expires = None;
            self.granted = 0.0;
        }
    }

    fn request(&mut self, now: Instant) -> bool {
        self.expire(now);
        let admitted = match &mut self.assignment {
            Assignment::Allow => true,
            Assignment::None | Assignment::Deny => false,
            Assignment::Bucket(t) => {
                t.refill(now);
                if t.tokens >= 1.0 {
                    t.tokens -= 1.0;
                    true
                } else {
                    false
                }
            }
        };
        if admitted {
            self.allowed += 1;
            self.admitted.push(now);
        } else {
            self.denied += 1;
        }
        admitted
    }

    fn apply(&mut self, action: bucket_action::BucketAction, now: Instant) {
        self.expire(now);
        match action {
            bucket_action::BucketAction::AbandonAction(_) => {
                self.abandoned += 1;
                self.assignment = Assignment::None;
                self.expires = None;
                self.granted = 0.0;
            }
            bucket_action::BucketAction::QuotaAssignmentAction(a) => {
                let ttl = a.assignment_time_to_live.map_or(0, |d| d.seconds.max(0) as u64);
                self.expires = Some(now + Duration::from_secs(ttl));
                match a.rate_limit_strategy.and_then(|s| s.strategy) {
                    Some(Strategy::BlanketRule(r)) => {
                        self.granted = 0.0;
                        self.assignment =
                            if r == BlanketRule::DenyAll as i32 { Assignment::Deny } else { Assignment::Allow };
                    }
                    Some(Strategy::TokenBucket(tb)) => {
                        let fill = tb.fill_interval.expect("fill_interval");
                        assert!(fill.seconds >= 1 && fill.nanos == 0, "Envoy reads whole seconds: {fill:?}");
                        let tpf = tb.tokens_per_fill.expect("tokens_per_fill");
                        assert!(tb.max_tokens > 0 && tpf > 0, "Envoy refuses zeros: {tb:?}");
                        let config = (tb.max_tokens, tpf, fill.seconds);
                        let max = tb.max_tokens as f64;
                        let per_second = tpf as f64 / fill.seconds as f64;
                        self.granted = per_second;
                        match &mut self.assignment {
                            Assignment::Bucket(t) if t.config == config => {} // extended, bucket kept
                            old => {
                                let tokens = match old {
                                    Assignment::Bucket(t) => {
                                        t.refill(now);
                                        let tokens = max * (t.tokens / t.max);
                                        self.minted += (tokens - t.tokens).max(0.0);
                                        tokens
                                    }
                                    _ => {
                                        self.minted += max;
                                        max
                                    }
                                };
                                *old = Assignment::Bucket(Tokens { config, max, per_second, tokens, at: now });
                            }
                        }
                    }
                    None => panic!("an assignment without a strategy"),
                }
            }
        }
    }
}

/// One simulated Envoy: its stream to `addr`, its bucket `name`, its demand over time.
struct Envoy {
    state: Arc<Mutex<EnvoyState>>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Option<tonic::Status>>,
}

/// Demand in requests per second at a time since the start.
type Demand = Arc<dyn Fn(Duration) -> f64 + Send + Sync>;

async fn connect(addr: SocketAddr) -> RateLimitQuotaServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to the rls at {addr}: {e}"));
    RateLimitQuotaServiceClient::new(channel)
}

impl Envoy {
    fn start(addr: SocketAddr, name: &str, start: Instant, demand: Demand) -> Envoy {
        let state = Arc::new(Mutex::new(EnvoyState::new()));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let (shared, name) = (state.clone(), name.to_string());
        let task = tokio::spawn(async move {
            let mut client = connect(addr).await;
            let (tx, rx) = tokio::sync::mpsc::channel::<RateLimitQuotaUsageReports>(16);
            let outbound = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
            let mut inbound = match client.stream_rate_limit_quotas(outbound).await {
                Ok(response) => response.into_inner(),
                // Refused at once (a bound): the status is the Envoy's end.
                Err(status) => return Some(status),
            };
            let reader_state = shared.clone();
            let reader = tokio::spawn(async move {
                loop {
                    match inbound.message().await {
                        Ok(Some(response)) => {
                            let now = Instant::now();
                            let mut s = reader_state.lock().unwrap();
                            for action in response.bucket_action {
                                s.apply(action.bucket_action.expect("an action"), now);
                            }
                        }
                        Ok(None) => return None,
                        Err(status) => return Some(status),
                    }
                }
            });
            let report = |s: &mut EnvoyState, elapsed: Duration| RateLimitQuotaUsageReports {
                domain: "edge".into(),
                bucket_quota_usages: vec![BucketQuotaUsage {
                    bucket_id: Some(bucket(&name)),
                    // Envoy sends whole seconds.
                    time_elapsed: Some(prost_types::Duration { seconds: elapsed.as_secs() as i64, nanos: 0 }),
                    num_requests_allowed: std::mem::take(&mut s.allowed),
                    num_requests_denied: std::mem::take(&mut s.denied),
                }],
            };
            let step = Duration::from_millis(5);
            let mut owed = 0.0f64;
            let mut last = Instant::now();
            let mut last_report: Option<Instant> = None;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(step) => {}
                    _ = stopped.changed() => break,
                }
                let now = Instant::now();
                owed += demand(now.duration_since(start)) * now.duration_since(last).as_secs_f64();
                last = now;
                let message = {
                    let mut s = shared.lock().unwrap();
                    let mut first = None;
                    while owed >= 1.0 {
                        owed -= 1.0;
                        s.request(now);
                        if last_report.is_none() && first.is_none() {
                            // The first request of a bucket is reported at once (the subscription).
                            first = Some(report(&mut s, Duration::ZERO));
                        }
                    }
                    match (first, last_report) {
                        (Some(m), _) => Some(m),
                        (None, Some(at)) if now.duration_since(at) >= INTERVAL => Some(report(&mut s, now - at)),
                        _ => None,
                    }
                };
                if let Some(m) = message {
                    last_report = Some(now);
                    if tx.send(m).await.is_err() {
                        break;
                    }
                }
                if reader.is_finished() {
                    break;
                }
            }
            drop(tx);
            if reader.is_finished() {
                reader.await.ok().flatten()
            } else {
                reader.abort();
                None
            }
        });
        Envoy { state, stop, task }
    }

    fn granted(&self) -> f64 {
        self.state.lock().unwrap().granted
    }

    fn admitted_between(&self, from: Instant, to: Instant) -> usize {
        self.state.lock().unwrap().admitted.iter().filter(|&&t| t >= from && t < to).count()
    }

    /// Stops reporting and sending (the Envoy is gone); its stream's status if it had ended.
    async fn stop(self) -> (Option<tonic::Status>, EnvoyState) {
        let _ = self.stop.send(true);
        let status = tokio::time::timeout(Duration::from_secs(10), self.task).await.expect("stops").expect("no panic");
        let state = std::mem::replace(&mut *self.state.lock().unwrap(), EnvoyState::new());
        (status, state)
    }
}

fn constant(r: f64) -> Demand {
    Arc::new(move |_| r)
}

/// The most admitted in any window of `window` over all `times` (sorted here).
fn most_in_window(times: &mut [Instant], window: Duration) -> usize {
    times.sort();
    let (mut best, mut from) = (0, 0);
    for to in 0..times.len() {
        while times[to].duration_since(times[from]) >= window {
            from += 1;
        }
        best = best.max(to + 1 - from);
    }
    best
}

/// The exact limiter's bound over `window`: capacity + rate·window.
fn exact_bound(window: Duration) -> f64 {
    CAPACITY + RATE * window.as_secs_f64()
}

/// Three Envoys of unequal demand that shifts halfway, two on one Weir and one on another, both
/// on one Redis: together they admit within one limiter's bound plus the stated burst terms, and
/// each one's share follows its demand.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_envoys_on_two_weirs_share_one_limit_by_demand() {
    let redis = RedisServer::start();
    let cfg = config(&redis);
    let (w1, w2) = (Weir::start(&cfg), Weir::start(&cfg));
    let start = Instant::now();
    let half = Duration::from_secs(8);
    let shift = |before: f64, after: f64| -> Demand { Arc::new(move |t| if t < half { before } else { after }) };
    let a = Envoy::start(w1.addr, "api", start, shift(10.0, 120.0));
    let b = Envoy::start(w1.addr, "api", start, shift(30.0, 30.0));
    let c = Envoy::start(w2.addr, "api", start, shift(120.0, 10.0));
    tokio::time::sleep(2 * half).await;
    let end = Instant::now();
    // Each share follows demand: the last 4 s of each half (the division needs an interval or two).
    let phase = |from: Duration, to: Duration| (start + from, start + to);
    let (p1, p2) = (phase(Duration::from_secs(4), half), phase(half + Duration::from_secs(4), 2 * half));
    let rate = |e: &Envoy, (f, t): (Instant, Instant)| e.admitted_between(f, t) as f64 / (t - f).as_secs_f64();
    let (a1, b1, c1) = (rate(&a, p1), rate(&b, p1), rate(&c, p1));
    let (a2, b2, c2) = (rate(&a, p2), rate(&b, p2), rate(&c, p2));
    println!("first half (demand 10/30/120): admitted {a1:.1} {b1:.1} {c1:.1} r/s");
    println!("second half (demand 120/30/10): admitted {a2:.1} {b2:.1} {c2:.1} r/s");
    assert!(c1 > 1.5 * a1 && c1 >= 20.0, "c asks most first: {a1} {b1} {c1}");
    assert!(a1 >= 5.0, "a's small demand is (mostly) met: {a1}");
    assert!(a2 > 1.5 * c2 && a2 >= 20.0, "a asks most then: {a2} {b2} {c2}");
    assert!(b1 >= 15.0 && b2 >= 15.0, "b keeps a fair share: {b1} {b2}");
    let mut states = Vec::new();
    for e in [a, b, c] {
        let (status, state) = e.stop().await;
        assert!(status.is_none(), "no stream ended with an error: {status:?}");
        states.push(state);
    }
    let minted: f64 = states.iter().map(|s| s.minted).sum();
    let mut all: Vec<Instant> = states.iter().flat_map(|s| s.admitted.iter().copied()).collect();
    let total = all.len() as f64;
    let run = end - start;
    // The bound (docs/rlqs.md): capacity + rate·τ + the burst terms beyond the first capacity
    // (tokens new buckets started with or replaced ones gained) + the old rates for one
    // answer's flight (generously 200 ms).
    let extra = (minted - CAPACITY).max(0.0) + RATE * 0.2;
    println!(
        "admitted {total} in {:.1} s: {:.3} of one limiter's {:.0}; burst terms {minted:.1} tokens",
        run.as_secs_f64(),
        total / exact_bound(run),
        exact_bound(run)
    );
    assert!(total <= exact_bound(run) + extra, "admitted {total} > {} + {extra}", exact_bound(run));
    assert!(total >= 0.75 * RATE * run.as_secs_f64(), "the division leaves the limit unused: {total}");
    for window in [Duration::from_secs(1), Duration::from_secs(3)] {
        let most = most_in_window(&mut all, window) as f64;
        println!("most in any {window:?}: {most} (one limiter: {:.0})", exact_bound(window));
        assert!(most <= exact_bound(window) + extra, "{most} in {window:?}");
    }
    // The cost per report: the ledger's two script calls, as Weir measured them.
    for w in [&w1, &w2] {
        let m = support::metrics::scrape(w.addrs[1]);
        let label = [("domain", "edge")];
        let (sum, count) = (
            m.must("weir_rlqs_ledger_duration_seconds_sum", &label),
            m.must("weir_rlqs_ledger_duration_seconds_count", &label),
        );
        let reports = m.must("weir_rlqs_reports_total", &label);
        // Reports plus the clamped buckets' rechecks.
        println!("ledger: {count} ledger steps for {reports} reports received, {:.0} µs each", 1e6 * sum / count);
        assert!(count >= 8.0, "{count} ledger steps for {reports} reports");
        assert!(m.must("weir_rlqs_assignments_total", &label) >= 1.0);
    }
    // Redis's own time per script call (all of them are the ledger's here).
    let mut conn = redis::Client::open(redis.url()).expect("url").get_connection().expect("connect");
    let info: String = redis::cmd("INFO").arg("commandstats").query(&mut conn).expect("INFO");
    let evalsha = info.lines().find(|l| l.starts_with("cmdstat_evalsha:")).unwrap_or("none");
    println!("redis: {evalsha}");
    drop((w1, w2));
}

/// `GET /rlqs` of one Weir: its divided keys with their holders.
fn live_view(admin: SocketAddr) -> serde_json::Value {
    let r = support::http::get(admin, "/rlqs");
    assert_eq!(r.status, 200, "GET /rlqs: {}", r.summary());
    r.json()
}

/// The shares `GET /rlqs` shows for this instance's holders, smallest first.
fn shown_shares(key: &serde_json::Value) -> Vec<f64> {
    let mut shares: Vec<f64> = key["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .filter(|h| h["here"] == true)
        .map(|h| h["rate_per_s"].as_f64().expect("rate_per_s"))
        .collect();
    shares.sort_by(f64::total_cmp);
    shares
}

/// The live view (`GET /rlqs`): each Weir shows the divided key with its own Envoys' streams and
/// the fleet's holder count from the ledger, and the shares it shows are the ones its Envoys hold;
/// an Envoy whose stream ended leaves its Weir's list.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_live_view_shows_each_keys_envoys_and_their_shares() {
    let redis = RedisServer::start();
    let cfg = config(&redis);
    let (w1, w2) = (Weir::start(&cfg), Weir::start(&cfg));
    let start = Instant::now();
    let a = Envoy::start(w1.addr, "api", start, constant(15.0));
    let b = Envoy::start(w1.addr, "api", start, constant(100.0));
    let c = Envoy::start(w2.addr, "api", start, constant(100.0));
    // Until the division has settled and both views agree with what the Envoys were granted (an
    // answer is recorded just before it is sent: a poll may fall between the two).
    let deadline = Instant::now() + Duration::from_secs(25);
    let (view1, view2) = loop {
        let (v1, v2) = (live_view(w1.addrs[1]), live_view(w2.addrs[1]));
        let mut here1 = vec![a.granted(), b.granted()];
        here1.sort_by(f64::total_cmp);
        // Settled: every holder has reported a full interval (a first report's demand is one
        // request's), and the shares shown are the ones held.
        let agree = |view: &serde_json::Value, expected: &[f64], here: u64| {
            let key = &view["keys"][0];
            let measured = key["holders"]
                .as_array()
                .is_some_and(|hs| hs.iter().all(|h| h["demand_per_s"].as_f64().is_some_and(|d| d >= 5.0)));
            measured
                && key["holders_here"] == here
                && key["holders_fleet"] == 3
                && expected.iter().all(|g| *g > 0.0)
                && shown_shares(key).len() == expected.len()
                && shown_shares(key).iter().zip(expected).all(|(s, g)| (s - g).abs() < 1e-6)
        };
        if agree(&v1, &here1, 2) && agree(&v2, &[c.granted()], 1) {
            break (v1, v2);
        }
        assert!(
            Instant::now() < deadline,
            "the live views never matched the grants ({here1:?}, {}):\n{v1:#}\n{v2:#}",
            c.granted()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("GET /rlqs on the first Weir: {view1:#}");
    for view in [&view1, &view2] {
        assert_eq!(view["enabled"], true);
        assert_eq!(view["store"], "redis");
        assert_eq!(view["keys_total"], 1, "{view:#}");
        let key = &view["keys"][0];
        assert_eq!((key["domain"].as_str(), key["zone"].as_str()), (Some("edge"), Some("api")));
        assert!(key["key"].as_str().unwrap().starts_with("sha256:"), "a descriptor-keyed zone's key is hashed");
        assert_eq!(key["budget"]["rate_per_s"], RATE);
        let holders = key["holders"].as_array().unwrap();
        assert_eq!(holders.len(), 3, "its own holders and the ledger's others: {key:#}");
        let granted: f64 = holders.iter().map(|h| h["rate_per_s"].as_f64().unwrap()).sum();
        assert!(granted <= RATE + 1e-6, "the shares shown sum within the rate: {granted}");
        // Demand follows what the Envoys ask: a's 15 r/s is the smallest.
        let least = holders.iter().map(|h| h["demand_per_s"].as_f64().unwrap()).fold(f64::MAX, f64::min);
        assert!((5.0..=25.0).contains(&least), "a's demand about 15 r/s: {least}");
    }
    assert_eq!(view1["streams"], 2);
    assert_eq!(view2["streams"], 1);
    // The admin listener's checks hold here too: a page rebound to 127.0.0.1 cannot read it.
    let rebound = support::http::get_with(w1.addrs[1], "/rlqs", &[("Host", "evil.example")]);
    assert_eq!(rebound.status, 403, "{}", rebound.summary());
    let (status, _) = a.stop().await;
    assert!(status.is_none(), "{status:?}");
    let left = Instant::now() + Duration::from_secs(10);
    loop {
        let view = live_view(w1.addrs[1]);
        if view["keys"][0]["holders_here"] == 1 && view["streams"] == 1 {
            break;
        }
        assert!(Instant::now() < left, "the stopped Envoy is still listed here: {view:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for e in [b, c] {
        let (status, _) = e.stop().await;
        assert!(status.is_none(), "{status:?}");
    }
}

/// An Envoy that stops reporting has its share handed to the others within two intervals of the
/// report it missed (its assignment's time to live, plus one of their reports).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_envoys_share_goes_to_the_others_within_two_intervals() {
    let redis = RedisServer::start();
    let cfg = config(&redis);
    let (w1, w2) = (Weir::start(&cfg), Weir::start(&cfg));
    let start = Instant::now();
    let a = Envoy::start(w1.addr, "api", start, constant(100.0));
    let b = Envoy::start(w2.addr, "api", start, constant(100.0));
    let c = Envoy::start(w2.addr, "api", start, constant(100.0));
    // Equal demand, about equal shares: a few intervals to settle (more on a loaded machine).
    let settled = Instant::now() + Duration::from_secs(20);
    let (before_a, before_b, before_c) = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let shares = (a.granted(), b.granted(), c.granted());
        if [shares.0, shares.1, shares.2].iter().all(|g| (0.2 * RATE..=0.5 * RATE).contains(g)) {
            break shares;
        }
        assert!(Instant::now() < settled, "equal demand, shares still {shares:?} after 20 s");
    };
    println!("shares before: {before_a} {before_b} {before_c} r/s, {:?} after the start", start.elapsed());
    assert!(before_a + before_b + before_c <= RATE + 1e-9, "shares sum within the rate");
    let (_, _) = c.stop().await;
    let silent = Instant::now();
    // Its next report was due within an interval; the others hold (nearly) all within two more.
    let deadline = silent + INTERVAL + 2 * INTERVAL + Duration::from_millis(500);
    let taken = loop {
        let sum = a.granted() + b.granted();
        if sum >= 0.9 * RATE {
            break Instant::now() - silent;
        }
        assert!(Instant::now() < deadline, "after {:?}, a + b hold {sum} of {RATE}", silent.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!("a and b hold {:.1} r/s {taken:?} after c went silent", a.granted() + b.granted());
    assert!(a.granted() + b.granted() <= RATE + 1e-9);
    for e in [a, b] {
        let (status, _) = e.stop().await;
        assert!(status.is_none(), "{status:?}");
    }
    drop((w1, w2));
}

/// A malformed stream is ended with INVALID_ARGUMENT naming what is wrong, and a stream beside it
/// (same connection's service, same Weir) goes on getting assignments; unlimited buckets get
/// ALLOW_ALL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_stream_is_refused_and_its_neighbour_is_undisturbed() {
    let redis = RedisServer::start();
    let w = Weir::start(&config(&redis));
    let start = Instant::now();
    let good = Envoy::start(w.addr, "api", start, constant(20.0));
    let open = Envoy::start(w.addr, "open", start, constant(20.0));
    let bad_cases: Vec<(RateLimitQuotaUsageReports, &str)> = vec![
        (RateLimitQuotaUsageReports { domain: String::new(), bucket_quota_usages: vec![] }, "name its domain"),
        (
            RateLimitQuotaUsageReports {
                domain: "edge".into(),
                bucket_quota_usages: vec![BucketQuotaUsage { bucket_id: None, ..Default::default() }],
            },
            "without its bucket_id",
        ),
        (
            RateLimitQuotaUsageReports {
                domain: "edge".into(),
                bucket_quota_usages: vec![BucketQuotaUsage {
                    bucket_id: Some(BucketId { bucket: HashMap::new() }),
                    ..Default::default()
                }],
            },
            "no entries",
        ),
        (RateLimitQuotaUsageReports { domain: "nope".into(), bucket_quota_usages: vec![] }, "no [[rls.domain]]"),
    ];
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (message, expected) in bad_cases {
        let mut client = connect(w.addr).await;
        let outbound = futures_util::stream::iter(vec![message]).chain(futures_util::stream::pending());
        let mut inbound = client.stream_rate_limit_quotas(outbound).await.expect("stream opens").into_inner();
        let status = tokio::time::timeout(Duration::from_secs(10), inbound.message())
            .await
            .expect("an answer")
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(expected), "{expected:?} in {status:?}");
    }
    // A stream that changes its domain is refused too.
    let mut client = connect(w.addr).await;
    let first = RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: vec![BucketQuotaUsage { bucket_id: Some(bucket("x")), ..Default::default() }],
    };
    let second = RateLimitQuotaUsageReports { domain: "other".into(), bucket_quota_usages: vec![] };
    let outbound = futures_util::stream::iter(vec![first, second]).chain(futures_util::stream::pending());
    let mut inbound = client.stream_rate_limit_quotas(outbound).await.expect("opens").into_inner();
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(10), inbound.message()).await.expect("an answer") {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("ended without a status"),
            Err(s) => break s,
        }
    };
    assert!(status.message().contains("open another stream"), "{status:?}");
    // Refusals are counted, by configured domains only: a caller's domain never becomes a label.
    let m = support::metrics::scrape(w.addrs[1]);
    assert!(m.must("weir_rlqs_streams_refused_total", &[("domain", "-")]) >= 2.0);
    assert!(m.must("weir_rlqs_streams_refused_total", &[("domain", "edge")]) >= 2.0);
    assert!(!m.filtered().contains("nope"), "an unknown domain became a label:\n{}", m.filtered());
    // The neighbour kept its assignment all along and goes on admitting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = Instant::now();
    let recent = good.admitted_between(now - Duration::from_secs(2), now);
    assert!(recent >= 30, "the good stream admits its 20 r/s: {recent} in 2 s");
    assert!(good.granted() > 0.0);
    let open_recent = open.admitted_between(now - Duration::from_secs(2), now);
    assert!(open_recent >= 30, "ALLOW_ALL admits everything: {open_recent}");
    for e in [good, open] {
        let (status, _) = e.stop().await;
        assert!(status.is_none(), "{status:?}");
    }
}

/// On the memory store (one instance, the ledger in process) the division is the same; a stream
/// past `max_quota_streams` is refused RESOURCE_EXHAUSTED and the open ones go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_divides_and_streams_are_capped() {
    let cfg = r#"[log]
access_log = false

[[limit_req_zone]]
name = "api"
rate = "60r/s"

[rls]
listen = ["$LISTEN"]
quota_report_interval = "2s"
max_quota_streams = 2

[[rls.domain]]
name = "edge"

[[rls.domain.bucket]]
id = { name = "api" }
zone = "api"
burst = 29
"#;
    let w = Weir::start(cfg);
    let start = Instant::now();
    let a = Envoy::start(w.addr, "api", start, constant(100.0));
    let b = Envoy::start(w.addr, "api", start, constant(100.0));
    let settled = Instant::now() + Duration::from_secs(20);
    while !(a.granted() >= 0.3 * RATE && b.granted() >= 0.3 * RATE) {
        assert!(Instant::now() < settled, "shares {} {}", a.granted(), b.granted());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(a.granted() + b.granted() <= RATE + 1e-9, "{} + {}", a.granted(), b.granted());
    let third = Envoy::start(w.addr, "api", start, constant(100.0));
    let (status, _) = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if third.task.is_finished() {
                break third.stop().await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the third stream is refused");
    let status = status.expect("a status");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("max_quota_streams"), "{status:?}");
    let now = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let recent =
        a.admitted_between(now, now + Duration::from_secs(2)) + b.admitted_between(now, now + Duration::from_secs(2));
    assert!(recent >= 60, "the open streams go on admitting: {recent} in 2 s");
    for e in [a, b] {
        let (status, _) = e.stop().await;
        assert!(status.is_none(), "{status:?}");
    }
}

/// The end of a stream that sends `messages` (then waits): its status.
async fn refusal(addr: SocketAddr, messages: Vec<RateLimitQuotaUsageReports>) -> tonic::Status {
    let mut client = connect(addr).await;
    let outbound = futures_util::stream::iter(messages).chain(futures_util::stream::pending());
    let mut inbound = client.stream_rate_limit_quotas(outbound).await.expect("opens").into_inner();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), inbound.message()).await.expect("an end in time") {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("ended without a status"),
            Err(status) => break status,
        }
    }
}

/// Hostile input through the real binary: a stream past `max_quota_buckets`, and one that reports
/// far more often than once an interval, are ended with RESOURCE_EXHAUSTED naming the bound, and
/// a well-behaved stream beside them keeps its assignment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_past_the_bucket_and_report_bounds_are_ended() {
    let cfg = r#"[server]
admin = "$LISTEN2"

[log]
access_log = false

[[limit_req_zone]]
name = "api"
rate = "60r/s"

[rls]
listen = ["$LISTEN"]
quota_report_interval = "5s"
max_quota_buckets = 2

[[rls.domain]]
name = "edge"

[[rls.domain.bucket]]
id = { name = "*" }
zone = "api"
burst = 29
"#;
    let w = Weir::start(cfg);
    let good = Envoy::start(w.addr, "api", Instant::now(), constant(20.0));
    let usage = |name: &str| BucketQuotaUsage { bucket_id: Some(bucket(name)), ..Default::default() };
    let report = |names: &[&str]| RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: names.iter().map(|n| usage(n)).collect(),
    };
    let status = refusal(w.addr, vec![report(&["a", "b", "c"])]).await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("max_quota_buckets"), "{status:?}");
    // 16 + 2 × max_quota_buckets messages an interval are allowed; the next ends the stream.
    let flood: Vec<RateLimitQuotaUsageReports> = (0..21).map(|_| report(&["a"])).collect();
    let status = refusal(w.addr, flood).await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("reports in one report interval"), "{status:?}");
    let m = support::metrics::scrape(w.addrs[1]);
    assert!(m.must("weir_rlqs_streams_refused_total", &[("domain", "edge")]) >= 2.0);
    // The neighbour was assigned and goes on admitting.
    let deadline = Instant::now() + Duration::from_secs(10);
    while good.granted() == 0.0 {
        assert!(Instant::now() < deadline, "the good stream got no share");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = good.stop().await;
    assert!(status.is_none(), "{status:?}");
}

/// `lua/rlqs_demand.lua` and its in-process twin (`MemoryLedger`) answer a random sequence of
/// reports, claims and leaves alike, on the same clock (the script given `now`, as with
/// `clock = "local"`).
#[test]
fn the_ledger_script_is_its_in_process_twin() {
    use weir::limit::{Clock, ManualClock, Rate};
    use weir::rls::quota::assign::{Budget, Grant};
    use weir::rls::quota::MemoryLedger;

    let redis = RedisServer::start();
    let mut conn = redis::Client::open(redis.url()).expect("url").get_connection().expect("connect");
    let script = redis::Script::new(include_str!("../lua/rlqs_demand.lua"));
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let memory = MemoryLedger::new(clock.clone());
    let budget = Budget::of(Rate::parse("50r/s").unwrap(), 12);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (life, stale) = (Duration::from_millis(3000), Duration::from_millis(1500));
    for step in 0..600 {
        clock.advance_us(1000 * (next() % 700));
        let now_ms = clock.now_us() / 1000;
        let holder = format!("h{}", next() % 4);
        let demand = (next() % 100_000) as f64 / 1000.0;
        let mut call = script.key("weir:rlqs:z:{k}");
        match next() % 10 {
            0 => {
                let _: Vec<String> =
                    call.arg("leave").arg(now_ms).arg(&holder).arg(0).invoke(&mut conn).expect("leave");
                memory.leave("z", b"k", &holder);
            }
            1..=4 => {
                let reply: Vec<String> = call
                    .arg("report")
                    .arg(now_ms)
                    .arg(&holder)
                    .arg(life.as_millis() as u64)
                    .arg(format!("{demand:.3}"))
                    .arg(stale.as_millis() as u64)
                    .invoke(&mut conn)
                    .expect("report");
                let mut lua: Vec<(String, String, u64, u64)> = reply
                    .chunks(4)
                    .map(|c| {
                        (
                            c[0].clone(),
                            format!("{:.3}", c[1].parse::<f64>().unwrap()),
                            c[2].parse().unwrap(),
                            c[3].parse().unwrap(),
                        )
                    })
                    .collect();
                let mut rust: Vec<(String, String, u64, u64)> = memory
                    .report("z", b"k", &holder, demand, life, stale)
                    .into_iter()
                    .map(|h| (h.id, format!("{:.3}", h.demand), h.grant.tokens_per_fill, h.grant.max_tokens))
                    .collect();
                lua.sort();
                rust.sort();
                assert_eq!(lua, rust, "report at step {step}");
            }
            _ => {
                let want = Grant { tokens_per_fill: next() % 150, max_tokens: next() % 15 };
                let reply: Vec<String> = call
                    .arg("claim")
                    .arg(now_ms)
                    .arg(&holder)
                    .arg(life.as_millis() as u64)
                    .arg(format!("{demand:.3}"))
                    .arg(want.tokens_per_fill)
                    .arg(want.max_tokens)
                    .arg(budget.rate_tokens)
                    .arg(budget.max_tokens)
                    .invoke(&mut conn)
                    .expect("claim");
                let rust = memory.claim("z", b"k", &holder, demand, want, &budget, life);
                assert_eq!(
                    reply,
                    vec![rust.tokens_per_fill.to_string(), rust.max_tokens.to_string()],
                    "claim at step {step}"
                );
            }
        }
    }
}
