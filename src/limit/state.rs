//! The state each algorithm keeps per (zone, key), as one enum for the stores, and the dispatch
//! from a zone's algorithm to its decision function and to the reader of its stored text. The
//! algorithms know only their own state type.

use super::evaluation::Evaluation;
use super::{fixed_window, leaky_bucket, sliding_log, sliding_window, token_bucket};
use super::{Algorithm, BucketState, LimitReq, SlidingState, TokenState, WindowState};

/// Per (zone, key) state; which variant depends on the zone's algorithm.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    Bucket(BucketState),
    Tokens(TokenState),
    Window(WindowState),
    Sliding(SlidingState),
    /// Sliding log: admission times, oldest first, one entry per cost unit.
    Log(Vec<u64>),
}

impl State {
    /// A key's string as the Lua part of the algorithm that wrote it stores it, whichever
    /// algorithm that was (the admin API reads a key without its zone's config). Each algorithm
    /// reads its own format (`from_stored` in its file); the formats cannot be mistaken for one
    /// another (a tag or a word count apart). `None`: no algorithm's format.
    pub fn from_stored_text(text: &str) -> Option<State> {
        let words: Vec<&str> = text.split(' ').collect();
        Algorithm::ALL.into_iter().find_map(|algorithm| match algorithm {
            Algorithm::LeakyBucket => BucketState::from_stored(&words).map(State::Bucket),
            Algorithm::TokenBucket => TokenState::from_stored(&words).map(State::Tokens),
            Algorithm::FixedWindow => WindowState::from_stored(&words).map(State::Window),
            Algorithm::SlidingWindow => SlidingState::from_stored(&words).map(State::Sliding),
            // A sorted set, not a string: `log_entry_from_stored`, one score at a time.
            Algorithm::SlidingLog => None,
        })
    }

    /// One entry of a sliding log as stored: a score of the key's sorted set.
    pub fn log_entry_from_stored(score: &str) -> Option<u64> {
        sliding_log::entry_from_stored(score)
    }
}

/// What one zone says about one request, with the state as the stores keep it.
pub type ZoneOutcome = Evaluation<State>;

/// Outcomes a store reports without evaluating the zone (its state unknown or untouched, e.g. a
/// full in-process zone or the deny cache): a stand-in state that is never stored, as such a
/// request is always rejected.
impl ZoneOutcome {
    /// This zone rejects for `retry_us` from `now_us`.
    pub fn rejected_for(limit: &LimitReq, cost: u64, retry_us: u64, now_us: u64) -> Self {
        Evaluation {
            admitted: false,
            excess: limit.burst.saturating_add(cost) as f64,
            delay_us: 0,
            retry_after_us: Some(retry_us),
            remaining: 0,
            reset_us: retry_us,
            expires_us: now_us + retry_us,
            next: State::Bucket(BucketState { level: 0.0, last_us: now_us }),
        }
    }

    /// This zone would admit, but another one rejected the request, so it was not charged.
    pub fn not_charged(limit: &LimitReq, now_us: u64) -> Self {
        Evaluation {
            admitted: true,
            excess: 0.0,
            delay_us: 0,
            retry_after_us: None,
            remaining: limit.burst,
            reset_us: 0,
            expires_us: now_us,
            next: State::Bucket(BucketState { level: 0.0, last_us: now_us }),
        }
    }
}

/// Evaluates one zone for one request of `cost` at `now_us`. Pure: the caller decides whether to
/// store `next` (only when every zone of the request admits it). State of another algorithm (the
/// zone's algorithm changed in a reload) counts as no state.
pub fn evaluate(limit: &LimitReq, state: Option<&State>, now_us: u64, cost: u64) -> ZoneOutcome {
    match (limit.algorithm, state) {
        (Algorithm::LeakyBucket, state) => {
            let s = match state {
                Some(State::Bucket(b)) => Some(*b),
                _ => None,
            };
            leaky_bucket::evaluate(limit, s, now_us, cost).map_state(State::Bucket)
        }
        (Algorithm::TokenBucket, state) => {
            let s = match state {
                Some(State::Tokens(t)) => Some(*t),
                _ => None,
            };
            token_bucket::evaluate(limit, s, now_us, cost).map_state(State::Tokens)
        }
        (Algorithm::FixedWindow, state) => {
            let s = match state {
                Some(State::Window(w)) => Some(*w),
                _ => None,
            };
            fixed_window::evaluate(limit, s, now_us, cost).map_state(State::Window)
        }
        (Algorithm::SlidingWindow, state) => {
            let s = match state {
                Some(State::Sliding(w)) => Some(*w),
                _ => None,
            };
            sliding_window::evaluate(limit, s, now_us, cost).map_state(State::Sliding)
        }
        (Algorithm::SlidingLog, state) => {
            let entries = match state {
                Some(State::Log(entries)) => entries.as_slice(),
                _ => &[],
            };
            sliding_log::evaluate(limit, entries, now_us, cost).map_state(State::Log)
        }
    }
}

/// Charges one zone after the response (`leaky_bucket::charge`): never refused, capped at the
/// ceiling `limit` (burst plus the debt cap). Only leaky buckets keep debt (the config allows
/// `cost_from_response` on no other algorithm); any other is charged like a request.
pub fn charge(limit: &LimitReq, state: Option<&State>, now_us: u64, cost: u64) -> ZoneOutcome {
    match (limit.algorithm, state) {
        (Algorithm::LeakyBucket, state) => {
            let s = match state {
                Some(State::Bucket(b)) => Some(*b),
                _ => None,
            };
            leaky_bucket::charge(limit, s, now_us, cost).map_state(State::Bucket)
        }
        _ => evaluate(limit, state, now_us, cost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each algorithm's stored text reads back as that algorithm's state, exactly; anything else
    /// (a tag and the wrong word count, garbage, a non-finite fraction) is no state.
    #[test]
    fn stored_text_reads_back_as_its_algorithms_state() {
        let leaky = State::Bucket(BucketState { level: 0.1, last_us: 1_700_000_000_000_000 });
        assert_eq!(State::from_stored_text("0.10000000000000001 1700000000000000"), Some(leaky));
        assert_eq!(
            State::from_stored_text("t 2.5 1700000000000000"),
            Some(State::Tokens(TokenState { tokens: 2.5, last_us: 1_700_000_000_000_000 }))
        );
        assert_eq!(
            State::from_stored_text("f 1699999980000000 7"),
            Some(State::Window(WindowState { start_us: 1_699_999_980_000_000, count: 7 }))
        );
        assert_eq!(
            State::from_stored_text("s 1699999980000000 3 4"),
            Some(State::Sliding(SlidingState { start_us: 1_699_999_980_000_000, prev: 3, curr: 4 }))
        );
        for bad in ["garbage", "1 -5", "t 1", "f 1.5 2", "s 1 2", "x 1 2", "1 2 3", "inf 5", "t x 5", "f 1 2 3", ""] {
            assert_eq!(State::from_stored_text(bad), None, "{bad:?}");
        }
        assert_eq!(State::log_entry_from_stored("1.7e+15"), Some(1_700_000_000_000_000));
        assert_eq!(State::log_entry_from_stored("1.5"), None);
    }
}
