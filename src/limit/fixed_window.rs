//! Fixed window: at most `count` (in cost units) per window of `period`, windows aligned to the
//! Unix epoch so every instance agrees where they start. Known weakness: up to twice the limit can
//! pass around a boundary (the end of one window and the start of the next).
//!
//! ```text
//! start  = now - now % window
//! used   = state.start == start ? state.count : 0
//! reject   if used + cost > limit                           # rejected requests are free
//! ```
//!
//! A limit of 0 blocks every key (envoyproxy/ratelimit's `requests_per_unit: 0`); its rejections
//! carry the time to the window's end as their retry, as the peer's `duration_until_reset` does.

use super::evaluation::Evaluation;
use super::{stored, LimitReq};

/// Admissions (in cost units) in the window starting at `start_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowState {
    pub start_us: u64,
    pub count: u64,
}

impl WindowState {
    /// The state as `lua/limit_req/fixed_window.lua` stores it, split on ' ': "f <start_us>
    /// <count>". `None`: not this algorithm's text.
    pub fn from_stored(words: &[&str]) -> Option<Self> {
        match words {
            ["f", start_us, count] => {
                Some(Self { start_us: stored::integer(start_us)?, count: stored::integer(count)? })
            }
            _ => None,
        }
    }
}

pub fn evaluate(limit: &LimitReq, state: Option<WindowState>, now_us: u64, cost: u64) -> Evaluation<WindowState> {
    let window = limit.rate.period_us;
    let aligned = now_us - now_us % window;
    let (start_us, used) = match state {
        Some(WindowState { start_us: start, count }) if start == aligned => (start, count),
        // A late clock never moves a key back to an earlier window.
        Some(WindowState { start_us: start, count }) if start > aligned => (start, count),
        _ => (aligned, 0),
    };
    let end_us = start_us + window;
    let reset_us = end_us.saturating_sub(now_us);
    let limit_count = limit.rate.count;
    if used + cost > limit_count {
        return Evaluation {
            admitted: false,
            excess: (used + cost - limit_count) as f64,
            delay_us: 0,
            // A cost over a nonzero limit never passes: no retry. A block (limit 0) names the window's end.
            retry_after_us: (cost <= limit_count || limit_count == 0).then_some(reset_us),
            remaining: 0,
            reset_us,
            expires_us: end_us,
            next: WindowState { start_us, count: used },
        };
    }
    let count = used + cost;
    Evaluation {
        admitted: true,
        excess: 0.0,
        delay_us: 0,
        retry_after_us: None,
        remaining: limit_count - count,
        reset_us,
        expires_us: end_us,
        next: WindowState { start_us, count },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, DelayPolicy, Rate};

    const SEC: u64 = 1_000_000;
    const T0: u64 = 1_700_000_020 * SEC; // 40 s into an epoch-aligned minute

    fn limit(rate: &str) -> LimitReq {
        LimitReq {
            algorithm: Algorithm::FixedWindow,
            rate: Rate::parse(rate).unwrap(),
            burst: 0,
            delay: DelayPolicy::NoDelay,
        }
    }

    fn window(out: &Evaluation<WindowState>) -> Option<WindowState> {
        Some(out.next)
    }

    #[test]
    fn counts_per_aligned_window_and_allows_the_boundary_double_burst() {
        let l = limit("3r/m");
        let mut state = None;
        for _ in 0..3 {
            let out = evaluate(&l, state, T0, 1);
            assert!(out.admitted);
            state = window(&out);
        }
        let out = evaluate(&l, state, T0 + SEC, 1);
        assert!(!out.admitted);
        assert_eq!(out.retry_after_us, Some(19 * SEC), "the minute ends 20 s after T0");
        // At the boundary a whole new window opens: 3 more right away (the known weakness).
        let out = evaluate(&l, state, T0 + 20 * SEC, 1);
        assert!(out.admitted);
        assert_eq!(out.remaining, 2);
        assert_eq!(window(&out), Some(WindowState { start_us: T0 + 20 * SEC, count: 1 }));
    }

    #[test]
    fn a_limit_of_zero_blocks_until_the_window_ends() {
        let block = LimitReq { rate: Rate { count: 0, period_us: 60 * SEC }, ..limit("3r/m") };
        let out = evaluate(&block, None, T0, 1);
        assert!(!out.admitted);
        assert_eq!(out.retry_after_us, Some(20 * SEC), "the minute ends 20 s after T0");
        assert_eq!(out.next, WindowState { start_us: T0 - 40 * SEC, count: 0 }, "nothing is counted");
        // A week-long window is aligned to the epoch like the peer's `now / 604800`.
        let week = LimitReq { rate: Rate { count: 0, period_us: 7 * 86_400 * SEC }, ..limit("3r/m") };
        let out = evaluate(&week, None, T0, 1);
        assert_eq!(out.retry_after_us, Some(7 * 86_400 * SEC - (T0 / SEC % (7 * 86_400)) * SEC));
    }

    #[test]
    fn cost_over_the_limit_never_passes() {
        let out = evaluate(&limit("3r/m"), None, T0, 4);
        assert!(!out.admitted);
        assert_eq!(out.retry_after_us, None);
    }
}
