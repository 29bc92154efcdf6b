//! The fixed window (src/limit/fixed_window.rs) in rows: window edges, retry, free
//! rejections, cost, a late clock, 1 ms windows.

use super::*;

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
