//! `weir` on a Redis Cluster (`url = "redis+cluster://…"`): 3 masters with a replica each, made by
//! `redis-cli --cluster create`, real weir processes, real upstream, real sockets.
//!
//! * Two instances enforce one limit exactly as on one Redis, for keys on every master.
//! * A route whose zones live in two hash slots (client keys `ip` and `header:X-Key`): when the
//!   second slot rejects, the first slot's charge is taken back exactly (`lua/restore.lua`).
//! * limit_conn across two instances, and a lease taken in one slot released when another slot's
//!   zone is at its max.
//! * Requests of one hash slot that arrive together are coalesced into one script call on the
//!   slot's master (fewer EVALSHA than requests), and a fleet of two still admits exactly the limit.
//! * A slot moved to another master (ASK, then MOVED) is decided there, each request charged once.
//! * A master killed with SIGKILL: its replica is promoted, weir serves per its failure policy
//!   meanwhile and decides on Redis again by itself afterwards.

use crate::support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use support::config::{redis_store, with_app, NO_ACCESS_LOG};
use support::http::{self, summaries, Response};
use support::poll::wait_until;
use support::redis_topology::{connect, Cluster};
use support::upstream::Upstream;
use support::weir::Weir;
use support::{admin, concurrent, metrics};
use weir::store::key_slot;

/// One request as a client sends it: `path` with `X-Key: key`.
fn get(addr: SocketAddr, path: &str, key: &str) -> Response {
    http::get_with(addr, path, &[("X-Key", key)])
}

fn statuses(rs: &[Response]) -> Vec<u16> {
    rs.iter().map(|r| r.status).collect()
}

/// A weir instance on the cluster, `store_extra` lines added to `[store]`.
fn member(cluster: &Cluster, up: &Upstream, store_extra: &str) -> Weir {
    let store = redis_store(&cluster.url(), &format!("timeout = \"500ms\"\n{store_extra}"));
    let sections = format!("{NO_ACCESS_LOG}\n\n{store}");
    let rest = r#"[[limit_req_zone]]
name = "fleet"
key = "header:X-Key"
rate = "1r/m"

[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[limit_req_zone]]
name = "per_key"
key = "header:X-Key"
rate = "1r/m"

[[limit_conn_zone]]
name = "conn_key"
key = "header:X-Key"

[[limit_conn_zone]]
name = "conn_ip"
key = "ip"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "fleet", burst = 4, nodelay = true } ]

[[route]]
name = "key"
path_prefix = "/key/"
upstream = "app"
limit_req = [ { zone = "per_key", burst = 0, nodelay = true } ]

[[route]]
name = "both"
path_prefix = "/both/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 2, nodelay = true }, { zone = "per_key", burst = 0, nodelay = true } ]

[[route]]
name = "conn"
path_prefix = "/conn/"
upstream = "app"
limit_conn = [ { zone = "conn_key", max = 2 } ]

[[route]]
name = "conn2"
path_prefix = "/conn2/"
upstream = "app"
limit_conn = [ { zone = "conn_ip", max = 5 }, { zone = "conn_key", max = 1 } ]
"#;
    Weir::start(&with_app(admin::LISTEN, &sections, up.addr(), rest))
}

/// `n` values of `X-Key` (prefixed `prefix`) whose slot is served by the master on `port`.
fn keys_on(cluster: &Cluster, port: u16, prefix: &str, n: usize) -> Vec<String> {
    let map = cluster.slot_map();
    let keys: Vec<String> = (0..100_000)
        .map(|i| format!("{prefix}{i}"))
        .filter(|k| map.master_of(key_slot(k.as_bytes())) == port)
        .take(n)
        .collect();
    assert_eq!(keys.len(), n, "not enough keys on master {port}");
    keys
}

/// The masters' ports, as the cluster says.
fn masters(cluster: &Cluster) -> BTreeSet<u16> {
    cluster.slot_map().masters()
}

fn exists_on_owner(cluster: &Cluster, key: &str) -> bool {
    let mut conn = cluster.connection_for(key);
    redis::cmd("EXISTS").arg(key).query::<u64>(&mut conn).expect("EXISTS") == 1
}

fn get_on_owner(cluster: &Cluster, key: &str) -> Option<String> {
    let mut conn = cluster.connection_for(key);
    redis::cmd("GET").arg(key).query(&mut conn).expect("GET")
}

#[test]
fn one_limit_across_instances_and_slots() {
    let started = Instant::now();
    let cluster = Cluster::start(3);
    println!("cluster of 6 nodes ready after {:?}", started.elapsed());
    let up = Upstream::start();
    let w1 = member(&cluster, &up, "deny_cache_size = 0");
    let w2 = member(&cluster, &up, "deny_cache_size = 0");
    let masters = masters(&cluster);
    assert_eq!(masters.len(), 3, "{masters:?}");

    // (a) 1r/m burst 4 nodelay: exactly 5 admitted across both instances, for a key on each master.
    for &port in &masters {
        let key = keys_on(&cluster, port, "fleet-", 1).remove(0);
        let rs: Vec<Response> = (0..10).map(|i| get([w1.addr, w2.addr][i % 2], "/api/x", &key)).collect();
        assert_eq!(statuses(&rs), [200, 200, 200, 200, 200, 429, 429, 429, 429, 429], "{:#?}", summaries(&rs));
        let redis_key = format!("weir:fleet:{{{key}}}");
        assert_eq!(cluster.keyslot(&redis_key), key_slot(key.as_bytes()), "CLUSTER KEYSLOT agrees");
        assert_eq!(cluster.master_of(&redis_key), port);
        assert!(exists_on_owner(&cluster, &redis_key), "{redis_key} lives on master {port}");
    }

    // (b) Zones in two slots. per_ip (key 127.0.0.1, capacity 3) is charged first, per_key
    // (capacity 1) second; when per_key rejects, per_ip's charge must be taken back.
    let ip_key = "weir:per_ip:{127.0.0.1}";
    let ip_master = cluster.master_of(ip_key);
    let other = *masters.iter().find(|&&p| p != ip_master).expect("another master");
    let keys = keys_on(&cluster, other, "k-", 6);
    for k in &keys {
        assert_ne!(key_slot(k.as_bytes()), key_slot(b"127.0.0.1"));
    }
    let (spent1, spent2, fresh) = (&keys[0], &keys[1], &keys[2..]);
    // Use up per_key for two keys on a route without per_ip.
    assert_eq!(get(w1.addr, "/key/", spent1).status, 200);
    assert_eq!(get(w2.addr, "/key/", spent2).status, 200);

    // per_ip has no state: the rejected request must leave none.
    let r = get(w1.addr, "/both/", spent1);
    assert_eq!(r.status, 429, "{}", r.summary());
    assert_eq!(r.json()["zone"], "per_key", "{}", r.summary());
    assert!(!exists_on_owner(&cluster, ip_key), "per_ip charged by a rejected request");

    // per_ip has state: the rejected request must leave it exactly as it was.
    assert_eq!(get(w2.addr, "/both/", &fresh[0]).status, 200);
    let before = get_on_owner(&cluster, ip_key).expect("per_ip state");
    let r = get(w2.addr, "/both/", spent2);
    assert_eq!(r.status, 429, "{}", r.summary());
    assert_eq!(get_on_owner(&cluster, ip_key).as_ref(), Some(&before), "per_ip state changed by a rejection");

    // per_ip still admits exactly its quota: 3 in all (one already), then it rejects.
    let rs: Vec<Response> =
        fresh[1..].iter().enumerate().map(|(i, k)| get([w1.addr, w2.addr][i % 2], "/both/", k)).collect();
    assert_eq!(statuses(&rs), [200, 200, 429], "{:#?}", summaries(&rs));
    assert_eq!(rs[2].json()["zone"], "per_ip", "{}", rs[2].summary());

    // limit_conn: at most 2 in flight for one key across both instances.
    up.set_sleep(Duration::from_millis(1500));
    let conn_key = keys_on(&cluster, ip_master, "c-", 1).remove(0);
    let (addrs, key) = ([w1.addr, w2.addr], conn_key.as_str());
    let rs: Vec<Response> = thread::scope(|s| {
        let handles: Vec<_> = (0..6).map(|i| s.spawn(move || get(addrs[i % 2], "/conn/", key))).collect();
        handles.into_iter().map(|h| h.join().expect("request thread")).collect()
    });
    let mut got = statuses(&rs);
    got.sort();
    assert_eq!(got, [200, 200, 503, 503, 503, 503], "{:#?}", summaries(&rs));
    let lease_key = format!("weir:conn:conn_key:{{{conn_key}}}");
    let mut owner = cluster.connection_for(&lease_key);
    assert!(
        wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
            redis::cmd("ZCARD").arg(&lease_key).query::<u64>(&mut owner).expect("ZCARD") == 0
        })
        .is_some(),
        "leases released after the requests"
    );

    // limit_conn over two slots: conn_ip (slot of 127.0.0.1) is taken first, conn_key (max 1)
    // second; a request rejected by conn_key must not keep its conn_ip lease.
    let key = keys_on(&cluster, other, "d-", 1).remove(0);
    let ip_leases = "weir:conn:conn_ip:{127.0.0.1}";
    let mut ip_owner = cluster.connection_for(ip_leases);
    let hits = up.hits();
    thread::scope(|s| {
        let holder = s.spawn(|| get(w1.addr, "/conn2/", &key));
        assert!(up.wait_hits(hits + 1, Duration::from_secs(5)), "the first request reached the upstream");
        for w in [&w1, &w2] {
            let r = get(w.addr, "/conn2/", &key);
            assert_eq!(r.status, 503, "{}", r.summary());
        }
        let held: u64 = redis::cmd("ZCARD").arg(ip_leases).query(&mut ip_owner).expect("ZCARD");
        assert_eq!(held, 1, "conn_ip holds only the admitted request's lease");
        assert_eq!(holder.join().expect("holder").status, 200);
    });
    up.set_sleep(Duration::ZERO);
    println!("one_limit_across_instances_and_slots: {:?}", started.elapsed());
}

/// `EVALSHA` calls the master on `port` has served (`INFO commandstats`).
fn evalsha_calls(cluster: &Cluster, port: u16) -> u64 {
    evalsha_stat(cluster, port, "calls")
}

/// `field` (`calls`, `rejected_calls`, …) of `EVALSHA` in `INFO commandstats` of `port`.
fn evalsha_stat(cluster: &Cluster, port: u16, field: &str) -> u64 {
    let info: String =
        redis::cmd("INFO").arg("commandstats").query(&mut cluster.node(port).connection()).expect("INFO");
    let Some(stats) = info.lines().find_map(|l| l.strip_prefix("cmdstat_evalsha:")) else { return 0 };
    stats
        .split(',')
        .find_map(|kv| kv.strip_prefix(field).and_then(|v| v.strip_prefix('=')))
        .map(|v| v.parse().expect("a count"))
        .unwrap_or_else(|| panic!("no {field} in {stats}"))
}

/// `(count, sum)` of weir's `weir_redis_batch_size` histogram.
fn batches(w: &Weir) -> (f64, f64) {
    let scrape = metrics::scrape(admin::addr(w));
    (scrape.value_or_zero("weir_redis_batch_size_count", &[]), scrape.value_or_zero("weir_redis_batch_size_sum", &[]))
}

#[test]
fn concurrent_requests_of_one_slot_coalesce_on_its_master_and_stay_exact() {
    let cluster = Cluster::start(3);
    let up = Upstream::start();
    let w1 = member(&cluster, &up, "deny_cache_size = 0");
    let w2 = member(&cluster, &up, "deny_cache_size = 0");
    // The slot map is read in the background on the first decision; until then redis-rs decides.
    for w in [&w1, &w2] {
        let ready = wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            get(w.addr, "/key/", "warm-up");
            batches(w).0 >= 1.0
        });
        assert!(ready.is_some(), "no decision went through a lane to a master within 10 s");
    }
    let before = (batches(&w1), batches(&w2));
    const PER_KEY: usize = 120;
    let mut requests = 0u64;
    let mut calls = 0u64;
    for port in masters(&cluster) {
        let key = keys_on(&cluster, port, "burst-", 1).remove(0);
        let evalsha_before = evalsha_calls(&cluster, port);
        let reqs = (0..PER_KEY)
            .map(|i| ([w1.addr, w2.addr][i % 2], http::Request::new("GET", "/api/x").header("X-Key", &key)))
            .collect();
        let rs = concurrent::fire(reqs);
        let mut got = statuses(&rs);
        got.sort();
        // 1r/m burst 4 nodelay: exactly 5 of the concurrent requests across both instances.
        assert_eq!(got.iter().filter(|&&s| s == 200).count(), 5, "master {port}: {:#?}", summaries(&rs));
        assert_eq!(got.iter().filter(|&&s| s == 429).count(), PER_KEY - 5, "master {port}: {:#?}", summaries(&rs));
        requests += PER_KEY as u64;
        calls += evalsha_calls(&cluster, port) - evalsha_before;
    }
    let after = (batches(&w1), batches(&w2));
    let batch_count = (after.0 .0 - before.0 .0) + (after.1 .0 - before.1 .0);
    let batched = (after.0 .1 - before.0 .1) + (after.1 .1 - before.1 .1);
    println!(
        "coalescing on the cluster: {requests} requests, {calls} EVALSHA on the masters, {batch_count} lane calls carrying {batched} decisions"
    );
    assert_eq!(batched as u64, requests, "every decision went through a master's lane");
    assert!(calls < requests, "{calls} EVALSHA for {requests} requests: nothing was coalesced");
    assert!(batch_count < batched, "the lanes sent {batch_count} calls for {batched} decisions");
}

/// `CLUSTER <args>` on the node on `port`.
fn cluster_cmd(cluster: &Cluster, port: u16, args: &[&str]) -> redis::Value {
    let mut conn = cluster.node(port).connection();
    redis::cmd("CLUSTER").arg(args).query(&mut conn).unwrap_or_else(|e| panic!("CLUSTER {args:?} on {port}: {e}"))
}

/// A slot moved to another master while weir decides on it (the resharding steps of the Redis
/// Cluster specification): the lane's calls to the old master are refused with `ASK` (keys
/// migrated, slot still migrating) then `MOVED`, go through redis-rs instead, and charge once;
/// the lanes then follow the new slot map to the new master.
#[test]
fn a_slot_moved_to_another_master_is_decided_there_exactly_once() {
    let cluster = Cluster::start(3);
    let up = Upstream::start();
    let w1 = member(&cluster, &up, "deny_cache_size = 0");
    let w2 = member(&cluster, &up, "deny_cache_size = 0");
    let masters = masters(&cluster);
    let from = *masters.iter().next().expect("a master");
    let to = *masters.iter().find(|&&p| p != from).expect("another master");
    let key = keys_on(&cluster, from, "moving-", 1).remove(0);
    let slot = key_slot(key.as_bytes());
    let redis_key = format!("weir:fleet:{{{key}}}");
    // The slot map is read on the first decision; wait until the lanes decide (on `from`).
    for w in [&w1, &w2] {
        let ready = wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            get(w.addr, "/key/", "warm-up");
            batches(w).0 >= 1.0
        });
        assert!(ready.is_some(), "no decision went through a lane to a master within 10 s");
    }
    // 1r/m burst 4: 3 of the 5 spent on the old master.
    let rs: Vec<Response> = (0..3).map(|i| get([w1.addr, w2.addr][i % 2], "/api/", &key)).collect();
    assert_eq!(statuses(&rs), [200, 200, 200], "{:#?}", summaries(&rs));
    assert!(exists_on_owner(&cluster, &redis_key));

    let id = |port: u16| -> String {
        let mut conn = cluster.node(port).connection();
        redis::cmd("CLUSTER").arg("MYID").query(&mut conn).expect("CLUSTER MYID")
    };
    let (from_id, to_id, slot_text) = (id(from), id(to), slot.to_string());
    cluster_cmd(&cluster, to, &["SETSLOT", &slot_text, "IMPORTING", &from_id]);
    cluster_cmd(&cluster, from, &["SETSLOT", &slot_text, "MIGRATING", &to_id]);
    let mut from_conn = cluster.node(from).connection();
    let moved: String = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(to)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(&redis_key)
        .query(&mut from_conn)
        .expect("MIGRATE");
    assert_eq!(moved, "OK");
    // The key is on `to`, the slot still `from`'s (migrating): `from` answers ASK.
    let (before_ask, refused, lane_calls) =
        (evalsha_calls(&cluster, to), evalsha_stat(&cluster, from, "rejected_calls"), batches(&w1).0);
    assert_eq!(get(w1.addr, "/api/", &key).status, 200, "the 4th of 5, decided on the importing master");
    assert!(evalsha_calls(&cluster, to) > before_ask, "decided where the key now is");
    assert_eq!(batches(&w1).0, lane_calls + 1.0, "the request went to the old master's lane first");
    assert!(evalsha_stat(&cluster, from, "rejected_calls") > refused, "and the old master refused it (ASK)");
    for port in [to, from].into_iter().chain(masters.iter().copied().filter(|&p| p != to && p != from)) {
        cluster_cmd(&cluster, port, &["SETSLOT", &slot_text, "NODE", &to_id]);
    }
    // Now `from` answers MOVED until the lanes read the new map.
    let rs: Vec<Response> = (0..3).map(|i| get([w2.addr, w1.addr][i % 2], "/api/", &key)).collect();
    assert_eq!(statuses(&rs), [200, 429, 429], "exactly 5 in all across the move: {:#?}", summaries(&rs));
    assert_eq!(cluster.master_of(&redis_key), to);
    assert!(exists_on_owner(&cluster, &redis_key), "the state lives on the new master");
    // The lanes follow: a decision of the slot reaches `to` without a call to `from`.
    for w in [&w1, &w2] {
        let followed = wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            let (old, lanes) = (evalsha_calls(&cluster, from), batches(w).0);
            let r = get(w.addr, "/api/", &key);
            assert_eq!(r.status, 429, "{}", r.summary());
            evalsha_calls(&cluster, from) == old && batches(w).0 > lanes
        });
        assert!(followed.is_some(), "the lanes still call the old master 10 s after the move");
    }
}

#[test]
fn a_killed_master_is_replaced_and_weir_follows() {
    let started = Instant::now();
    let mut cluster = Cluster::start(3);
    let up = Upstream::start();
    // Fail open while Redis cannot decide; a fresh key then gets 6 × 200 instead of 5 + 429.
    let w1 = member(&cluster, &up, "on_error = \"allow\"\ndeny_cache_size = 0");
    let w2 = member(&cluster, &up, "on_error = \"allow\"\ndeny_cache_size = 0");
    let victim = cluster.master_of_slot(key_slot(b"victim"));
    let keys = keys_on(&cluster, victim, "f-", 400);
    let mut fresh = keys.iter();
    let mut probe = || {
        let key = fresh.next().expect("enough fresh keys");
        let rs: Vec<Response> = (0..6).map(|i| get([w1.addr, w2.addr][i % 2], "/api/", key)).collect();
        (key.clone(), rs)
    };
    let (_, rs) = probe();
    assert_eq!(statuses(&rs), [200, 200, 200, 200, 200, 429], "before the kill: {:#?}", summaries(&rs));

    cluster.node_mut(victim).kill();
    let killed = Instant::now();
    let cluster = &cluster;
    let (recovered, during, cluster_ok) = thread::scope(|s| {
        // How long the cluster itself takes: cluster_state:ok everywhere, the slots on a live node.
        let cluster_ok = s.spawn(|| cluster.wait_ok(Duration::from_secs(30)));
        let mut during = 0;
        while killed.elapsed() < Duration::from_secs(30) {
            let (key, rs) = probe();
            for r in &rs {
                assert!(r.status == 200 || r.status == 429, "not served per policy: {}", r.summary());
            }
            if statuses(&rs) == [200, 200, 200, 200, 200, 429] {
                return (Some((killed.elapsed(), key)), during, cluster_ok.join().expect("wait_ok"));
            }
            during += rs.len();
            thread::sleep(Duration::from_millis(100));
        }
        (None, during, cluster_ok.join().expect("wait_ok"))
    });
    let Some((took, key)) = recovered else {
        let tail = |w: &Weir| w.stderr().lines().rev().take(30).collect::<Vec<_>>().join("\n");
        panic!(
            "weir does not decide on Redis again within 30 s of the kill (cluster ok after {cluster_ok:?})\n\
             --- w1 ---\n{}\n--- w2 ---\n{}",
            tail(&w1),
            tail(&w2)
        );
    };
    let cluster_ok = cluster_ok.expect("cluster_state:ok again within 30 s");
    let redis_key = format!("weir:fleet:{{{key}}}");
    let new_master = cluster.master_of(&redis_key);
    assert_ne!(new_master, victim, "the slot moved to the promoted replica");
    assert!(exists_on_owner(cluster, &redis_key), "the decision was made on the new master");
    assert!(connect(victim).is_err(), "the victim is dead");
    println!(
        "failover: weir decides on Redis again {took:?} after SIGKILL of master {victim} (new master {new_master}), \
         {during} requests served per policy meanwhile; the cluster was ok again after {cluster_ok:?}; \
         test {:?}",
        started.elapsed()
    );

    // Still one limit for both instances, on every master.
    for port in masters(cluster) {
        let key = keys_on(cluster, port, "after-", 1).remove(0);
        let rs: Vec<Response> = (0..7).map(|i| get([w1.addr, w2.addr][i % 2], "/api/", &key)).collect();
        assert_eq!(statuses(&rs), [200, 200, 200, 200, 200, 429, 429], "master {port}: {:#?}", summaries(&rs));
    }
}

/// The per-slot path against one call: the same random multi-zone requests (every algorithm,
/// client keys in three slots on three masters, costs 0 to 2) decided by a store on the cluster
/// and by a store on one `redis-server`, both on the same manual clock, must give equal verdicts
/// and leave equal states: a rejected request's charges in earlier slots are fully taken back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_slot_decisions_equal_one_call() {
    use std::sync::Arc;

    use rand::{Rng, SeedableRng};
    use support::redis_server::RedisServer;
    use tokio::task::block_in_place;
    use weir::limit::{evaluate, Algorithm, Clock, DelayPolicy, LimitReq, ManualClock, Rate, State};
    use weir::store::{KeyedZone, LimitStore, RedisClock, RedisStore, RedisStoreConfig};

    let cluster = block_in_place(|| Cluster::start(3));
    let single = block_in_place(RedisServer::start);
    let clock = Arc::new(ManualClock::new(1_700_000_000_000_000));
    let store = |url: String| {
        let config = RedisStoreConfig {
            url,
            timeout: Duration::from_secs(2),
            clock: RedisClock::Local,
            key_prefix: "weir:".into(),
            tls: None,
        };
        RedisStore::new(config, clock.clone()).expect("store").with_full_outcomes(true)
    };
    let (on_cluster, on_one) = (store(cluster.url()), store(single.url()));
    assert_eq!((on_cluster.topology(), on_one.topology()), ("cluster", "single"));
    let clients = ["a", "b", "c"];
    let slots: BTreeSet<u16> = clients.iter().map(|c| key_slot(c.as_bytes())).collect();
    let owners: BTreeSet<u16> = block_in_place(|| slots.iter().map(|&s| cluster.master_of_slot(s)).collect());
    assert_eq!((slots.len(), owners.len()), (3, 3), "three slots on three masters");

    let limit =
        |algorithm, rate: &str, burst, delay| LimitReq { algorithm, rate: Rate::parse(rate).unwrap(), burst, delay };
    let zones = [
        ("leaky", limit(Algorithm::LeakyBucket, "5r/s", 3, DelayPolicy::After(1))),
        ("token", limit(Algorithm::TokenBucket, "4r/s", 2, DelayPolicy::NoDelay)),
        ("fixed", limit(Algorithm::FixedWindow, "4r/s", 0, DelayPolicy::NoDelay)),
        ("log", limit(Algorithm::SlidingLog, "4r/s", 0, DelayPolicy::NoDelay)),
        ("sliding", limit(Algorithm::SlidingWindow, "4r/s", 0, DelayPolicy::NoDelay)),
    ];
    // What is compared of a stored state: a log's expired entries are trimmed by whichever admitted
    // call comes next (and a call taken back does not put them back), so live entries only; and a
    // state about to be forgotten (within 100 ms) may already be gone from one Redis and not from
    // the other (its key's TTL runs on Redis' clock), so it counts as none.
    let comparable = |state: Option<State>, limit: &LimitReq, now: u64| {
        let state = match state? {
            State::Log(entries) => State::Log(entries.into_iter().filter(|t| t + limit.rate.period_us > now).collect()),
            other => other,
        };
        let soon = now + 100_000;
        let forgettable = [0, 1, limit.capacity()]
            .iter()
            .all(|&cost| evaluate(limit, Some(&state), soon, cost) == evaluate(limit, None, soon, cost));
        (!forgettable).then_some(state)
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (mut admitted, mut multi_slot_rejections) = (0, 0);
    // The manual clock never falls behind real time (keys expire on Redis' clock): a key gone from
    // Redis always holds a state already expired on the manual clock.
    let mut last_real = Instant::now();
    for n in 0..300 {
        let real = last_real.elapsed().as_micros() as u64;
        last_real = Instant::now();
        clock.advance_us(rng.gen_range(0..120_000u64).max(real));
        let picked: Vec<usize> = {
            let mut all: Vec<usize> = (0..zones.len()).collect();
            for i in (1..all.len()).rev() {
                all.swap(i, rng.gen_range(0..=i));
            }
            all.truncate(rng.gen_range(1..=4));
            all
        };
        let checks: Vec<KeyedZone<'_>> = picked
            .iter()
            .map(|&z| {
                let client = clients[rng.gen_range(0..clients.len())];
                KeyedZone::new(zones[z].0, client.as_bytes(), zones[z].1, rng.gen_range(0..=2))
            })
            .collect();
        let expected = on_one.decide(&checks).await.expect("single redis");
        let got = on_cluster.decide(&checks).await.expect("cluster");
        assert_eq!(got, expected, "request {n}: {checks:?}");
        let spread: BTreeSet<&[u8]> = checks.iter().map(|c| c.key.as_slice()).collect();
        admitted += usize::from(got.admitted);
        multi_slot_rejections += usize::from(!got.admitted && spread.len() > 1 && got.zones.iter().any(|z| z.admitted));
        let now = clock.now_us();
        for (zone, limit) in &zones {
            for client in clients {
                let a = on_cluster.raw_state(zone, client.as_bytes()).await.expect("cluster state");
                let b = on_one.raw_state(zone, client.as_bytes()).await.expect("single state");
                assert_eq!(
                    comparable(a, limit, now),
                    comparable(b, limit, now),
                    "request {n}: state of {zone}/{client}"
                );
            }
        }
    }
    // Another algorithm's value under a key (as after a reload that changed a zone's algorithm) is
    // put back as it was, whatever its type.
    let never = KeyedZone::new("fixed", b"b", zones[2].1, 5);
    let mut a_owner = block_in_place(|| cluster.connection_for("weir:leaky:{a}"));
    let cmd = |c: &mut redis::Connection, args: &[&str]| -> redis::Value {
        block_in_place(|| redis::cmd(args[0]).arg(&args[1..]).query(c).expect("redis command"))
    };
    cmd(&mut a_owner, &["DEL", "weir:leaky:{a}", "weir:log:{a}"]);
    cmd(&mut a_owner, &["ZADD", "weir:leaky:{a}", "1", "m1"]);
    cmd(&mut a_owner, &["PEXPIRE", "weir:leaky:{a}", "100000"]);
    cmd(&mut a_owner, &["SET", "weir:log:{a}", "garbage", "PX", "100000"]);
    for zone in [0, 3] {
        let check = KeyedZone::new(zones[zone].0, b"a", zones[zone].1, 1);
        let v = on_cluster.decide(&[check, never.clone()]).await.expect("cluster");
        assert!(!v.admitted && v.zones[0].admitted, "{v:?}");
    }
    assert_eq!(cmd(&mut a_owner, &["ZSCORE", "weir:leaky:{a}", "m1"]), redis::Value::BulkString(b"1".to_vec()));
    assert_eq!(cmd(&mut a_owner, &["GET", "weir:log:{a}"]), redis::Value::BulkString(b"garbage".to_vec()));
    for key in ["weir:leaky:{a}", "weir:log:{a}"] {
        let redis::Value::Int(pttl) = cmd(&mut a_owner, &["PTTL", key]) else { panic!("PTTL") };
        assert!(pttl > 90_000 && pttl <= 100_000, "{key}: PTTL {pttl}");
    }

    assert!(
        admitted > 50 && multi_slot_rejections > 20,
        "{admitted} admitted, {multi_slot_rejections} rejected with a zone admitting in another slot"
    );
    println!("per-slot = one call: 300 requests, {admitted} admitted, {multi_slot_rejections} rejections after charges in other slots");
}
