//! Sliding window counter: counts per epoch-aligned window, and estimates the sliding window as
//! the current count plus the previous window's count weighted by how much of it still overlaps.
//! Two small counters per key; the estimate assumes the previous window's requests were spread
//! evenly, so bursty traffic can pass slightly more or less than an exact sliding log.
//!
//! ```text
//! estimate = prev * (window - elapsed) / window + curr
//! reject     if estimate + cost > limit                     # nothing counted
//! ```

use super::evaluation::{ceil_us, Evaluation};
use super::{stored, LimitReq};

/// The window starting at `start_us` (`curr` admissions) and the one before it (`prev`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingState {
    pub start_us: u64,
    pub prev: u64,
    pub curr: u64,
}

impl SlidingState {
    /// The state as `lua/limit_req/sliding_window.lua` stores it, split on ' ': "s <start_us>
    /// <prev> <curr>". `None`: not this algorithm's text.
    pub fn from_stored(words: &[&str]) -> Option<Self> {
        match words {
            ["s", start_us, prev, curr] => Some(Self {
                start_us: stored::integer(start_us)?,
                prev: stored::integer(prev)?,
                curr: stored::integer(curr)?,
            }),
            _ => None,
        }
    }
}

pub fn evaluate(limit: &LimitReq, state: Option<SlidingState>, now_us: u64, cost: u64) -> Evaluation<SlidingState> {
    let window = limit.rate.period_us;
    let aligned = now_us - now_us % window;
    let (start_us, prev, curr) = match state {
        Some(SlidingState { start_us: start, prev, curr }) if start == aligned => (start, prev, curr),
        Some(SlidingState { start_us: start, curr, .. }) if start + window == aligned => (aligned, curr, 0),
        // A late clock keeps the key in its newer window.
        Some(SlidingState { start_us: start, prev, curr }) if start > aligned => (start, prev, curr),
        _ => (aligned, 0, 0),
    };
    let elapsed = now_us.saturating_sub(start_us);
    let window_f = window as f64;
    let estimate = prev as f64 * (window - elapsed) as f64 / window_f + curr as f64;
    let limit_f = limit.rate.count as f64;
    let cost_f = cost as f64;
    let expires_us = start_us + 2 * window;
    if estimate + cost_f > limit_f {
        let retry_after_us = if limit.rate.count == 0 {
            // A block (limit 0): the current window's end, as a fixed window names it.
            Some((start_us + window).saturating_sub(now_us))
        } else {
            (cost <= limit.rate.count).then(|| retry_us(limit_f - cost_f, prev, curr, elapsed, window))
        };
        return Evaluation {
            admitted: false,
            excess: estimate + cost_f - limit_f,
            delay_us: 0,
            retry_after_us,
            remaining: 0,
            reset_us: expires_us.saturating_sub(now_us),
            expires_us,
            next: SlidingState { start_us, prev, curr },
        };
    }
    let room = (limit_f - estimate - cost_f).floor();
    Evaluation {
        admitted: true,
        excess: 0.0,
        delay_us: 0,
        retry_after_us: None,
        remaining: if room > 0.0 { room as u64 } else { 0 },
        reset_us: expires_us.saturating_sub(now_us),
        expires_us,
        next: SlidingState { start_us, prev, curr: curr + cost },
    }
}

/// Time until `estimate <= allowed`: first while the previous window slides out of this one
/// (possible only if `curr` alone fits), else in the next window, where `curr` becomes the
/// previous count.
fn retry_us(allowed: f64, prev: u64, curr: u64, elapsed: u64, window: u64) -> u64 {
    let window_f = window as f64;
    if (curr as f64) <= allowed && prev > 0 {
        // prev * (window - t) / window + curr <= allowed  ⇔  t >= window - (allowed - curr) * window / prev
        let t = window_f - (allowed - curr as f64) * window_f / prev as f64;
        return ceil_us(t - elapsed as f64);
    }
    // In the next window: curr * (window - t) / window <= allowed.
    let t = if curr > 0 { window_f - allowed * window_f / curr as f64 } else { 0.0 };
    ceil_us((window - elapsed) as f64 + t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, DelayPolicy, Rate};

    const SEC: u64 = 1_000_000;
    const T0: u64 = 1_700_000_020 * SEC; // 40 s into an epoch-aligned minute

    fn limit(rate: &str) -> LimitReq {
        LimitReq {
            algorithm: Algorithm::SlidingWindow,
            rate: Rate::parse(rate).unwrap(),
            burst: 0,
            delay: DelayPolicy::NoDelay,
        }
    }

    fn sliding(out: &Evaluation<SlidingState>) -> Option<SlidingState> {
        Some(out.next)
    }

    #[test]
    fn weights_the_previous_window_by_its_overlap() {
        let l = limit("10r/m");
        let mut state = None;
        for _ in 0..10 {
            let out = evaluate(&l, state, T0, 1);
            assert!(out.admitted);
            state = sliding(&out);
        }
        assert!(!evaluate(&l, state, T0, 1).admitted);
        // 5 s into the next minute the previous 10 still weigh 10 * 55/60 = 9.17: no room for 1.
        let next_minute = T0 + 25 * SEC;
        assert!(!evaluate(&l, state, next_minute, 1).admitted);
        // At 30 s they weigh 5: five more pass.
        let half = T0 + 50 * SEC;
        let mut s = state;
        for i in 0..5 {
            let out = evaluate(&l, s, half, 1);
            assert!(out.admitted, "request {i}");
            s = sliding(&out);
        }
        assert!(!evaluate(&l, s, half, 1).admitted);
    }

    #[test]
    fn retry_time_reaches_a_passing_estimate() {
        let l = limit("10r/m");
        let mut state = None;
        for _ in 0..10 {
            state = sliding(&evaluate(&l, state, T0, 1));
        }
        let out = evaluate(&l, state, T0 + SEC, 1);
        let retry = out.retry_after_us.unwrap();
        assert!(!evaluate(&l, state, T0 + SEC + retry - 1, 1).admitted);
        assert!(evaluate(&l, state, T0 + SEC + retry, 1).admitted);
        assert_eq!(evaluate(&l, None, T0, 11).retry_after_us, None);
    }
}
