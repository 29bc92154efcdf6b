//! One instance's side of one leased key: the tokens it holds, how large its next lease should be,
//! and what to do with a request. Pure, on the instance's own clock (`now_us`): a lease's life is
//! counted from when this instance sent its request for it, so neither the round trip nor the skew
//! between this clock and the store's can lengthen it.
//!
//! Invariants the bound relies on (docs/leases.md):
//! - tokens held plus tokens asked for never exceed `spec.tokens` (a request's own cost aside:
//!   a request always may ask for its cost);
//! - a token is spent only before its lease's end (`sent + lifetime`, or its window's end);
//! - one request for a lease is in flight at a time; requests that need tokens meanwhile wait for
//!   its answer (the front door queues them) instead of asking again.

use super::{Grant, LeaseSpec};

/// One lease this instance holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    tokens: u64,
    /// Local clock: the lease may not be spent from here on.
    ends_us: u64,
    /// Fixed windows: the window the tokens belong to (given back only to it).
    window_start_us: Option<u64>,
}

/// What the instance does with a request for this key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalDecision {
    /// Admitted from a lease, no round trip. `renew`: ask the store for a lease of this many
    /// tokens in the background (the lease runs low or ends soon and the key is busy).
    Admit { renew: Option<u64> },
    /// The store said the key's budget cannot cover this request until then (local clock): refused
    /// with no round trip. Exact for the bucket family: other instances only take tokens.
    Refuse { retry_at_us: u64 },
    /// No usable tokens: ask the store for at least `min` (the request's cost), ideally `want`; the
    /// request waits for the answer.
    Ask { min: u64, want: u64 },
    /// A request for a lease is in flight: wait for its answer, then decide again.
    Wait,
}

/// Demand: tokens spent in the current and the previous lifetime-long period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Demand {
    period_start_us: u64,
    current: u64,
    previous: u64,
}

impl Demand {
    fn roll(&mut self, now_us: u64, period_us: u64) {
        if now_us >= self.period_start_us + 2 * period_us {
            *self = Demand { period_start_us: now_us, current: 0, previous: 0 };
        } else if now_us >= self.period_start_us + period_us {
            *self = Demand { period_start_us: self.period_start_us + period_us, current: 0, previous: self.current };
        }
    }

    /// Tokens a lease should hold to last one lifetime at the recent pace: twice the busier of the
    /// two periods, so a growing key doubles its lease per lifetime and a cold one asks for little.
    fn lease_size(&self) -> u64 {
        2 * self.current.max(self.previous)
    }
}

/// One instance's state for one leased key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lessee {
    /// Oldest first; at most two (the current lease and its early renewal).
    leases: Vec<Held>,
    in_flight: bool,
    /// The store refused a lease until then (local clock).
    empty_until_us: u64,
    demand: Demand,
    /// The lease the last local admission spent from (for [`Lessee::refund`]).
    last_spent: Option<Spent>,
    /// Tokens of leases that ended unspent since [`Lessee::take_expired`] (metrics).
    expired_unused: u64,
}

/// Which lease an admission spent from: a refund goes back to that lease only, so a refunded
/// token is never spent after the end of the lease it was debited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spent {
    ends_us: u64,
    window_start_us: Option<u64>,
    cost: u64,
}

impl Spent {
    /// The tokens the admission spent.
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

impl Lessee {
    /// Tokens usable at `now_us`.
    pub fn held(&self, now_us: u64) -> u64 {
        self.leases.iter().filter(|l| l.ends_us > now_us).map(|l| l.tokens).sum()
    }

    /// Whether a request for a lease is in flight.
    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// The live leases at `now_us`, oldest first: tokens left and end (local clock). For the
    /// admin's view of a key (`GET /limits`).
    pub fn live(&self, now_us: u64) -> Vec<(u64, u64)> {
        self.leases.iter().filter(|l| l.ends_us > now_us).map(|l| (l.tokens, l.ends_us)).collect()
    }

    /// Until when (local clock) the store said the key's budget cannot cover a request: refusals
    /// until then cost no call. `None` when it is not known empty at `now_us`.
    pub fn empty_until_us(&self, now_us: u64) -> Option<u64> {
        (self.empty_until_us > now_us).then_some(self.empty_until_us)
    }

    /// What to do with a request of `cost` at `now_us`.
    pub fn decide(&mut self, spec: &LeaseSpec, now_us: u64, cost: u64) -> LocalDecision {
        self.demand.roll(now_us, spec.lifetime_us);
        self.forget_ended(now_us);
        self.last_spent = None;
        if let Some(i) = self.leases.iter().position(|l| l.tokens >= cost) {
            // Spend from the oldest lease that covers the request (a cost is never split across
            // leases: each lease stays a plain count).
            self.leases[i].tokens -= cost;
            self.demand.current += cost;
            let l = &self.leases[i];
            self.last_spent = Some(Spent { ends_us: l.ends_us, window_start_us: l.window_start_us, cost });
            return LocalDecision::Admit { renew: self.renewal(spec, now_us) };
        }
        if self.in_flight {
            return LocalDecision::Wait;
        }
        if now_us < self.empty_until_us {
            return LocalDecision::Refuse { retry_at_us: self.empty_until_us };
        }
        let want = self.wanted(spec, now_us).max(cost);
        self.in_flight = true;
        LocalDecision::Ask { min: cost, want }
    }

    /// Tokens to ask for so that held plus asked stays within `spec.tokens`.
    fn wanted(&self, spec: &LeaseSpec, now_us: u64) -> u64 {
        let target = self.demand.lease_size().clamp(1, spec.tokens);
        target.saturating_sub(self.held(now_us))
    }

    /// After a local admission: renew early when the key is busy and its tokens run low (under a
    /// quarter of the lease size) or end within a quarter of the lifetime.
    fn renewal(&mut self, spec: &LeaseSpec, now_us: u64) -> Option<u64> {
        let ending = self.leases.iter().all(|l| l.ends_us <= now_us + spec.lifetime_us / 4);
        self.ask_early(spec, now_us, |held, size| held * 4 < size || ending)
    }

    /// A top-up riding on a call made for other keys: a busy key (spent from this lifetime-long
    /// period) that has used a quarter of its lease size asks for the rest now, so that it asks
    /// on its own less often. Marks the ask in flight; `None` when it needs none (or asks
    /// already, holds two leases, or is known empty). Held plus asked stays within `spec.tokens`.
    pub fn top_up(&mut self, spec: &LeaseSpec, now_us: u64) -> Option<u64> {
        self.demand.roll(now_us, spec.lifetime_us);
        self.forget_ended(now_us);
        if self.demand.current == 0 {
            return None;
        }
        self.ask_early(spec, now_us, |held, size| held * 4 < 3 * size)
    }

    /// An ask before the key runs dry, when `low(held, lease size)` says so: the tokens wanted,
    /// marked in flight. None while an ask is in flight, two leases are held, or the key is known
    /// empty (an ask now would only be refused).
    fn ask_early(&mut self, spec: &LeaseSpec, now_us: u64, low: impl FnOnce(u64, u64) -> bool) -> Option<u64> {
        if self.in_flight || self.leases.len() >= 2 || now_us < self.empty_until_us {
            return None;
        }
        let size = self.demand.lease_size().clamp(1, spec.tokens);
        if !low(self.held(now_us), size) {
            return None;
        }
        let want = self.wanted(spec, now_us);
        if want == 0 {
            return None;
        }
        self.in_flight = true;
        Some(want)
    }

    /// The store answered the request sent at `sent_us` (local clock) and the answer arrived at
    /// `now_us`. A grant that arrives after its own lifetime is dead on arrival: its tokens are
    /// returned by [`Lessee::take_unused`]'s caller as unused (the grant is reported back as
    /// `dead`).
    pub fn answered(&mut self, spec: &LeaseSpec, sent_us: u64, now_us: u64, grant: &Grant) -> Answered {
        self.in_flight = false;
        if grant.tokens == 0 {
            if let Some(retry) = grant.retry_after_us {
                // Counted from the send: the store saw the refusal no earlier.
                self.empty_until_us = self.empty_until_us.max(sent_us + retry);
            }
            return Answered::Refused;
        }
        let life = grant.window_left_us.map_or(spec.lifetime_us, |left| left.min(spec.lifetime_us));
        let ends_us = sent_us + life;
        if ends_us <= now_us {
            return Answered::Dead { unused: grant.tokens };
        }
        let window_start_us = grant.window_start_us;
        self.leases.push(Held { tokens: grant.tokens, ends_us, window_start_us });
        // A grant that emptied the key: spend it, then refuse locally until the store said.
        self.empty_until_us = grant.retry_after_us.map_or(0, |retry| sent_us + retry);
        Answered::Granted
    }

    /// The store could not be asked (error, timeout): nothing is held for that request.
    pub fn failed(&mut self) {
        self.in_flight = false;
    }

    /// Drops the leases that ended by `now_us`, counting their unspent tokens as expired.
    fn forget_ended(&mut self, now_us: u64) {
        let ended: u64 = self.leases.iter().filter(|l| l.ends_us <= now_us).map(|l| l.tokens).sum();
        self.expired_unused += ended;
        self.leases.retain(|l| l.ends_us > now_us && l.tokens > 0);
    }

    /// What the last [`LocalDecision::Admit`] spent, to undo it with [`Lessee::refund`].
    pub fn last_spent(&self) -> Option<Spent> {
        self.last_spent
    }

    /// Undoes an admission (another zone of the same request refused it: all or nothing): its
    /// tokens go back to the lease they came from, if it is still held and live; otherwise they
    /// are lost to this instance, as unused tokens of an ended lease are.
    pub fn refund(&mut self, spent: Spent, now_us: u64) {
        let lease = self
            .leases
            .iter_mut()
            .find(|l| l.ends_us == spent.ends_us && l.window_start_us == spent.window_start_us && l.ends_us > now_us);
        if let Some(lease) = lease {
            lease.tokens += spent.cost;
            self.demand.current = self.demand.current.saturating_sub(spent.cost);
        }
    }

    /// Tokens of leases that ended unspent since the last call (and forgets those leases).
    pub fn take_expired(&mut self, now_us: u64) -> u64 {
        self.forget_ended(now_us);
        std::mem::take(&mut self.expired_unused)
    }

    /// The live leases' fixed window, if any (the window given-back tokens are credited to).
    pub fn window_start_us(&self, now_us: u64) -> Option<u64> {
        self.leases.iter().find(|l| l.ends_us > now_us).and_then(|l| l.window_start_us)
    }

    /// When the latest live lease ends (local clock), if one is held.
    pub fn ends_us(&self, now_us: u64) -> Option<u64> {
        self.leases.iter().filter(|l| l.ends_us > now_us).map(|l| l.ends_us).max()
    }

    /// Gives up every lease (reload, shutdown, key gone cold): the tokens to credit back.
    pub fn take_unused(&mut self, now_us: u64) -> u64 {
        self.take_unused_by_window(now_us).iter().map(|(tokens, _)| tokens).sum()
    }

    /// [`Lessee::take_unused`], per window the tokens belong to (fixed windows credit each
    /// window's tokens to it only; `None` for the bucket family).
    pub fn take_unused_by_window(&mut self, now_us: u64) -> Vec<(u64, Option<u64>)> {
        self.forget_ended(now_us);
        let mut out: Vec<(u64, Option<u64>)> = Vec::new();
        for l in self.leases.drain(..) {
            match out.iter_mut().find(|(_, w)| *w == l.window_start_us) {
                Some((tokens, _)) => *tokens += l.tokens,
                None => out.push((l.tokens, l.window_start_us)),
            }
        }
        out.retain(|(tokens, _)| *tokens > 0);
        out
    }
}

/// What an answer from the store did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    Granted,
    Refused,
    /// The grant came back after its lease had ended; `unused` tokens go back to the store.
    Dead {
        unused: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000;
    const SPEC: LeaseSpec = LeaseSpec { tokens: 100, lifetime_us: SEC };

    fn granted(tokens: u64) -> Grant {
        Grant { tokens, retry_after_us: None, window_start_us: None, window_left_us: None }
    }

    /// One request at `now` with a store that answers at once; the sizes asked for, if any.
    fn step(l: &mut Lessee, now: u64, sizes: &mut Vec<u64>) {
        match l.decide(&SPEC, now, 1) {
            LocalDecision::Ask { want, .. } => {
                sizes.push(want);
                l.answered(&SPEC, now, now, &granted(want));
                step(l, now, sizes);
            }
            LocalDecision::Admit { renew: Some(want) } => {
                sizes.push(want);
                l.answered(&SPEC, now, now, &granted(want));
            }
            LocalDecision::Admit { renew: None } => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_cold_key_asks_small_and_a_hot_one_grows_to_the_cap() {
        let mut l = Lessee::default();
        let mut sizes = vec![];
        step(&mut l, 0, &mut sizes);
        assert_eq!(sizes[0], 1, "a cold key's first lease is one token");
        // 1,000 requests a second: each ask asks twice the recent pace, capped at 100.
        let mut now = 0;
        for _ in 0..5000 {
            now += 1000;
            step(&mut l, now, &mut sizes);
            assert!(l.held(now) <= SPEC.tokens);
        }
        assert!(*sizes.last().unwrap() >= 50, "{sizes:?}");
        assert!(sizes.iter().all(|&s| s <= SPEC.tokens));
        // ~5,000 requests in ~5 s took far fewer than 5,000 asks.
        assert!(sizes.len() < 5000 / 50, "{} asks: {sizes:?}", sizes.len());
    }

    #[test]
    fn tokens_are_not_spent_after_their_lease_ends() {
        let mut l = Lessee::default();
        assert!(matches!(l.decide(&SPEC, 0, 1), LocalDecision::Ask { .. }));
        l.answered(&SPEC, 0, 10, &granted(5));
        assert!(matches!(l.decide(&SPEC, SEC - 1, 1), LocalDecision::Admit { .. }));
        assert!(matches!(l.decide(&SPEC, SEC, 1), LocalDecision::Ask { .. }));
    }

    #[test]
    fn a_refusal_is_remembered_until_its_retry_time() {
        let mut l = Lessee::default();
        assert!(matches!(l.decide(&SPEC, 0, 1), LocalDecision::Ask { .. }));
        l.answered(
            &SPEC,
            0,
            300,
            &Grant { tokens: 0, retry_after_us: Some(100_000), window_start_us: None, window_left_us: None },
        );
        assert_eq!(l.decide(&SPEC, 500, 1), LocalDecision::Refuse { retry_at_us: 100_000 });
        assert!(matches!(l.decide(&SPEC, 100_000, 1), LocalDecision::Ask { .. }));
    }

    #[test]
    fn a_grant_that_empties_the_key_is_spent_then_refuses_without_asking() {
        let mut l = Lessee::default();
        assert!(matches!(l.decide(&SPEC, 0, 1), LocalDecision::Ask { .. }));
        let last = Grant { tokens: 2, retry_after_us: Some(100_000), window_start_us: None, window_left_us: None };
        l.answered(&SPEC, 0, 300, &last);
        // The two tokens are spent, with no early renewal (the store said it has nothing).
        assert_eq!(l.decide(&SPEC, 400, 1), LocalDecision::Admit { renew: None });
        assert_eq!(l.decide(&SPEC, 500, 1), LocalDecision::Admit { renew: None });
        // Then refused locally until the store's time, counted from the send.
        assert_eq!(l.decide(&SPEC, 600, 1), LocalDecision::Refuse { retry_at_us: 100_000 });
        assert!(matches!(l.decide(&SPEC, 100_000, 1), LocalDecision::Ask { .. }));
        // A grant that leaves room clears it.
        l.answered(&SPEC, 100_000, 100_100, &granted(1));
        assert_eq!(l.empty_until_us(100_100), None);
    }

    #[test]
    fn one_ask_in_flight_and_others_wait() {
        let mut l = Lessee::default();
        assert!(matches!(l.decide(&SPEC, 0, 1), LocalDecision::Ask { .. }));
        assert_eq!(l.decide(&SPEC, 1, 1), LocalDecision::Wait);
        l.failed();
        assert!(matches!(l.decide(&SPEC, 2, 1), LocalDecision::Ask { .. }));
    }

    #[test]
    fn a_refund_goes_back_to_its_own_lease_while_it_lives() {
        let mut l = Lessee::default();
        assert!(matches!(l.decide(&SPEC, 0, 1), LocalDecision::Ask { .. }));
        l.answered(&SPEC, 0, 10, &granted(3));
        assert!(matches!(l.decide(&SPEC, 20, 2), LocalDecision::Admit { .. }));
        let spent = l.last_spent().expect("an admission spent");
        assert_eq!(l.held(20), 1);
        l.refund(spent, 30);
        assert_eq!(l.held(30), 3);
        // After its lease ended, a refund gives nothing back, and the tokens count as expired.
        assert!(matches!(l.decide(&SPEC, 40, 2), LocalDecision::Admit { .. }));
        let spent = l.last_spent().expect("spent");
        l.refund(spent, SEC);
        assert_eq!(l.held(SEC), 0);
        assert_eq!(l.take_expired(SEC), 1);
    }

    #[test]
    fn a_grant_arriving_after_its_lifetime_is_dead() {
        let mut l = Lessee::default();
        assert!(matches!(l.decide(&SPEC, 0, 1), LocalDecision::Ask { .. }));
        assert_eq!(l.answered(&SPEC, 0, SEC, &granted(7)), Answered::Dead { unused: 7 });
        assert_eq!(l.held(SEC), 0);
    }

    #[test]
    fn a_busy_key_tops_up_within_its_lease_and_an_idle_or_asking_one_does_not() {
        let mut l = Lessee::default();
        assert_eq!(l.top_up(&SPEC, 0), None, "a key never spent from asks for nothing");
        assert!(matches!(l.decide(&SPEC, 0, 1), LocalDecision::Ask { .. }));
        assert_eq!(l.top_up(&SPEC, 0), None, "an ask is in flight");
        l.answered(&SPEC, 0, 10, &granted(40));
        for t in 1..=20 {
            l.decide(&SPEC, 10 * t, 1);
        }
        // 20 spent this period: the lease size is 40; 20 held is under three quarters of it.
        let want = l.top_up(&SPEC, 300).expect("a busy key a quarter spent tops up");
        assert!(l.held(300) + want <= SPEC.tokens, "held {} + asked {want}", l.held(300));
        assert_eq!(l.top_up(&SPEC, 300), None, "one ask at a time");
        l.answered(
            &SPEC,
            300,
            310,
            &Grant { tokens: 0, retry_after_us: Some(SEC), window_start_us: None, window_left_us: None },
        );
        assert_eq!(l.top_up(&SPEC, 400), None, "known empty");
        // Two lifetimes idle: not busy, no top-up.
        assert_eq!(l.top_up(&SPEC, 3 * SEC + 400), None);
    }
}
