//! The state each algorithm keeps per (zone, key), what one zone says about one request, and the
//! dispatch from a zone's algorithm to its decision function.

use super::{fixed_window, leaky_bucket, sliding_log, sliding_window, token_bucket};
use super::{Algorithm, BucketState, LimitReq};

/// Per (zone, key) state; which variant depends on the zone's algorithm.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// Leaky bucket: requests in the bucket at `last_us`.
    Bucket(BucketState),
    /// Token bucket: tokens available at `last_us`.
    Tokens { tokens: f64, last_us: u64 },
    /// Fixed window: admissions (in cost units) in the window starting at `start_us`.
    Window { start_us: u64, count: u64 },
    /// Sliding window counter: the window starting at `start_us` and the one before it.
    Sliding { start_us: u64, prev: u64, curr: u64 },
    /// Sliding log: admission times, oldest first, one entry per cost unit.
    Log(Vec<u64>),
}

/// What one zone says about one request.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneOutcome {
    pub admitted: bool,
    /// How far over the limit this request would go (leaky bucket: nginx's `excess`).
    pub excess: f64,
    /// How long an admitted request waits before it is forwarded (leaky bucket only).
    pub delay_us: u64,
    /// For a rejected request: how long until the same request would be admitted; `None` if it never
    /// can (its cost exceeds what the zone can ever admit).
    pub retry_after_us: Option<u64>,
    /// Requests of cost 1 that could still be admitted right now (the `r` of the RateLimit header).
    pub remaining: u64,
    /// Time until the quota is whole again (the `t` of the RateLimit header).
    pub reset_us: u64,
    /// When the state can be forgotten (absolute µs): from then on, no state equals this state.
    pub expires_us: u64,
    /// The state to store if the whole request is admitted (when rejected: the current state, not
    /// stored).
    pub next: State,
}

/// Evaluates one zone for one request of `cost` at `now_us`. Pure: the caller decides whether to
/// store `next` (only when every zone of the request admits it). State of another algorithm (the
/// zone's algorithm changed in a reload) counts as no state.
pub fn evaluate(limit: &LimitReq, state: Option<&State>, now_us: u64, cost: u64) -> ZoneOutcome {
    match limit.algorithm {
        Algorithm::LeakyBucket => {
            let s = match state {
                Some(State::Bucket(b)) => Some(*b),
                _ => None,
            };
            leaky_bucket::evaluate(limit, s, now_us, cost)
        }
        Algorithm::TokenBucket => {
            let s = match state {
                Some(State::Tokens { tokens, last_us }) => Some((*tokens, *last_us)),
                _ => None,
            };
            token_bucket::evaluate(limit, s, now_us, cost)
        }
        Algorithm::FixedWindow => {
            let s = match state {
                Some(State::Window { start_us, count }) => Some((*start_us, *count)),
                _ => None,
            };
            fixed_window::evaluate(limit, s, now_us, cost)
        }
        Algorithm::SlidingWindow => {
            let s = match state {
                Some(State::Sliding { start_us, prev, curr }) => Some((*start_us, *prev, *curr)),
                _ => None,
            };
            sliding_window::evaluate(limit, s, now_us, cost)
        }
        Algorithm::SlidingLog => {
            let s = match state {
                Some(State::Log(entries)) => entries.as_slice(),
                _ => &[],
            };
            sliding_log::evaluate(limit, s, now_us, cost)
        }
    }
}

/// Rounds a time up to whole microseconds; negative or zero is 0. Mirrored in the Lua scripts.
pub(crate) fn ceil_us(us: f64) -> u64 {
    if us > 0.0 {
        us.ceil() as u64
    } else {
        0
    }
}
