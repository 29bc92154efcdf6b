//! `lua/limit_req.lua` against the Rust model, bit for bit, for every algorithm.
//!
//! Random request traces run through `limit::decide_all` (with a state map kept here, a copy of
//! what Redis holds) and through `RedisStore` with `RedisClock::Local`, both fed the same
//! `ManualClock`. Each trace has zones of random algorithms (a request usually checks several, of
//! different algorithms, all-or-nothing), random costs (0, small, the capacity, beyond it), gaps
//! aimed at window boundaries and at the instants the previous verdict named, backwards clock
//! steps, and "reloads" that change a zone's algorithm under the same name, so keys hold another
//! algorithm's state. Every verdict field, every stored state (exact f64, the exact set of log
//! entries) and every TTL must agree.
//!
//! Redis expires keys on its own wall clock while the trace's clock jumps by hours, so after each
//! decision the test PERSISTs the keys and expires them itself, on the trace's "real" time, at the
//! instant Redis would have (write time + the TTL the script set). Both sides then forget a key at
//! the same moment, and the test checks that forgetting it changes no decision (absent == expired).
//!
//! Reproduce a failure with `WEIR_DIFF_SEED=<seed printed in the output>`.

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use redis::Value;
use support::differential;
use support::redis_server::RedisServer;
use weir::limit::{
    decide_all, evaluate, Algorithm, BucketState, DelayPolicy, LimitReq, ManualClock, Rate, SlidingState, State,
    TokenState, Verdict, WindowState, ZoneInput,
};
use weir::store::{redis_key, KeyedZone, LimitStore};

const PREFIX: &str = "weir:";
const DEFAULT_SEED: u64 = 0x5EED_0004;
const TRACES: usize = 2000;
const T0: u64 = 1_700_000_000_000_000;
const SEC: u64 = 1_000_000;
/// A key with a TTL this short may expire on Redis' own clock before the test reads it back.
const SHORT_TTL_MS: i64 = 250;
const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::LeakyBucket,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
];

#[derive(Clone)]
struct Zone {
    name: String,
    limit: LimitReq,
}

/// The model's copy of one Redis key.
struct Stored {
    state: State,
    /// The limit that wrote it.
    limit: LimitReq,
    /// When the state can be forgotten, on the trace's clock.
    expires_us: u64,
    /// When Redis would drop the key, on the trace's real time.
    expires_real_us: u64,
}

/// Cases seen per algorithm: the traces must reach every branch, or agreement proves little.
#[derive(Default, Clone, Copy)]
struct Counts {
    zone_decisions: usize,
    admitted: usize,
    rejected: usize,
    never: usize,
    /// Admitted zones whose key held this zone's state (not a fresh or foreign one).
    with_state: usize,
    /// Zones whose key held another algorithm's state (a reload changed the zone's algorithm).
    foreign_state: usize,
    expired: usize,
    /// Writes whose TTL is known to the millisecond (Redis' clock did not tick during the call):
    /// these catch a TTL short or long by 1 ms.
    exact_ttl: usize,
    /// Decisions made right at (±1 µs) a window boundary or a time the previous verdict named.
    boundary: usize,
    /// Decisions whose clock was behind the key's state (backwards step).
    behind: usize,
    /// Admitted with cost 0.
    zero_cost: usize,
    /// Leaky and token buckets: fractional stored levels/tokens. Windows: a retry time > 0.
    special: usize,
}

#[derive(Default)]
struct Stats {
    decisions: usize,
    rejected: usize,
    partial_reject: usize,
    delayed: usize,
    multi_zone: usize,
    mixed_algorithms: usize,
    duplicate_keys: usize,
    backwards: usize,
    reloads: usize,
    log_entries_max: usize,
    /// Keys with a TTL of a few ms that Redis expired on its own clock before the test read them.
    wall_expired: usize,
    per_algorithm: [Counts; 5],
}

fn algo_index(a: Algorithm) -> usize {
    a.id() as usize
}

fn random_bucket_rate(rng: &mut StdRng) -> Rate {
    let text = match rng.gen_range(0..3) {
        0 => format!("{}r/s", rng.gen_range(1..=50)),
        1 => format!("{}r/m", rng.gen_range(1..=600)),
        _ => format!("{}r/h", rng.gen_range(1..=7200)),
    };
    Rate::parse(&text).unwrap()
}

/// A window algorithm's `count` per `period_us`: the nginx units, and the odd windows that
/// `window = "..."` allows.
fn random_window_rate(rng: &mut StdRng, algorithm: Algorithm) -> Rate {
    let period_us = match rng.gen_range(0..14) {
        0 | 1 => SEC,
        2 | 3 => 60 * SEC,
        4 => 3600 * SEC,
        5 | 6 => 10 * SEC,
        7 => 250_000,
        8 => 1000,
        9 => 1_500_000,
        10 => 86_400 * SEC,
        // envoyproxy/ratelimit's week, month (30 days) and year (365 days).
        11 => [7, 30, 365][rng.gen_range(0..3)] * 86_400 * SEC,
        12 => 86_400 * SEC * rng.gen_range(2..=365),
        _ => rng.gen_range(1..=20_000) * 1000 + rng.gen_range(0..1000),
    };
    let small = rng.gen_bool(0.6);
    let count = match algorithm {
        // A block (limit 0): always over, retry at the window's end.
        Algorithm::FixedWindow | Algorithm::SlidingWindow if rng.gen_bool(0.05) => 0,
        // One entry per admitted unit: keep the logs small enough for thousands of traces.
        Algorithm::SlidingLog if !small => rng.gen_range(11..=150),
        _ if small => rng.gen_range(1..=10),
        _ => rng.gen_range(11..=1000),
    };
    Rate { count, period_us }
}

fn random_zone(rng: &mut StdRng, name: String) -> Zone {
    let algorithm = *ALGORITHMS.choose(rng).unwrap();
    let limit = match algorithm {
        Algorithm::LeakyBucket => {
            // Small bursts half the time, so that buckets fill within a trace.
            let burst = if rng.gen_bool(0.5) { rng.gen_range(0..=5) } else { rng.gen_range(0..=50) };
            let delay = match rng.gen_range(0..10) {
                0..=3 => DelayPolicy::NoDelay,
                // Sometimes beyond the burst, where it acts like nodelay.
                4 => DelayPolicy::After(rng.gen_range(0..=burst + 3)),
                _ => DelayPolicy::After(rng.gen_range(0..=burst)),
            };
            LimitReq { algorithm, rate: random_bucket_rate(rng), burst, delay }
        }
        Algorithm::TokenBucket => {
            let burst = if rng.gen_bool(0.5) { rng.gen_range(0..=5) } else { rng.gen_range(0..=50) };
            LimitReq { algorithm, rate: random_bucket_rate(rng), burst, delay: DelayPolicy::NoDelay }
        }
        _ => LimitReq { algorithm, rate: random_window_rate(rng, algorithm), burst: 0, delay: DelayPolicy::NoDelay },
    };
    Zone { name, limit }
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
    let capacity = limit.capacity();
    match rng.gen_range(0..50) {
        0..=33 => 1,
        34..=41 => rng.gen_range(2..=5),
        42 | 43 => 0,
        // Around the capacity: exactly the capacity still fits an empty zone, more never does.
        44..=46 => capacity,
        47 => rng.gen_range(1..=capacity.max(1)),
        _ => capacity + rng.gen_range(1..=5),
    }
}

/// µs the clock moves before the next request, and whether it aims at a boundary. Negative: the
/// clock steps back (another instance's clock, an NTP correction).
fn random_gap(rng: &mut StdRng, zones: &[Zone], last: Option<&Verdict>, now_us: u64) -> (i64, bool) {
    let zone = zones.choose(rng).unwrap();
    let rate = zone.limit.rate;
    let window = rate.period_us as i64;
    // The time one request "takes" at the zone's rate (windows: the average spacing).
    let emission = ((rate.period_us / rate.count.max(1)) as i64).max(1);
    if let Some(v) = last {
        // Probe the exact instants the previous verdict named.
        if rng.gen_bool(0.15) {
            let z = v.zones.choose(rng).unwrap();
            let at = match rng.gen_range(0..3) {
                0 => z.retry_after_us.unwrap_or(z.reset_us),
                1 => z.reset_us,
                _ => z.expires_us.saturating_sub(now_us),
            } as i64;
            return (at + rng.gen_range(-1..=1), true);
        }
    }
    if zone.limit.algorithm.is_window() && rng.gen_bool(0.2) {
        // The next (or the one after the next) window boundary, ±1 µs.
        let to_boundary = window - (now_us % rate.period_us) as i64;
        let windows = if rng.gen_bool(0.8) { 0 } else { 1 };
        return (to_boundary + windows * window + rng.gen_range(-1..=1), true);
    }
    let gap = match rng.gen_range(0..100) {
        0..=34 => 0,
        35..=54 => rng.gen_range(0..=emission),
        55..=74 => rng.gen_range(0..=3 * emission),
        75..=82 => rng.gen_range(0..=3 * window),
        // A whole number of emission intervals: exact drains.
        83..=89 => rng.gen_range(1..=3) * emission,
        90..=93 => rng.gen_range(0..=window.min(10 * SEC as i64)),
        _ => -rng.gen_range(1..=(2 * emission).min(window).max(2)),
    };
    (gap, false)
}

/// Redis' clock, in ms.
fn redis_ms(conn: &mut redis::Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).unwrap();
    (secs * 1_000_000 + micros) / 1000
}

fn ttl_ms(now_us: u64, expires_us: u64) -> u64 {
    (expires_us - now_us).div_ceil(1000) + 1
}

/// The stored value as the script documents it, parsed independently of `RedisStore`.
fn parse_string_state(ctx: &str, raw: &[u8]) -> State {
    let text = std::str::from_utf8(raw).expect("state is text");
    let words: Vec<&str> = text.split(' ').collect();
    let n = |w: &str| -> u64 { w.parse().unwrap_or_else(|_| panic!("{ctx}: {w:?} in {text:?} is not an integer")) };
    let f = |w: &str| -> f64 { w.parse().unwrap_or_else(|_| panic!("{ctx}: {w:?} in {text:?} is not a number")) };
    match words.as_slice() {
        ["t", tokens, last] => State::Tokens(TokenState { tokens: f(tokens), last_us: n(last) }),
        ["f", start, count] => State::Window(WindowState { start_us: n(start), count: n(count) }),
        ["s", start, prev, curr] => State::Sliding(SlidingState { start_us: n(start), prev: n(prev), curr: n(curr) }),
        [level, last] => State::Bucket(BucketState { level: f(level), last_us: n(last) }),
        _ => panic!("{ctx}: unknown state {text:?}"),
    }
}

/// A sorted set's entries, checking the member names: "<time>", then "<time>:<n>", n = 1.. per time.
fn parse_log(ctx: &str, members: &[(String, String)]) -> State {
    let mut per_time: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut times = Vec::with_capacity(members.len());
    for (member, score) in members {
        let time: u64 = score.parse().unwrap_or_else(|_| panic!("{ctx}: score {score:?}"));
        let (t, n) = match member.split_once(':') {
            Some((_, "0")) => panic!("{ctx}: member {member:?}: the first of a time has no number"),
            Some(split) => split,
            None => (member.as_str(), "0"),
        };
        assert_eq!(t.parse::<u64>().ok(), Some(time), "{ctx}: member {member:?} has score {score}");
        per_time.entry(time).or_default().push(n.parse().unwrap_or_else(|_| panic!("{ctx}: member {member:?}")));
        times.push(time);
    }
    for (time, mut ns) in per_time {
        ns.sort_unstable();
        assert!(ns.iter().copied().eq(0..ns.len() as u64), "{ctx}: members of {time} are numbered {ns:?}");
    }
    State::Log(times)
}

/// An empty log is no state (Redis deletes an empty sorted set).
fn normalized(state: Option<State>) -> Option<State> {
    match state {
        Some(State::Log(entries)) if entries.is_empty() => None,
        other => other,
    }
}

#[test]
fn lua_script_matches_the_model() {
    let seed = differential::seed(DEFAULT_SEED);
    println!("lua_differential: seed {seed:#x} (rerun with WEIR_DIFF_SEED={seed:#x})");
    let started = Instant::now();
    let server = RedisServer::start();
    let mut inspect = server.connection();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let store = differential::model_store(&server, PREFIX, clock.clone());

    let mut rng = StdRng::seed_from_u64(seed);
    let mut stats = Stats::default();
    for trace in 0..TRACES {
        let mut zones: Vec<Zone> =
            (0..rng.gen_range(1..=4)).map(|i| random_zone(&mut rng, format!("t{trace}z{i}"))).collect();
        let client_keys = random_client_keys(&mut rng);
        let mut model: HashMap<Vec<u8>, Stored> = HashMap::new();
        let mut real_us = T0 + rng.gen_range(0..1_000_000_000_000);
        // The trace's clock runs `skew` µs behind its real time; a backwards step grows it.
        let mut skew: u64 = 0;
        let mut last: Option<Verdict> = None;

        for step in 0..rng.gen_range(5..=30) {
            let ctx = format!("seed {seed:#x} trace {trace} step {step}");
            if rng.gen_bool(0.03) {
                // A reload gives a zone another algorithm (or other parameters), same name.
                let z = zones.choose_mut(&mut rng).unwrap();
                *z = random_zone(&mut rng, z.name.clone());
                stats.reloads += 1;
            }
            let (gap, boundary) = random_gap(&mut rng, &zones, last.as_ref(), real_us - skew);
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
                // Unless the clock stepped back since the write, the state has expired by now.
                if now_us >= s.expires_us + 1000 {
                    for cost in [0, 1, s.limit.capacity()] {
                        assert_eq!(
                            evaluate(&s.limit, Some(&s.state), now_us, cost),
                            evaluate(&s.limit, None, now_us, cost),
                            "{ctx}: an expired key must behave like an absent one: {:?}",
                            s.state
                        );
                    }
                }
                let _: () = redis::cmd("DEL").arg(&key).query(&mut inspect).unwrap();
                stats.per_algorithm[algo_index(s.limit.algorithm)].expired += 1;
            }

            let mut picked: Vec<&Zone> = zones.iter().collect();
            picked.shuffle(&mut rng);
            picked.truncate(rng.gen_range(1..=zones.len()));
            let mut checks: Vec<KeyedZone<'_>> = picked
                .iter()
                .map(|z| {
                    let key = client_keys.choose(&mut rng).unwrap();
                    KeyedZone::new(&z.name, key.as_slice(), z.limit, random_cost(&mut rng, &z.limit))
                })
                .collect();
            if rng.gen_bool(0.02) {
                // One zone twice (the config forbids it, the script copes): the last one's state is
                // stored, as in the memory store.
                let mut again = checks[rng.gen_range(0..checks.len())].clone();
                again.cost = random_cost(&mut rng, &again.limit);
                let at = rng.gen_range(0..=checks.len());
                checks.insert(at, again);
                stats.duplicate_keys += 1;
            }
            let keys: Vec<Vec<u8>> = checks.iter().map(|c| redis_key(PREFIX, c.zone, &c.key)).collect();

            let inputs: Vec<ZoneInput<'_>> = checks
                .iter()
                .zip(&keys)
                .map(|(c, k)| ZoneInput { limit: &c.limit, state: model.get(k).map(|s| s.state.clone()), cost: c.cost })
                .collect();
            let expected = decide_all(&inputs, now_us);
            let sent = Instant::now();
            let before_ms = redis_ms(&mut inspect);
            let got = rt.block_on(store.decide(&checks)).unwrap_or_else(|e| panic!("{ctx}: redis decide failed: {e}"));
            assert_eq!(got, expected, "{ctx}: verdicts differ at {now_us}; checks {checks:?}; states {inputs:?}");

            for (input, zone) in inputs.iter().zip(&expected.zones) {
                let c = &mut stats.per_algorithm[algo_index(input.limit.algorithm)];
                c.zone_decisions += 1;
                c.boundary += usize::from(boundary);
                let own = match (&input.state, input.limit.algorithm) {
                    (None, _) => None,
                    (Some(s @ State::Bucket(_)), Algorithm::LeakyBucket)
                    | (Some(s @ State::Tokens(TokenState { .. })), Algorithm::TokenBucket)
                    | (Some(s @ State::Window(WindowState { .. })), Algorithm::FixedWindow)
                    | (Some(s @ State::Log(_)), Algorithm::SlidingLog)
                    | (Some(s @ State::Sliding(SlidingState { .. })), Algorithm::SlidingWindow) => Some(s),
                    (Some(_), _) => {
                        c.foreign_state += 1;
                        None
                    }
                };
                c.behind += usize::from(match own {
                    Some(State::Bucket(b)) => now_us < b.last_us,
                    Some(State::Tokens(TokenState { last_us, .. })) => now_us < *last_us,
                    Some(
                        State::Window(WindowState { start_us, .. }) | State::Sliding(SlidingState { start_us, .. }),
                    ) => now_us < *start_us,
                    Some(State::Log(e)) => e.last().is_some_and(|&t| now_us < t),
                    None => false,
                });
                if zone.admitted {
                    c.admitted += 1;
                    c.with_state += usize::from(own.is_some());
                    c.zero_cost += usize::from(input.cost == 0);
                } else {
                    c.rejected += 1;
                    c.never += usize::from(zone.retry_after_us.is_none());
                }
                c.special += usize::from(match &zone.next {
                    State::Bucket(b) => b.level.fract() != 0.0,
                    State::Tokens(TokenState { tokens, .. }) => tokens.fract() != 0.0,
                    _ => zone.retry_after_us.is_some_and(|r| r > 0),
                });
            }

            // What the script stored: TYPE and the absolute expiry (PEXPIRETIME, ms on Redis'
            // clock), then PERSIST so that Redis' wall clock never expires a key the trace's clock
            // still needs; then the value by type. The script wrote between `before_ms` and
            // `after_ms` on Redis' clock, so PEXPIRETIME - TTL must fall in between.
            let mut pipe = redis::pipe();
            pipe.cmd("TIME");
            for k in &keys {
                pipe.cmd("TYPE").arg(k).cmd("PEXPIRETIME").arg(k);
            }
            // (After all of them: a key may be given twice.)
            for k in &keys {
                pipe.cmd("PERSIST").arg(k).ignore();
            }
            let replies: Vec<Value> = pipe.query(&mut inspect).unwrap();
            let after_ms = {
                let (secs, micros): (u64, u64) = redis::from_redis_value(replies[0].clone()).unwrap();
                (secs * 1_000_000 + micros) / 1000
            };
            let expire_at = |i: usize| match replies[2 + 2 * i] {
                Value::Int(n) => n,
                ref other => panic!("{ctx}: PEXPIRETIME gave {other:?}"),
            };
            let mut stored: Vec<Option<State>> = Vec::with_capacity(keys.len());
            for (i, k) in keys.iter().enumerate() {
                let kind = match &replies[1 + 2 * i] {
                    Value::SimpleString(s) => s.clone(),
                    other => panic!("{ctx}: TYPE gave {other:?}"),
                };
                stored.push(match kind.as_str() {
                    "none" => None,
                    "string" => {
                        // (None: expired on Redis' clock since TYPE.)
                        let raw: Option<Vec<u8>> = redis::cmd("GET").arg(k).query(&mut inspect).unwrap();
                        raw.map(|raw| parse_string_state(&ctx, &raw))
                    }
                    "zset" => {
                        let members: Vec<(String, String)> =
                            redis::cmd("ZRANGE").arg(k).arg(0).arg(-1).arg("WITHSCORES").query(&mut inspect).unwrap();
                        stats.log_entries_max = stats.log_entries_max.max(members.len());
                        normalized(Some(parse_log(&ctx, &members)))
                    }
                    other => panic!("{ctx}: key of type {other}"),
                });
            }
            // The store's own reader agrees (the admin API's view).
            let i = rng.gen_range(0..keys.len());
            let read = rt.block_on(store.raw_state(checks[i].zone, &checks[i].key)).unwrap();
            // (A key with a TTL of a few ms may have expired on Redis' own clock by now.)
            let wall_expired = read.is_none() && expire_at(i) >= 0 && expire_at(i) - after_ms as i64 <= SHORT_TTL_MS;
            assert!(
                read == stored[i] || wall_expired,
                "{ctx}: raw_state of zone {i}: {read:?}, stored {:?}",
                stored[i]
            );
            // Writes may take this long to be read back: a shorter TTL can run out on Redis' clock.
            let waited_ms = sent.elapsed().as_millis() as u64 + 1;

            if expected.admitted {
                // The last zone of a key decides what it stores.
                for ((k, zone), check) in keys.iter().zip(&expected.zones).zip(&checks) {
                    let ttl = ttl_ms(now_us, zone.expires_us);
                    let entry = Stored {
                        state: zone.next.clone(),
                        limit: check.limit,
                        expires_us: zone.expires_us,
                        expires_real_us: real_us + ttl * 1000,
                    };
                    if normalized(Some(zone.next.clone())).is_some() {
                        model.insert(k.clone(), entry);
                    } else {
                        model.remove(k);
                    }
                }
            }
            for (i, k) in keys.iter().enumerate() {
                let expires_ms = expire_at(i);
                // Redis dropped this key on its own wall clock before the PERSIST (so PEXPIRETIME
                // may still have read its expiry).
                let mut wall_expired = false;
                if expected.admitted && stored[i].is_none() {
                    if let Some(s) = model.get(k) {
                        if ttl_ms(now_us, s.expires_us) <= waited_ms {
                            // Forget it here too (the trace's clock has not reached `expires_us`).
                            model.remove(k);
                            stats.wall_expired += 1;
                            wall_expired = true;
                        }
                    }
                }
                let want = model.get(k);
                assert_eq!(
                    stored[i],
                    want.map(|s| s.state.clone()),
                    "{ctx}: zone {i} ({}) stored state; admitted {}",
                    checks[i].limit.algorithm.as_str(),
                    expected.admitted
                );
                if expected.admitted {
                    match want {
                        Some(s) => {
                            let ttl = ttl_ms(now_us, s.expires_us) as i64;
                            let written_ms = expires_ms - ttl;
                            assert!(
                                before_ms as i64 <= written_ms && written_ms <= after_ms as i64,
                                "{ctx}: zone {i} ({:?}) expires at {expires_ms} ms on Redis' clock: a TTL of \
                                 {} to {} ms, expected {ttl}",
                                s.state,
                                expires_ms - after_ms as i64,
                                expires_ms - before_ms as i64
                            );
                            stats.per_algorithm[algo_index(s.limit.algorithm)].exact_ttl +=
                                usize::from(before_ms == after_ms);
                        }
                        None => assert!(
                            expires_ms == -2 || wall_expired,
                            "{ctx}: zone {i}: an empty log is no key, but PEXPIRETIME gave {expires_ms}"
                        ),
                    }
                } else {
                    // Rejected: nothing written (the key keeps the value and the PERSIST of an
                    // earlier step).
                    assert!(
                        expires_ms == -1 || (expires_ms == -2 && want.is_none()),
                        "{ctx}: zone {i} PEXPIRETIME {expires_ms} after a rejection"
                    );
                }
            }

            stats.decisions += 1;
            stats.multi_zone += usize::from(checks.len() > 1);
            stats.mixed_algorithms +=
                usize::from(checks.iter().any(|c| c.limit.algorithm != checks[0].limit.algorithm));
            if expected.admitted {
                stats.delayed += usize::from(expected.delay_us > 0);
            } else {
                stats.rejected += 1;
                stats.partial_reject += usize::from(expected.zones.iter().any(|z| z.admitted));
            }
            last = Some(expected);
        }
    }

    let elapsed = started.elapsed();
    println!(
        "lua_differential: {} decisions in {TRACES} traces, {elapsed:?}: {} rejected ({} by some zones only), \
         {} delayed, {} multi-zone ({} mixing algorithms), {} with a key twice, {} backwards steps, {} reloads, \
         up to {} log entries per key, {} keys expired on Redis' clock",
        stats.decisions,
        stats.rejected,
        stats.partial_reject,
        stats.delayed,
        stats.multi_zone,
        stats.mixed_algorithms,
        stats.duplicate_keys,
        stats.backwards,
        stats.reloads,
        stats.log_entries_max,
        stats.wall_expired,
    );
    for algorithm in ALGORITHMS {
        let c = stats.per_algorithm[algo_index(algorithm)];
        println!(
            "  {:<14} {:>6} zone decisions: {} admitted ({} with state, {} cost 0), {} rejected ({} never), \
             {} foreign state, {} expirations, {} exact TTLs, {} at boundaries, {} behind, {} {}",
            algorithm.as_str(),
            c.zone_decisions,
            c.admitted,
            c.with_state,
            c.zero_cost,
            c.rejected,
            c.never,
            c.foreign_state,
            c.expired,
            c.exact_ttl,
            c.boundary,
            c.behind,
            c.special,
            if algorithm.is_window() { "retries > 0" } else { "fractional" },
        );
    }
    assert!(stats.decisions >= 20_000, "{} decisions", stats.decisions);
    for (what, n) in [
        ("rejected", stats.rejected),
        ("partial_reject", stats.partial_reject),
        ("delayed", stats.delayed),
        ("multi_zone", stats.multi_zone),
        ("mixed_algorithms", stats.mixed_algorithms),
        ("duplicate_keys", stats.duplicate_keys),
        ("backwards", stats.backwards),
        ("reloads", stats.reloads),
    ] {
        assert!(n >= 20, "only {n} `{what}` cases in {} decisions", stats.decisions);
    }
    for algorithm in ALGORITHMS {
        let c = stats.per_algorithm[algo_index(algorithm)];
        for (what, n) in [
            ("admitted", c.admitted),
            ("with_state", c.with_state),
            ("zero_cost", c.zero_cost),
            ("rejected", c.rejected),
            ("never", c.never),
            ("foreign_state", c.foreign_state),
            ("expired", c.expired),
            ("exact_ttl", c.exact_ttl),
            ("boundary", c.boundary),
            ("behind", c.behind),
            ("special", c.special),
        ] {
            assert!(n >= 20, "{}: only {n} `{what}` cases in {} zone decisions", algorithm.as_str(), c.zone_decisions);
        }
    }
}
