//! Bounded waiting: look again and again until something holds or a deadline passes, never
//! forever. The caller picks both the bound and how often to look.

use std::thread;
use std::time::{Duration, Instant};

/// Calls `probe` every `every` until `done` accepts what it returned or `timeout` has passed
/// since the first call: `Ok` with the accepted value, or `Err` with the last one (for the
/// failure message, or to go on with when "the last value either way" is what is wanted).
pub fn poll<T>(
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> Result<T, T> {
    let deadline = Instant::now() + timeout;
    loop {
        let value = probe();
        if done(&value) {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(value);
        }
        thread::sleep(every);
    }
}

/// Calls `cond` every `every` until it holds or `timeout` has passed: how long it took to hold,
/// or None.
pub fn wait_until(timeout: Duration, every: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    poll(timeout, every, &mut cond, |&held| held).ok().map(|_| t0.elapsed())
}

/// [`wait_until`] that must hold: how long it took, or a panic naming `what` (a wait that can
/// only time out into a failed test, never into an assertion quietly skipped).
pub fn must_hold_within(timeout: Duration, what: &str, cond: impl FnMut() -> bool) -> Duration {
    wait_until(timeout, Duration::from_millis(5), cond).unwrap_or_else(|| panic!("{what}: not within {timeout:?}"))
}
