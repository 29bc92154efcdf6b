//! `RedisStore` against a real `redis-server`: script reloads, restarts, expiry, dead and hung
//! servers, Redis' clock, concurrency, and the memory one key costs.

use crate::support;

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::redis_server::RedisServer;
use support::weir::refusing_addr;
use tokio::task::{block_in_place, JoinSet};
use weir::limit::{
    decide_all, evaluate, Algorithm, Clock, DelayPolicy, LimitReq, ManualClock, Rate, State, SystemClock, Verdict,
    ZoneInput,
};
use weir::store::{KeyedZone, LimitStore, RedisClock, RedisStore, RedisStoreConfig, StoreError};

const PREFIX: &str = "weir:";

fn store(url: String, clock: RedisClock, timeout: Duration) -> Arc<RedisStore> {
    let config = RedisStoreConfig { url, timeout, clock, key_prefix: PREFIX.to_string(), tls: None };
    Arc::new(RedisStore::new(config, Arc::new(SystemClock)).unwrap())
}

fn limit(rate: &str, burst: u64, delay: DelayPolicy) -> LimitReq {
    LimitReq { algorithm: Algorithm::LeakyBucket, rate: Rate::parse(rate).unwrap(), burst, delay }
}

fn check<'a>(zone: &'a str, key: &'a str, limit: LimitReq) -> KeyedZone<'a> {
    KeyedZone::new(zone, key.as_bytes(), limit, 1)
}

/// Redis' clock in µs, from a blocking connection.
fn redis_time(conn: &mut redis::Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).unwrap();
    secs * 1_000_000 + micros
}

fn weir_keys(conn: &mut redis::Connection) -> Vec<String> {
    redis::cmd("KEYS").arg(format!("{PREFIX}*")).query(conn).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovers_from_script_flush_and_redis_restart() {
    let mut server = RedisServer::start();
    let store = store(server.url(), RedisClock::Redis, Duration::from_millis(500));
    let once_a_minute = limit("1r/m", 0, DelayPolicy::NoDelay);
    let req = [check("per_ip", "192.0.2.1", once_a_minute)];

    assert!(store.decide(&req).await.unwrap().admitted);
    // NOSCRIPT: the store reloads the script by itself, and the state survives.
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut server.connection()).unwrap();
    let after_flush = store.decide(&req).await.unwrap();
    assert!(!after_flush.admitted, "state kept across SCRIPT FLUSH");

    // A restart loses the data, the connection and the script cache.
    block_in_place(|| server.restart());
    let (verdict, took, errors) = decide_until_ok(&store, &req).await;
    println!("redis restart: recovered after {took:?} and {errors} failed decisions");
    assert!(verdict.admitted, "the restarted redis starts empty");
    assert!(!store.decide(&req).await.unwrap().admitted);

    // A longer outage outlasts the manager's reconnect retries: every decision fails (fast), and
    // the first one after redis is back starts a new reconnect.
    block_in_place(|| server.stop());
    let down = Instant::now();
    while down.elapsed() < Duration::from_millis(1500) {
        let started = Instant::now();
        assert!(store.decide(&req).await.is_err());
        assert!(started.elapsed() < Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    block_in_place(|| server.restart());
    let (verdict, took, errors) = decide_until_ok(&store, &req).await;
    println!("redis outage of 1.5 s: recovered after {took:?} and {errors} failed decisions");
    assert!(verdict.admitted);
}

/// Retries a decision until it succeeds, for at most 5 s.
async fn decide_until_ok(store: &RedisStore, req: &[KeyedZone<'_>]) -> (Verdict, Duration, usize) {
    let started = Instant::now();
    let mut errors = 0;
    loop {
        match store.decide(req).await {
            Ok(v) => return (v, started.elapsed(), errors),
            Err(e) => {
                errors += 1;
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "no recovery within 5 s after redis came back; last error: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_expires_once_its_bucket_has_drained() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let store = store(server.url(), RedisClock::Redis, Duration::from_secs(2));
    // About 1 s to drain per client and 0.5 s per route: longer than the traffic takes.
    let per_ip = limit("4r/s", 9, DelayPolicy::NoDelay);
    let per_route = limit("400r/s", 200, DelayPolicy::After(10));

    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for client in 0..300 {
        let store = store.clone();
        tasks.spawn(async move {
            let ip = format!("198.51.{}.{}", client / 256, client % 256);
            let route = format!("/api/{}", client % 7);
            let mut drain_us = 0;
            for _ in 0..4 {
                let v =
                    store.decide(&[check("per_ip", &ip, per_ip), check("per_route", &route, per_route)]).await.unwrap();
                drain_us = drain_us.max(v.zones.iter().map(|z| z.reset_us).max().unwrap_or(0));
            }
            drain_us
        });
    }
    let mut drain_us = 0;
    while let Some(task) = tasks.join_next().await {
        drain_us = drain_us.max(task.unwrap());
    }
    let traffic = started.elapsed();
    let keys = block_in_place(|| weir_keys(&mut conn));
    assert!(!keys.is_empty(), "keys expired before the traffic ended ({traffic:?})");
    for key in &keys {
        let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).unwrap();
        // -2: expired since KEYS listed it (a slow machine).
        assert!(
            pttl == -2 || (pttl > 0 && pttl <= (drain_us / 1000 + 2) as i64),
            "{key}: PTTL {pttl} ms beyond the drain time {drain_us} µs"
        );
    }

    // Keys expire on their own; SCAN also drops the expired keys it meets.
    let drain = Duration::from_micros(drain_us);
    let deadline = Instant::now() + drain + Duration::from_secs(3);
    loop {
        let mut cursor = 0u64;
        let mut left = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{PREFIX}*"))
                .arg("COUNT")
                .arg(1000)
                .query(&mut conn)
                .unwrap();
            left += batch.len();
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} keys still there {drain:?} + 3 s after the traffic");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "expiry: 1200 decisions in {traffic:?}, {} keys; all gone {:?} after the traffic \
         (drain time {drain:?})",
        keys.len(),
        started.elapsed() - traffic
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_fails_fast() {
    let timeout = Duration::from_millis(50);
    let (_reserved, dead) = refusing_addr();
    let store = store(format!("redis://{dead}/"), RedisClock::Redis, timeout);
    let req = [check("per_ip", "192.0.2.1", limit("1r/s", 0, DelayPolicy::NoDelay))];
    for _ in 0..10 {
        let started = Instant::now();
        let result = store.decide(&req).await;
        let took = started.elapsed();
        assert!(result.is_err(), "decided without redis: {result:?}");
        assert!(took < Duration::from_secs(2), "took {took:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_times_out() {
    // The kernel completes the handshake into the backlog, but nothing ever answers.
    let black_hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = black_hole.local_addr().unwrap().port();
    let timeout = Duration::from_millis(50);
    let store = store(format!("redis://127.0.0.1:{port}/"), RedisClock::Redis, timeout);
    let req = [check("per_ip", "192.0.2.1", limit("1r/s", 0, DelayPolicy::NoDelay))];
    for _ in 0..3 {
        let started = Instant::now();
        let result = store.decide(&req).await;
        let took = started.elapsed();
        assert!(matches!(result, Err(StoreError::Timeout(t)) if t == timeout), "{result:?}");
        assert!(took >= timeout && took < Duration::from_secs(2), "took {took:?}");
    }
    drop(black_hole);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_clock_is_redis_time() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    // The local clock says 1970: with RedisClock::Redis it must not matter.
    let config = RedisStoreConfig {
        url: server.url(),
        timeout: Duration::from_secs(2),
        clock: RedisClock::Redis,
        key_prefix: PREFIX.to_string(),
        tls: None,
    };
    let store = RedisStore::new(config, Arc::new(ManualClock::new(1))).unwrap().with_full_outcomes(true);
    let once_a_second = limit("1r/s", 0, DelayPolicy::NoDelay);
    let req = [check("per_ip", "192.0.2.9", once_a_second)];

    let before = block_in_place(|| redis_time(&mut conn));
    let first = store.decide(&req).await.unwrap();
    let after = block_in_place(|| redis_time(&mut conn));
    let State::Bucket(bucket) = first.zones[0].next else { panic!("{first:?}") };
    let stamped = bucket.last_us;
    assert!(before <= stamped && stamped <= after, "{before} <= {stamped} <= {after}");
    assert_eq!(store.raw_state("per_ip", b"192.0.2.9").await.unwrap(), Some(first.zones[0].next.clone()));

    let second = store.decide(&req).await.unwrap();
    assert!(!second.admitted);
    let retry = second.retry_after_us.unwrap();
    let waited = block_in_place(|| redis_time(&mut conn)) - stamped;
    assert!(retry <= 1_000_000 && retry + waited >= 1_000_000, "retry {retry} µs, {waited} µs after the first request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_decisions_on_one_key_are_atomic() {
    let server = RedisServer::start();
    let store = store(server.url(), RedisClock::Redis, Duration::from_secs(2));
    let mut tasks = JoinSet::new();
    for _ in 0..100 {
        let store = store.clone();
        tasks.spawn(async move {
            let per_user = limit("1r/m", 9, DelayPolicy::NoDelay);
            let global = limit("1r/m", 99, DelayPolicy::NoDelay);
            let v =
                store.decide(&[check("per_user", "alice", per_user), check("global", "all", global)]).await.unwrap();
            v.admitted
        });
    }
    let mut admitted = 0;
    while let Some(task) = tasks.join_next().await {
        admitted += usize::from(task.unwrap());
    }
    assert_eq!(admitted, 10, "burst 9 admits exactly 10 at once");
    // Rejected requests charged no zone, not even the one that admitted them.
    // (10 requests, a few ms of real time drained.)
    let Some(State::Bucket(global)) = store.raw_state("global", b"all").await.unwrap() else { panic!("no bucket") };
    assert!(global.level > 9.9 && global.level <= 10.0, "{global:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_script_arguments_are_errors() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let script = redis::Script::new(include_str!("../lua/limit_req.lua"));
    let err = script.key("weir:z:{k}").arg("1700000000000000").invoke::<redis::Value>(&mut conn).unwrap_err();
    assert!(err.to_string().contains("expected 8 ARGV"), "{err}");
    let err = script
        .key("weir:z:{k}")
        .arg("soon")
        .arg("0")
        .arg(0)
        .arg(1)
        .arg(1_000_000)
        .arg(0)
        .arg(-1)
        .arg(1)
        .invoke::<redis::Value>(&mut conn)
        .unwrap_err();
    assert!(err.to_string().contains("not a number"), "{err}");
    let err = script
        .key("weir:z:{k}")
        .arg("1700000000000000")
        .arg("0")
        .arg(5)
        .arg(1)
        .arg(1_000_000)
        .arg(0)
        .arg(-1)
        .arg(1)
        .invoke::<redis::Value>(&mut conn)
        .unwrap_err();
    assert!(err.to_string().contains("unknown algorithm 5"), "{err}");
}

/// A zone of a window algorithm: `count` per `window_ms`.
fn window(algorithm: Algorithm, count: u64, window_ms: u64) -> LimitReq {
    LimitReq { algorithm, rate: Rate { count, period_us: window_ms * 1000 }, burst: 0, delay: DelayPolicy::NoDelay }
}

fn token_bucket(rate: &str, burst: u64) -> LimitReq {
    LimitReq { algorithm: Algorithm::TokenBucket, rate: Rate::parse(rate).unwrap(), burst, delay: DelayPolicy::NoDelay }
}

/// Sends `costs` to one key on Redis' clock, then checks that the key lives exactly as long as its
/// state matters: its expiry (PEXPIRETIME) is after the model's `expires_us` of the last admitted
/// request, by at most a few ms; the stored state is then no state; and the key is gone after it.
async fn key_expires_when_its_state_can_be_forgotten(limit: LimitReq, costs: &[u64]) {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let config = RedisStoreConfig {
        url: server.url(),
        timeout: Duration::from_secs(2),
        clock: RedisClock::Redis,
        key_prefix: PREFIX.to_string(),
        tls: None,
    };
    let store = RedisStore::new(config, Arc::new(SystemClock)).unwrap().with_full_outcomes(true);
    let zone = limit.algorithm.as_str();
    let key = format!("{PREFIX}{zone}:{{203.0.113.7}}");
    // A window's state ends with its window: start just after one begins (on Redis' clock, which
    // the store reads), so that the whole life of the key lies ahead of the checks below.
    if limit.algorithm.is_window() {
        let period = limit.rate.period_us;
        let redis_now_us = block_in_place(|| redis_time(&mut conn));
        tokio::time::sleep(Duration::from_micros(period - redis_now_us % period + 5_000)).await;
    }
    let mut last_admitted = None;
    for &cost in costs {
        let v = store.decide(&[KeyedZone::new(zone, b"203.0.113.7", limit, cost)]).await.unwrap();
        if v.admitted {
            last_admitted = Some(v.zones[0].clone());
        }
    }
    let outcome = last_admitted.expect("at least one request admitted");
    // Before the state expires, the key is there: Redis' clock and EXISTS read in one transaction.
    let ((secs, micros), exists): ((u64, u64), i64) =
        block_in_place(|| redis::pipe().atomic().cmd("TIME").cmd("EXISTS").arg(&key).query(&mut conn).unwrap());
    let redis_now_us = secs * 1_000_000 + micros;
    assert!(
        redis_now_us < outcome.expires_us,
        "precondition: the key is looked at before its state expires (the requests take ms, the \
         state lives >= 200 ms), but Redis' clock is {} µs past it: the machine was too slow",
        redis_now_us - outcome.expires_us
    );
    assert_eq!(exists, 1, "{zone}: key gone {} µs before its state expires", outcome.expires_us - redis_now_us);
    let state = store.raw_state(zone, b"203.0.113.7").await.unwrap().expect("a stored state");
    assert_eq!(state, outcome.next, "{zone}: stored state");
    let expire_ms: i64 = block_in_place(|| redis::cmd("PEXPIRETIME").arg(&key).query(&mut conn).unwrap());
    let expire_us = expire_ms as u64 * 1000;
    // Never before the state expires (absent must mean expired), and not much later.
    assert!(
        expire_us > outcome.expires_us && expire_us <= outcome.expires_us + 50_000,
        "{zone}: key expires at {expire_us} µs, state at {} µs",
        outcome.expires_us
    );
    // From the key's expiry on, the state it held is no state, for any request.
    for cost in [0, 1, limit.capacity()] {
        assert_eq!(
            evaluate(&limit, Some(&state), expire_us, cost),
            evaluate(&limit, None, expire_us, cost),
            "{zone}: the state is forgettable when its key expires"
        );
    }
    // Redis expires a key on its own clock: time must pass, until just after the expiry (2 ms,
    // Redis' own rounding) and no longer.
    let redis_now_us = block_in_place(|| redis_time(&mut conn));
    tokio::time::sleep(Duration::from_micros((expire_us + 2000).saturating_sub(redis_now_us))).await;
    let exists: i64 = block_in_place(|| redis::cmd("EXISTS").arg(&key).query(&mut conn).unwrap());
    assert_eq!(exists, 0, "{zone}: key still there after its TTL");
    println!(
        "{zone}: state {state:?} expires {} µs after the last request, its key {} µs after that",
        outcome.reset_us,
        expire_us - outcome.expires_us
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_bucket_key_expires_when_drained() {
    // 3 requests at 10r/s: drained 300 ms after the last.
    key_expires_when_its_state_can_be_forgotten(limit("10r/s", 5, DelayPolicy::NoDelay), &[1, 1, 1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_key_expires_when_full_again() {
    key_expires_when_its_state_can_be_forgotten(token_bucket("10r/s", 4), &[2, 1, 9]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_key_expires_with_its_window() {
    key_expires_when_its_state_can_be_forgotten(window(Algorithm::FixedWindow, 5, 300), &[1, 2, 9]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_key_expires_with_its_newest_entry() {
    key_expires_when_its_state_can_be_forgotten(window(Algorithm::SlidingLog, 5, 300), &[1, 2, 9, 1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_key_expires_after_two_windows() {
    key_expires_when_its_state_can_be_forgotten(window(Algorithm::SlidingWindow, 5, 200), &[1, 2, 9]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_may_change_its_algorithm() {
    // A reload changes the algorithm of a zone (same name, same keys): the key holds the other
    // algorithm's value, a string or a sorted set. It counts as no state, is overwritten by an
    // admitted request and left alone by a rejected one. Never an error.
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000_000));
    let config = RedisStoreConfig {
        url: server.url(),
        timeout: Duration::from_secs(2),
        clock: RedisClock::Local,
        key_prefix: PREFIX.to_string(),
        tls: None,
    };
    let store = RedisStore::new(config, clock.clone()).unwrap().with_full_outcomes(true);
    let limits = [
        limit("10r/s", 3, DelayPolicy::After(1)),
        token_bucket("10r/s", 3),
        window(Algorithm::FixedWindow, 4, 1000),
        window(Algorithm::SlidingLog, 4, 1000),
        window(Algorithm::SlidingWindow, 4, 1000),
    ];
    let mut switches = 0;
    for (i, from) in limits.iter().enumerate() {
        for (j, to) in limits.iter().enumerate() {
            let key = format!("client{i}{j}");
            let decide = |limit: LimitReq, cost: u64| {
                let store = &store;
                let key = key.clone();
                async move { store.decide(&[KeyedZone::new("switching", key.as_bytes(), limit, cost)]).await }
            };
            clock.advance_us(1000);
            let first = decide(*from, 2).await.unwrap();
            assert!(first.admitted);
            let old = store.raw_state("switching", key.as_bytes()).await.unwrap();
            assert_eq!(old.as_ref(), Some(&first.zones[0].next));

            // A request the new algorithm rejects writes nothing: the old value stays.
            clock.advance_us(1000);
            let too_costly = decide(*to, to.capacity() + 1).await.unwrap();
            assert!(!too_costly.admitted && too_costly.retry_after_us.is_none());
            assert_eq!(store.raw_state("switching", key.as_bytes()).await.unwrap(), old);

            // An admitted one replaces it; the new algorithm saw no state (unless it is the same).
            let now = clock.now_us();
            let same = i == j;
            let expected =
                decide_all(&[ZoneInput { limit: to, state: same.then(|| old.clone()).flatten(), cost: 1 }], now);
            let got = decide(*to, 1)
                .await
                .unwrap_or_else(|e| panic!("{} -> {}: {e}", from.algorithm.as_str(), to.algorithm.as_str()));
            assert_eq!(got, expected, "{} -> {}", from.algorithm.as_str(), to.algorithm.as_str());
            assert_eq!(
                store.raw_state("switching", key.as_bytes()).await.unwrap().as_ref(),
                Some(&got.zones[0].next),
                "{} -> {}",
                from.algorithm.as_str(),
                to.algorithm.as_str()
            );
            switches += usize::from(!same);
        }
    }
    assert_eq!(switches, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compact_verdict_carries_what_the_proxy_reads() {
    let server = RedisServer::start();
    let store = store(server.url(), RedisClock::Redis, Duration::from_secs(2));
    let log = window(Algorithm::SlidingLog, 10, 60_000);
    let req = [KeyedZone::new("log", b"k", log, 3)];
    let v = store.decide(&req).await.unwrap();
    assert!(v.admitted);
    assert_eq!(v.zones[0].remaining, 7);
    assert!(v.zones[0].reset_us > 59_000_000 && v.zones[0].reset_us <= 60_000_000, "{v:?}");
    let again = store.decide(&req).await.unwrap();
    assert!(again.admitted && again.zones[0].remaining == 4, "{again:?}");
    let full = store.decide(&[KeyedZone::new("log", b"k", log, 5)]).await.unwrap();
    assert!(!full.admitted, "{full:?}");
    let retry = full.retry_after_us.expect("10 of 60 s can be made room for");
    assert!(retry > 59_000_000 && retry <= 60_000_000, "{full:?}");
    let Some(State::Log(entries)) = store.raw_state("log", b"k").await.unwrap() else { panic!("no log") };
    // Two admitted requests of cost 3; the rejected one wrote nothing.
    assert_eq!(entries.len(), 6);
    assert!(entries[..3].iter().all(|&t| t == entries[0]) && entries[3..].iter().all(|&t| t == entries[3]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_costly_request_adds_all_its_log_entries() {
    // More entries than one ZADD takes (the script adds them in batches of 1000).
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000_000));
    let config = RedisStoreConfig {
        url: server.url(),
        timeout: Duration::from_secs(5),
        clock: RedisClock::Local,
        key_prefix: PREFIX.to_string(),
        tls: None,
    };
    let store = RedisStore::new(config, clock.clone()).unwrap().with_full_outcomes(true);
    let log = window(Algorithm::SlidingLog, 10_000, 60_000);
    let mut state = None;
    for (cost, admitted) in [(2500, true), (7499, true), (2, false), (1, true), (1, false)] {
        clock.advance_us(1000);
        let now = clock.now_us();
        let expected = decide_all(&[ZoneInput { limit: &log, state: state.clone(), cost }], now);
        let got = store.decide(&[KeyedZone::new("log", b"k", log, cost)]).await.unwrap();
        assert_eq!(got, expected, "cost {cost}");
        assert_eq!(got.admitted, admitted, "cost {cost}");
        if got.admitted {
            state = Some(got.zones[0].next.clone());
        }
        assert_eq!(store.raw_state("log", b"k").await.unwrap(), state, "cost {cost}");
    }
    let Some(State::Log(entries)) = state else { panic!("no log") };
    assert_eq!(entries.len(), 10_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_usage_of_one_key() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let store = store(server.url(), RedisClock::Redis, Duration::from_secs(2));
    let per_ip = limit("3r/s", 20, DelayPolicy::After(5));
    let req = [check("per_ip", "203.0.113.7", per_ip)];
    let key = "weir:per_ip:{203.0.113.7}";

    store.decide(&req).await.unwrap();
    let whole = measure(&mut conn, key);
    // A partly drained bucket holds a fractional level: the longest value the script writes.
    tokio::time::sleep(Duration::from_millis(77)).await;
    store.decide(&req).await.unwrap();
    let fractional = measure(&mut conn, key);
    println!("MEMORY USAGE {key}: {whole} (whole level), {fractional} (fractional level)");
    assert!(fractional < 200, "{fractional} bytes per key");

    // One key per algorithm, at its longest value.
    let mut table = vec![("leaky_bucket".to_string(), fractional)];
    // (Zone "per_ip" and client keys of the same length: key names as long as the one above.)
    for (name, client, limit, costs) in [
        ("token_bucket", "203.0.113.1", token_bucket("3r/s", 20), vec![1, 1]),
        ("fixed_window", "203.0.113.2", window(Algorithm::FixedWindow, 1_000_000, 3_600_000), vec![999_999]),
        ("sliding_window", "203.0.113.3", window(Algorithm::SlidingWindow, 1_000_000, 1000), vec![500_000]),
    ] {
        for cost in costs {
            let check = KeyedZone::new("per_ip", client.as_bytes(), limit, cost);
            store.decide(&[check]).await.unwrap();
            // Time passes so that the state is partly drained: its longest (fractional) form.
            tokio::time::sleep(Duration::from_millis(77)).await;
        }
        let bytes = measure(&mut conn, &format!("weir:per_ip:{{{client}}}"));
        assert!(bytes < 200, "{name}: {bytes} bytes per key");
        table.push((name.to_string(), bytes));
    }
    // The sliding log: one entry per admitted request, each request at its own time (and once
    // 10 entries of one time: a request of cost 10).
    let log = window(Algorithm::SlidingLog, 10_000, 3_600_000);
    for (client, entries, cost) in
        [("203.0.113.4", 10, 1), ("203.0.113.5", 10, 10), ("203.0.113.6", 100, 1), ("203.0.113.8", 128, 1)]
            .into_iter()
            .chain([("203.0.113.9", 129, 1), ("203.0.11.10", 1000, 1)])
    {
        for _ in 0..entries / cost {
            let check = KeyedZone::new("per_ip", client.as_bytes(), log, cost);
            assert!(store.decide(&[check]).await.unwrap().admitted);
        }
        let bytes = measure(&mut conn, &format!("weir:per_ip:{{{client}}}"));
        let what = if cost == 1 {
            format!("sliding_log, {entries} entries")
        } else {
            format!("sliding_log, {entries} entries at once")
        };
        table.push((what, bytes));
    }
    println!("MEMORY USAGE per key (Redis {}):", redis_version(&mut conn));
    for (what, bytes) in &table {
        println!("  {what:<32} {bytes:>6} bytes");
    }

    // MEMORY USAGE leaves out the expiry entry and the dictionaries' growth: count those too.
    let before = block_in_place(|| used_memory(&mut conn));
    let keys = 5000;
    let mut tasks = JoinSet::new();
    for task in 0..10 {
        let store = store.clone();
        tasks.spawn(async move {
            for i in (task..keys).step_by(10) {
                let ip = format!("203.0.{}.{}", i / 256, i % 256);
                let per_ip = limit("1r/m", 20, DelayPolicy::After(5));
                let v = store.decide(&[check("per_ip", &ip, per_ip)]).await;
                assert!(v.unwrap().admitted);
            }
        });
    }
    while let Some(task) = tasks.join_next().await {
        task.unwrap();
    }
    let after = block_in_place(|| used_memory(&mut conn));
    println!(
        "used_memory grew {} bytes for {keys} keys: {} bytes per key",
        after - before,
        (after - before) / keys as u64
    );
}

fn used_memory(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("memory").query(conn).unwrap();
    info.lines().find_map(|line| line.strip_prefix("used_memory:")).and_then(|n| n.trim().parse().ok()).unwrap()
}

fn redis_version(conn: &mut redis::Connection) -> String {
    let info: String = block_in_place(|| redis::cmd("INFO").arg("server").query(conn).unwrap());
    info.lines().find_map(|line| line.strip_prefix("redis_version:")).unwrap_or("?").trim().to_string()
}

/// `MEMORY USAGE` of a key, printing its value (strings) or its size (sorted sets).
fn measure(conn: &mut redis::Connection, key: &str) -> u64 {
    block_in_place(|| {
        let kind: String = redis::cmd("TYPE").arg(key).query(conn).unwrap();
        let value = if kind == "zset" {
            let n: u64 = redis::cmd("ZCARD").arg(key).query(conn).unwrap();
            let newest: Vec<String> = redis::cmd("ZRANGE").arg(key).arg(-1).arg(-1).query(conn).unwrap();
            format!("{n} entries, newest {newest:?}")
        } else {
            let value: String = redis::cmd("GET").arg(key).query(conn).unwrap();
            format!("{value:?} ({} bytes)", value.len())
        };
        let bytes: u64 = redis::cmd("MEMORY").arg("USAGE").arg(key).arg("SAMPLES").arg(0).query(conn).unwrap();
        let encoding: String = redis::cmd("OBJECT").arg("ENCODING").arg(key).query(conn).unwrap();
        println!("{key} = {value} ({encoding}): {bytes} bytes");
        bytes
    })
}
