//! Time as the limit model sees it: microseconds since the Unix epoch, injected by the caller.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of "now" in microseconds since the Unix epoch.
///
/// Wall-clock time (not `Instant`) because Redis keeps state in absolute time shared by the fleet.
pub trait Clock: Send + Sync {
    fn now_us(&self) -> u64;
}

/// The machine's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
    }
}

/// A clock that only moves when told to: the simulated clock of unit and differential tests.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(start_us: u64) -> Self {
        Self(AtomicU64::new(start_us))
    }
    pub fn set_us(&self, now_us: u64) {
        self.0.store(now_us, Ordering::SeqCst);
    }
    pub fn advance_us(&self, by_us: u64) {
        self.0.fetch_add(by_us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
