//! The limit model: pure decision functions over a caller-supplied clock.
//!
//! Nothing here does I/O or reads the system time. The same functions drive the embedded
//! `memory` store and the local fallback, and they are the reference that the Lua scripts in
//! `lua/` are tested against (see `tests/lua_differential.rs`).

mod clock;
mod leaky_bucket;
mod rate;
mod verdict;

pub use clock::{Clock, ManualClock, SystemClock};
pub use leaky_bucket::{evaluate, BucketState, DelayPolicy, LimitReq, ZoneOutcome};
pub use rate::{Rate, RateError};
pub use verdict::{decide_all, Verdict, ZoneInput};
