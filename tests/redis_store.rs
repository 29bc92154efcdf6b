//! `RedisStore` against a real `redis-server`: script reloads, restarts, expiry, dead and hung
//! servers, Redis' clock, concurrency, and the memory one key costs.

mod support;

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::redis_server::{free_port, RedisServer};
use tokio::task::{block_in_place, JoinSet};
use weir::limit::{DelayPolicy, LimitReq, ManualClock, Rate, SystemClock, Verdict};
use weir::store::{LimitStore, RedisClock, RedisStore, RedisStoreConfig, StoreError, ZoneCheck};

const PREFIX: &str = "weir:";

fn store(url: String, clock: RedisClock, timeout: Duration) -> Arc<RedisStore> {
    let config = RedisStoreConfig { url, timeout, clock, key_prefix: PREFIX.to_string() };
    Arc::new(RedisStore::new(config, Arc::new(SystemClock)).unwrap())
}

fn limit(rate: &str, burst: u64, delay: DelayPolicy) -> LimitReq {
    LimitReq { rate: Rate::parse(rate).unwrap(), burst, delay }
}

fn check<'a>(zone: &'a str, key: &'a str, limit: LimitReq) -> ZoneCheck<'a> {
    ZoneCheck { zone, key: key.as_bytes(), limit, cost: 1 }
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
async fn decide_until_ok(store: &RedisStore, req: &[ZoneCheck<'_>]) -> (Verdict, Duration, usize) {
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
    let store = store(format!("redis://127.0.0.1:{}/", free_port()), RedisClock::Redis, timeout);
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
    };
    let store = RedisStore::new(config, Arc::new(ManualClock::new(1))).unwrap();
    let once_a_second = limit("1r/s", 0, DelayPolicy::NoDelay);
    let req = [check("per_ip", "192.0.2.9", once_a_second)];

    let before = block_in_place(|| redis_time(&mut conn));
    let first = store.decide(&req).await.unwrap();
    let after = block_in_place(|| redis_time(&mut conn));
    let stamped = first.zones[0].next.last_us;
    assert!(before <= stamped && stamped <= after, "{before} <= {stamped} <= {after}");
    assert_eq!(store.raw_state("per_ip", b"192.0.2.9").await.unwrap(), Some(first.zones[0].next));

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
    let global = store.raw_state("global", b"all").await.unwrap().unwrap();
    assert!(global.level > 9.9 && global.level <= 10.0, "{global:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_script_arguments_are_errors() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let script = redis::Script::new(include_str!("../lua/limit_req.lua"));
    let err = script.key("weir:z:{k}").arg("1700000000000000").invoke::<redis::Value>(&mut conn).unwrap_err();
    assert!(err.to_string().contains("expected 6 ARGV"), "{err}");
    let err = script
        .key("weir:z:{k}")
        .arg("soon")
        .arg(1)
        .arg(1_000_000)
        .arg(0)
        .arg(-1)
        .arg(1)
        .invoke::<redis::Value>(&mut conn)
        .unwrap_err();
    assert!(err.to_string().contains("not a number"), "{err}");
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

/// `MEMORY USAGE` of a key, printing its value.
fn measure(conn: &mut redis::Connection, key: &str) -> u64 {
    block_in_place(|| {
        let value: String = redis::cmd("GET").arg(key).query(conn).unwrap();
        let bytes: u64 = redis::cmd("MEMORY").arg("USAGE").arg(key).arg("SAMPLES").arg(0).query(conn).unwrap();
        let encoding: String = redis::cmd("OBJECT").arg("ENCODING").arg(key).query(conn).unwrap();
        println!("{key} = {value:?} ({} bytes, {encoding}): {bytes} bytes", value.len());
        bytes
    })
}
