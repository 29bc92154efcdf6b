//! Envoy's rate limit quota service (RLQS, `envoy.service.rate_limit_quota.v3`) on the `[rls]`
//! listeners: each Envoy enforces its own token bucket per quota bucket and reports its usage over
//! one stream; Weir divides each zone's rate and burst among the Envoys that report into it,
//! fleet-wide through the store, so together they admit what one limiter would (the bound:
//! docs/rlqs.md).
//!
//! - `buckets`: bucket id → `[[rls.domain.bucket]]` rule and zone key (pure);
//! - `assign`: the budget in Envoy's token-bucket units, the division by demand (shared with the
//!   leased budgets: `limit::lease::division`), hysteresis, times to live (pure);
//! - `stream`: one stream's buckets, bounds and timers (pure);
//! - `ledger`: every holder's demand and live grant, atomically (`lua/rlqs_demand.lua` on Redis,
//!   its in-process twin on the memory store);
//! - `live`: each key's holders and shares, for the admin's `GET /rlqs`;
//! - `service`: the gRPC glue (and one trace span per report).

pub mod assign;
pub mod buckets;
pub mod ledger;
pub mod live;
pub mod service;
#[cfg(test)]
mod sim;
pub mod stream;

pub use ledger::{Ledger, MemoryLedger};
pub use live::Live;
pub use service::QuotaService;
