//! Who gets what share of a divided zone, and when an Envoy's assignment changes: pure code on
//! caller-given numbers and times (the ledger's view in, an assignment out).
//!
//! A zone's budget is counted in whole tokens per *fill interval* `F` (a whole number of seconds:
//! Envoy's filter reads only the seconds of `fill_interval`, and compares only its nanoseconds to
//! tell two assignments apart, so Weir keeps `F` fixed per zone and varies `tokens_per_fill`):
//! `rate_tokens = ⌊rate·F⌋` tokens every `F` seconds, and `max_tokens = burst + 1`. Each holder
//! (one Envoy's bucket) gets `tokens_per_fill` and `max_tokens`; the ledger grants them only while
//! the live grants of all holders sum to at most the budget's (`ledger.rs`), so the Envoys' fill
//! rates never sum past the zone's rate nor their bucket sizes past its burst + 1.
//!
//! The share is [`division::divide`] of the budget by the holders' demand (requests per second
//! over their last report, denied ones included) with a floor of a tenth of an even split, made
//! whole with [`division::divide_whole`], in the holders' id order so that every Weir instance
//! reading the same view computes the same division.

use std::time::Duration;

use crate::limit::lease::division;
use crate::limit::Rate;

/// Each holder gets at least this fraction of an even split of the budget.
const FLOOR_OF_EVEN_SPLIT: f64 = 0.1;
/// A new share within this fraction of the current one keeps the current one (Envoy keeps its
/// token bucket only while the assignment is unchanged).
const HYSTERESIS: f64 = 0.1;
/// `F` is the smallest whole number of seconds that holds this many tokens of the rate...
const TOKENS_PER_FILL_RESOLUTION: f64 = 100.0;
/// ...but no longer than a minute (or the rate's own period, for `r/h` rates).
const MAX_FILL_INTERVAL_S: u64 = 60;

/// A divided zone's budget, in the units of Envoy's token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// `F`, whole seconds.
    pub fill_interval_s: u64,
    /// Tokens the zone's rate makes every `F`: what the holders' `tokens_per_fill` sum to at most.
    pub rate_tokens: u64,
    /// What the holders' `max_tokens` sum to at most: the zone's burst + 1.
    pub max_tokens: u64,
}

impl Budget {
    /// The budget of a zone of `rate` and `capacity` (burst + 1).
    pub fn of(rate: Rate, capacity: u64) -> Budget {
        let per_second = rate.count as f64 * 1e6 / rate.period_us as f64;
        let longest = MAX_FILL_INTERVAL_S.max(rate.period_secs());
        let fill_interval_s = ((TOKENS_PER_FILL_RESOLUTION / per_second).ceil() as u64).clamp(1, longest);
        // Exact integer arithmetic: count·F·1e6 / period_us, rounded down.
        let rate_tokens = (rate.count as u128 * fill_interval_s as u128 * 1_000_000 / rate.period_us as u128) as u64;
        Budget { fill_interval_s, rate_tokens: rate_tokens.max(1), max_tokens: capacity.max(1) }
    }

    /// The rate `tokens_per_fill` stands for, in requests per second.
    pub fn per_second(&self, tokens_per_fill: u64) -> f64 {
        tokens_per_fill as f64 / self.fill_interval_s as f64
    }
}

/// One holder as the ledger shows it: its last demand and its live grant.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    pub id: String,
    /// Requests per second over its last report.
    pub demand: f64,
    pub grant: Grant,
}

/// A holder's share: `tokens_per_fill` every `F`, at most `max_tokens` at once. Zero in either
/// means no token bucket can be given (DENY_ALL until there is room).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Grant {
    pub tokens_per_fill: u64,
    pub max_tokens: u64,
}

impl Grant {
    pub fn is_empty(&self) -> bool {
        self.tokens_per_fill == 0 || self.max_tokens == 0
    }
}

/// The share `me` should have under `holders` (which include `me`): the division of the budget by
/// demand, made whole.
pub fn fair_share(budget: &Budget, holders: &[Holder], me: &str) -> Grant {
    let mut order: Vec<&Holder> = holders.iter().collect();
    order.sort_by(|a, b| a.id.cmp(&b.id));
    let Some(mine) = order.iter().position(|h| h.id == me) else { return Grant::default() };
    let n = order.len() as f64;
    // Demand in tokens per F, like the budget.
    let demand: Vec<f64> = order.iter().map(|h| h.demand.max(0.0) * budget.fill_interval_s as f64).collect();
    let rate = budget.rate_tokens as f64;
    let shares = division::divide(rate, &demand, FLOOR_OF_EVEN_SPLIT * rate / n);
    let tokens_per_fill = division::divide_whole(budget.rate_tokens, &shares)[mine];
    let max_tokens = division::divide_whole(budget.max_tokens, &shares)[mine];
    Grant { tokens_per_fill, max_tokens }
}

/// What to ask the ledger for: the fair share, unless the current grant is within the hysteresis
/// of it (then the same assignment again, which Envoy extends without touching its bucket).
pub fn wanted(current: Option<Grant>, fair: Grant) -> Grant {
    let close = |now: u64, new: u64| (now as f64 - new as f64).abs() <= (HYSTERESIS * now as f64).max(1.0);
    match current {
        Some(c)
            if !c.is_empty()
                && close(c.tokens_per_fill, fair.tokens_per_fill)
                && close(c.max_tokens, fair.max_tokens) =>
        {
            c
        }
        _ => fair,
    }
}

/// Whether the ledger gave less than was asked (another holder's grant still holds the room): the
/// stream asks again soon instead of waiting for the next report.
pub fn clamped(asked: Grant, granted: Grant) -> bool {
    granted.tokens_per_fill < asked.tokens_per_fill || granted.max_tokens < asked.max_tokens
}

/// Requests per second a report stands for: allowed + denied over the time since the bucket's
/// previous report. Weir's own measure of that time wins over the report's (Envoy sends whole
/// seconds only, so 4.9 s reads 4); the report's stands in on a stream's first report, and the
/// report interval when neither is known (a first report says 0). Never less than half an
/// interval, so a report right after another cannot pretend to a burst of demand.
pub fn demand(allowed: u64, denied: u64, measured: Option<Duration>, reported: Duration, interval: Duration) -> f64 {
    let elapsed = measured.filter(|m| !m.is_zero()).or(Some(reported).filter(|r| !r.is_zero())).unwrap_or(interval);
    let elapsed = elapsed.max(interval / 2).as_secs_f64();
    allowed.saturating_add(denied) as f64 / elapsed
}

/// An assignment's time to live: a little over the report interval, in whole seconds (Envoy reads
/// only the seconds), so an Envoy that reports on time is never without one.
pub fn time_to_live(interval: Duration) -> Duration {
    let slack = (interval / 5).max(Duration::from_secs(1));
    Duration::from_secs((interval + slack).as_secs_f64().ceil() as u64)
}

/// How long the ledger counts a grant: its time to live plus a second for the answer to reach
/// Envoy (Envoy counts the time to live from when it reads the answer).
pub fn ledger_life(interval: Duration) -> Duration {
    time_to_live(interval) + Duration::from_secs(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(id: &str, demand: f64) -> Holder {
        Holder { id: id.into(), demand, grant: Grant::default() }
    }

    fn rate(text: &str) -> Rate {
        Rate::parse(text).unwrap()
    }

    #[test]
    fn budgets_count_whole_tokens_per_whole_second_intervals() {
        assert_eq!(Budget::of(rate("1000r/s"), 51), Budget { fill_interval_s: 1, rate_tokens: 1000, max_tokens: 51 });
        assert_eq!(Budget::of(rate("10r/s"), 1), Budget { fill_interval_s: 10, rate_tokens: 100, max_tokens: 1 });
        assert_eq!(Budget::of(rate("1r/m"), 1), Budget { fill_interval_s: 60, rate_tokens: 1, max_tokens: 1 });
        assert_eq!(Budget::of(rate("5r/h"), 1), Budget { fill_interval_s: 3600, rate_tokens: 5, max_tokens: 1 });
        assert_eq!(Budget::of(rate("7r/m"), 3), Budget { fill_interval_s: 60, rate_tokens: 7, max_tokens: 3 });
        let b = Budget::of(rate("30r/s"), 10);
        assert_eq!((b.fill_interval_s, b.rate_tokens), (4, 120));
        assert!((b.per_second(120) - 30.0).abs() < 1e-9);
    }

    #[test]
    fn shares_follow_demand_with_a_floor_and_sum_to_the_budget() {
        let b = Budget::of(rate("100r/s"), 30);
        let holders = vec![holder("a", 10.0), holder("b", 30.0), holder("c", 200.0)];
        let shares: Vec<Grant> = ["a", "b", "c"].iter().map(|me| fair_share(&b, &holders, me)).collect();
        assert_eq!(shares.iter().map(|g| g.tokens_per_fill).sum::<u64>(), b.rate_tokens);
        assert_eq!(shares.iter().map(|g| g.max_tokens).sum::<u64>(), b.max_tokens);
        // a and b get what they ask (10 and 30 r/s), c the rest, within a token of rounding
        // (divide_whole gives each one token before the proportional rest).
        let near = |g: Grant, want: u64| g.tokens_per_fill.abs_diff(want) <= 1;
        assert!(near(shares[0], 10) && near(shares[1], 30) && near(shares[2], 60), "{shares:?}");
        let idle = vec![holder("a", 0.0), holder("b", 500.0)];
        let a = fair_share(&b, &idle, "a");
        assert!(a.tokens_per_fill >= 5 && a.tokens_per_fill <= 6, "the floor: a tenth of an even split, {a:?}");
        assert_eq!(fair_share(&b, &idle, "nobody"), Grant::default());
    }

    #[test]
    fn the_same_view_gives_the_same_division_in_any_order() {
        let b = Budget::of(rate("50r/s"), 7);
        let one = vec![holder("x", 3.0), holder("y", 3.0), holder("z", 3.0)];
        let mut other = one.clone();
        other.reverse();
        for me in ["x", "y", "z"] {
            assert_eq!(fair_share(&b, &one, me), fair_share(&b, &other, me));
        }
        let total: u64 = ["x", "y", "z"].iter().map(|me| fair_share(&b, &one, me).max_tokens).sum();
        assert_eq!(total, 7);
    }

    #[test]
    fn small_moves_keep_the_assignment_large_ones_change_it() {
        let now = Grant { tokens_per_fill: 100, max_tokens: 10 };
        assert_eq!(wanted(Some(now), Grant { tokens_per_fill: 95, max_tokens: 11 }), now);
        let far = Grant { tokens_per_fill: 80, max_tokens: 10 };
        assert_eq!(wanted(Some(now), far), far);
        assert_eq!(wanted(None, far), far);
        assert_eq!(wanted(Some(Grant::default()), far), far, "an empty grant is always replaced");
        assert!(clamped(far, Grant { tokens_per_fill: 79, max_tokens: 10 }));
        assert!(!clamped(far, far));
    }

    #[test]
    fn demand_uses_weirs_clock_and_bounds_short_reports() {
        let i = Duration::from_secs(5);
        let s = Duration::from_secs;
        assert!((demand(40, 10, Some(Duration::from_millis(4900)), s(4), i) - 50.0 / 4.9).abs() < 1e-9);
        assert!((demand(40, 10, None, s(5), i) - 10.0).abs() < 1e-9, "the report's time on a first report");
        assert!((demand(1, 0, None, s(0), i) - 0.2).abs() < 1e-9, "neither known: the interval");
        assert!(
            (demand(10, 0, Some(Duration::from_millis(10)), s(0), i) - 4.0).abs() < 1e-9,
            "at least half an interval"
        );
        assert_eq!(demand(u64::MAX, u64::MAX, None, s(5), i), u64::MAX as f64 / 5.0);
    }

    #[test]
    fn assignments_outlive_the_interval_in_whole_seconds() {
        let s = Duration::from_secs;
        assert_eq!(time_to_live(s(5)), s(6));
        assert_eq!(time_to_live(s(1)), s(2));
        assert_eq!(time_to_live(s(2)), s(3));
        assert_eq!(time_to_live(s(60)), s(72));
        assert_eq!(time_to_live(Duration::from_millis(1500)), s(3));
        assert_eq!(ledger_life(s(5)), s(7));
    }
}
