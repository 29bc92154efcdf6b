//! Adaptive concurrency (issue #37): a per-upstream limit on requests in flight that Weir learns
//! from the latency it observes, with priority shedding when the limit is reached.
//!
//! - `controller`: the learning rule, pure, on a caller-given clock (docs/adaptive.md).
//! - `admission`: who may take a place (priorities), pure.
//! - `limiter`: one upstream's places, queue and permits (the proxy's side).
//! - `priority_from`: a request's priority from a header or a verified claim, pure.
//! - `sim` (tests): a simulated upstream and clients on a simulated clock; `attacks` (tests): the
//!   controller under issue 46's hostile schedules there.
//!
//! Each upstream's limit is kept across reloads with its pool (`upstream::Registry`).

mod admission;
#[cfg(test)]
mod attacks;
mod controller;
mod limiter;
mod priority_from;
#[cfg(test)]
mod sim;

pub use admission::{Occupancy, Priority, ShedReason};
pub use controller::{Controller, Settings, Verdict};
pub use limiter::{AdaptiveLimit, AdaptiveSpec, Permit, QueueSettings};
pub use priority_from::{PriorityFrom, Source as PrioritySource};
