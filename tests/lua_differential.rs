//! `lua/limit_req.lua` against the Rust model, bit for bit.
//!
//! Random request traces run through `limit::decide_all` (with a state map kept here) and through
//! `RedisStore` with `RedisClock::Local`, both fed the same `ManualClock`. Every verdict field,
//! every stored state (exact f64) and every TTL must agree.
//!
//! Redis expires keys on its own wall clock while the trace's clock jumps by hours, so after each
//! decision the test PERSISTs the keys and expires them itself, on the trace's "real" time, at the
//! instant Redis would have (write time + the TTL the script set). Both sides then forget a key at
//! the same moment, and the test checks that forgetting it changes no decision (absent == drained).
//!
//! Reproduce a failure with `WEIR_DIFF_SEED=<seed printed in the output>`.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use redis::Value;
use support::redis_server::RedisServer;
use weir::limit::{decide_all, evaluate, BucketState, DelayPolicy, LimitReq, ManualClock, Rate, Verdict, ZoneInput};
use weir::store::{redis_key, LimitStore, RedisClock, RedisStore, RedisStoreConfig, ZoneCheck};

const PREFIX: &str = "weir:";
const DEFAULT_SEED: u64 = 0x5EED_0003;
const TRACES: usize = 240;
const T0: u64 = 1_700_000_000_000_000;
/// PTTL is read right after the write; this much may have elapsed in between on a loaded machine
/// (`exact_pttl` below still catches a TTL short by 1 ms).
const PTTL_SLACK_MS: i64 = 250;

struct Zone {
    name: String,
    limit: LimitReq,
}

/// The model's copy of one Redis key.
struct Stored {
    state: BucketState,
    limit: LimitReq,
    /// When the bucket is empty, on the trace's clock.
    drained_at_us: u64,
    /// When Redis would drop the key, on the trace's real time.
    expires_real_us: u64,
}

#[derive(Default)]
struct Stats {
    decisions: usize,
    rejected: usize,
    never: usize,
    delayed: usize,
    multi_zone: usize,
    partial_reject: usize,
    backwards: usize,
    expired: usize,
    fractional_levels: usize,
    /// Writes whose PTTL read back equals the TTL the model expects: proves the TTL is not short
    /// by a millisecond or two, which the slack alone would hide.
    exact_pttl: usize,
}

fn seed() -> u64 {
    match std::env::var("WEIR_DIFF_SEED") {
        Ok(s) => {
            let s = s.trim();
            match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            }
            .expect("WEIR_DIFF_SEED must be an integer")
        }
        Err(_) => DEFAULT_SEED,
    }
}

fn random_rate(rng: &mut StdRng) -> Rate {
    let text = match rng.gen_range(0..3) {
        0 => format!("{}r/s", rng.gen_range(1..=50)),
        1 => format!("{}r/m", rng.gen_range(1..=600)),
        _ => format!("{}r/h", rng.gen_range(1..=7200)),
    };
    Rate::parse(&text).unwrap()
}

fn random_zone(rng: &mut StdRng, name: String) -> Zone {
    // Small bursts half the time, so that buckets fill within a trace.
    let burst = if rng.gen_bool(0.5) { rng.gen_range(0..=5) } else { rng.gen_range(0..=50) };
    let delay = match rng.gen_range(0..10) {
        0..=3 => DelayPolicy::NoDelay,
        // Sometimes beyond the burst, where it acts like nodelay.
        4 => DelayPolicy::After(rng.gen_range(0..=burst + 3)),
        _ => DelayPolicy::After(rng.gen_range(0..=burst)),
    };
    Zone { name, limit: LimitReq { rate: random_rate(rng), burst, delay } }
}

fn random_client_keys(rng: &mut StdRng) -> Vec<Vec<u8>> {
    let n = rng.gen_range(1..=3);
    (0..n)
        .map(|i| match rng.gen_range(0..10) {
            // Longer than 200 bytes: hashed in the Redis key name.
            0 => vec![b'L'; 200 + rng.gen_range(1..100)],
            1 => format!("#{i}").into_bytes(),
            2 => format!("user{{{i}}}").into_bytes(),
            _ => format!("198.51.100.{i}").into_bytes(),
        })
        .collect()
}

fn random_cost(rng: &mut StdRng, limit: &LimitReq) -> u64 {
    match rng.gen_range(0..40) {
        0..=29 => 1,
        30..=36 => rng.gen_range(2..=5),
        // Around the capacity: exactly burst + 1 still fits an empty bucket, more never does.
        37 | 38 => limit.burst + 1,
        _ => limit.burst + rng.gen_range(2..=5),
    }
}

/// µs the clock moves before the next request. Negative: the clock steps back (another
/// instance's clock, an NTP correction).
fn random_gap(rng: &mut StdRng, zones: &[Zone], last: Option<&Verdict>) -> i64 {
    let rate = zones.choose(rng).unwrap().limit.rate;
    let emission = (rate.period_us / rate.count) as i64;
    if let Some(v) = last {
        // Probe the exact instants the previous verdict named.
        if rng.gen_bool(0.15) {
            let at = if v.admitted {
                v.zones.iter().map(|z| z.reset_us).max().unwrap_or(0)
            } else {
                v.retry_after_us.unwrap_or(0)
            } as i64;
            return at + rng.gen_range(-1..=1);
        }
    }
    match rng.gen_range(0..100) {
        0..=39 => 0,
        40..=59 => rng.gen_range(0..=emission),
        60..=79 => rng.gen_range(0..=3 * emission),
        80..=86 => rng.gen_range(0..=3 * rate.period_us as i64),
        // A whole number of emission intervals: exact drains.
        87..=94 => rng.gen_range(1..=3) * rate.period_us as i64 / rate.count as i64,
        _ => -rng.gen_range(1..=2 * emission),
    }
}

fn ttl_ms(now_us: u64, next: &BucketState, reset_us: u64) -> u64 {
    (reset_us + (next.last_us - now_us)).div_ceil(1000) + 1
}

fn parse_state(raw: &[u8]) -> BucketState {
    let text = std::str::from_utf8(raw).expect("state is text");
    let (level, last_us) = text.split_once(' ').expect("state is \"<level> <last_us>\"");
    BucketState { level: level.parse().expect("level"), last_us: last_us.parse().expect("last_us") }
}

#[test]
fn lua_script_matches_the_model() {
    let seed = seed();
    println!("lua_differential: seed {seed:#x} (rerun with WEIR_DIFF_SEED={seed:#x})");
    let started = Instant::now();
    let server = RedisServer::start();
    let mut inspect = server.connection();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let store = RedisStore::new(
        RedisStoreConfig {
            url: server.url(),
            timeout: Duration::from_secs(5),
            clock: RedisClock::Local,
            key_prefix: PREFIX.to_string(),
        },
        clock.clone(),
    )
    .unwrap();

    let mut rng = StdRng::seed_from_u64(seed);
    let mut stats = Stats::default();
    for trace in 0..TRACES {
        let zones: Vec<Zone> =
            (0..rng.gen_range(1..=3)).map(|i| random_zone(&mut rng, format!("t{trace}z{i}"))).collect();
        let client_keys = random_client_keys(&mut rng);
        let mut model: HashMap<Vec<u8>, Stored> = HashMap::new();
        let mut real_us = T0 + rng.gen_range(0..1_000_000_000);
        // The trace's clock runs `skew` µs behind its real time; a backwards step grows it.
        let mut skew: u64 = 0;
        let mut last: Option<Verdict> = None;

        for step in 0..rng.gen_range(5..=45) {
            let ctx = format!("seed {seed:#x} trace {trace} step {step}");
            let gap = random_gap(&mut rng, &zones, last.as_ref());
            if gap >= 0 {
                real_us += gap as u64;
            } else {
                skew += gap.unsigned_abs();
                stats.backwards += 1;
            }
            let now_us = real_us - skew;
            clock.set_us(now_us);

            // Expire keys as Redis would, and check that forgetting them changes nothing.
            let expired: Vec<Vec<u8>> =
                model.iter().filter(|(_, s)| s.expires_real_us <= real_us).map(|(k, _)| k.clone()).collect();
            for key in expired {
                let s = model.remove(&key).unwrap();
                // Unless the clock stepped back since the write, the bucket has drained by now.
                if now_us >= s.drained_at_us + 1000 {
                    assert_eq!(
                        evaluate(&s.limit, Some(s.state), now_us, 1),
                        evaluate(&s.limit, None, now_us, 1),
                        "{ctx}: an expired key must behave like a drained one"
                    );
                }
                let _: () = redis::cmd("DEL").arg(&key).query(&mut inspect).unwrap();
                stats.expired += 1;
            }

            let mut picked: Vec<&Zone> = zones.iter().collect();
            picked.shuffle(&mut rng);
            picked.truncate(rng.gen_range(1..=zones.len()));
            let checks: Vec<ZoneCheck<'_>> = picked
                .iter()
                .map(|z| ZoneCheck {
                    zone: &z.name,
                    key: client_keys.choose(&mut rng).unwrap(),
                    limit: z.limit,
                    cost: random_cost(&mut rng, &z.limit),
                })
                .collect();
            let keys: Vec<Vec<u8>> = checks.iter().map(|c| redis_key(PREFIX, c.zone, c.key)).collect();

            let inputs: Vec<ZoneInput<'_>> = checks
                .iter()
                .zip(&keys)
                .map(|(c, k)| ZoneInput { limit: &c.limit, state: model.get(k).map(|s| s.state), cost: c.cost })
                .collect();
            let expected = decide_all(&inputs, now_us);
            let got = rt.block_on(store.decide(&checks)).unwrap_or_else(|e| panic!("{ctx}: redis decide failed: {e}"));
            assert_eq!(got, expected, "{ctx}: verdicts differ; checks {checks:?}");

            // What the script stored: GET and PTTL, then PERSIST so that Redis' wall clock never
            // expires a key the trace's clock still needs.
            let mut pipe = redis::pipe();
            for k in &keys {
                pipe.cmd("GET").arg(k).cmd("PTTL").arg(k).cmd("PERSIST").arg(k);
            }
            let replies: Vec<Value> = pipe.query(&mut inspect).unwrap();
            for (i, ((k, zone), check)) in keys.iter().zip(&expected.zones).zip(&checks).enumerate() {
                let raw = match &replies[3 * i] {
                    Value::BulkString(b) => Some(parse_state(b)),
                    Value::Nil => None,
                    other => panic!("{ctx}: GET gave {other:?}"),
                };
                let pttl = match replies[3 * i + 1] {
                    Value::Int(n) => n,
                    ref other => panic!("{ctx}: PTTL gave {other:?}"),
                };
                if expected.admitted {
                    assert_eq!(raw, Some(zone.next), "{ctx}: zone {i} stored state");
                    let ttl = ttl_ms(now_us, &zone.next, zone.reset_us);
                    assert!(
                        pttl <= ttl as i64 && pttl >= ttl as i64 - PTTL_SLACK_MS,
                        "{ctx}: zone {i} PTTL {pttl}, expected about {ttl}"
                    );
                    stats.exact_pttl += usize::from(pttl == ttl as i64);
                    model.insert(
                        k.clone(),
                        Stored {
                            state: zone.next,
                            limit: check.limit,
                            drained_at_us: zone.next.last_us + zone.reset_us,
                            expires_real_us: real_us + ttl * 1000,
                        },
                    );
                    if zone.next.level.fract() != 0.0 {
                        stats.fractional_levels += 1;
                    }
                } else {
                    // Rejected: nothing written (the key keeps the value and the PERSIST of
                    // an earlier step).
                    assert_eq!(raw, model.get(k).map(|s| s.state), "{ctx}: zone {i} was written by a rejected request");
                    assert!(
                        pttl == -1 || (pttl == -2 && raw.is_none()),
                        "{ctx}: zone {i} PTTL {pttl} after a rejection"
                    );
                }
            }

            stats.decisions += 1;
            stats.multi_zone += usize::from(checks.len() > 1);
            if expected.admitted {
                stats.delayed += usize::from(expected.delay_us > 0);
            } else {
                stats.rejected += 1;
                stats.never += usize::from(expected.retry_after_us.is_none());
                stats.partial_reject += usize::from(expected.zones.iter().any(|z| z.admitted));
            }
            last = Some(expected);
        }
    }

    let Stats {
        decisions,
        rejected,
        never,
        delayed,
        multi_zone,
        partial_reject,
        backwards,
        expired,
        fractional_levels,
        exact_pttl,
    } = stats;
    println!(
        "lua_differential: {decisions} decisions in {:?}: {rejected} rejected ({never} never, \
         {partial_reject} by some zones only), {delayed} delayed, {multi_zone} multi-zone, \
         {backwards} backwards steps, {expired} expirations, {fractional_levels} fractional levels, \
         {exact_pttl} exact PTTLs",
        started.elapsed()
    );
    // The traces must reach every branch, or agreement proves little.
    assert!(decisions >= 4000, "{decisions} decisions");
    for (what, n) in [
        ("rejected", rejected),
        ("never", never),
        ("partial_reject", partial_reject),
        ("delayed", delayed),
        ("multi_zone", multi_zone),
        ("backwards", backwards),
        ("expired", expired),
        ("fractional_levels", fractional_levels),
        ("exact_pttl", exact_pttl),
    ] {
        assert!(n >= 20, "only {n} `{what}` cases in {decisions} decisions");
    }
}
