//! A circuit breaker for the shared store: after `threshold` consecutive failures it opens, and
//! while open every decision is answered at once by the failure policy instead of waiting on a dead
//! Redis. A background probe closes it when the store answers again. Pure state machine: the
//! caller supplies time and reports outcomes.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

pub struct Breaker {
    threshold: u32,
    consecutive_failures: AtomicU32,
    open: AtomicBool,
}

/// What a failure did to the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    None,
    /// This failure opened the circuit: start probing.
    Opened,
}

impl Breaker {
    pub fn new(threshold: u32) -> Self {
        Self { threshold: threshold.max(1), consecutive_failures: AtomicU32::new(0), open: AtomicBool::new(false) }
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    pub fn record_success(&self) {
        self.consecutive_failures.store(0, Ordering::Release);
    }

    pub fn record_failure(&self) -> Transition {
        let failures = self.consecutive_failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures >= self.threshold && !self.open.swap(true, Ordering::AcqRel) {
            Transition::Opened
        } else {
            Transition::None
        }
    }

    /// The probe saw the store answer: decisions go to it again.
    pub fn close(&self) {
        self.consecutive_failures.store(0, Ordering::Release);
        self.open.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_only() {
        let b = Breaker::new(3);
        assert_eq!(b.record_failure(), Transition::None);
        assert_eq!(b.record_failure(), Transition::None);
        b.record_success();
        assert_eq!(b.record_failure(), Transition::None);
        assert_eq!(b.record_failure(), Transition::None);
        assert!(!b.is_open());
        assert_eq!(b.record_failure(), Transition::Opened);
        assert!(b.is_open());
        // Further failures while open do not "re-open" (one probe at a time).
        assert_eq!(b.record_failure(), Transition::None);
        b.close();
        assert!(!b.is_open());
        assert_eq!(b.record_failure(), Transition::None);
    }
}
