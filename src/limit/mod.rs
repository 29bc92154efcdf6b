//! The limit model: pure decision functions over a caller-supplied clock.
//!
//! Nothing here does I/O or reads the system time. The same functions drive the embedded
//! `memory` store and the local fallback, and they are the reference that the Lua scripts in
//! `lua/` are tested against (see `tests/lua_differential.rs`).

mod clock;
mod fixed_window;
mod leaky_bucket;
mod params;
mod rate;
mod sliding_log;
mod sliding_window;
mod state;
mod token_bucket;
mod verdict;

pub use clock::{Clock, ManualClock, SystemClock};
pub use leaky_bucket::BucketState;
pub use params::{Algorithm, DelayPolicy, LimitReq};
pub use rate::{Rate, RateError};
pub use state::{evaluate, State, ZoneOutcome};
pub use verdict::{decide_all, Verdict, ZoneInput};
