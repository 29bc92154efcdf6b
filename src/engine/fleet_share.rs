//! The `local` failure policy's limits: when the shared store cannot be reached, each instance
//! decides alone with its share of each fleet-wide limit (1/fleet_size of it).

use crate::limit::{DelayPolicy, LimitReq, Rate};
use crate::store::{KeyedConn, KeyedZone};

/// A zone of one request whose limit can be divided over the fleet (`KeyedZone`, `KeyedConn`).
pub trait FleetShare: Sized {
    /// The same zone with this instance's share of its fleet-wide limit.
    fn fleet_share(&self, fleet_size: u64) -> Self;
}

impl FleetShare for KeyedZone<'_> {
    /// A bucket's rate divided exactly (the period stretched N times), a window's count divided
    /// (rounded down, at least 1) over the same window, burst and delay divided and rounded down.
    /// Approximate by nature: traffic is rarely spread evenly over the fleet.
    fn fleet_share(&self, fleet_size: u64) -> Self {
        let n = fleet_size.max(1);
        let limit = &self.limit;
        let rate = if limit.algorithm.is_window() {
            // A block (count 0) stays a block on every instance.
            Rate { count: (limit.rate.count / n).max(limit.rate.count.min(1)), period_us: limit.rate.period_us }
        } else {
            Rate { count: limit.rate.count, period_us: limit.rate.period_us * n }
        };
        let delay = match limit.delay {
            DelayPolicy::NoDelay => DelayPolicy::NoDelay,
            DelayPolicy::After(d) => DelayPolicy::After(d / n),
        };
        let limit = LimitReq { algorithm: limit.algorithm, rate, burst: limit.burst / n, delay };
        KeyedZone { limit, ..self.clone() }
    }
}

impl FleetShare for KeyedConn<'_> {
    /// Each cap divided, at least one request.
    fn fleet_share(&self, fleet_size: u64) -> Self {
        KeyedConn { max: (u64::from(self.max) / fleet_size.max(1)).max(1) as u32, ..self.clone() }
    }
}

/// This instance's share of each zone of a group whose store failed (the `local` policy). Clones
/// the keys: the failure path only.
pub fn fleet_shares<T: FleetShare>(group: &[T], fleet_size: u64) -> Vec<T> {
    group.iter().map(|z| z.fleet_share(fleet_size)).collect()
}
