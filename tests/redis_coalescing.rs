//! The decision lane (`store/redis/lane.rs`) against a real `redis-server`: decisions that are
//! ready together go to Redis in one call of `lua/limit_req.lua` (batch mode), and each must come
//! out exactly as if it had been decided alone, in the order the requests asked; one request's
//! error must not touch the others; a flushed script cache or a restarted Redis must not lose a
//! decision that can still be made.

use crate::support;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::redis_server::RedisServer;
use tokio::task::JoinSet;
use weir::limit::{Algorithm, DelayPolicy, LimitReq, ManualClock, Rate, Verdict};
use weir::metrics::METRICS;
use weir::store::{KeyedZone, LimitStore, MemoryStore, RedisClock, RedisStore, RedisStoreConfig};

const T0: u64 = 1_700_000_000_000_000;

fn redis_store(server: &RedisServer, clock: Arc<ManualClock>) -> Arc<RedisStore> {
    let config = RedisStoreConfig {
        url: server.url(),
        timeout: Duration::from_secs(5),
        clock: RedisClock::Local,
        key_prefix: "weir:".to_string(),
        tls: None,
    };
    Arc::new(RedisStore::new(config, clock).expect("store").with_full_outcomes(true))
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// A slow limit (state lives for minutes on both clocks), of a random algorithm.
fn random_limit(rng: &mut StdRng) -> LimitReq {
    let algorithm = [
        Algorithm::LeakyBucket,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
    ][rng.gen_range(0..5)];
    let window = !matches!(algorithm, Algorithm::LeakyBucket | Algorithm::TokenBucket);
    let count = rng.gen_range(1..=6);
    LimitReq {
        algorithm,
        rate: Rate::parse(&format!("{count}r/m")).expect("rate"),
        burst: if window { 0 } else { rng.gen_range(0..=4) },
        delay: if algorithm == Algorithm::LeakyBucket && rng.gen_bool(0.5) {
            DelayPolicy::After(rng.gen_range(0..=2))
        } else {
            DelayPolicy::NoDelay
        },
    }
}

/// One request: (zone name, client key, limit, cost) per zone.
type Request = Vec<(String, String, LimitReq, u64)>;

fn checks(request: &Request) -> Vec<KeyedZone<'_>> {
    request.iter().map(|(zone, key, limit, cost)| KeyedZone::new(zone, key.as_bytes(), *limit, *cost)).collect()
}

#[test]
fn coalesced_decisions_equal_the_same_decisions_made_one_by_one() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let redis = redis_store(&server, clock.clone());
    let model = MemoryStore::new(clock.clone());
    let mut rng = StdRng::seed_from_u64(0xC0A1_E5CE);
    let zones: Vec<(String, LimitReq)> = (0..4).map(|i| (format!("z{i}"), random_limit(&mut rng))).collect();
    let rt = current_thread();
    let batches_before = METRICS.redis_batch_size.get_sample_count();
    let requests_before = METRICS.redis_batch_size.get_sample_sum();
    let mut decided = 0;
    let mut rejected = 0;
    for round in 0..40 {
        clock.set_us(T0 + round * 700_000);
        // Every fourth round, all requests have the same zones and costs (only keys differ): the
        // lane then sends "=" for the arguments of all but the first of a batch.
        let uniform = round % 4 == 3;
        let requests: Vec<Request> = (0..rng.gen_range(2..=60))
            .map(|_| {
                let mut picked: Vec<usize> = (0..rng.gen_range(1..=3)).map(|_| rng.gen_range(0..zones.len())).collect();
                picked.sort_unstable();
                picked.dedup();
                if uniform {
                    picked = vec![0, 2];
                }
                let key = format!("client{}", rng.gen_range(0..4));
                picked
                    .into_iter()
                    .map(|z| {
                        (zones[z].0.clone(), key.clone(), zones[z].1, if uniform { 1 } else { rng.gen_range(0..=2) })
                    })
                    .collect()
            })
            .collect();
        // All requests ask at once, from tasks of one thread, in index order: the lane queues them
        // in that order and Redis decides them in it.
        let got: Vec<Verdict> = rt.block_on(async {
            let mut tasks = JoinSet::new();
            for (i, request) in requests.iter().cloned().enumerate() {
                let redis = redis.clone();
                tasks.spawn(async move { (i, redis.decide(&checks(&request)).await) });
            }
            let mut out: Vec<Option<Verdict>> = vec![None; requests.len()];
            while let Some(joined) = tasks.join_next().await {
                let (i, verdict) = joined.expect("task");
                out[i] = Some(verdict.unwrap_or_else(|e| panic!("round {round} request {i}: {e}")));
            }
            out.into_iter().map(|v| v.expect("every request answered")).collect()
        });
        for (i, request) in requests.iter().enumerate() {
            let want = rt.block_on(model.decide(&checks(request))).expect("model");
            assert_eq!(got[i], want, "round {round} request {i} ({request:?})");
            decided += 1;
            rejected += usize::from(!want.admitted);
        }
    }
    let batches = METRICS.redis_batch_size.get_sample_count() - batches_before;
    let requests = METRICS.redis_batch_size.get_sample_sum() - requests_before;
    // (Other tests of this binary run beside this one and add their own decisions.)
    assert!(
        requests as usize >= decided,
        "{requests} decisions through the lane, {decided} made: not all went through it"
    );
    assert!(
        (batches as usize) < decided / 4,
        "{decided} concurrent decisions took {batches} script calls: they were not coalesced"
    );
    assert!(
        rejected > decided / 10 && rejected < decided * 9 / 10,
        "{rejected} of {decided} rejected: not a mixed trace"
    );
}

/// Sends `eval` raw (redis-rs turns a reply holding an error into an error as a whole) and returns
/// the reply as Redis wrote it (RESP text).
fn raw_reply(server: &RedisServer, eval: &redis::Cmd) -> String {
    let mut packed = eval.get_packed_command();
    packed.extend_from_slice(b"*1\r\n$4\r\nQUIT\r\n");
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    socket.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    socket.write_all(&packed).expect("send");
    let mut raw = String::new();
    socket.read_to_string(&mut raw).expect("a reply");
    raw
}

#[test]
fn one_bad_request_in_a_batch_leaves_the_others_decided() {
    let server = RedisServer::start();
    let script = include_str!("../lua/limit_req.lua");
    // Request 1: a leaky bucket of 1r/s, burst 0. Request 2: an unknown algorithm (99).
    // Request 3: the same bucket as request 1, so it must see request 1's charge.
    let mut eval = redis::cmd("EVAL");
    eval.arg(script).arg(3).arg("k:a").arg("k:b").arg("k:a").arg("batch").arg(3);
    for algorithm in [0, 99, 0] {
        eval.arg(1).arg(T0).arg("0").arg(&[algorithm, 1, 1_000_000, 0, -1, 1]);
    }
    let raw = raw_reply(&server, &eval);
    let lines: Vec<&str> = raw.split("\r\n").collect();
    // [*3, *6 (request 1's compact reply: 4 values + 2 for its only zone), :1 (admitted), ...].
    assert_eq!(&lines[..3], ["*3", "*6", ":1"], "request 1 is admitted: {raw:?}");
    let error = lines.iter().position(|l| l.starts_with('-')).expect("request 2 gets an error");
    assert!(lines[error].contains("unknown algorithm 99"), "request 2's own error: {}", lines[error]);
    assert_eq!(&lines[error + 1..error + 3], ["*6", ":0"], "request 3 sees request 1's charge: {raw:?}");
}

#[test]
fn repeated_arguments_decide_like_written_ones() {
    let server = RedisServer::start();
    let script = include_str!("../lua/limit_req.lua");
    // Leaky bucket 1r/s, burst 0, on keys a, a, b: request 2 and 3 say "=" (request 1's
    // arguments). Request 2 meets request 1's charge; request 3 has a key of its own.
    let mut eval = redis::cmd("EVAL");
    eval.arg(script).arg(3).arg("k:a").arg("k:a").arg("k:b").arg("batch").arg(3);
    eval.arg(1).arg(T0).arg("0").arg(&[0, 1, 1_000_000, 0, -1, 1]);
    eval.arg(1).arg("=").arg(1).arg("=");
    let raw = raw_reply(&server, &eval);
    let lines: Vec<&str> = raw.split("\r\n").collect();
    // Three compact replies of 6 values each (flat, each after its length: the leaky-bucket
    // path): admitted 1, 0, 1.
    assert_eq!((lines[0], lines[1], lines[2]), ("*21", ":6", ":1"), "{raw:?}");
    assert_eq!((lines[8], lines[9]), (":6", ":0"), "request 2 meets request 1's charge: {raw:?}");
    assert_eq!((lines[15], lines[16]), (":6", ":1"), "request 3 has its own key: {raw:?}");

    // A request that repeats a bad request's arguments gets the same error; nothing else does.
    let mut eval = redis::cmd("EVAL");
    eval.arg(script).arg(3).arg("k:c").arg("k:d").arg("k:e").arg("batch").arg(3);
    eval.arg(1).arg(T0).arg("0").arg(&[99, 1, 1_000_000, 0, -1, 1]);
    eval.arg(1).arg("=");
    eval.arg(1).arg(T0).arg("0").arg(&[0, 1, 1_000_000, 0, -1, 1]);
    let raw = raw_reply(&server, &eval);
    assert_eq!(raw.matches("unknown algorithm 99").count(), 2, "{raw:?}");
    // (A call that is not all "=" takes the general path: a nested reply per request.)
    assert!(raw.ends_with("*6\r\n:1\r\n:0\r\n:-1\r\n:1700000000000000\r\n:0\r\n:1000000\r\n+OK\r\n"), "{raw:?}");

    // "=" with nothing before it, or with another key count, is a malformed call.
    for bad in [vec!["1", "="], vec!["1", &T0.to_string(), "0", "0", "1", "1000000", "0", "-1", "1", "2", "="]] {
        let mut eval = redis::cmd("EVAL");
        let keys = if bad.len() == 2 { 1 } else { 3 };
        eval.arg(script).arg(keys);
        for k in 0..keys {
            eval.arg(format!("k:{k}"));
        }
        eval.arg("batch").arg(if bad.len() == 2 { 1 } else { 2 });
        for a in &bad {
            eval.arg(*a);
        }
        let raw = raw_reply(&server, &eval);
        assert!(raw.starts_with("-") && raw.contains("repeats arguments"), "{raw:?}");
    }
}

#[test]
fn a_flushed_script_cache_and_a_restarted_redis_cost_no_decision() {
    let mut server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let store = redis_store(&server, clock.clone());
    let limit = LimitReq {
        algorithm: Algorithm::LeakyBucket,
        rate: Rate::parse("1r/s").expect("rate"),
        burst: 100,
        delay: DelayPolicy::NoDelay,
    };
    let request: Request = vec![("z".into(), "k".into(), limit, 1)];
    let rt = current_thread();
    let decide = |store: &Arc<RedisStore>| rt.block_on(store.decide(&checks(&request)));
    assert!(decide(&store).expect("first decision").admitted);

    // The script cache is flushed under the lane's connection: the lane loads it again and the
    // very next decision is made, not failed.
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut server.connection()).expect("flush");
    assert!(decide(&store).expect("decision after SCRIPT FLUSH").admitted);

    // Redis restarts (its state is gone with it): decisions on the dead connection fail fast,
    // and the lane connects again on the next decision.
    server.restart();
    let mut last_error = None;
    let recovered = (0..50).any(|_| match decide(&store) {
        Ok(v) => v.admitted,
        Err(e) => {
            last_error = Some(e.to_string());
            std::thread::sleep(Duration::from_millis(100));
            false
        }
    });
    assert!(recovered, "no decision within 5 s of Redis' restart; last error: {last_error:?}");
}

/// A batch call's replies, one per request: an array each (the general path), or written flat
/// as its number of values followed by them (the leaky-bucket path).
fn per_request(reply: &redis::Value) -> Vec<Vec<redis::Value>> {
    let redis::Value::Array(items) = reply else { panic!("a batch reply is an array: {reply:?}") };
    let mut out = Vec::new();
    let mut items = items.iter();
    while let Some(item) = items.next() {
        match item {
            redis::Value::Array(values) => out.push(values.clone()),
            redis::Value::Int(n) => out.push(items.by_ref().take(*n as usize).cloned().collect()),
            other => panic!("not a request's reply: {other:?}"),
        }
    }
    out
}

/// `lua/limit_req.lua` decides a call whose zones are all leaky buckets and whose later requests
/// repeat the first one's arguments ("=") on a path of its own, before the general one is even
/// defined. The same requests with every argument written out take the general path: both must
/// give the same replies and store the same values, whatever the parameters, costs, clock steps
/// (backwards too), duplicate keys and existing state.
#[test]
fn the_leaky_bucket_path_decides_like_the_general_path() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let script = redis::Script::new(include_str!("../lua/limit_req.lua"));
    let mut rng = StdRng::seed_from_u64(0x1EA4);
    let mut now = T0;
    for round in 0..400 {
        let zones = rng.gen_range(1..=3);
        let args: Vec<[i64; 6]> = (0..zones)
            .map(|_| {
                let period = [1_000_000, 60_000_000][rng.gen_range(0..2)];
                let delay = if rng.gen_bool(0.5) { -1 } else { rng.gen_range(0..=2) };
                [0, rng.gen_range(1..=5), period, rng.gen_range(0..=4), delay, rng.gen_range(0..=6)]
            })
            .collect();
        let requests = rng.gen_range(2..=6);
        let keys: Vec<String> =
            (0..requests * zones).map(|i| format!("z{}:{{k{}}}", i % zones, rng.gen_range(0..4))).collect();
        now = if rng.gen_bool(0.1) { now - rng.gen_range(0..2_000_000) } else { now + rng.gen_range(0..3_000_000) };
        let flags = if rng.gen_bool(0.5) { "0" } else { "1" };
        let mut replies = Vec::new();
        for (prefix, repeat) in [("a:", true), ("b:", false)] {
            let mut call = script.prepare_invoke();
            for key in &keys {
                call.key(format!("{prefix}{key}"));
            }
            call.arg("batch").arg(requests);
            for r in 0..requests {
                call.arg(zones);
                if r > 0 && repeat {
                    call.arg("=");
                } else {
                    call.arg(now).arg(flags);
                    for zone in &args {
                        call.arg(&zone[..]);
                    }
                }
            }
            let reply: redis::Value = call.invoke(&mut conn).expect("batch call");
            // Each key's TTL and value right after the call, before Redis's clock expires it.
            let mut read = redis::pipe();
            for key in &keys {
                read.cmd("PTTL").arg(format!("{prefix}{key}")).cmd("GET").arg(format!("{prefix}{key}"));
            }
            let stored: Vec<(i64, Option<String>)> = read.query(&mut conn).expect("pttl and get");
            replies.push((reply, stored));
        }
        let ctx =
            format!("round {round}: zones {args:?}, {requests} requests, keys {keys:?}, now {now}, flags {flags}");
        assert_eq!(per_request(&replies[0].0), per_request(&replies[1].0), "{ctx}: replies differ");
        for (i, key) in keys.iter().enumerate() {
            let ((ttl_a, a), (ttl_b, b)) = (&replies[0].1[i], &replies[1].1[i]);
            if *ttl_a > 1000 || *ttl_b > 1000 {
                // Both set from the same expiry a few ms apart.
                assert!((ttl_a - ttl_b).abs() <= 1000, "{ctx}: PTTL of {key}: {ttl_a} vs {ttl_b}");
                assert_eq!(a, b, "{ctx}: stored values of {key} differ");
                // Expiry follows Redis's clock, not the test's: the state stays for later rounds.
                for prefix in ["a:", "b:"] {
                    let _: i64 = redis::cmd("PERSIST").arg(format!("{prefix}{key}")).query(&mut conn).expect("persist");
                }
            } else {
                // A state that drains within a second (or none): Redis may expire either copy at
                // any moment, so both go now, alike.
                if let (Some(a), Some(b)) = (a, b) {
                    assert_eq!(a, b, "{ctx}: stored values of {key} differ");
                }
                let _: i64 =
                    redis::cmd("DEL").arg(format!("a:{key}")).arg(format!("b:{key}")).query(&mut conn).expect("del");
            }
        }
    }
}
