//! The sliding window counter (src/limit/sliding_window.rs) in rows: the previous window's weight
//! as the window slides, the retry time.

use super::*;

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
