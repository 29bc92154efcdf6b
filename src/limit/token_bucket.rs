//! Token bucket: `burst + 1` tokens, refilled at `rate`; a request spends `cost` tokens or is
//! rejected. Never delays. (Decision for decision it equals a leaky bucket with `nodelay`: tokens
//! are the bucket's free room. It is offered under its own name for users who think in tokens.)
//!
//! ```text
//! tokens' = min(capacity, tokens + rate * (now - last))    # a new key starts full
//! reject    if cost > tokens'                               # nothing spent
//! tokens''= tokens' - cost
//! ```

use super::evaluation::{ceil_us, Evaluation};
use super::{stored, LimitReq};

/// Tokens available at `last_us`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenState {
    pub tokens: f64,
    pub last_us: u64,
}

impl TokenState {
    /// The state as `lua/limit_req/token_bucket.lua` stores it, split on ' ': "t <tokens>
    /// <last_us>". `None`: not this algorithm's text.
    pub fn from_stored(words: &[&str]) -> Option<Self> {
        match words {
            ["t", tokens, last_us] => {
                Some(Self { tokens: stored::fraction(tokens)?, last_us: stored::integer(last_us)? })
            }
            _ => None,
        }
    }
}

pub fn evaluate(limit: &LimitReq, state: Option<TokenState>, now_us: u64, cost: u64) -> Evaluation<TokenState> {
    let capacity = limit.burst as f64 + 1.0;
    let (tokens_now, anchor_us) = match state {
        None => (capacity, now_us),
        // Time never runs backwards for a key: a late clock refills nothing.
        Some(TokenState { tokens, last_us }) if now_us <= last_us => (tokens, last_us),
        // Full again (the state's expiry): exactly no state, whatever the float residue.
        Some(TokenState { tokens, last_us })
            if now_us >= last_us + ceil_us(limit.rate.time_for_us(capacity - tokens)) =>
        {
            (capacity, now_us)
        }
        Some(TokenState { tokens, last_us }) => {
            let refilled = tokens + limit.rate.drained_in(now_us - last_us);
            (if refilled < capacity { refilled } else { capacity }, now_us)
        }
    };
    let cost_f = cost as f64;
    if cost_f > tokens_now {
        let reset_us = ceil_us(limit.rate.time_for_us(capacity - tokens_now));
        return Evaluation {
            admitted: false,
            excess: cost_f - tokens_now,
            delay_us: 0,
            retry_after_us: (cost_f <= capacity).then(|| ceil_us(limit.rate.time_for_us(cost_f - tokens_now))),
            remaining: 0,
            reset_us,
            expires_us: anchor_us + reset_us,
            next: TokenState { tokens: tokens_now, last_us: anchor_us },
        };
    }
    let tokens_new = tokens_now - cost_f;
    let reset_us = ceil_us(limit.rate.time_for_us(capacity - tokens_new));
    Evaluation {
        admitted: true,
        excess: 0.0,
        delay_us: 0,
        retry_after_us: None,
        remaining: tokens_new.floor() as u64,
        reset_us,
        expires_us: anchor_us + reset_us,
        next: TokenState { tokens: tokens_new, last_us: anchor_us },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, DelayPolicy, Rate};

    const SEC: u64 = 1_000_000;
    const T0: u64 = 1_700_000_000 * SEC;

    fn limit(rate: &str, burst: u64) -> LimitReq {
        LimitReq {
            algorithm: Algorithm::TokenBucket,
            rate: Rate::parse(rate).unwrap(),
            burst,
            delay: DelayPolicy::NoDelay,
        }
    }

    fn tokens(out: &Evaluation<TokenState>) -> Option<TokenState> {
        Some(out.next)
    }

    #[test]
    fn full_bucket_spends_then_refills_at_the_rate() {
        let l = limit("2r/s", 3); // 4 tokens, one every 500 ms
        let mut state = None;
        for i in 0..4 {
            let out = evaluate(&l, state, T0, 1);
            assert!(out.admitted, "request {i}");
            assert_eq!(out.remaining, 3 - i);
            state = tokens(&out);
        }
        let out = evaluate(&l, state, T0, 1);
        assert!(!out.admitted);
        assert_eq!(out.retry_after_us, Some(500_000));
        assert!(!evaluate(&l, state, T0 + 499_999, 1).admitted);
        assert!(evaluate(&l, state, T0 + 500_000, 1).admitted);
        // A long idle gap refills to capacity, not beyond.
        let out = evaluate(&l, state, T0 + 3600 * SEC, 1);
        assert_eq!(out.remaining, 3);
    }

    #[test]
    fn at_its_expiry_a_state_equals_no_state_despite_float_residue() {
        let l = LimitReq {
            algorithm: Algorithm::TokenBucket,
            rate: Rate { count: 44, period_us: 60_000_000 },
            burst: 7,
            delay: DelayPolicy::NoDelay,
        };
        let last_us = 1_700_870_204_949_505;
        let expires = last_us + ceil_us(l.rate.time_for_us(8.0 - 3.210200333333333));
        let out = evaluate(&l, Some(TokenState { tokens: 3.210200333333333, last_us }), expires, 8);
        assert_eq!(out, evaluate(&l, None, expires, 8));
        assert!(out.admitted);
    }

    #[test]
    fn cost_spends_several_tokens_and_too_costly_never_passes() {
        let l = limit("1r/s", 4);
        let out = evaluate(&l, None, T0, 5);
        assert!(out.admitted);
        assert_eq!(out.remaining, 0);
        assert_eq!(evaluate(&l, None, T0, 6).retry_after_us, None);
    }
}
