//! Leased zones (docs/leases.md) through the real binary: `weir check` refuses what cannot lease
//! and prints the bound; 4 real instances on one real redis-server, an upstream that timestamps
//! what it admits: the measured excess over `burst + 1 + rate·τ` (every τ, every pair of
//! admissions) stays within the printed bound, Redis is called far less than once per decision,
//! Redis stopped (SIGSTOP) for twice the lifetime admits only what leases held (`on_error =
//! "deny"` adds nothing); the rate limit service answers a leased zone without a Redis call.

use crate::support;

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use support::config::{redis_store, with_app, NO_ACCESS_LOG};
use support::http::{KeepAlive, Request};
use support::redis_cmd::script_calls;
use support::redis_server::RedisServer;
use support::upstream::Upstream;
use support::weir::{check_config, Weir};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn config_with(zone_extra: &str, reference: &str) -> String {
    format!(
        r#"[server]
listen = ["127.0.0.1:8080"]

[store]
kind = "redis"
url = "redis://127.0.0.1:6379/0"

[[upstream]]
name = "app"
servers = ["127.0.0.1:9000"]

[[limit_req_zone]]
name = "api"
key = "ip"
rate = "100r/s"
lease = {{ tokens = 10, lifetime = "200ms" }}
{zone_extra}

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
limit_req = [ {reference} ]
"#
    )
}

#[test]
fn weir_check_refuses_what_cannot_lease_and_prints_the_bound() {
    let ok =
        check_config("ok.toml", &config_with("", r#"{ zone = "api", burst = 50, nodelay = true }"#), REQUEST_TIMEOUT);
    assert!(ok.code == Some(0), "{}", ok.describe());
    assert!(
        ok.stdout.contains(
            "at most 51 + 100/s·τ + min(4·10, 100/s·0.2s) = 51 + 100/s·τ + 20 in any interval τ with 4 instances"
        ),
        "{}",
        ok.describe()
    );
    let refusals = [
        (config_with("", r#"{ zone = "api", burst = 50 }"#), "use `nodelay`"),
        (config_with("", r#"{ zone = "api", burst = 50, delay = 5 }"#), "queued burst"),
        (config_with("count_statuses = [200]", r#"{ zone = "api", burst = 50, nodelay = true }"#), "count_statuses"),
        (config_with("", r#"{ zone = "api", burst = 5, nodelay = true }"#), "lease.tokens (10) is more than the 6"),
        (
            config_with("algorithm = \"sliding_log\"", r#"{ zone = "api" }"#)
                .replace("rate = \"100r/s\"", "window = \"1s\"\nlimit = 50"),
            "sliding log",
        ),
        (
            config_with("", r#"{ zone = "api", burst = 50, nodelay = true }"#)
                + "\n[[limit_conn_zone]]\nname = \"c\"\nkey = \"ip\"\nlease = { tokens = 1, lifetime = \"1s\" }\n",
            "limit_conn zone counts requests in flight",
        ),
    ];
    for (text, reason) in refusals {
        let out = check_config("bad.toml", &text, REQUEST_TIMEOUT);
        assert!(out.code == Some(1) && out.stderr.contains(reason), "expected {reason:?}: {}", out.describe());
    }
    // The fleet size is the flag's; the memory store's note says the lease does nothing there.
    let memory = config_with("", r#"{ zone = "api", burst = 50, nodelay = true }"#)
        .replace("kind = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"", "kind = \"memory\"");
    let dir = support::weir::ConfigDir::new();
    let path = dir.write("memory.toml", &memory);
    let out = support::weir::run(["check", "--instances", "16", "-c", path.to_str().expect("path")], REQUEST_TIMEOUT);
    assert!(out.code == Some(0), "{}", out.describe());
    assert!(
        out.stdout.contains("min(16·10, 100/s·0.2s)") && out.stdout.contains("ignored on the memory store"),
        "{}",
        out.describe()
    );
}

/// One member of the fleet: zone `hot` (leased leaky bucket), zone `calm` (leased, far above the
/// load), both keyed by `X-Key`, on_error deny.
fn member(up: &Upstream, url: &str) -> Weir {
    let sections = format!("{NO_ACCESS_LOG}\n\n{}", redis_store(url, "timeout = \"100ms\"\non_error = \"deny\""));
    let zones = r#"[[limit_req_zone]]
name = "hot"
key = "header:X-Key"
rate = "100r/s"
lease = { tokens = 10, lifetime = "500ms" }

[[limit_req_zone]]
name = "calm"
key = "header:X-Key"
rate = "5000r/s"
lease = { tokens = 100, lifetime = "1s" }

[[route]]
name = "hot"
path_prefix = "/hot"
upstream = "app"
limit_req = [ { zone = "hot", burst = 50, nodelay = true } ]

[[route]]
name = "calm"
path_prefix = "/calm"
upstream = "app"
limit_req = [ { zone = "calm", burst = 5000, nodelay = true } ]
"#;
    Weir::start(&with_app("", &sections, up.addr(), zones))
}

/// Every instance's client sends `path` with `X-Key: key` for `duration`, `pause` apart;
/// returns the statuses seen.
fn load(addrs: &[SocketAddr], path: &str, key: &str, duration: Duration, pause: Duration) -> Vec<u16> {
    let start = Arc::new(Barrier::new(addrs.len()));
    let handles: Vec<_> = addrs
        .iter()
        .map(|&addr| {
            let (start, path, key) = (start.clone(), path.to_string(), key.to_string());
            thread::spawn(move || {
                let mut conn = KeepAlive::new(addr, REQUEST_TIMEOUT);
                let mut statuses = vec![];
                start.wait();
                let until = Instant::now() + duration;
                while Instant::now() < until {
                    match conn.send(&Request::get(&path).header("X-Key", &key)) {
                        Ok(r) => statuses.push(r.status),
                        Err(_) => statuses.push(0),
                    }
                    thread::sleep(pause);
                }
                statuses
            })
        })
        .collect();
    handles.into_iter().flat_map(|h| h.join().expect("client thread")).collect()
}

/// The largest excess over `capacity + rate·τ` of any interval of the admissions `times`
/// (seconds, sorted): max over i ≤ j of (j − i + 1) − capacity − rate·(t_j − t_i), in one pass.
fn max_excess(times: &[f64], capacity: f64, rate: f64) -> f64 {
    let mut best_start = f64::NEG_INFINITY;
    let mut worst = f64::NEG_INFINITY;
    for (j, &t) in times.iter().enumerate() {
        best_start = best_start.max(rate * t - j as f64);
        worst = worst.max((j as f64 + 1.0 - rate * t) + best_start - capacity);
    }
    worst
}

fn admitted_times(up: &Upstream, prefix: &str, key: &str, since: Instant) -> Vec<f64> {
    let mut times: Vec<f64> = up
        .seen()
        .iter()
        .filter(|s| s.path.starts_with(prefix) && s.header("X-Key").as_deref() == Some(key) && s.at >= since)
        .map(|s| s.at.duration_since(since).as_secs_f64())
        .collect();
    times.sort_by(f64::total_cmp);
    times
}

fn redis_pid(conn: &mut redis::Connection) -> u32 {
    let info: String = redis::cmd("INFO").arg("server").query(conn).expect("INFO server");
    info.lines().find_map(|l| l.trim().strip_prefix("process_id:")).and_then(|p| p.parse().ok()).expect("process_id")
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill").arg(sig).arg(pid.to_string()).status().expect("kill").success();
    assert!(ok, "kill {sig} {pid}");
}

#[test]
fn four_instances_stay_within_the_bound_with_far_fewer_redis_calls() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let fleet: Vec<Weir> = (0..4).map(|_| member(&up, &redis.url())).collect();
    let addrs: Vec<SocketAddr> = fleet.iter().map(|w| w.addr).collect();
    let mut conn = redis.connection();

    // Below the limit: each instance ~100 r/s on a key allowed 5000 r/s. Exact mode would call
    // Redis once per request; leases, about once per lease of up to 100.
    // A second first, not counted: a cold key's leases double from 1 token (7 asks to reach 100).
    load(&addrs, "/calm", "k-calm", Duration::from_secs(1), Duration::from_millis(10));
    let calls_before = script_calls(&mut conn);
    let statuses = load(&addrs, "/calm", "k-calm", Duration::from_secs(3), Duration::from_millis(10));
    let calls = script_calls(&mut conn) - calls_before;
    let admitted = statuses.iter().filter(|&&s| s == 200).count() as u64;
    assert_eq!(admitted as usize, statuses.len(), "below the limit every request passes: {statuses:?}");
    assert!(admitted >= 400, "the load ran: {admitted} requests");
    eprintln!(
        "calm: {admitted} admitted, {calls} Redis script calls ({:.4} per request)",
        calls as f64 / admitted as f64
    );
    assert!(calls * 20 <= admitted, "{calls} Redis calls for {admitted} requests: not far below one per request");

    // Redis stopped for twice the lifetime while every instance holds a lease of the calm key:
    // only tokens already leased are spent (at most N·T = 400, within one lifetime of 1 s), then
    // on_error = "deny" refuses everything until Redis is back.
    let pid = redis_pid(&mut conn);
    drop(conn);
    let stopped_at = Instant::now();
    signal(pid, "-STOP");
    let statuses = load(&addrs, "/calm", "k-calm", Duration::from_secs(2), Duration::from_millis(2));
    signal(pid, "-CONT");
    let during = admitted_times(&up, "/calm", "k-calm", stopped_at);
    eprintln!(
        "stopped: {} requests, {} admitted from held leases, the last {:.3}s into the stop",
        statuses.len(),
        during.len(),
        during.last().copied().unwrap_or(0.0)
    );
    assert!(!during.is_empty(), "the leases held when Redis stopped are spent until they end");
    assert!(during.len() <= 400, "{} admitted while Redis was stopped (at most 4·100 leased)", during.len());
    let last = during.last().copied().unwrap_or(0.0);
    assert!(last <= 1.0 + 0.25, "an admission {last:.3}s into the stop, after every lease ended");
    let refused = statuses.iter().filter(|&&s| s != 200).count();
    assert!(refused > statuses.len() / 3, "deny answered once the leases ended: {refused} of {}", statuses.len());

    // Far above the limit: 4 instances as fast as they can on one key of 100 r/s, burst 50.
    let since = Instant::now();
    let mut conn = redis.connection();
    let calls_before = script_calls(&mut conn);
    let statuses = load(&addrs, "/hot", "k-hot", Duration::from_secs(4), Duration::ZERO);
    let calls = script_calls(&mut conn) - calls_before;
    let times = admitted_times(&up, "/hot", "k-hot", since);
    let excess = max_excess(&times, 51.0, 100.0);
    // The printed bound: min(N·T, r·L) = min(4·10, 100/s·0.5s) = 40. The upstream timestamps
    // admissions after the proxy forwarded them: jitter on a loaded machine can squeeze an
    // interval, so 10 more (0.1 s of rate) are allowed.
    eprintln!(
        "hot: {} requests, {} admitted, {calls} Redis calls, max excess over 51 + 100/s·τ: {excess:.1} (bound 40)",
        statuses.len(),
        times.len()
    );
    assert!(times.len() >= 51, "the fleet admitted at least the burst: {}", times.len());
    assert!(excess <= 40.0 + 10.0, "excess {excess:.1} over the bound 40");
    // At or above the limit no more calls than the exact mode (one per request), and refusals
    // while the budget is known empty cost none.
    assert!(calls <= statuses.len() as u64, "{calls} Redis calls for {} requests", statuses.len());

    // Back: the fleet admits again.
    let back = load(&addrs, "/hot", "k-back", Duration::from_secs(2), Duration::from_millis(20));
    assert!(back.contains(&200), "after SIGCONT the fleet admits again: {back:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_service_answers_a_leased_zone_without_redis() {
    use support::rls_client::{client, code};
    use weir::rls::proto::rate_limit_response::Code;

    let redis = RedisServer::start();
    let zone = r#"rate = "1000r/s"
lease = { tokens = 100, lifetime = "2s" }"#;
    let weir = Weir::start(&rls_config(&redis, zone, "", "burst = 1000\nnodelay = true"));
    let mut rls = client(weir.addr).await;
    let mut conn = redis.connection();
    let before = script_calls(&mut conn);
    let calls = 200;
    for _ in 0..calls {
        let answer = rls.should_rate_limit(call_for_c1()).await.expect("ShouldRateLimit").into_inner();
        assert_eq!(code(&answer), Code::Ok);
    }
    let asked = script_calls(&mut conn) - before;
    eprintln!("rls: {calls} ShouldRateLimit answered with {asked} Redis calls");
    // A cold key's leases double from 1 token: 200 calls take about 8 asks, not 200.
    assert!(asked >= 1 && asked * 10 <= calls, "{asked} Redis calls for {calls} ShouldRateLimit");
}

/// Many ShouldRateLimit calls in flight on one leased key: a call that waits through many answers
/// of the key's asks is no store failure. (It was: after four answers the zone's `on_error` took
/// it, and its `local` fallback admitted past the lease: 107-143 of a window's 100.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_on_one_leased_key_never_pass_its_window() {
    use support::rls_client::{client, code};
    use weir::rls::proto::rate_limit_response::Code;

    let redis = RedisServer::start();
    let zone = r#"algorithm = "fixed_window"
rate = "100r/h"
lease = { tokens = 10, lifetime = "2s" }"#;
    let weir = Weir::start(&rls_config(&redis, zone, "on_error = \"local\"", ""));
    let rls = client(weir.addr).await;
    let hour = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 3600);
    let first_hour = hour();
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let mut rls = rls.clone();
        calls.spawn(async move {
            let mut ok = 0;
            for _ in 0..40 {
                let answer = rls.should_rate_limit(call_for_c1()).await.expect("ShouldRateLimit").into_inner();
                if code(&answer) == Code::Ok {
                    ok += 1;
                }
            }
            ok
        });
    }
    let mut ok = 0;
    while let Some(done) = calls.join_next().await {
        ok += done.expect("the calls ran");
    }
    // The windows are the clock's hours: calls that straddled one may take two windows' worth.
    let windows = hour() - first_hour + 1;
    assert!(ok <= 100 * windows, "{ok} of 640 calls admitted in {windows} window(s) of 100");
    assert!(ok >= 100, "{ok} of 640 calls admitted: the window's 100 were not all given");
}

/// A rate limit service on `redis` with one domain "edge" whose descriptor `client` decides zone
/// "per_client": the zone's, the domain's and the descriptor's own lines given.
fn rls_config(redis: &RedisServer, zone: &str, domain: &str, descriptor: &str) -> String {
    let store = redis_store(&redis.url(), "timeout = \"1s\"");
    format!(
        r#"{NO_ACCESS_LOG}

{store}

[[limit_req_zone]]
name = "per_client"
{zone}

[rls]
listen = ["$LISTEN"]

[[rls.domain]]
name = "edge"
{domain}

[[rls.domain.descriptor]]
key = "client"
zone = "per_client"
{descriptor}
"#
    )
}

/// One ShouldRateLimit of domain "edge" for client c1, as Envoy sends it (hits_addend 0: one).
fn call_for_c1() -> weir::rls::proto::RateLimitRequest {
    weir::rls::proto::RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![support::rls_client::descriptor(&[("client", "c1")])],
        hits_addend: 0,
    }
}

/// The level of a leaky bucket's key in Redis (0 when absent).
fn level(conn: &mut redis::Connection, key: &str) -> f64 {
    let raw: Option<String> = redis::cmd("GET").arg(key).query(conn).expect("GET");
    raw.and_then(|r| r.split(' ').next().and_then(|l| l.parse().ok())).unwrap_or(0.0)
}

#[test]
fn unused_tokens_go_back_at_reload_and_at_exit() {
    use support::poll::poll;

    let redis = RedisServer::start();
    let up = Upstream::start();
    // 10 a minute: the bucket drains 0.17 a second, so what Redis holds is what was leased.
    let sections = format!("{NO_ACCESS_LOG}\n\n{}", redis_store(&redis.url(), "timeout = \"1s\""));
    let zones = r#"[[limit_req_zone]]
name = "slow"
key = "header:X-Key"
rate = "10r/m"
lease = { tokens = 100, lifetime = "30s" }

[[route]]
name = "slow"
path_prefix = "/"
upstream = "app"
limit_req = [ { zone = "slow", burst = 1000, nodelay = true } ]
"#;
    let mut weir = Weir::start(&with_app("", &sections, up.addr(), zones));
    let mut conn = redis.connection();
    let key = "weir:slow:{k}";
    let send = |n: usize| {
        let mut c = KeepAlive::new(weir.addr, REQUEST_TIMEOUT);
        for _ in 0..n {
            assert_eq!(c.send(&Request::get("/").header("X-Key", "k")).expect("request").status, 200);
        }
    };
    send(6);
    let leased = level(&mut conn, key);
    assert!(leased >= 7.0, "the instance holds tokens beyond the 6 it spent: Redis has {leased}");
    // A reload gives every unused token back: Redis then holds what was spent.
    let text = std::fs::read_to_string(&weir.config_path).expect("config");
    std::fs::write(&weir.config_path, format!("{text}\n# reloaded\n")).expect("config written");
    weir.signal(libc::SIGHUP);
    let after = poll(Duration::from_secs(10), Duration::from_millis(50), || level(&mut conn, key), |l| *l <= 6.0);
    assert!(after.is_ok(), "after the reload Redis still holds {after:?} for 6 spent");
    send(6);
    assert!(level(&mut conn, key) >= 12.5, "leased again after the reload");
    // SIGTERM: the exit gives back what is left.
    weir.terminate(Duration::from_secs(10)).expect("weir exits on SIGTERM");
    let at_exit = level(&mut conn, key);
    assert!(at_exit <= 12.0, "after the exit Redis holds {at_exit} for 12 spent");
}

#[test]
fn a_reset_voids_the_leases_of_its_key() {
    use support::admin;
    use support::poll::poll;

    let redis = RedisServer::start();
    let up = Upstream::start();
    let sections = format!("{NO_ACCESS_LOG}\n\n{}", redis_store(&redis.url(), "timeout = \"1s\""));
    // 1 a minute, burst 4: once spent, a lease is refused for a minute.
    let zones = r#"[[limit_req_zone]]
name = "slow"
key = "header:X-Key"
rate = "1r/m"
lease = { tokens = 5, lifetime = "30s" }

[[route]]
name = "slow"
path_prefix = "/"
upstream = "app"
limit_req = [ { zone = "slow", burst = 4, nodelay = true } ]
"#;
    let weir = Weir::start(&with_app(admin::LISTEN, &sections, up.addr(), zones));
    let mut c = KeepAlive::new(weir.addr, REQUEST_TIMEOUT);
    let mut statuses = vec![];
    for _ in 0..8 {
        statuses.push(c.send(&Request::get("/").header("X-Key", "k")).expect("request").status);
    }
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 5, "the budget is 5: {statuses:?}");
    let reset = admin::request(admin::addr(&weir), "DELETE", "/limits/slow/k", None);
    assert!(reset.status < 300, "reset: {}", reset.summary());
    // Without voiding, the instance would refuse locally for a minute (the store's retry time).
    let back = poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        || c.send(&Request::get("/").header("X-Key", "k")).expect("request").status,
        |s| *s == 200,
    );
    assert!(back.is_ok(), "after the reset the key's budget is whole again: {back:?}");
}

#[test]
fn limits_and_zones_show_a_leased_keys_leases() {
    use support::admin;

    let redis = RedisServer::start();
    let up = Upstream::start();
    let sections = format!("{NO_ACCESS_LOG}\n\n{}", redis_store(&redis.url(), "timeout = \"1s\""));
    // 10 a minute: the bucket drains 0.17 a second, so what Redis holds is what was leased; a
    // 30 s lifetime: nothing ends or goes back while the test reads.
    let zones = r#"[[limit_req_zone]]
name = "slow"
key = "header:X-Key"
rate = "10r/m"
lease = { tokens = 100, lifetime = "30s" }

[[route]]
name = "slow"
path_prefix = "/"
upstream = "app"
limit_req = [ { zone = "slow", burst = 1000, nodelay = true } ]
"#;
    let weir = Weir::start(&with_app(admin::LISTEN, &sections, up.addr(), zones));
    let mut c = KeepAlive::new(weir.addr, REQUEST_TIMEOUT);
    for key in ["k", "k", "k", "k", "k", "k", "k", "k", "k", "k", "other"] {
        assert_eq!(c.send(&Request::get("/").header("X-Key", key)).expect("request").status, 200);
    }
    // A background renewal may still be on its way: read once none is in flight.
    let read = || admin::request(admin::addr(&weir), "GET", "/limits?zone=slow&key=k", None).json();
    let answer = support::poll::poll(Duration::from_secs(5), Duration::from_millis(50), read, |a| {
        a["lease"]["this_instance"]["asking"] == false
    })
    .expect("no ask in flight");
    let lease = &answer["lease"];
    assert_eq!((lease["tokens"].as_u64(), lease["lifetime_ms"].as_f64()), (Some(100), Some(30_000.0)), "{answer}");
    let mine = &lease["this_instance"];
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("not a count: {v} in {answer}"));
    assert_eq!(n(&mine["spent"]), 10, "ten requests of cost 1 were admitted from leases: {answer}");
    let (granted, held) = (n(&mine["granted"]), n(&mine["held"]));
    assert!(granted >= 10, "every admission spent a granted token: {answer}");
    assert_eq!(
        granted - n(&mine["spent"]) - n(&mine["given_back"]) - n(&mine["expired_unused"]),
        held,
        "granted − spent = tokens left: {answer}"
    );
    let leases = mine["leases"].as_array().expect("leases");
    assert_eq!(leases.iter().map(|l| n(&l["tokens_left"])).sum::<u64>(), held, "{answer}");
    assert!(
        leases.iter().all(|l| l["ends_in_ms"].as_f64().is_some_and(|ms| ms > 0.0 && ms <= 30_000.0)),
        "every lease ends within its lifetime: {answer}"
    );
    // Redis: the bucket holds what was leased (drained by at most a few seconds at 1/6 a second),
    // and this instance is the key's one live holder.
    let level = answer["state"]["level"].as_f64().expect("a bucket");
    let debited = (granted - n(&mine["given_back"])) as f64;
    assert!(level <= debited && level >= debited - 2.0, "Redis holds {level} for {debited} leased");
    assert_eq!(lease["fleet"]["holders"], 1, "{answer}");
    assert_eq!(lease["fleet"]["leases"][0]["holder"], mine["holder"], "{answer}");

    // GET /zones: two keys, whose holders' hashes are counted apart, not as two more keys.
    let r = admin::request(admin::addr(&weir), "GET", "/zones", None);
    let zones = r.json();
    assert_eq!(zones["limit_req"]["slow"], 2, "k and other, not their holders: {zones}");
    assert_eq!(zones["lease_holders"]["slow"], 2, "{zones}");
}
