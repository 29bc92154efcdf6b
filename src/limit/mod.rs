//! The limit model: pure decision functions over a caller-supplied clock.
//!
//! Nothing here does I/O, and the decision functions never read the system time: they take `now`
//! from the caller, who reads a [`Clock`] (`SystemClock` in production, the one place in this
//! module that reads it; `ManualClock` in tests). The same functions drive the embedded
//! `memory` store and the local fallback, and they are the reference that the Lua scripts in
//! `lua/` are tested against (see `tests/lua_differential.rs`).
//!
//! One file per algorithm (its decision, its state and that state's stored text), each with its
//! Lua twin `lua/limit_req/<algorithm>.lua` and its table of cases `tables/<algorithm>.rs`;
//! `state.rs` dispatches on the algorithm, `verdict.rs` decides a request's zones together. The
//! recipe for a new algorithm is in docs/architecture.md.

mod clock;
mod evaluation;
pub mod fields;
mod fixed_window;
mod leaky_bucket;
pub mod lease;
mod params;
mod rate;
mod sliding_log;
mod sliding_window;
mod state;
mod stored;
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
