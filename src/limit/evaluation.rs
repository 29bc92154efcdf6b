//! What evaluating one zone for one request gives: the decision, the numbers for the response
//! headers, and the state to keep. Generic over the state, so each algorithm returns its own state
//! type and only the dispatch in `state.rs` knows the enum of them all.

/// What one zone says about one request; `S` is the state the zone keeps per key.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation<S> {
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
    pub next: S,
}

impl<S> Evaluation<S> {
    /// The same evaluation with its state wrapped (e.g. into [`super::State`]).
    pub fn map_state<T>(self, wrap: impl FnOnce(S) -> T) -> Evaluation<T> {
        Evaluation {
            admitted: self.admitted,
            excess: self.excess,
            delay_us: self.delay_us,
            retry_after_us: self.retry_after_us,
            remaining: self.remaining,
            reset_us: self.reset_us,
            expires_us: self.expires_us,
            next: wrap(self.next),
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
