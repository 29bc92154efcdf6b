//! The limit model, table-driven on the manual clock: every algorithm at its boundaries (the
//! refill instant, one µs before and after it, window edges), cost (0, 1, the whole capacity,
//! more than it, huge), the extremes of every parameter (no panic, no wraparound), nginx's
//! documented `burst`/`delay`/`nodelay` cases, and several zones on one request.
//!
//! One row per case: a name, the zone, and the requests in order (when, cost, what must happen).
//! A row's admitted requests are stored, as the stores do; rejected ones are not. Every failing
//! row is reported by name, not only the first.
//!
//! This file is the harness and the tables that span algorithms (the extremes of every parameter,
//! several zones on one request); each algorithm's own rows are in the file named after it.

mod fixed_window;
mod leaky_bucket;
mod sliding_log;
mod sliding_window;
mod token_bucket;

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{
    decide_all, evaluate, Algorithm, Clock, DelayPolicy, LimitReq, ManualClock, Rate, State, ZoneInput, ZoneOutcome,
};

const MS: u64 = 1_000;
const SEC: u64 = 1_000_000;
const MIN: u64 = 60 * SEC;
const HOUR: u64 = 60 * MIN;
/// 2023-11-14T00:00:00Z: a whole day, so every epoch-aligned window (1 ms up to 24 h) starts here.
const T0: u64 = 1_699_920_000 * SEC;

/// What must happen to one request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    /// Admitted at once.
    Pass,
    /// Admitted at once with exactly this many cost-1 requests remaining (the `r` of `RateLimit`).
    PassLeft(u64),
    /// Admitted, forwarded after exactly this delay.
    Delay(u64),
    /// Rejected; the same request would pass after exactly this long.
    Reject(u64),
    /// Rejected; retrying later may help (how long is not exact: float residue at this instant).
    RejectLater,
    /// Rejected, and no wait would help: the cost exceeds what the zone ever admits.
    Never,
}
use Want::*;

/// One request: at `T0 + at`, of `cost`.
struct Step {
    at: u64,
    cost: u64,
    want: Want,
}

fn at(at: u64, cost: u64, want: Want) -> Step {
    Step { at, cost, want }
}

/// `n` requests of cost 1 at `T0 + at`, each wanting the next of `wants`.
fn burst(at: u64, wants: &[Want]) -> Vec<Step> {
    wants.iter().map(|&want| Step { at, cost: 1, want }).collect()
}

struct Row {
    name: &'static str,
    limit: LimitReq,
    steps: Vec<Step>,
}

fn row(name: &'static str, limit: LimitReq, steps: Vec<Step>) -> Row {
    Row { name, limit, steps }
}

fn zone(algorithm: Algorithm, count: u64, period_us: u64, burst: u64, delay: DelayPolicy) -> LimitReq {
    LimitReq { algorithm, rate: Rate { count, period_us }, burst, delay }
}
fn leaky(rate: &str, burst: u64, delay: DelayPolicy) -> LimitReq {
    LimitReq { algorithm: Algorithm::LeakyBucket, rate: parse(rate), burst, delay }
}
fn tokens(rate: &str, burst: u64) -> LimitReq {
    LimitReq { algorithm: Algorithm::TokenBucket, rate: parse(rate), burst, delay: DelayPolicy::NoDelay }
}
fn window(algorithm: Algorithm, limit: u64, period_us: u64) -> LimitReq {
    zone(algorithm, limit, period_us, 0, DelayPolicy::NoDelay)
}
fn parse(rate: &str) -> Rate {
    Rate::parse(rate).unwrap_or_else(|e| panic!("{rate}: {e}"))
}

/// What a request got, in the terms of [`Want`]: `Pass`/`PassLeft` are told apart by the row.
fn got(out: &ZoneOutcome, want: Want) -> Want {
    match (out.admitted, out.delay_us, out.retry_after_us) {
        (true, 0, _) if matches!(want, PassLeft(_)) => PassLeft(out.remaining),
        (true, 0, _) => Pass,
        (true, d, _) => Delay(d),
        (false, _, None) => Never,
        (false, _, Some(_)) if want == RejectLater => RejectLater,
        (false, _, Some(r)) => Reject(r),
    }
}

/// Runs the row's requests in order on a manual clock; `Err` names the first step that differs.
fn run_row(row: &Row) -> Result<(), String> {
    let clock = ManualClock::new(T0);
    let mut state: Option<State> = None;
    for (i, step) in row.steps.iter().enumerate() {
        clock.set_us(T0 + step.at);
        let now = clock.now_us();
        let out = catch_unwind(AssertUnwindSafe(|| evaluate(&row.limit, state.as_ref(), now, step.cost)))
            .map_err(|_| format!("step {i} (T0+{}µs, cost {}): panicked", step.at, step.cost))?;
        let got = got(&out, step.want);
        if got != step.want {
            return Err(format!(
                "step {i} (T0+{}µs, cost {}): want {:?}, got {got:?}\n  outcome: {out:?}",
                step.at, step.cost, step.want
            ));
        }
        check_invariants(&row.limit, &out, now).map_err(|e| format!("step {i}: {e}\n  outcome: {out:?}"))?;
        if out.admitted {
            state = Some(out.next);
        }
    }
    Ok(())
}

/// What holds for every outcome, whatever the inputs: nothing wraps around.
fn check_invariants(limit: &LimitReq, out: &ZoneOutcome, now: u64) -> Result<(), String> {
    if out.excess.is_nan() {
        return Err("excess is NaN".into());
    }
    // `LimitReq::capacity` without its `burst + 1` overflow at burst = u64::MAX.
    let capacity = if limit.algorithm.is_window() { limit.rate.count } else { limit.burst.saturating_add(1) };
    if out.remaining > capacity {
        return Err(format!("remaining {} above the capacity {capacity}", out.remaining));
    }
    if out.admitted && out.retry_after_us.is_some() {
        return Err("an admission with a retry time".into());
    }
    if !out.admitted && (out.delay_us != 0 || out.remaining != 0) {
        return Err("a rejection with a delay or something remaining".into());
    }
    if out.expires_us < now.min(state_time(&out.next)) {
        return Err(format!("expires at {} before now {now}: wrapped around", out.expires_us));
    }
    Ok(())
}

/// The time a state was measured at (buckets), or its newest entry (windows).
fn state_time(state: &State) -> u64 {
    match state {
        State::Bucket(b) => b.last_us,
        State::Tokens(t) => t.last_us,
        State::Window(w) => w.start_us,
        State::Sliding(s) => s.start_us,
        State::Log(entries) => entries.first().copied().unwrap_or(u64::MAX),
    }
}

fn assert_rows(rows: &[Row]) {
    let failures: Vec<String> =
        rows.iter().filter_map(|r| run_row(r).err().map(|e| format!("row {:?}: {e}", r.name))).collect();
    assert!(failures.is_empty(), "{} of {} rows failed:\n{}", failures.len(), rows.len(), failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Extremes: nothing panics, nothing wraps around
// ---------------------------------------------------------------------------------------------

/// The largest values a config can give (`weir check` refuses more): 1000000r/s, 1r/h, windows of
/// 1 ms and 24 h, burst, limit and cost of 1000000.
#[test]
fn config_extremes_decide_exactly() {
    const MAX: u64 = 1_000_000;
    let nodelay = DelayPolicy::NoDelay;
    assert_rows(&[
        row(
            "1000000r/s burst=0: one per µs",
            leaky("1000000r/s", 0, nodelay),
            vec![at(0, 1, Pass), at(0, 1, Reject(1)), at(1, 1, Pass)],
        ),
        row(
            "1000000r/s burst=1000000, cost 1000000",
            leaky("1000000r/s", MAX, nodelay),
            vec![
                at(0, MAX, PassLeft(1)),
                at(0, 1, PassLeft(0)),
                at(0, 1, Reject(1)),
                at(0, MAX + 2, Never),
                // Drained only at 1000001 µs.
                at(SEC, MAX + 1, Reject(1)),
                at(SEC + 1, MAX + 1, PassLeft(0)),
            ],
        ),
        row(
            "1r/h burst=1000000 delays up to ~114 years",
            leaky("1r/h", MAX, DelayPolicy::After(0)),
            vec![at(0, MAX, Delay((MAX - 1) * HOUR)), at(0, 1, Delay(MAX * HOUR)), at(0, 1, Reject(HOUR))],
        ),
        row(
            "token bucket 1r/h, burst and cost 1000000",
            tokens("1r/h", MAX),
            vec![at(0, MAX, PassLeft(1)), at(0, 2, Reject(HOUR)), at(0, MAX + 2, Never), at(HOUR, 2, PassLeft(0))],
        ),
        row(
            "token bucket 1000000r/s",
            tokens("1000000r/s", 0),
            vec![at(0, 1, Pass), at(0, 1, Reject(1)), at(1, 1, Pass)],
        ),
        row(
            "fixed window 24 h, limit 1000000",
            window(Algorithm::FixedWindow, MAX, 24 * HOUR),
            vec![
                at(0, MAX, PassLeft(0)),
                at(24 * HOUR - 1, 1, Reject(1)),
                at(24 * HOUR, MAX, PassLeft(0)),
                at(24 * HOUR, MAX, Reject(24 * HOUR)),
            ],
        ),
        row(
            "fixed window 1 ms, limit 1000000",
            window(Algorithm::FixedWindow, MAX, MS),
            vec![at(0, MAX, PassLeft(0)), at(0, 1, Reject(MS)), at(MS, 1, Pass)],
        ),
        row(
            "sliding window 24 h, limit 1000000",
            window(Algorithm::SlidingWindow, MAX, 24 * HOUR),
            vec![at(0, MAX, PassLeft(0)), at(0, 1, RejectLater), at(48 * HOUR, MAX, PassLeft(0))],
        ),
        // sliding_log is limited to 10000 per window (one entry per unit).
        row(
            "sliding log 24 h, limit 10000",
            window(Algorithm::SlidingLog, 10_000, 24 * HOUR),
            vec![at(0, 10_000, PassLeft(0)), at(0, 1, Reject(24 * HOUR)), at(24 * HOUR, 10_000, PassLeft(0))],
        ),
    ]);
}

/// Every algorithm over the extremes a config reaches (1r/h up to 3600000000r/h and 1000000r/s,
/// windows of 1 ms and 24 h, burst and limit 1000000) with costs up to `u32::MAX` (a future front
/// door's `hits_addend`), on a fresh key and on a used one, now and in year 9999: every decision
/// is made without a panic and without wraparound.
#[test]
fn reachable_extremes_neither_panic_nor_wrap() {
    let rates = [(1, HOUR), (1_000_000, SEC), (3_600_000_000, HOUR), (60_000_000, MIN)];
    let windows = [(1, MS), (1_000_000, MS), (1, 24 * HOUR), (1_000_000, 24 * HOUR), (10_000, 24 * HOUR)];
    let mut zones = Vec::new();
    for (count, period) in rates {
        for burst in [0, 1_000_000] {
            for delay in [DelayPolicy::NoDelay, DelayPolicy::After(0), DelayPolicy::After(1_000_000)] {
                zones.push(zone(Algorithm::LeakyBucket, count, period, burst, delay));
            }
            zones.push(zone(Algorithm::TokenBucket, count, period, burst, DelayPolicy::NoDelay));
        }
    }
    for (count, period) in windows {
        zones.push(window(Algorithm::FixedWindow, count, period));
        zones.push(window(Algorithm::SlidingWindow, count, period));
        if count <= 10_000 {
            zones.push(window(Algorithm::SlidingLog, count, period));
        }
    }
    let year_9999 = 253_402_300_799 * SEC;
    let failures = extremes(&zones, &[0, 1, 1_000_000, u64::from(u32::MAX)], &[T0, year_9999]);
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// The same with each parameter at its type's extreme (u64::MAX rate, period, burst, cost). No
/// config reaches these; today they overflow (`expires_us`/window ends added without saturation,
/// `used + cost`, `curr + cost`, a sliding log of u64::MAX entries): run with `--ignored` after
/// a fix.
#[test]
#[ignore = "known: u64::MAX parameters overflow in src/limit (unreachable through a config)"]
fn type_extremes_neither_panic_nor_wrap() {
    let mut zones = Vec::new();
    for algorithm in [
        Algorithm::LeakyBucket,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        for (count, period) in [(1, 1), (u64::MAX, 1), (1, u64::MAX), (u64::MAX, u64::MAX)] {
            for burst in [0, u64::MAX] {
                let burst = if algorithm.is_window() { 0 } else { burst };
                zones.push(zone(algorithm, count, period, burst, DelayPolicy::After(0)));
            }
        }
    }
    let failures = extremes(&zones, &[0, 1, u64::MAX], &[0, T0, u64::MAX - 1]);
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// For each zone, cost and start time: the request on a fresh key, then on what a first request of
/// cost 1 left, then a request of cost 1 one µs and a year later. The failures, named.
fn extremes(zones: &[LimitReq], costs: &[u64], starts: &[u64]) -> Vec<String> {
    let mut failures = Vec::new();
    for limit in zones {
        for &cost in costs {
            for &start in starts {
                let name = format!("{limit:?} cost={cost} at {start}µs");
                let result = catch_unwind(AssertUnwindSafe(|| {
                    let used = evaluate(limit, None, start, 1);
                    check_invariants(limit, &used, start)?;
                    for state in [None, used.admitted.then_some(used.next)] {
                        let out = evaluate(limit, state.as_ref(), start, cost);
                        check_invariants(limit, &out, start)?;
                        let state = if out.admitted { Some(out.next) } else { state };
                        for now in [start.saturating_add(1), start.saturating_add(365 * 24 * HOUR)] {
                            check_invariants(limit, &evaluate(limit, state.as_ref(), now, 1), now)?;
                        }
                    }
                    Ok::<(), String>(())
                }));
                match result {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => failures.push(format!("{name}: {e}")),
                    Err(_) => failures.push(format!("{name}: panicked")),
                }
            }
        }
    }
    failures
}

// ---------------------------------------------------------------------------------------------
// Several zones on one request
// ---------------------------------------------------------------------------------------------

#[test]
fn several_zones_decide_all_or_nothing() {
    let loose = leaky("100r/s", 100, DelayPolicy::NoDelay);
    let tight = leaky("1r/s", 0, DelayPolicy::NoDelay);
    let slow = leaky("1r/m", 0, DelayPolicy::NoDelay);
    let never = tokens("1r/s", 0);
    let delay1 = leaky("1r/s", 5, DelayPolicy::After(0));
    let delay2 = leaky("2r/s", 5, DelayPolicy::After(0));
    let input = |limit, state: &Option<State>, cost| ZoneInput { limit, state: state.clone(), cost };

    // limit_req2.t: each zone rejects alone, both reject; rejections charge no zone.
    let (mut a, mut b) = (None, None);
    let first = decide_all(&[input(&loose, &a, 1), input(&tight, &b, 1)], T0);
    assert!(first.admitted && first.delay_us == 0 && first.retry_after_us.is_none(), "{first:?}");
    let stored: Vec<State> = first.states_to_store().expect("admitted").cloned().collect();
    (a, b) = (Some(stored[0].clone()), Some(stored[1].clone()));

    let second = decide_all(&[input(&loose, &a, 1), input(&tight, &b, 1)], T0);
    assert!(!second.admitted, "the tight zone rejects alone: {second:?}");
    assert!(second.zones[0].admitted, "the loose zone alone would admit");
    assert!(second.states_to_store().is_none(), "a rejection charges no zone");
    assert_eq!((second.delay_us, second.retry_after_us), (0, Some(SEC)));

    let c = decide_all(&[input(&slow, &None, 1)], T0).zones[0].next.clone();
    let both = decide_all(&[input(&tight, &b, 1), input(&slow, &Some(c.clone()), 1)], T0);
    assert!(!both.admitted && !both.zones[0].admitted && !both.zones[1].admitted, "{both:?}");
    assert_eq!(both.retry_after_us, Some(MIN), "the longest retry of the rejecting zones");

    // A zone that can never admit makes the request never admissible, whatever the others say.
    let hopeless = decide_all(&[input(&tight, &b, 1), input(&never, &None, 2)], T0);
    assert!(!hopeless.admitted);
    assert_eq!(hopeless.retry_after_us, None, "{hopeless:?}");

    // Each zone has its own cost; the largest delay wins.
    let s = Some(State::Bucket(super::BucketState { level: 2.0, last_us: T0 }));
    let v = decide_all(&[input(&delay1, &s, 1), input(&delay2, &s, 1)], T0);
    assert!(v.admitted);
    assert_eq!((v.zones[0].delay_us, v.zones[1].delay_us, v.delay_us), (2 * SEC, SEC, 2 * SEC));
    let v = decide_all(&[input(&delay1, &None, 1), input(&delay2, &None, 4)], T0);
    assert_eq!((v.zones[0].delay_us, v.zones[1].delay_us, v.delay_us), (0, 1_500 * MS, 1_500 * MS));

    // No zone: admitted at once.
    let v = decide_all(&[], T0);
    assert!(v.admitted && v.delay_us == 0 && v.retry_after_us.is_none() && v.zones.is_empty());

    // The stores' stand-ins: a full zone rejects for its time, an uncharged one admits.
    let full = ZoneOutcome::rejected_for(&tight, 1, 3 * SEC, T0);
    let spare = ZoneOutcome::not_charged(&loose, T0);
    let v = super::Verdict::combine(vec![spare, full], T0);
    assert!(!v.admitted);
    assert_eq!((v.delay_us, v.retry_after_us, v.decided_us), (0, Some(3 * SEC), T0));
    let huge =
        ZoneOutcome::rejected_for(&zone(Algorithm::LeakyBucket, 1, 1, u64::MAX, DelayPolicy::NoDelay), u64::MAX, 1, T0);
    assert!(huge.excess.is_finite() && !huge.admitted, "saturates: {huge:?}");
}
