//! The limit model: pure decision functions over a caller-supplied clock.
//!
//! Nothing here does I/O, and the decision functions never read the system time: they take `now`
//! from the caller, who reads a [`Clock`] (`SystemClock` in production, the one place in this
//! module that reads it; `ManualClock` in tests). The same functions drive the embedded
//! `memory` store and the local fallback, and they are the reference that the Lua scripts in
//! `lua/` are tested against (see `tests/lua_differential.rs`).

mod clock;
mod evaluation;
pub mod fields;
mod fixed_window;
mod leaky_bucket;
mod params;
mod rate;
mod sliding_log;
mod sliding_window;
mod state;
mod token_bucket;
mod verdict;

#[cfg(test)]
mod tables;

pub use clock::{Clock, ManualClock, SystemClock};
pub use evaluation::Evaluation;
pub use fixed_window::WindowState;
pub use leaky_bucket::BucketState;
pub use params::{Algorithm, DelayPolicy, LimitReq};
pub use rate::{Rate, RateError};
pub use sliding_window::SlidingState;
pub use state::{charge, evaluate, State, ZoneOutcome};
pub use token_bucket::TokenState;
pub use verdict::{charge_all, decide_all, Verdict, ZoneInput};
