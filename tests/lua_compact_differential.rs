//! `lua/limit_req.lua`'s compact reply (what the proxy and the rate limit service read) against the
//! Rust model, for the lone request of one leaky-bucket zone: the call the decision lane sends when
//! there is nothing to batch, which the script decides on a path of its own (its "lone request"
//! path). `lua_differential` compares the full reply; this compares what the compact one carries
//! (admitted, delay, retry, remaining, reset, the decision's time), the state stored (exact f64)
//! and the TTL the script sets, over random traces: rates, bursts, delays, costs (0, small, the
//! capacity, beyond it), gaps aimed at the instants the previous verdict named, and clock steps
//! backwards.
//!
//! Redis would expire keys on its own wall clock while the trace's clock jumps, so each key is
//! PERSISTed after its TTL is checked; a stored state past its expiry is no state to the script and
//! to the model alike. Reproduce a failure with `WEIR_DIFF_SEED=<seed printed in the output>`.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::differential;
use support::redis_server::RedisServer;
use weir::limit::{decide_all, Algorithm, Clock, DelayPolicy, LimitReq, ManualClock, Rate, State, ZoneInput};
use weir::store::{redis_key, KeyedZone, LimitStore, RedisClock, RedisStore, RedisStoreConfig};

const PREFIX: &str = "weir:";
const DEFAULT_SEED: u64 = 0x5EED_0010;
const TRACES: usize = 300;
const STEPS: usize = 40;
const T0: u64 = 1_700_000_000_000_000;
const SEC: u64 = 1_000_000;

fn compact_store(server: &RedisServer, clock: RedisClock, manual: Arc<ManualClock>) -> RedisStore {
    let config = RedisStoreConfig {
        url: server.url(),
        timeout: Duration::from_secs(5),
        clock,
        key_prefix: PREFIX.to_string(),
        tls: None,
    };
    RedisStore::new(config, manual).expect("a Redis store on the test server")
}

fn random_limit(rng: &mut StdRng) -> LimitReq {
    let period_us = [SEC, 60 * SEC, 3600 * SEC][rng.gen_range(0..3)];
    let burst = [0, 1, 5, 20, 1000][rng.gen_range(0..5)];
    let delay = match rng.gen_range(0..3) {
        0 => DelayPolicy::NoDelay,
        1 => DelayPolicy::After(0),
        _ => DelayPolicy::After(rng.gen_range(0..=burst)),
    };
    LimitReq { algorithm: Algorithm::LeakyBucket, rate: Rate { count: rng.gen_range(1..=50), period_us }, burst, delay }
}

#[test]
fn the_lone_leaky_bucket_call_matches_the_model() {
    let seed = differential::seed(DEFAULT_SEED);
    println!("WEIR_DIFF_SEED={seed:#x}");
    let mut rng = StdRng::seed_from_u64(seed);
    let server = RedisServer::start();
    let mut inspect = server.connection();
    let clock = Arc::new(ManualClock::new(T0));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    let store = compact_store(&server, RedisClock::Local, clock.clone());
    let (mut admitted, mut rejected, mut with_state, mut backwards) = (0, 0, 0, 0);

    for trace in 0..TRACES {
        let limit = random_limit(&mut rng);
        let key = format!("k{trace}");
        let redis_key = String::from_utf8(redis_key(PREFIX, "z", key.as_bytes())).expect("a text key");
        let mut model: Option<State> = None;
        let mut hint_us: Option<u64> = None;
        for step in 0..STEPS {
            let ctx = format!("seed {seed:#x} trace {trace} step {step} limit {limit:?}");
            let now = clock.now_us();
            let gap = match rng.gen_range(0..10) {
                0 if now > T0 + SEC => {
                    backwards += 1;
                    now - rng.gen_range(1..SEC)
                }
                1..=3 => now + hint_us.unwrap_or(0),
                4..=6 => now + rng.gen_range(0..limit.rate.period_us / limit.rate.count + 1),
                _ => now + rng.gen_range(0..10 * SEC),
            };
            clock.set_us(gap);
            let now = clock.now_us();
            let cost = match rng.gen_range(0..8) {
                0 => 0,
                1 => limit.burst + 1,
                2 => limit.burst + 2,
                _ => rng.gen_range(1..=3),
            };
            let expected = decide_all(&[ZoneInput { limit: &limit, state: model.clone(), cost }], now);
            let sent = std::time::Instant::now();
            let got = rt
                .block_on(store.decide(&[KeyedZone::new("z", key.as_bytes(), limit, cost)]))
                .unwrap_or_else(|e| panic!("{ctx}: redis decide failed: {e}"));
            assert_eq!(got.admitted, expected.admitted, "{ctx}: admitted; model {expected:?}, got {got:?}");
            assert_eq!(got.delay_us, expected.delay_us, "{ctx}: delay");
            assert_eq!(got.retry_after_us, expected.retry_after_us, "{ctx}: retry");
            assert_eq!(got.decided_us, now, "{ctx}: the decision's time");
            let (g, e) = (&got.zones[0], &expected.zones[0]);
            assert_eq!((g.remaining, g.reset_us), (e.remaining, e.reset_us), "{ctx}: remaining, reset");
            with_state += usize::from(model.is_some());
            if expected.admitted {
                admitted += 1;
                model = Some(e.next.clone());
                // The TTL: ceil((expires - now) / 1 ms) + 1 ms, counted down since the write.
                let pttl: i64 = redis::cmd("PTTL").arg(&redis_key).query(&mut inspect).expect("PTTL");
                let ttl_ms = (e.expires_us.saturating_sub(now)).div_ceil(1000) as i64 + 1;
                let kept: i64 = redis::cmd("PERSIST").arg(&redis_key).query(&mut inspect).expect("PERSIST");
                if pttl == -2 || kept == 0 {
                    // Gone already (a busy machine, or a state that is no state at once: 1-2 ms), as
                    // Redis has it: only once its TTL has run out since the call was sent.
                    let waited_ms = sent.elapsed().as_millis() as i64 + 1;
                    assert!(ttl_ms <= waited_ms, "{ctx}: the key is gone after {waited_ms} ms, its TTL {ttl_ms} ms");
                    model = None;
                } else {
                    assert!(pttl <= ttl_ms && pttl >= ttl_ms - 1000, "{ctx}: PTTL {pttl}, expected {ttl_ms}");
                }
            } else {
                rejected += 1;
            }
            hint_us = got.retry_after_us.or(Some(g.reset_us));
            let stored = rt.block_on(store.raw_state("z", key.as_bytes())).expect("raw state");
            assert_eq!(stored, model, "{ctx}: the state stored");
        }
    }
    println!("admitted {admitted}, rejected {rejected}, with a stored state {with_state}, clock backwards {backwards}");
    // The traces reach every branch that matters.
    assert!(admitted > 2000 && rejected > 1000 && with_state > 5000 && backwards > 100);
}

#[test]
fn the_lone_call_on_redis_time_decides_at_redis_time() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    let store = compact_store(&server, RedisClock::Redis, Arc::new(ManualClock::new(T0)));
    let limit = LimitReq {
        algorithm: Algorithm::LeakyBucket,
        rate: Rate { count: 1, period_us: 60 * SEC },
        burst: 4,
        delay: DelayPolicy::NoDelay,
    };
    let wall_us = |now: std::time::SystemTime| {
        now.duration_since(std::time::UNIX_EPOCH).expect("after the epoch").as_micros() as u64
    };
    let before = wall_us(std::time::SystemTime::now());
    let mut remaining = Vec::new();
    for _ in 0..6 {
        let v = rt.block_on(store.decide(&[KeyedZone::new("z", &b"k"[..], limit, 1)])).expect("a decision");
        assert!(v.decided_us >= before - 5 * SEC && v.decided_us <= wall_us(std::time::SystemTime::now()) + 5 * SEC);
        remaining.push((v.admitted, v.zones[0].remaining));
    }
    // Capacity 5 (burst + 1): five admitted, the sixth refused (one drains a minute).
    assert_eq!(remaining[..5].iter().filter(|(a, _)| *a).count(), 5, "{remaining:?}");
    assert_eq!(remaining[0].1, 4, "{remaining:?}");
    assert!(!remaining[5].0, "{remaining:?}");
    let Some(State::Bucket(b)) = rt.block_on(store.raw_state("z", b"k")).expect("raw state") else {
        panic!("no bucket stored")
    };
    assert!(b.level > 4.0 && b.level <= 5.0, "{b:?}");
}
