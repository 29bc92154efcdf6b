//! Redis under memory pressure. With an eviction policy that can drop limit state (`allkeys-lru`
//! under `maxmemory`), Weir says so at start: a warning in its log, `weir_redis_eviction_risk` and
//! a warning in `/readyz`. With `noeviction` and Redis full, decisions fail with `OOM command not
//! allowed`: requests get the failure policy, `/readyz` is 503 with the reason, and the circuit
//! breaker stays open (one open, not a flap per PING) until Redis accepts writes again; the same
//! with a Redis answering `BUSY` (a runaway script). Real weir, real `redis-server` (with
//! `--maxmemory 2mb`, or a Cluster), real upstream, loopback.

use crate::support;

use std::time::{Duration, Instant};

use support::admin;
use support::config::{redis_store, with_app};
use support::http::{KeepAlive, Request, Response};
use support::metrics::{scrape, scrape_until};
use support::poll::poll;
use support::redis_server::RedisServer;
use support::redis_topology::Cluster;
use support::upstream::Upstream;
use support::weir::Weir;

const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// The policy is read at start-up; allow for a slow machine.
const SETTLE: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(50);
/// How long requests are driven against a full Redis to count breaker opens.
const WINDOW: Duration = Duration::from_secs(3);

fn start(redis: &RedisServer, up: &Upstream, on_error: &str) -> Weir {
    start_url(&redis.url(), up, on_error)
}

fn start_url(url: &str, up: &Upstream, on_error: &str) -> Weir {
    let sections =
        redis_store(url, &format!("timeout = \"200ms\"\non_error = \"{on_error}\"\ncircuit_breaker_failures = 3"));
    Weir::start(&with_app(
        admin::LISTEN,
        &sections,
        up.addr(),
        r#"
[[limit_req_zone]]
name = "per_key"
key = "header:X-Key"
rate = "1000r/s"

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
limit_req = [ { zone = "per_key", burst = 1000, nodelay = true } ]
"#,
    ))
}

fn readyz(w: &Weir) -> Response {
    admin::request(admin::addr(w), "GET", "/readyz", None)
}

#[test]
fn an_eviction_policy_that_can_drop_limit_state_is_reported_at_start() {
    let up = Upstream::start();
    let lru = RedisServer::start_with_args(&["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"]);
    let weir = start(&lru, &up, "allow");
    let ready = poll(SETTLE, POLL, || readyz(&weir), |r| r.json()["redis"]["maxmemory_policy"] == "allkeys-lru")
        .unwrap_or_else(|r| panic!("/readyz never showed the policy: {}", r.summary()));
    assert_eq!(ready.status, 200, "a warning does not make Weir unready: {}", ready.summary());
    let body = ready.json();
    assert_eq!(body["status"], "ready", "{body}");
    assert_eq!(body["redis"]["eviction_risk"], true, "{body}");
    assert_eq!(body["redis"]["maxmemory"], 2 * 1024 * 1024, "{body}");
    let warning = body["warnings"][0].as_str().unwrap_or_default().to_string();
    assert!(warning.contains("allkeys-lru") && warning.contains("noeviction"), "{body}");
    assert_eq!(scrape(admin::addr(&weir)).must("weir_redis_eviction_risk", &[]), 1.0);
    assert!(
        weir.stderr().lines().any(|l| l.contains("WARN") && l.contains("maxmemory-policy is allkeys-lru")),
        "no warning in the log:\n{}",
        weir.stderr()
    );

    // The right setting: no warning.
    let safe = RedisServer::start_with_args(&["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]);
    let weir = start(&safe, &up, "allow");
    let ready = poll(SETTLE, POLL, || readyz(&weir), |r| r.json()["redis"]["maxmemory_policy"] == "noeviction")
        .unwrap_or_else(|r| panic!("/readyz never showed the policy: {}", r.summary()));
    let body = ready.json();
    assert_eq!((ready.status, &body["redis"]["eviction_risk"]), (200, &serde_json::json!(false)), "{body}");
    assert!(body.get("warnings").is_none(), "{body}");
    assert_eq!(scrape(admin::addr(&weir)).must("weir_redis_eviction_risk", &[]), 0.0);
}

#[test]
fn on_a_cluster_any_master_that_can_evict_is_reported() {
    let up = Upstream::start();
    let cluster = Cluster::start(3);
    let master = *cluster.slot_map().masters().iter().next().expect("a master");
    let mut conn = cluster.node(master).connection();
    for (name, value) in [("maxmemory", "64mb"), ("maxmemory-policy", "volatile-ttl")] {
        let _: () = redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query(&mut conn).expect("CONFIG SET");
    }
    let weir = start_url(&cluster.url(), &up, "allow");
    let ready = poll(SETTLE, POLL, || readyz(&weir), |r| r.json()["redis"]["maxmemory_policy"] == "volatile-ttl")
        .unwrap_or_else(|r| panic!("/readyz never showed the master's policy: {}", r.summary()));
    assert_eq!(ready.json()["redis"]["eviction_risk"], true, "{}", ready.summary());
    assert_eq!(ready.status, 200, "{}", ready.summary());
}

#[test]
fn a_full_noeviction_redis_gets_the_failure_policy_and_readyz_says_why_without_flapping() {
    let up = Upstream::start();
    // Room to fill first (a busy redis-server's baseline was 1.4 MB, and 512 KB more passed 2 MB);
    // maxmemory is set below what is used once it is full.
    let redis = RedisServer::start_with_args(&["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"]);
    let weir = start(&redis, &up, "deny");
    let admin = admin::addr(&weir);
    let mut client = KeepAlive::new(weir.addr, IO_TIMEOUT);
    let mut n = 0u64;
    let mut send = |client: &mut KeepAlive| {
        n += 1;
        client.send(&Request::get("/").header("X-Key", &format!("k{n}"))).expect("request")
    };
    assert_eq!(send(&mut client).status, 200, "healthy");
    assert_eq!(readyz(&weir).status, 200);

    // Fill Redis until it refuses writes: 512 KB of data, then maxmemory below what is used (a
    // filler write alone only goes over for as long as its own query buffer is counted).
    let mut conn = redis.connection();
    let used = |conn: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("memory").query(conn).expect("INFO");
        info.lines().find_map(|l| l.trim().strip_prefix("used_memory:")?.parse().ok()).expect("used_memory")
    };
    let baseline = used(&mut conn);
    let filler = vec![b'x'; 64 * 1024];
    for i in 0..8 {
        let r: redis::RedisResult<()> = redis::cmd("SET").arg(format!("filler:{i}")).arg(&filler).query(&mut conn);
        r.unwrap_or_else(|e| panic!("fill {i} (used_memory {baseline} at start): {e}"));
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(baseline + 256 * 1024)
        .query(&mut conn)
        .expect("CONFIG SET");
    let refused: redis::RedisResult<()> = redis::cmd("SET").arg("probe").arg("1").query(&mut conn);
    assert!(refused.is_err_and(|e| e.to_string().contains("OOM")), "redis still accepts writes");

    // Every request gets the failure policy (deny: the route's status), for the whole window.
    let opens_before = scrape(admin).value_or_zero("weir_store_circuit_opens_total", &[]);
    let t0 = Instant::now();
    let mut statuses = std::collections::BTreeMap::new();
    while t0.elapsed() < WINDOW {
        let r = send(&mut client);
        assert!(r.text().contains("limiter_unavailable") || r.status == 200, "{}", r.summary());
        *statuses.entry(r.status).or_insert(0u32) += 1;
    }
    assert_eq!(statuses.keys().copied().collect::<Vec<_>>(), [429], "statuses over the window: {statuses:?}");
    let ready = poll(SETTLE, POLL, || readyz(&weir), |r| r.status == 503)
        .unwrap_or_else(|r| panic!("/readyz stayed ready: {}", r.summary()));
    let body = ready.json();
    assert_eq!(body["status"], "not_ready", "{body}");
    assert!(body["reason"].as_str().is_some_and(|r| r.contains("OOM")), "the reason names OOM: {body}");
    let opens = scrape(admin).must("weir_store_circuit_opens_total", &[]) - opens_before;
    assert_eq!(opens, 1.0, "the breaker opened once and stayed open, over {statuses:?} requests in {WINDOW:?}");

    // Room again: the probe closes the circuit, /readyz is ready, requests pass.
    let _: () = redis::cmd("FLUSHALL").query(&mut conn).expect("FLUSHALL");
    poll(SETTLE, POLL, || readyz(&weir), |r| r.status == 200)
        .unwrap_or_else(|r| panic!("/readyz never came back: {}", r.summary()));
    assert_eq!(send(&mut client).status, 200, "decided by Redis again");
    let s = scrape_until(admin, SETTLE, POLL, |s| s.value_or_zero("weir_store_circuit_open", &[]) == 0.0)
        .unwrap_or_else(|s| panic!("circuit still open:\n{}", s.filtered()));
    assert_eq!(s.must("weir_store_circuit_opens_total", &[]), opens_before + 1.0);
}

#[test]
fn a_busy_redis_keeps_the_circuit_open_and_readyz_not_ready_until_the_script_is_killed() {
    let up = Upstream::start();
    // Redis answers BUSY to everyone else once a script has run for 100 ms.
    let redis = RedisServer::start_with_args(&["--busy-reply-threshold", "100"]);
    let weir = start(&redis, &up, "deny");
    let admin = admin::addr(&weir);
    let mut client = KeepAlive::new(weir.addr, IO_TIMEOUT);
    let mut n = 0u64;
    let mut send = |client: &mut KeepAlive| {
        n += 1;
        client.send(&Request::get("/").header("X-Key", &format!("k{n}"))).expect("request")
    };
    assert_eq!(send(&mut client).status, 200, "healthy");

    // A script that never ends (read-only, so SCRIPT KILL can stop it).
    let url = redis.url();
    let runaway = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).expect("url").get_connection().expect("connect");
        let _: redis::RedisResult<()> = redis::cmd("EVAL").arg("while true do end").arg(0).query(&mut conn);
    });
    let opens_before = scrape(admin).value_or_zero("weir_store_circuit_opens_total", &[]);
    let ready = poll(SETTLE, POLL, || readyz(&weir), |r| r.status == 503)
        .unwrap_or_else(|r| panic!("/readyz stayed ready: {}", r.summary()));
    assert!(ready.json()["reason"].as_str().is_some_and(|r| r.contains("BUSY")), "{}", ready.summary());
    let t0 = Instant::now();
    let mut statuses = std::collections::BTreeMap::new();
    while t0.elapsed() < WINDOW {
        *statuses.entry(send(&mut client).status).or_insert(0u32) += 1;
    }
    assert_eq!(statuses.keys().copied().collect::<Vec<_>>(), [429], "the failure policy answers: {statuses:?}");
    let opens = scrape(admin).must("weir_store_circuit_opens_total", &[]) - opens_before;
    assert_eq!(opens, 1.0, "one open over {WINDOW:?} of BUSY replies, no flapping");

    let mut conn = redis.connection();
    let _: () = redis::cmd("SCRIPT").arg("KILL").query(&mut conn).expect("SCRIPT KILL");
    runaway.join().expect("the runaway script's client");
    poll(SETTLE, POLL, || readyz(&weir), |r| r.status == 200)
        .unwrap_or_else(|r| panic!("/readyz never came back: {}", r.summary()));
    assert_eq!(send(&mut client).status, 200, "decided by Redis again");
}
