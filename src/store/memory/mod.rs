//! The embedded store: the limit model over in-process maps, one per zone, like nginx's
//! `limit_req_zone` shared memory. Exact for one instance while a zone has room. `limit_req.rs`
//! holds rate-limit state (`MemoryStore`), `limit_conn.rs` concurrency counts (`MemoryConnStore`),
//! `admin.rs` the operator's side of both (`MemoryAdmin`); this file is what they share: zone
//! capacities and metrics, and `decided_at_once` (a call's result at its first poll: they never
//! wait). Both bound each zone by its `max_keys`.

mod admin;
mod limit_conn;
mod limit_req;

pub use admin::MemoryAdmin;
pub use limit_conn::MemoryConnStore;
pub use limit_req::MemoryStore;

/// The result of a call to an in-process store, which never waits: ready at its first poll
/// (replay decides a whole log this way, on its simulated clock; so do the unit tests).
pub fn decided_at_once<F: std::future::Future>(decision: F) -> F::Output {
    ready_now(decision).expect("the memory store decides without waiting")
}

/// The result of `call` if it is ready at its first poll; `None` (and `call` dropped) if not.
pub fn ready_now<F: std::future::Future>(call: F) -> Option<F::Output> {
    match std::pin::pin!(call).poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(done) => Some(done),
        std::task::Poll::Pending => None,
    }
}
use std::sync::Arc;

use prometheus::{IntCounter, IntGauge};

use crate::metrics::METRICS;

/// Keys per zone when the config does not say (~150 MB for a full zone).
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The capacity of a zone, by name (the config's `max_keys`, read at every decision so that a
/// reload applies).
pub type ZoneLimits = Arc<dyn Fn(&str) -> usize + Send + Sync>;

/// A zone's metric handles, resolved once.
struct ZoneMetrics {
    pub keys: IntGauge,
    pub capacity: IntGauge,
    pub evicted: IntCounter,
    pub expired: IntCounter,
    pub full: IntCounter,
}

impl ZoneMetrics {
    /// Zone names are unique across limit_req and limit_conn zones.
    pub(super) fn new(zone: &str) -> Self {
        Self {
            keys: METRICS.memory_keys.with_label_values(&[zone]),
            capacity: METRICS.memory_max_keys.with_label_values(&[zone]),
            evicted: METRICS.memory_evictions.with_label_values(&[zone, "live"]),
            expired: METRICS.memory_evictions.with_label_values(&[zone, "expired"]),
            full: METRICS.memory_zone_full.with_label_values(&[zone]),
        }
    }
}
