//! Sliding log: at most `count` admissions (in cost units) in any window of `period` that ends now.
//! Exact, at the price of one entry per admitted unit (a Redis sorted set): memory grows with the
//! limit, so keep it for small limits.
//!
//! ```text
//! live   = entries with time > now - window
//! reject   if len(live) + cost > limit                      # nothing recorded
//! retry  = the (len + cost - limit)-th oldest entry + window - now
//! ```

use super::evaluation::Evaluation;
use super::{stored, LimitReq};

/// One entry as `lua/limit_req/sliding_log.lua` stores it: a member of the key's sorted set whose
/// score is the entry's time in µs (the member's name is the script's business). `None`: not a
/// time.
pub fn entry_from_stored(score: &str) -> Option<u64> {
    stored::integer(score)
}

pub fn evaluate(limit: &LimitReq, entries: &[u64], now_us: u64, cost: u64) -> Evaluation<Vec<u64>> {
    let window = limit.rate.period_us;
    // Entries are sorted; a late clock stamps new entries at the newest time, keeping them sorted.
    let anchor_us = entries.last().map_or(now_us, |&newest| newest.max(now_us));
    let live: Vec<u64> = entries.iter().copied().filter(|&t| t + window > now_us).collect();
    let limit_count = limit.rate.count;
    let used = live.len() as u64;
    if used + cost > limit_count {
        let retry_after_us = (cost <= limit_count).then(|| {
            // Making room for `cost` needs the `used + cost - limit` oldest entries to expire.
            let k = (used + cost - limit_count) as usize;
            (live[k - 1] + window).saturating_sub(now_us)
        });
        let expires_us = live.last().map_or(now_us, |&t| t + window);
        return Evaluation {
            admitted: false,
            excess: (used + cost - limit_count) as f64,
            delay_us: 0,
            retry_after_us,
            remaining: 0,
            reset_us: expires_us.saturating_sub(now_us),
            expires_us,
            next: live,
        };
    }
    let mut next = live;
    next.extend(std::iter::repeat_n(anchor_us, cost as usize));
    let expires_us = anchor_us + window;
    Evaluation {
        admitted: true,
        excess: 0.0,
        delay_us: 0,
        retry_after_us: None,
        remaining: limit_count - used - cost,
        reset_us: expires_us - now_us,
        expires_us,
        next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, DelayPolicy, Rate};

    const SEC: u64 = 1_000_000;
    const T0: u64 = 1_700_000_000 * SEC;

    fn limit(rate: &str) -> LimitReq {
        LimitReq {
            algorithm: Algorithm::SlidingLog,
            rate: Rate::parse(rate).unwrap(),
            burst: 0,
            delay: DelayPolicy::NoDelay,
        }
    }

    fn log(out: &Evaluation<Vec<u64>>) -> Vec<u64> {
        out.next.clone()
    }

    #[test]
    fn exact_window_with_no_boundary_burst() {
        let l = limit("3r/m");
        let mut entries = vec![];
        for t in [0, 10, 20] {
            let out = evaluate(&l, &entries, T0 + t * SEC, 1);
            assert!(out.admitted);
            entries = log(&out);
        }
        let out = evaluate(&l, &entries, T0 + 59 * SEC, 1);
        assert!(!out.admitted);
        assert_eq!(out.retry_after_us, Some(SEC), "the first entry leaves the window at T0+60s");
        assert!(!evaluate(&l, &entries, T0 + 60 * SEC - 1, 1).admitted);
        let out = evaluate(&l, &entries, T0 + 60 * SEC, 1);
        assert!(out.admitted);
        assert_eq!(log(&out), vec![T0 + 10 * SEC, T0 + 20 * SEC, T0 + 60 * SEC]);
    }

    #[test]
    fn equal_timestamps_are_all_kept_and_cost_adds_entries() {
        let l = limit("5r/s");
        let out = evaluate(&l, &[], T0, 2);
        let out = evaluate(&l, &log(&out), T0, 3);
        assert!(out.admitted);
        assert_eq!(log(&out), vec![T0; 5]);
        let out = evaluate(&l, &log(&out), T0, 1);
        assert!(!out.admitted);
        assert_eq!(out.retry_after_us, Some(SEC));
        assert_eq!(evaluate(&l, &[], T0, 6).retry_after_us, None);
    }
}
