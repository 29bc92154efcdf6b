//! The token bucket (src/limit/token_bucket.rs) in rows, and its equivalence with the leaky bucket
//! with `nodelay`.

use super::*;

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
