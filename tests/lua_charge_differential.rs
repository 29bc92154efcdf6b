//! Charge from the response: `lua/limit_req.lua`'s charge (flag "c") against the Rust model
//! (`limit::charge_all`), bit for bit, on leaky buckets.
//!
//! Random traces of one key mix requests (`decide_all` / `RedisStore::decide`) with charges after
//! the response (`charge_all` / `RedisStore::charge`) of random costs — 0, small, a bucket, far
//! beyond the debt cap — at random gaps, some backwards, some aimed at the instant the bucket
//! drains. The charge runs on the ceiling limit (burst plus the debt cap) as the engine sends it.
//! Every verdict field and every stored state (exact f64 level) must agree, and no level may pass
//! the ceiling. Keys are PERSISTed after each call (the trace's clock jumps by hours while Redis's
//! runs on); both sides treat a drained state as no state, so expiry needs no simulation here (the
//! TTLs of the shared write path are checked by tests/lua_differential.rs).
//!
//! Reproduce a failure with `WEIR_DIFF_SEED=<seed printed in the output>`.

use crate::support;

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::differential;
use support::redis_server::RedisServer;
use weir::limit::{
    charge_all, decide_all, Algorithm, BucketState, DelayPolicy, LimitReq, ManualClock, Rate, State, ZoneInput,
};
use weir::store::{redis_key, KeyedZone, LimitStore};

const PREFIX: &str = "weir:";
const DEFAULT_SEED: u64 = 0xC4A2_6E00;
const TRACES: usize = 300;
const T0: u64 = 1_700_000_000_000_000;
const SEC: u64 = 1_000_000;
/// A state that drains within this may be expired by Redis's own clock before the test reads it.
const SHORT_TTL_US: u64 = 250_000;

fn random_limit(rng: &mut StdRng) -> LimitReq {
    let period_us = [SEC, 60 * SEC, 3600 * SEC][rng.gen_range(0..3)];
    let count = [1, 3, 7, 10, 125, 1000, 20_000][rng.gen_range(0..7)];
    let burst = [0, 1, 4, 9, 19_999, 1_000_000][rng.gen_range(0..6)];
    let delay = if rng.gen_bool(0.5) { DelayPolicy::NoDelay } else { DelayPolicy::After(rng.gen_range(0..=burst)) };
    LimitReq { algorithm: Algorithm::LeakyBucket, rate: Rate { count, period_us }, burst, delay }
}

fn random_cost(rng: &mut StdRng, limit: &LimitReq) -> u64 {
    match rng.gen_range(0..6) {
        0 => 0,
        1 => 1,
        2 => rng.gen_range(1..=5),
        3 => limit.burst + 1,
        4 => rng.gen_range(0..=2 * (limit.burst + 1)),
        _ => 1_000_000,
    }
}

#[test]
fn lua_charge_matches_the_model() {
    let seed = differential::seed(DEFAULT_SEED);
    println!("lua_charge_differential: seed {seed:#x} (rerun with WEIR_DIFF_SEED={seed:#x})");
    let server = RedisServer::start();
    let mut inspect = server.connection();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let store = differential::model_store(&server, PREFIX, clock.clone());

    let mut rng = StdRng::seed_from_u64(seed);
    let (mut charges, mut capped, mut in_debt_refused, mut fractional, mut backwards) = (0, 0, 0, 0, 0);
    let mut wall_expired = 0;
    for trace in 0..TRACES {
        let zone = format!("c{trace}");
        let limit = random_limit(&mut rng);
        let debt = [0, 1, 5000, limit.burst + 1][rng.gen_range(0..4)];
        let ceiling = LimitReq { burst: limit.burst + debt, delay: DelayPolicy::NoDelay, ..limit };
        let key = redis_key(PREFIX, &zone, b"k");
        let mut state: Option<State> = None;
        let mut now = T0 + rng.gen_range(0..1_000_000_000_000);
        for step in 0..rng.gen_range(5..=25) {
            let ctx = format!("seed {seed:#x} trace {trace} step {step} ({limit:?}, debt {debt})");
            now = match rng.gen_range(0..10) {
                0 => {
                    backwards += 1;
                    now.saturating_sub(rng.gen_range(1..=SEC))
                }
                1 => match &state {
                    // The instant the bucket drains, or one µs either side.
                    Some(State::Bucket(b)) => {
                        let drained = b.last_us + ceiling.rate.time_for_us(b.level).ceil() as u64;
                        // (Within a day: a full bucket of 1r/h drains in centuries, past 2^53 µs.)
                        (drained + rng.gen_range(0..=2) - 1).min(now + 24 * 3600 * SEC)
                    }
                    _ => now,
                },
                2..=5 => now + rng.gen_range(0..=SEC / 10),
                _ => now + rng.gen_range(0..=limit.rate.period_us),
            };
            clock.set_us(now);
            let is_charge = rng.gen_bool(0.5);
            let cost = random_cost(&mut rng, &limit);
            let used = if is_charge { &ceiling } else { &limit };
            let check = [KeyedZone::new(&zone, b"k".as_slice(), *used, cost)];
            let input = [ZoneInput { limit: used, state: state.clone(), cost }];
            let (expected, got) = if is_charge {
                (charge_all(&input, now), rt.block_on(store.charge(&check)))
            } else {
                (decide_all(&input, now), rt.block_on(store.decide(&check)))
            };
            let got = got.unwrap_or_else(|e| panic!("{ctx}: redis failed: {e}"));
            assert_eq!(got, expected, "{ctx}: charge {is_charge} of {cost} at {now} from {state:?}");
            let _: () = redis::cmd("PERSIST").arg(&key).query(&mut inspect).unwrap();
            let stored = rt.block_on(store.raw_state(&zone, b"k")).unwrap();
            if expected.admitted {
                state = Some(expected.zones[0].next.clone());
            }
            if let (None, Some(State::Bucket(b))) = (&stored, &state) {
                // A TTL of a few ms may run out on Redis's own clock before the PERSIST: then the
                // state drains within that on the trace's clock too, and both sides forget it.
                let drains_in = b.last_us + ceiling.rate.time_for_us(b.level).ceil() as u64 - now.min(b.last_us);
                assert!(drains_in <= SHORT_TTL_US, "{ctx}: Redis lost a state that drains in {drains_in} µs");
                state = None;
                wall_expired += 1;
            }
            assert_eq!(stored, state, "{ctx}: stored states differ");
            if let Some(State::Bucket(BucketState { level, .. })) = &state {
                assert!(*level <= (ceiling.burst + 1) as f64, "{ctx}: level {level} past the ceiling");
                fractional += usize::from(level.fract() != 0.0);
            }
            if is_charge {
                assert!(expected.admitted, "{ctx}: a charge of a leaky bucket is never refused");
                charges += 1;
                if let Some(State::Bucket(b)) = &state {
                    capped += usize::from(b.level + 1.0 > (ceiling.burst + 1) as f64 && cost > 1);
                }
            } else if let Some(State::Bucket(b)) = &state {
                in_debt_refused += usize::from(!expected.admitted && b.level > (limit.burst + 1) as f64);
            }
        }
    }
    println!(
        "charges {charges}, capped at the ceiling {capped}, refused while in debt {in_debt_refused}, \
         fractional levels {fractional}, backwards steps {backwards}, expired on Redis's clock {wall_expired}"
    );
    // The traces must reach the cases that matter, or agreement proves little.
    assert!(charges > 1000 && capped > 100 && in_debt_refused > 50 && fractional > 100 && backwards > 100);
}
