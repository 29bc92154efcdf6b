//! The worst case of a leased zone, as a formula Weir prints (`weir check`) and the tests measure
//! (docs/leases.md has the proof).
//!
//! Bucket family (leaky bucket with `nodelay`, token bucket), rate `r`, burst `b`, `N` instances,
//! leases of at most `T` tokens living `L`: over every interval of length τ, the fleet admits at
//! most `b + 1 + r·τ + min(N·T, r·L)`, the exact limiter's `b + 1 + r·τ` plus the overshoot.
//! Fixed windows, whose leases end with their window: at most the window's count per window, no
//! overshoot. Failure terms are stated apart (docs/leases.md): they depend on the store, not on
//! the leases.

use super::LeaseSpec;
use crate::limit::{Algorithm, LimitReq};

/// What a leased zone may admit, for a given number of instances.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    pub algorithm: Algorithm,
    /// What the exact limiter admits at once: `burst + 1` (buckets) or the window's count.
    pub capacity: u64,
    /// Tokens per second the exact limiter adds (buckets); windows: count per window.
    pub rate_per_sec: f64,
    pub instances: u64,
    pub spec: LeaseSpec,
}

impl Bound {
    pub fn new(limit: &LimitReq, spec: LeaseSpec, instances: u64) -> Bound {
        let rate_per_sec = limit.rate.count as f64 * 1e6 / limit.rate.period_us as f64;
        Bound { algorithm: limit.algorithm, capacity: limit.capacity(), rate_per_sec, instances, spec }
    }

    /// The overshoot over the exact limiter, in tokens: `min(N·T, r·L)` for buckets, 0 per window
    /// for fixed windows.
    pub fn overshoot(&self) -> f64 {
        if self.algorithm == Algorithm::FixedWindow {
            return 0.0;
        }
        let holders = (self.instances * self.spec.tokens) as f64;
        let lifetime = self.rate_per_sec * self.spec.lifetime_us as f64 / 1e6;
        holders.min(lifetime)
    }

    /// The most the fleet admits over any interval of `tau_us` (buckets), or per window (windows).
    pub fn admitted_at_most(&self, tau_us: u64) -> f64 {
        if self.algorithm == Algorithm::FixedWindow {
            return self.capacity as f64;
        }
        self.capacity as f64 + self.rate_per_sec * tau_us as f64 / 1e6 + self.overshoot()
    }

    /// One line for `weir check`.
    pub fn describe(&self) -> String {
        let (n, t, l) = (self.instances, self.spec.tokens, self.spec.lifetime_us as f64 / 1e6);
        if self.algorithm == Algorithm::FixedWindow {
            return format!(
                "at most {} per window with {n} instances (leases end with their window: no overshoot)",
                self.capacity
            );
        }
        format!(
            "at most {} + {}/s·τ + min({n}·{t}, {}/s·{l}s) = {} + {}/s·τ + {} in any interval τ with {n} instances",
            self.capacity,
            trim(self.rate_per_sec),
            trim(self.rate_per_sec),
            self.capacity,
            trim(self.rate_per_sec),
            trim(self.overshoot()),
        )
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{DelayPolicy, Rate};

    #[test]
    fn the_overshoot_is_the_smaller_of_the_held_tokens_and_a_lifetime_of_rate() {
        let limit = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("10r/s").unwrap(),
            burst: 20,
            delay: DelayPolicy::NoDelay,
        };
        let spec = LeaseSpec { tokens: 100, lifetime_us: 1_000_000 };
        let b = Bound::new(&limit, spec, 4);
        assert_eq!(b.overshoot(), 10.0);
        assert_eq!(b.admitted_at_most(2_000_000), 21.0 + 20.0 + 10.0);
        assert_eq!(
            b.describe(),
            "at most 21 + 10/s·τ + min(4·100, 10/s·1s) = 21 + 10/s·τ + 10 in any interval τ with 4 instances"
        );
        let small = Bound::new(&limit, LeaseSpec { tokens: 2, lifetime_us: 1_000_000 }, 3);
        assert_eq!(small.overshoot(), 6.0);
    }
}
