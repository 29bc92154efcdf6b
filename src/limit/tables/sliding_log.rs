//! The sliding log (src/limit/sliding_log.rs) in rows: the exact window, cost, a late
//! clock.

use super::*;

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
