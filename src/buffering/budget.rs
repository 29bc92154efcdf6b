//! One process-wide budget of bytes (the memory of every response buffer, or the disk of every
//! temp file), shared by all client connections. A connection takes what it buffers and gives it
//! back when the bytes leave; when the budget is spent a connection buffers nothing more and
//! streams as it would without buffering (back-pressure), so a crowd of slow readers can cost at
//! most the budget, never more.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::IntGauge;

#[derive(Debug)]
pub struct Budget {
    limit: AtomicU64,
    used: AtomicU64,
    /// Follows `used` by the same deltas (so concurrent changes never leave it stale).
    gauge: Option<IntGauge>,
}

impl Budget {
    pub fn new(limit: u64) -> Self {
        Self { limit: AtomicU64::new(limit), used: AtomicU64::new(0), gauge: None }
    }

    /// A budget whose bytes held `gauge` shows.
    pub fn metered(limit: u64, gauge: IntGauge) -> Self {
        Self { gauge: Some(gauge), ..Self::new(limit) }
    }

    fn moved(&self, delta: i64) {
        if let Some(gauge) = &self.gauge {
            gauge.add(delta);
        }
    }

    /// A reload changes the limit for what is taken next; what is held stays held.
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Takes `n` bytes if they fit in what is left, all or nothing.
    pub fn try_take(&self, n: u64) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&after| after <= limit)
            })
            .is_ok();
        if taken {
            self.moved(i64::try_from(n).unwrap_or(i64::MAX));
        }
        taken
    }

    /// Takes as much of `want` as is left (possibly 0) and says how much.
    pub fn take_up_to(&self, want: u64) -> u64 {
        let limit = self.limit.load(Ordering::Relaxed);
        let mut got = 0;
        let _ = self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            got = want.min(limit.saturating_sub(used));
            (got > 0).then_some(used + got)
        });
        self.moved(i64::try_from(got).unwrap_or(i64::MAX));
        got
    }

    pub fn give_back(&self, n: u64) {
        // Never below zero, even if a caller's arithmetic were wrong: the budget would only grow.
        let before = self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| Some(used.saturating_sub(n)));
        let returned = before.map_or(0, |used| used.min(n));
        self.moved(-i64::try_from(returned).unwrap_or(i64::MAX));
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metered_budget_shows_what_it_holds() {
        let gauge = IntGauge::new("held", "held").expect("gauge");
        let b = Budget::metered(100, gauge.clone());
        assert!(b.try_take(60));
        assert!(!b.try_take(41));
        assert_eq!(b.take_up_to(70), 40);
        assert_eq!(gauge.get(), 100);
        b.give_back(30);
        b.give_back(500);
        assert_eq!((b.used(), gauge.get()), (0, 0), "a give-back past what is held returns only what was");
    }

    #[test]
    fn takes_all_or_nothing_and_gives_back() {
        let b = Budget::new(100);
        assert!(b.try_take(60));
        assert!(!b.try_take(41), "60 + 41 is past the limit");
        assert!(b.try_take(40));
        assert_eq!(b.used(), 100);
        b.give_back(60);
        assert!(b.try_take(10));
        assert_eq!(b.used(), 50);
    }

    #[test]
    fn take_up_to_takes_what_is_left() {
        let b = Budget::new(100);
        assert_eq!(b.take_up_to(70), 70);
        assert_eq!(b.take_up_to(70), 30);
        assert_eq!(b.take_up_to(1), 0);
        b.give_back(100);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn a_lower_limit_stops_new_takes_but_keeps_what_is_held() {
        let b = Budget::new(100);
        assert!(b.try_take(80));
        b.set_limit(50);
        assert!(!b.try_take(1));
        assert_eq!(b.used(), 80);
        b.give_back(80);
        assert!(b.try_take(50));
    }
}
