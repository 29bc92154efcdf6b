//! The leaky bucket (nginx `limit_req`, src/limit/leaky_bucket.rs) in rows: nginx's documented
//! `burst`/`delay`/`nodelay` cases, its boundaries, cost, and the charge after the response.

use super::*;
use crate::limit::charge;

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
                let out = charge(&ceiling, state.as_ref(), clock.now_us(), cost);
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
