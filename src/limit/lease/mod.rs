//! Leased budgets (issue 47), the pure model: an instance takes a slice of a key's budget from the
//! authoritative state in one atomic step and admits locally while the slice lasts; the fleet's
//! overshoot over an exact limiter is bounded by a formula ([`bound`]), proved in docs/leases.md.
//!
//! Two sides, both pure and on caller-given clocks:
//! - the **ledger** ([`Ledger`], [`grant`], [`give_back`]): what the store keeps and does for one
//!   key. A grant is a debit of the key's own state, made with the algorithm's own decision
//!   function ([`crate::limit::evaluate`] with the grant as the cost), so leased and exact zones
//!   share one state format and one arithmetic. The ledger also remembers who holds a live lease,
//!   so that near the limit the last tokens are divided among the holders instead of hoarded.
//! - the **lessee** ([`Lessee`]): one instance's view of one key: the tokens it holds and until
//!   when, how big its next lease should be (its own recent demand), and whether the key's budget
//!   is known to be empty (then a request is refused without asking the store).
//!
//! Which algorithms lease: the bucket family (leaky bucket with `burst`/`nodelay`, token bucket)
//! and fixed windows, whose leases are tagged with their window and end with it.

pub mod bound;
pub mod division;
pub mod lessee;
#[cfg(test)]
mod sim;

pub use bound::Bound;
pub use lessee::{Answered, Lessee, LocalDecision, Spent};

use super::{evaluate, Algorithm, DelayPolicy, LimitReq, State};

/// A zone's lease settings (`lease = { tokens = 100, lifetime = "1s" }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSpec {
    /// The most tokens one instance holds for one key at a time (leases in flight included).
    pub tokens: u64,
    /// How long a lease may be used, counted from when the instance *sent* its request for it.
    pub lifetime_us: u64,
}

/// Whether a zone's algorithm can lease, and why not.
pub fn leasable(limit: &LimitReq) -> Result<(), &'static str> {
    match limit.algorithm {
        // A token bucket never delays.
        Algorithm::TokenBucket => Ok(()),
        Algorithm::LeakyBucket => match limit.delay {
            DelayPolicy::NoDelay => Ok(()),
            // A queued burst delays each request by the exact level at its arrival; a lease
            // debited ahead of time cannot say how long a request must wait.
            DelayPolicy::After(_) => Err("a leaky bucket with a queued burst (`burst` without `nodelay`, or `delay = N`) delays each request by the exact level at its arrival, which a lease taken ahead of time cannot know: use `nodelay`"),
        },
        Algorithm::FixedWindow => Ok(()),
        Algorithm::SlidingLog => Err("a sliding log keeps one entry per admitted request in the store: there is nothing to lease"),
        Algorithm::SlidingWindow => {
            Err("sliding window counters are not leased yet (their estimate weighs the previous window by the time of each admission)")
        }
    }
}

/// One live lease as the ledger remembers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub instance: u64,
    /// When the lease can no longer be used, on the ledger's clock (an upper bound: the holder
    /// counts its lifetime from before the ledger saw the request).
    pub expires_us: u64,
}

/// What the store keeps for one leased key: the algorithm's own state plus the live holders.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Ledger {
    pub state: Option<State>,
    pub holders: Vec<Holder>,
}

/// The store's answer to a request for a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Tokens granted; 0: refused (the key's budget cannot cover the smallest grant asked for).
    pub tokens: u64,
    /// When the smallest grant fits again, from now: refused (None: never, its cost exceeds what
    /// the key can ever hold), or granted and the key left unable to cover it (None: it can).
    pub retry_after_us: Option<u64>,
    /// Fixed windows: the window the tokens belong to (on the store's clock), for giving them back.
    pub window_start_us: Option<u64>,
    /// Fixed windows: how long the window the tokens belong to lasts from now. The lease ends then
    /// whatever its lifetime, so a window's tokens are never spent in the next one.
    pub window_left_us: Option<u64>,
}

/// Tokens the key could give right now (what a request of cost 1 sees as room).
fn room(limit: &LimitReq, state: Option<&State>, now_us: u64) -> u64 {
    let probe = evaluate(limit, state, now_us, 1);
    if probe.admitted {
        probe.remaining + 1
    } else {
        0
    }
}

/// Grants `instance` a lease of up to `want` tokens (at least `min`, the cost of the request that
/// asked; `min <= want`) at the ledger's `now_us`, living `lifetime_us`.
///
/// The grant is `min(want, room, max(min, room / holders))`, where `holders` counts the live
/// holders other than `instance` plus itself: away from the limit a lease is as large as asked;
/// near it the remaining room is divided, so the last tokens go one request at a time, as in the
/// exact mode.
pub fn grant(
    limit: &LimitReq,
    ledger: &Ledger,
    now_us: u64,
    instance: u64,
    min: u64,
    want: u64,
    lifetime_us: u64,
) -> (Grant, Ledger) {
    let want = want.max(min);
    let mut holders: Vec<Holder> =
        ledger.holders.iter().copied().filter(|h| h.expires_us > now_us && h.instance != instance).collect();
    let room = room(limit, ledger.state.as_ref(), now_us);
    let share = (room / (holders.len() as u64 + 1)).max(min);
    let tokens = want.min(room).min(share);
    let is_window = limit.algorithm == Algorithm::FixedWindow;
    let window_start_us = is_window.then(|| now_us - now_us % limit.rate.period_us);
    let window_left_us = is_window.then(|| limit.rate.period_us - now_us % limit.rate.period_us);
    // The least grant as a request: what a refusal, and a grant that empties the key, say fits when.
    let first = min.max(1);
    if tokens < min || tokens == 0 {
        let refused = evaluate(limit, ledger.state.as_ref(), now_us, first);
        let grant = Grant { tokens: 0, retry_after_us: refused.retry_after_us, window_start_us, window_left_us };
        return (grant, Ledger { state: ledger.state.clone(), holders });
    }
    let debit = evaluate(limit, ledger.state.as_ref(), now_us, tokens);
    debug_assert!(debit.admitted, "a grant within the room is always admitted");
    // A grant that leaves the key unable to cover the least grant says when it can again: the
    // holder spends what it got, then refuses locally until then instead of asking an empty store.
    // Room left for the least grant needs no evaluation (room is a floor of what fits).
    let retry_after_us = if room - tokens >= first {
        None
    } else {
        let after = evaluate(limit, Some(&debit.next), now_us, first);
        if after.admitted {
            None
        } else {
            after.retry_after_us
        }
    };
    let lease_end = now_us + window_left_us.map_or(lifetime_us, |left| left.min(lifetime_us));
    holders.push(Holder { instance, expires_us: lease_end });
    let grant = Grant { tokens, retry_after_us, window_start_us, window_left_us };
    (grant, Ledger { state: Some(debit.next), holders })
}

/// Credits `unused` tokens of `instance`'s lease back to the key at `now_us` (a lease ended early:
/// reload, shutdown, the key gone cold). `window_start_us` is the window the lease belonged to
/// (fixed windows): tokens of a window that has ended are worth nothing and are dropped.
///
/// For a bucket the credit is exact: with the level floored at zero, the bucket after the credit
/// is the bucket it would be had the lease been `unused` tokens smaller (docs/leases.md).
pub fn give_back(
    limit: &LimitReq,
    ledger: &Ledger,
    now_us: u64,
    instance: u64,
    unused: u64,
    window_start_us: Option<u64>,
) -> Ledger {
    let holders = ledger.holders.iter().copied().filter(|h| h.expires_us > now_us && h.instance != instance).collect();
    let state = match (ledger.state.as_ref(), unused) {
        (state, 0) => state.cloned(),
        (Some(State::Bucket(b)), _) => {
            // Drain to now with the algorithm's own arithmetic (a probe of cost 0), then credit.
            let now = evaluate(limit, Some(&State::Bucket(*b)), now_us, 0);
            match now.next {
                State::Bucket(mut drained) => {
                    drained.level = (drained.level - unused as f64).max(0.0);
                    Some(State::Bucket(drained))
                }
                other => Some(other),
            }
        }
        (Some(State::Tokens(t)), _) => {
            let now = evaluate(limit, Some(&State::Tokens(*t)), now_us, 0);
            match now.next {
                State::Tokens(mut refilled) => {
                    refilled.tokens = (refilled.tokens + unused as f64).min(limit.burst as f64 + 1.0);
                    Some(State::Tokens(refilled))
                }
                other => Some(other),
            }
        }
        (Some(State::Window(w)), _) => {
            let mut w = *w;
            if Some(w.start_us) == window_start_us && now_us < w.start_us + limit.rate.period_us {
                w.count = w.count.saturating_sub(unused);
            }
            Some(State::Window(w))
        }
        (state, _) => state.cloned(),
    };
    Ledger { state, holders }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Rate;

    const SEC: u64 = 1_000_000;
    const T0: u64 = 1_700_000_000 * SEC;

    fn bucket(rate: &str, burst: u64) -> LimitReq {
        LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse(rate).unwrap(),
            burst,
            delay: DelayPolicy::NoDelay,
        }
    }

    #[test]
    fn a_grant_is_a_debit_of_the_keys_own_state() {
        let l = bucket("100r/s", 199);
        let (g, ledger) = grant(&l, &Ledger::default(), T0, 1, 1, 50, SEC);
        assert_eq!(g.tokens, 50);
        // The exact mode sees the same bucket as after 50 requests at T0.
        let mut exact = None;
        for _ in 0..50 {
            exact = Some(evaluate(&l, exact.as_ref(), T0, 1).next);
        }
        assert_eq!(ledger.state, exact);
    }

    #[test]
    fn near_the_limit_the_room_is_divided_among_holders() {
        let l = bucket("10r/s", 9); // 10 tokens
        let (a, ledger) = grant(&l, &Ledger::default(), T0, 1, 1, 4, SEC);
        assert_eq!(a.tokens, 4);
        // 6 left, two holders (1 and 2): 2 gets 3, not the 4 it asked for.
        let (b, ledger) = grant(&l, &ledger, T0, 2, 1, 4, SEC);
        assert_eq!(b.tokens, 3);
        // 3 left, three holders: 1 each.
        let (c, ledger) = grant(&l, &ledger, T0, 3, 1, 4, SEC);
        assert_eq!(c.tokens, 1);
        let (d, ledger) = grant(&l, &ledger, T0, 4, 1, 4, SEC);
        assert_eq!(d.tokens, 1);
        let (e, ledger) = grant(&l, &ledger, T0, 5, 1, 4, SEC);
        assert_eq!(e.tokens, 1);
        // The last token went with e's grant, and e's grant said so: when one token is back.
        assert_eq!((c.retry_after_us, d.retry_after_us), (None, None), "room was left");
        assert_eq!(e.retry_after_us, Some(SEC / 10));
        // Empty: refused, with the same time.
        let (f, _) = grant(&l, &ledger, T0, 6, 1, 4, SEC);
        assert_eq!(f.tokens, 0);
        assert_eq!(f.retry_after_us, Some(SEC / 10));
    }

    #[test]
    fn expired_holders_do_not_shrink_a_grant() {
        let l = bucket("10r/s", 9);
        let (_, ledger) = grant(&l, &Ledger::default(), T0, 1, 1, 2, SEC / 2);
        // Half a second later holder 1's lease is over: 2 gets what it asks within the room.
        let (g, _) = grant(&l, &ledger, T0 + SEC / 2, 2, 1, 8, SEC);
        assert_eq!(g.tokens, 8);
    }

    #[test]
    fn giving_back_equals_a_smaller_lease() {
        let l = bucket("100r/s", 99);
        for (wait_us, unused) in [(0, 30), (100_000, 30), (400_000, 30), (2 * SEC, 60)] {
            let (_, big) = grant(&l, &Ledger::default(), T0, 1, 1, 60, SEC);
            let returned = give_back(&l, &big, T0 + wait_us, 1, unused, None);
            let (_, small) = grant(&l, &Ledger::default(), T0, 1, 1, 60 - unused, SEC);
            let small_now = evaluate(&l, small.state.as_ref(), T0 + wait_us, 0).next;
            let returned_now = evaluate(&l, returned.state.as_ref(), T0 + wait_us, 0).next;
            match (returned_now, small_now) {
                (State::Bucket(a), State::Bucket(b)) => {
                    assert!((a.level - b.level).abs() < 1e-9, "wait {wait_us}: {a:?} vs {b:?}");
                }
                other => panic!("not buckets: {other:?}"),
            }
            assert!(returned.holders.is_empty());
        }
    }

    #[test]
    fn fixed_window_leases_end_with_their_window_and_stale_returns_are_dropped() {
        let l = LimitReq {
            algorithm: Algorithm::FixedWindow,
            rate: Rate::parse("100r/m").unwrap(),
            burst: 0,
            delay: DelayPolicy::NoDelay,
        };
        let minute = 60 * SEC;
        let start = T0 - T0 % minute;
        let now = start + 59 * SEC;
        let (g, ledger) = grant(&l, &Ledger::default(), now, 1, 1, 40, 5 * SEC);
        assert_eq!((g.tokens, g.window_left_us), (40, Some(SEC)));
        assert_eq!(ledger.holders[0].expires_us, start + minute);
        // Returned within the window: credited. After it: nothing to credit.
        let within = give_back(&l, &ledger, now + 1, 1, 10, Some(start));
        assert_eq!(within.state, Some(State::Window(crate::limit::WindowState { start_us: start, count: 30 })));
        let after = give_back(&l, &ledger, start + minute, 1, 10, Some(start));
        assert_eq!(after.state, ledger.state);
    }

    #[test]
    fn modes_that_cannot_lease_say_why() {
        let mut l = bucket("10r/s", 5);
        assert!(leasable(&l).is_ok());
        l.delay = DelayPolicy::After(2);
        assert!(leasable(&l).unwrap_err().contains("nodelay"));
        l.algorithm = Algorithm::SlidingLog;
        assert!(leasable(&l).is_err());
    }
}
