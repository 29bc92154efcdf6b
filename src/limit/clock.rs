//! Time as the limit model sees it: microseconds since the Unix epoch, injected by the caller.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of "now" in microseconds since the Unix epoch.
///
/// Wall-clock time (not `Instant`) because Redis keeps state in absolute time shared by the fleet.
pub trait Clock: Send + Sync {
    fn now_us(&self) -> u64;
}

/// The machine's clock as the process sees it: the wall time at the first reading, advanced by
/// the monotonic clock. A wall clock stepped back (NTP, an operator) would refill no bucket until
/// it caught up, and one stepped forward would refill them all; like nginx, Weir measures elapsed
/// time monotonically. Readings are also strictly increasing across the process, so two
/// decisions on one key (taken under its lock) never share a time and replay in their order.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
        static LAST_US: AtomicU64 = AtomicU64::new(0);
        let (start, start_us) = *ANCHOR.get_or_init(|| (Instant::now(), wall_us()));
        let now = start_us.saturating_add(start.elapsed().as_micros() as u64);
        // One atomic's modification order is total: a later reading sees every earlier one.
        let previous = LAST_US.fetch_max(now, Ordering::Relaxed);
        if now > previous {
            now
        } else {
            // Taken in the same microsecond as an earlier reading (or a later one raced ahead):
            // one past the latest.
            LAST_US.fetch_add(1, Ordering::Relaxed) + 1
        }
    }
}

fn wall_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_readings_are_unique_and_in_order_across_threads() {
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..20_000).map(|_| SystemClock.now_us()).collect::<Vec<u64>>()))
            .collect();
        let mut all = Vec::new();
        for t in threads {
            let readings = t.join().expect("reader thread");
            assert!(readings.windows(2).all(|w| w[0] < w[1]), "one thread's readings strictly increase");
            all.extend(readings);
        }
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "no two readings share a microsecond");
    }

    #[test]
    fn system_clock_is_wall_time() {
        let (before, reading, after) = (wall_us(), SystemClock.now_us(), wall_us());
        // Generous: the anchor may have been taken by another test a while ago; what matters is
        // that readings are epoch microseconds, not a count from the process start.
        assert!(reading + 60_000_000 > before && reading < after + 60_000_000, "{before} {reading} {after}");
    }
}
