//! The limit model, table-driven on the manual clock: every algorithm at its boundaries (the
//! refill instant, one µs before and after it, window edges), cost (0, 1, the whole capacity,
//! more than it, huge), the extremes of every parameter (no panic, no wraparound), nginx's
//! documented `burst`/`delay`/`nodelay` cases, and several zones on one request.
//!
//! One row per case: a name, the zone, and the requests in order (when, cost, what must happen).
//! A row's admitted requests are stored, as the stores do; rejected ones are not. Every failing
//! row is reported by name, not only the first.

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
// Leaky bucket (nginx limit_req)
// ---------------------------------------------------------------------------------------------

#[test]
fn leaky_bucket_nginx_cases() {
    let after = DelayPolicy::After;
    let nodelay = DelayPolicy::NoDelay;
    assert_rows(&[
        // nginx-semantics.md §1.4: 7 requests in one instant at rate=1r/s.
        row(
            "burst=5 delays r2-r6 by 1..5 s, rejects r7",
            leaky("1r/s", 5, after(0)),
            burst(0, &[Pass, Delay(SEC), Delay(2 * SEC), Delay(3 * SEC), Delay(4 * SEC), Delay(5 * SEC), Reject(SEC)]),
        ),
        row(
            "burst=5 nodelay passes r1-r6, rejects r7",
            leaky("1r/s", 5, nodelay),
            burst(0, &[Pass, Pass, Pass, Pass, Pass, Pass, Reject(SEC)]),
        ),
        row(
            "burst=5 delay=3 passes r1-r4, delays r5 r6, rejects r7",
            leaky("1r/s", 5, after(3)),
            burst(0, &[Pass, Pass, Pass, Pass, Delay(SEC), Delay(2 * SEC), Reject(SEC)]),
        ),
        // limit_req_delay.t: pass, not yet delayed, delayed, rejected.
        row(
            "limit_req_delay.t: 30r/m burst=2 delay=1",
            leaky("30r/m", 2, after(1)),
            burst(0, &[Pass, Pass, Delay(2 * SEC), Reject(2 * SEC)]),
        ),
        // delay >= burst: never delays (like nodelay).
        row("delay=burst never delays", leaky("1r/s", 2, after(2)), burst(0, &[Pass, Pass, Pass, Reject(SEC)])),
        row("a new key passes without burst", leaky("1r/s", 0, after(0)), burst(0, &[Pass, Reject(SEC)])),
        row(
            "burst=0: two in one instant, the second is rejected",
            leaky("10r/s", 0, nodelay),
            vec![at(0, 1, Pass), at(0, 1, Reject(100 * MS)), at(50 * MS, 1, Reject(50 * MS))],
        ),
        row(
            "10r/s burst=2 delays in 100 ms steps",
            leaky("10r/s", 2, after(0)),
            burst(0, &[Pass, Delay(100 * MS), Delay(200 * MS), Reject(100 * MS)]),
        ),
    ]);
}

#[test]
fn leaky_bucket_boundaries() {
    let nodelay = DelayPolicy::NoDelay;
    assert_rows(&[
        row(
            "burst=0: 1 µs before the refill instant, at it, 1 µs after",
            leaky("1r/s", 0, nodelay),
            vec![
                at(0, 1, Pass),
                at(SEC / 2, 1, Reject(SEC / 2)),
                at(SEC - 1, 1, RejectLater),
                at(SEC, 1, Pass),
                at(2 * SEC + 1, 1, Pass),
                at(3 * SEC, 1, RejectLater),
                at(3 * SEC + 1, 1, Pass),
            ],
        ),
        // The rejections in between charged nothing: the refill instant stays where it was.
        row("rejected requests are free", leaky("1r/s", 0, nodelay), {
            let mut steps = vec![at(0, 1, Pass)];
            steps.extend((1..100).map(|i| at(i * 5 * MS, 1, RejectLater)));
            steps.push(at(SEC, 1, Pass));
            steps
        }),
        row("a full burst drains one place per interval", leaky("1r/s", 5, nodelay), {
            let mut steps = burst(0, &[Pass; 6]);
            steps.extend([at(SEC - 1, 1, RejectLater), at(SEC, 1, Pass), at(SEC, 1, Reject(SEC))]);
            steps.extend([at(3 * SEC, 1, Pass), at(3 * SEC, 1, Pass), at(3 * SEC, 1, Reject(SEC))]);
            steps
        }),
        row(
            "1r/m is exactly 60 s (not nginx's 62.5 s)",
            leaky("1r/m", 0, nodelay),
            vec![at(0, 1, Pass), at(MIN - 1, 1, RejectLater), at(MIN, 1, Pass)],
        ),
        row(
            "5r/h is exactly 720 s",
            leaky("5r/h", 0, nodelay),
            vec![at(0, 1, Pass), at(720 * SEC - 1, 1, RejectLater), at(720 * SEC, 1, Pass)],
        ),
        row("a year idle drains fully, no further", leaky("10r/s", 20, nodelay), {
            let mut steps = burst(0, &[Pass; 21]);
            steps.push(at(365 * 24 * HOUR, 1, PassLeft(20)));
            steps
        }),
        // Another instance's clock, or a failover: time never runs backwards for a key.
        row(
            "a clock stepped back drains nothing",
            leaky("1r/s", 1, nodelay),
            vec![at(10 * SEC, 1, Pass), at(0, 1, PassLeft(0)), at(5 * SEC, 1, Reject(SEC)), at(11 * SEC, 1, Pass)],
        ),
        row(
            "remaining counts the free places",
            leaky("10r/s", 20, nodelay),
            vec![at(0, 1, PassLeft(20)), at(0, 1, PassLeft(19)), at(0, 1, PassLeft(18)), at(100 * MS, 1, PassLeft(18))],
        ),
    ]);
}

#[test]
fn leaky_bucket_cost() {
    let nodelay = DelayPolicy::NoDelay;
    assert_rows(&[
        row(
            "cost 0 always passes and charges nothing",
            leaky("1r/s", 0, nodelay),
            vec![at(0, 0, Pass), at(0, 1, Pass), at(0, 0, Pass), at(0, 0, Pass), at(0, 1, Reject(SEC))],
        ),
        row(
            "cost counts as that many requests",
            leaky("10r/s", 9, nodelay),
            vec![at(0, 6, PassLeft(4)), at(0, 5, Reject(100 * MS)), at(0, 4, PassLeft(0)), at(0, 1, Reject(100 * MS))],
        ),
        row(
            "cost = burst+1 fills a fresh bucket",
            leaky("1r/m", 9, nodelay),
            vec![at(0, 10, PassLeft(0)), at(0, 1, Reject(MIN)), at(0, 10, Reject(10 * MIN))],
        ),
        row(
            "cost > burst+1 never passes",
            leaky("1r/m", 1, nodelay),
            vec![at(0, 3, Never), at(0, 2, Pass), at(0, 3, Never)],
        ),
        row(
            "cost u64::MAX never passes",
            leaky("1r/s", 5, nodelay),
            vec![at(0, u64::MAX, Never), at(0, 1, Pass), at(0, u64::MAX, Never)],
        ),
        row(
            "a costly request is delayed by its excess",
            leaky("1r/s", 5, DelayPolicy::After(0)),
            vec![at(0, 3, Delay(2 * SEC)), at(0, 3, Delay(5 * SEC)), at(0, 1, Reject(SEC))],
        ),
    ]);
}

// ---------------------------------------------------------------------------------------------
// Token bucket
// ---------------------------------------------------------------------------------------------

#[test]
fn token_bucket_cases() {
    assert_rows(&[
        row(
            "burst+1 tokens, one back every 500 ms",
            tokens("2r/s", 3),
            vec![
                at(0, 1, PassLeft(3)),
                at(0, 1, PassLeft(2)),
                at(0, 1, PassLeft(1)),
                at(0, 1, PassLeft(0)),
                at(0, 1, Reject(500 * MS)),
                at(499_999, 1, RejectLater),
                at(500 * MS, 1, PassLeft(0)),
                at(500 * MS + 1, 1, RejectLater),
                at(HOUR, 1, PassLeft(3)),
            ],
        ),
        row(
            "1r/m burst=2: 3 pass, a token takes 60 s",
            tokens("1r/m", 2),
            vec![
                at(0, 1, PassLeft(2)),
                at(0, 1, PassLeft(1)),
                at(0, 1, PassLeft(0)),
                at(0, 1, Reject(MIN)),
                at(MIN - 1, 1, RejectLater),
                at(MIN, 1, PassLeft(0)),
            ],
        ),
        row(
            "route cost 3 against 6 tokens",
            tokens("1r/m", 5),
            vec![at(0, 3, PassLeft(3)), at(0, 3, PassLeft(0)), at(0, 3, Reject(3 * MIN))],
        ),
        row(
            "header costs against 10 tokens",
            tokens("1r/m", 9),
            vec![at(0, 2, PassLeft(8)), at(0, 4, PassLeft(4)), at(0, 4, PassLeft(0)), at(0, 1, Reject(MIN))],
        ),
        row(
            "cost = capacity passes, more never does",
            tokens("1r/m", 9),
            vec![at(0, 11, Never), at(0, 10, PassLeft(0)), at(0, 11, Never), at(0, 1, Reject(MIN))],
        ),
        row(
            "cost 0 passes on an empty bucket",
            tokens("1r/s", 0),
            vec![at(0, 1, PassLeft(0)), at(0, 0, PassLeft(0)), at(0, 1, Reject(SEC))],
        ),
        row("cost u64::MAX never passes", tokens("1r/s", 0), vec![at(0, u64::MAX, Never), at(0, 1, Pass)]),
        row(
            "a clock stepped back refills nothing",
            tokens("1r/s", 1),
            vec![at(10 * SEC, 1, Pass), at(0, 1, Pass), at(5 * SEC, 1, Reject(SEC)), at(11 * SEC, 1, Pass)],
        ),
    ]);
}

/// Token bucket and leaky bucket with `nodelay` are the same decision, retry and remaining included,
/// on any schedule (here: a fixed pseudo-random one).
#[test]
fn token_bucket_decides_like_leaky_bucket_nodelay() {
    for (rate, burst) in [("1r/s", 0), ("2r/s", 3), ("7r/m", 4), ("600r/m", 20), ("5r/h", 2)] {
        let lb = leaky(rate, burst, DelayPolicy::NoDelay);
        let tb = tokens(rate, burst);
        let (mut sl, mut st): (Option<State>, Option<State>) = (None, None);
        let mut now = T0;
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for i in 0..2_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            now += seed % (lb.rate.time_for_us(1.0) as u64 / 2 + 1);
            let cost = [0, 1, 1, 1, 2, burst + 1, burst + 2][(seed >> 32) as usize % 7];
            let (l, t) = (evaluate(&lb, sl.as_ref(), now, cost), evaluate(&tb, st.as_ref(), now, cost));
            let ctx = format!("{rate} burst={burst}, request {i} at T0+{}µs cost {cost}", now - T0);
            assert_eq!(l.admitted, t.admitted, "{ctx}\nleaky {l:?}\ntoken {t:?}");
            assert_eq!(l.retry_after_us.is_some(), t.retry_after_us.is_some(), "{ctx}\nleaky {l:?}\ntoken {t:?}");
            if let (Some(a), Some(b)) = (l.retry_after_us, t.retry_after_us) {
                assert!(a.abs_diff(b) <= 1, "retry within float rounding: {ctx}\nleaky {l:?}\ntoken {t:?}");
            }
            assert_eq!(l.remaining, t.remaining, "{ctx}\nleaky {l:?}\ntoken {t:?}");
            if l.admitted {
                sl = Some(l.next);
                st = Some(t.next);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Windows
// ---------------------------------------------------------------------------------------------

#[test]
fn fixed_window_cases() {
    let fw = |limit, period| window(Algorithm::FixedWindow, limit, period);
    assert_rows(&[
        row(
            "3 per 2 s: the window's edges",
            fw(3, 2 * SEC),
            vec![
                at(50 * MS, 1, PassLeft(2)),
                at(50 * MS, 1, PassLeft(1)),
                at(50 * MS, 1, PassLeft(0)),
                at(50 * MS, 1, Reject(1_950 * MS)),
                at(2 * SEC - 1, 1, Reject(1)),
                // A new window opens whole, right after the full one (the boundary double burst).
                at(2 * SEC, 1, PassLeft(2)),
                at(2 * SEC, 1, PassLeft(1)),
                at(2 * SEC, 1, PassLeft(0)),
                at(2 * SEC, 1, Reject(2 * SEC)),
                at(4 * SEC + 1, 1, PassLeft(2)),
            ],
        ),
        row(
            "3r/m: retry is the rest of the minute",
            fw(3, MIN),
            vec![
                at(40 * SEC, 1, Pass),
                at(40 * SEC, 1, Pass),
                at(40 * SEC, 1, Pass),
                at(41 * SEC, 1, Reject(19 * SEC)),
                at(MIN, 1, PassLeft(2)),
            ],
        ),
        row(
            "rejections are free",
            fw(1, SEC),
            vec![at(0, 1, Pass), at(1, 1, Reject(SEC - 1)), at(SEC - 1, 1, Reject(1)), at(SEC, 1, Pass)],
        ),
        row(
            "cost fills the window in units",
            fw(5, SEC),
            vec![
                at(0, 0, PassLeft(5)),
                at(0, 3, PassLeft(2)),
                at(0, 3, Reject(SEC)),
                at(0, 2, PassLeft(0)),
                at(0, 0, PassLeft(0)),
            ],
        ),
        row("cost over the limit never passes", fw(3, MIN), vec![at(0, 4, Never), at(0, 3, PassLeft(0))]),
        row("cost u64::MAX on a fresh key never passes", fw(3, MIN), vec![at(0, u64::MAX, Never)]),
        row(
            "a late clock stays in the newer window",
            fw(2, SEC),
            vec![at(SEC, 1, Pass), at(SEC - 1, 1, PassLeft(0)), at(SEC - 2, 1, Reject(SEC + 2)), at(2 * SEC, 1, Pass)],
        ),
        row(
            "1 ms windows",
            fw(1, MS),
            vec![at(0, 1, Pass), at(MS - 1, 1, Reject(1)), at(MS, 1, Pass), at(MS + 999, 1, Reject(1))],
        ),
    ]);
}

#[test]
fn sliding_window_cases() {
    let sw = |limit, period| window(Algorithm::SlidingWindow, limit, period);
    let filled = || burst(50 * MS, &[Pass, Pass, Pass, Pass]);
    let then = |mut steps: Vec<Step>, more: Vec<Step>| {
        steps.extend(more);
        steps
    };
    assert_rows(&[
        row(
            "4 per 2 s: full at the start of the next window",
            sw(4, 2 * SEC),
            then(filled(), vec![at(50 * MS, 1, RejectLater), at(2 * SEC + 50 * MS, 1, RejectLater)]),
        ),
        // In the next window the previous 4 weigh 4 × (1 - t/2 s): 2 from 1 s in, 1 from 1.5 s in.
        row(
            "1 s into the next window two pass",
            sw(4, 2 * SEC),
            then(filled(), vec![at(3 * SEC, 1, Pass), at(3 * SEC, 1, Pass), at(3 * SEC, 1, RejectLater)]),
        ),
        row(
            "20 ms later still two",
            sw(4, 2 * SEC),
            then(
                filled(),
                vec![
                    at(3 * SEC + 20 * MS, 1, Pass),
                    at(3 * SEC + 20 * MS, 1, Pass),
                    at(3 * SEC + 20 * MS, 1, RejectLater),
                ],
            ),
        ),
        row(
            "1 µs before 1.5 s still two",
            sw(4, 2 * SEC),
            then(filled(), vec![at(3_499_999, 1, Pass), at(3_499_999, 1, Pass), at(3_499_999, 1, RejectLater)]),
        ),
        row(
            "from 1.5 s three",
            sw(4, 2 * SEC),
            then(
                filled(),
                vec![
                    at(3_500_000, 1, Pass),
                    at(3_500_000, 1, Pass),
                    at(3_500_000, 1, Pass),
                    at(3_500_000, 1, RejectLater),
                ],
            ),
        ),
        row(
            "two windows later the previous count is gone",
            sw(4, 2 * SEC),
            then(filled(), vec![at(4 * SEC, 1, PassLeft(3))]),
        ),
        // Nothing before this minute, 5 in it: a sixth fits once 5 × (60 - t) / 60 <= 4 in the
        // next minute, i.e. 12 s into it.
        row(
            "5r/m: retry is the rest of the minute + 12 s",
            sw(5, MIN),
            vec![
                at(SEC, 1, PassLeft(4)),
                at(SEC, 1, PassLeft(3)),
                at(SEC, 1, PassLeft(2)),
                at(SEC, 1, PassLeft(1)),
                at(SEC, 1, PassLeft(0)),
                at(SEC, 1, Reject(71 * SEC)),
                at(72 * SEC - 1, 1, RejectLater),
                at(72 * SEC, 1, Pass),
            ],
        ),
        row("cost over the limit never passes", sw(3, MIN), vec![at(0, 4, Never), at(0, 3, PassLeft(0))]),
        row("cost 0 passes on a full window", sw(1, SEC), vec![at(0, 1, Pass), at(0, 0, Pass), at(0, 1, RejectLater)]),
        row("cost u64::MAX never passes", sw(3, MIN), vec![at(0, u64::MAX, Never), at(0, 1, Pass)]),
    ]);
}

#[test]
fn sliding_log_cases() {
    let log = |limit, period| window(Algorithm::SlidingLog, limit, period);
    assert_rows(&[
        row(
            "3r/m: the oldest entry leaves exactly a minute later",
            log(3, MIN),
            vec![
                at(0, 1, PassLeft(2)),
                at(10 * SEC, 1, PassLeft(1)),
                at(20 * SEC, 1, PassLeft(0)),
                at(59 * SEC, 1, Reject(SEC)),
                at(MIN - 1, 1, Reject(1)),
                at(MIN, 1, PassLeft(0)),
                at(MIN, 1, Reject(10 * SEC)),
            ],
        ),
        row(
            "3 per 2 s: the window slides, nothing resets",
            log(3, 2 * SEC),
            vec![
                at(0, 1, Pass),
                at(SEC, 1, Pass),
                at(SEC, 1, PassLeft(0)),
                at(SEC, 1, Reject(SEC)),
                at(1_800 * MS, 1, Reject(200 * MS)),
                at(2 * SEC, 1, PassLeft(0)),
                at(2 * SEC, 1, Reject(SEC)),
            ],
        ),
        row(
            "4 at once: rejected until they all leave",
            log(4, 3 * SEC),
            vec![
                at(0, 1, Pass),
                at(0, 1, Pass),
                at(0, 1, Pass),
                at(0, 1, Pass),
                at(0, 1, Reject(3 * SEC)),
                at(3 * SEC, 4, PassLeft(0)),
            ],
        ),
        row(
            "cost adds entries; retry waits for as many as needed",
            log(5, SEC),
            vec![
                at(0, 2, PassLeft(3)),
                at(MS, 3, PassLeft(0)),
                at(2 * MS, 1, Reject(SEC - 2 * MS)),
                at(2 * MS, 3, Reject(SEC - MS)),
                at(SEC, 2, PassLeft(0)),
            ],
        ),
        row("cost 0 passes on a full log", log(1, SEC), vec![at(0, 1, Pass), at(0, 0, Pass), at(0, 1, Reject(SEC))]),
        row("cost over the limit never passes", log(3, MIN), vec![at(0, 4, Never), at(0, 3, PassLeft(0))]),
        row("cost u64::MAX on a fresh key never passes", log(3, MIN), vec![at(0, u64::MAX, Never)]),
        row(
            "a late clock stamps at the newest entry",
            log(2, SEC),
            vec![at(SEC, 1, Pass), at(SEC / 2, 1, PassLeft(0)), at(2 * SEC - 1, 1, Reject(1)), at(2 * SEC, 1, Pass)],
        ),
    ]);
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

// ---------------------------------------------------------------------------------------------
// Charge from the response: a leaky bucket charged after the fact, into debt up to a ceiling
// ---------------------------------------------------------------------------------------------

/// One step of a budget trace: at `T0 + at`, a request of cost 1 (`Ok(want)`) or a charge after
/// the response (`Err(cost)`) with the level it must leave.
enum Budget {
    Request(u64, Want),
    Charge(u64, u64, f64),
}

/// Runs a trace of requests on `limit` and charges on its ceiling (`burst + debt`) on the manual
/// clock, as the engine does: requests checked (and charged here only with cost 1 when
/// `charge_requests`), responses charged with the reported cost.
fn run_budget(name: &str, limit: LimitReq, debt: u64, steps: &[Budget]) {
    let ceiling = LimitReq { burst: limit.burst + debt, delay: DelayPolicy::NoDelay, ..limit };
    let clock = ManualClock::new(T0);
    let mut state: Option<State> = None;
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Budget::Request(at, want) => {
                clock.set_us(T0 + at);
                // Checked uncharged: the state is not written.
                let out = evaluate(&limit, state.as_ref(), clock.now_us(), 1);
                assert_eq!(got(&out, want), want, "{name}: step {i}: {out:?}");
            }
            Budget::Charge(at, cost, level) => {
                clock.set_us(T0 + at);
                let out = super::charge(&ceiling, state.as_ref(), clock.now_us(), cost);
                assert!(out.admitted, "{name}: step {i}: a charge is never refused: {out:?}");
                match &out.next {
                    State::Bucket(b) => assert_eq!(b.level, level, "{name}: step {i}: level"),
                    other => panic!("{name}: step {i}: {other:?}"),
                }
                state = Some(out.next);
            }
        }
    }
}

#[test]
fn leaky_bucket_charged_from_the_response() {
    use Budget::{Charge, Request};
    let nodelay = DelayPolicy::NoDelay;
    // A 20000-token budget refilled at 20000/h (one token per 180 ms), 5000 tokens a response.
    let budget = leaky("20000r/h", 19_999, nodelay);
    run_budget(
        "four responses spend the budget, the fifth request waits for one token",
        budget,
        20_000,
        &[
            Request(0, Pass),
            Charge(0, 5000, 5000.0),
            Request(0, Pass),
            Charge(0, 5000, 10000.0),
            Request(0, Pass),
            Charge(0, 5000, 15000.0),
            Request(0, Pass),
            Charge(0, 5000, 20000.0),
            Request(0, Reject(180 * MS)),
            Request(180 * MS - 1, Reject(1)),
            Request(180 * MS, Pass),
        ],
    );
    run_budget(
        "a charge past the burst is debt: refused until it drains below the burst",
        budget,
        20_000,
        &[Charge(0, 15_000, 15_000.0), Charge(0, 15_000, 30_000.0), Request(0, Reject(10_001 * 180 * MS))],
    );
    run_budget(
        "the debt is capped: a huge charge fills to burst + 1 + debt, no further",
        budget,
        5000,
        &[Charge(0, 1_000_000, 25_000.0), Charge(HOUR, 1_000_000, 25_000.0), Request(2 * HOUR, Pass)],
    );
    run_budget(
        "no debt allowed: a charge fills the bucket and the rest is forgiven",
        leaky("1r/s", 4, nodelay),
        0,
        &[Charge(0, 3, 3.0), Charge(0, 3, 5.0), Request(0, Reject(SEC)), Request(SEC, Pass)],
    );
    run_budget(
        "a charge of 0 writes the drained level; the clock going back drains nothing",
        leaky("1r/s", 4, nodelay),
        5,
        &[
            Charge(10 * SEC, 8, 8.0),
            Charge(9 * SEC, 0, 8.0),
            Charge(12 * SEC, 0, 6.0),
            Request(12 * SEC, Reject(2 * SEC)),
        ],
    );
    run_budget(
        "a fractional level: only whole units below the ceiling are charged",
        leaky("2r/s", 1, nodelay),
        2,
        &[Charge(0, 4, 4.0), Charge(250 * MS, 9, 3.5), Request(250 * MS, Reject(1250 * MS))],
    );
    // Delayed, not refused, when the debt stays within the burst and past `delay`.
    let delayed = leaky("100r/s", 29_999, DelayPolicy::After(19_700));
    run_budget(
        "past delay the next request waits for the excess to drain",
        delayed,
        0,
        &[Charge(0, 20_000, 20_000.0), Request(0, Delay(3 * SEC)), Request(SEC, Delay(2 * SEC))],
    );
}
