//! Adaptive concurrency (issue #37): a per-upstream limit on requests in flight that Weir learns
//! from the latency it observes, with priority shedding when the limit is reached.
//!
//! - `controller`: the learning rule, pure, on a caller-given clock (docs/adaptive.md).
//! - `admission`: who may take a place (priorities), pure.
//! - `limiter`: one upstream's places, queue and permits (the proxy's side).
//! - `registry`: limits by upstream name, kept across reloads.

mod admission;
mod controller;
mod limiter;
mod registry;
#[cfg(test)]
mod sim;

pub use admission::{Occupancy, Priority, ShedReason};
pub use controller::{Controller, Settings, Verdict};
pub use limiter::{AdaptiveLimit, AdaptiveSpec, Permit, QueueSettings};
pub use registry::{all, attach};
