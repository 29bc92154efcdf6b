//! nginx `limit_req` as a leaky bucket (the GCRA family), exact and with a cost per request.
//!
//! nginx keeps `excess` and `last` per key and computes `excess = max(0, excess - rate*elapsed + 1)`.
//! We keep the same two numbers, as `level` (requests in the bucket, nginx's `excess + 1` after a
//! request) and `last_us`. The GCRA arrival time is `tat = last + level / rate`; we store the pair
//! instead of `tat` because every Redis Lua number is a double: an absolute `tat` in microseconds
//! (~1.7e15) keeps only ~0.25 µs of precision, and the rounding of repeated `+ 1/rate` steps would
//! decide the exact boundaries that nginx's documented cases probe. `level` stays small and exact.
//!
//! For one request of cost `c` at `now`:
//! ```text
//! level' = max(0, level - rate * (now - last)) + c
//! excess = level' - 1                       # requests ahead of the ideal pace (nginx's excess)
//! reject   if excess > burst                # state unchanged: rejected requests are free
//! delay  = max(0, excess - delay) / rate    # 0 with nodelay
//! ```

use super::evaluation::{ceil_us, Evaluation};
use super::{stored, DelayPolicy, LimitReq};

/// The state of a leaky bucket per (zone, key).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketState {
    /// Requests in the bucket at `last_us` (nginx's `excess`, plus one).
    pub level: f64,
    /// When `level` was measured, in µs since the epoch. Never moves backwards.
    pub last_us: u64,
}

impl BucketState {
    /// The state as `lua/limit_req/leaky_bucket.lua` stores it, split on ' ': "<level> <last_us>",
    /// untagged (the format of earlier versions). `None`: not this algorithm's text.
    pub fn from_stored(words: &[&str]) -> Option<Self> {
        match words {
            [level, last_us] => Some(Self { level: stored::fraction(level)?, last_us: stored::integer(last_us)? }),
            _ => None,
        }
    }
}

/// Evaluates one zone for one request of `cost` at `now_us`. Pure: the caller decides whether to
/// store `next` (only when every zone of the request admits it).
pub fn evaluate(limit: &LimitReq, state: Option<BucketState>, now_us: u64, cost: u64) -> Evaluation<BucketState> {
    let (level_now, anchor_us) = match state {
        None => (0.0, now_us),
        // The clock went backwards (another instance's clock, a Redis failover): keep the stored
        // time and drain nothing, so time never runs backwards for a key.
        Some(s) if now_us <= s.last_us => (s.level, s.last_us),
        // Drained (the state's expiry): exactly no state, whatever the float residue.
        Some(s) if now_us >= s.last_us + ceil_us(limit.rate.time_for_us(s.level)) => (0.0, now_us),
        Some(s) => {
            let level = s.level - limit.rate.drained_in(now_us - s.last_us);
            (if level > 0.0 { level } else { 0.0 }, now_us)
        }
    };
    let capacity = limit.burst as f64 + 1.0;
    let level_new = level_now + cost as f64;
    let excess = level_new - 1.0;

    if excess > limit.burst as f64 {
        let room_needed = level_now - (capacity - cost as f64);
        return Evaluation {
            admitted: false,
            excess,
            delay_us: 0,
            retry_after_us: (cost as f64 <= capacity).then(|| ceil_us(limit.rate.time_for_us(room_needed))),
            remaining: 0,
            reset_us: ceil_us(limit.rate.time_for_us(level_now)),
            expires_us: anchor_us + ceil_us(limit.rate.time_for_us(level_now)),
            next: BucketState { level: level_now, last_us: anchor_us },
        };
    }

    let delay_us = match limit.delay {
        DelayPolicy::After(threshold) if excess > threshold as f64 => {
            ceil_us(limit.rate.time_for_us(excess - threshold as f64))
        }
        _ => 0,
    };
    let room = (capacity - level_new).floor();
    Evaluation {
        admitted: true,
        excess,
        delay_us,
        retry_after_us: None,
        remaining: if room > 0.0 { room as u64 } else { 0 },
        reset_us: ceil_us(limit.rate.time_for_us(level_new)),
        expires_us: anchor_us + ceil_us(limit.rate.time_for_us(level_new)),
        next: BucketState { level: level_new, last_us: anchor_us },
    }
}

/// Charges `cost` after the fact (charge from the response): the request was served already, so
/// the charge is never refused. The caller folds the debt cap into `limit` (its `burst` is the
/// reference's burst plus `max_debt`): whatever whole units fit below that ceiling are charged,
/// the rest is forgiven, so a level never passes `burst + max_debt + 1`. A level past the
/// reference's own `burst + 1` is debt: later requests are refused (or delayed) until it drains,
/// nginx's excess carried past the burst.
pub fn charge(limit: &LimitReq, state: Option<BucketState>, now_us: u64, cost: u64) -> Evaluation<BucketState> {
    let out = evaluate(limit, state, now_us, cost);
    if out.admitted {
        return out;
    }
    // Refused: `next.level` is the level now. The same operand order as lua/limit_req.lua.
    let room = (limit.burst as f64 + 1.0 - out.next.level).floor();
    evaluate(limit, state, now_us, if room > 0.0 { room as u64 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, Rate};

    trait Next {
        fn b(&self) -> BucketState;
    }
    impl Next for Evaluation<BucketState> {
        fn b(&self) -> BucketState {
            self.next
        }
    }

    const SEC: u64 = 1_000_000;
    const T0: u64 = 1_700_000_000 * SEC;

    fn limit(rate: &str, burst: u64, delay: DelayPolicy) -> LimitReq {
        LimitReq { algorithm: Algorithm::LeakyBucket, rate: Rate::parse(rate).unwrap(), burst, delay }
    }

    /// Sends `n` requests at the same instant, storing state after each admitted one.
    fn burst_at(limit: &LimitReq, now: u64, n: usize) -> Vec<Evaluation<BucketState>> {
        let mut state = None;
        (0..n)
            .map(|_| {
                let out = evaluate(limit, state, now, 1);
                if out.admitted {
                    state = Some(out.b());
                }
                out
            })
            .collect()
    }

    #[test]
    fn new_key_passes_even_without_burst() {
        let out = evaluate(&limit("1r/s", 0, DelayPolicy::After(0)), None, T0, 1);
        assert!(out.admitted);
        assert_eq!(out.delay_us, 0);
        assert_eq!(out.excess, 0.0);
    }

    #[test]
    fn burst5_nodelay_admits_six_then_rejects() {
        let outs = burst_at(&limit("1r/s", 5, DelayPolicy::NoDelay), T0, 7);
        assert!(outs[..6].iter().all(|o| o.admitted && o.delay_us == 0));
        assert!(!outs[6].admitted);
        assert_eq!(outs[6].retry_after_us, Some(SEC));
    }

    #[test]
    fn burst5_delay3_matches_nginx_table() {
        // nginx: r1-r4 at once, r5 and r6 delayed 1 s and 2 s, r7 rejected.
        let outs = burst_at(&limit("1r/s", 5, DelayPolicy::After(3)), T0, 7);
        let delays: Vec<_> = outs[..6].iter().map(|o| o.delay_us).collect();
        assert_eq!(delays, vec![0, 0, 0, 0, SEC, 2 * SEC]);
        assert!(outs[..6].iter().all(|o| o.admitted));
        assert!(!outs[6].admitted);
    }

    #[test]
    fn burst_alone_delays_every_excess_request() {
        let outs = burst_at(&limit("1r/s", 5, DelayPolicy::After(0)), T0, 7);
        let delays: Vec<_> = outs[..6].iter().map(|o| o.delay_us / SEC).collect();
        assert_eq!(delays, vec![0, 1, 2, 3, 4, 5]);
        assert!(!outs[6].admitted);
    }

    #[test]
    fn limit_req_delay_t_sequence() {
        // nginx's limit_req_delay.t: rate=30r/m burst=2 delay=1: pass, not yet delayed, delayed, rejected.
        let outs = burst_at(&limit("30r/m", 2, DelayPolicy::After(1)), T0, 4);
        assert!(outs[0].admitted && outs[0].delay_us == 0);
        assert!(outs[1].admitted && outs[1].delay_us == 0);
        assert!(outs[2].admitted && outs[2].delay_us == 2 * SEC);
        assert!(!outs[3].admitted);
    }

    #[test]
    fn rejected_requests_are_free() {
        let l = limit("1r/s", 0, DelayPolicy::NoDelay);
        let first = evaluate(&l, None, T0, 1);
        let mut state = first.b();
        for i in 1..100 {
            let out = evaluate(&l, Some(state), T0 + i * 1000, 1);
            assert!(!out.admitted);
            // The would-be state after a rejection is only drained, never charged.
            assert!(out.b().level <= state.level);
            state = out.b();
        }
        assert!(evaluate(&l, Some(first.b()), T0 + SEC, 1).admitted);
    }

    #[test]
    fn per_minute_and_per_hour_rates_are_exact() {
        let per_min = limit("1r/m", 0, DelayPolicy::NoDelay);
        let s = evaluate(&per_min, None, T0, 1).b();
        assert!(!evaluate(&per_min, Some(s), T0 + 60 * SEC - 1, 1).admitted);
        assert!(evaluate(&per_min, Some(s), T0 + 60 * SEC, 1).admitted);

        let per_hour = limit("5r/h", 0, DelayPolicy::NoDelay);
        let s = evaluate(&per_hour, None, T0, 1).b();
        assert!(!evaluate(&per_hour, Some(s), T0 + 720 * SEC - 1, 1).admitted);
        assert!(evaluate(&per_hour, Some(s), T0 + 720 * SEC, 1).admitted);
    }

    #[test]
    fn long_idle_gap_drains_fully() {
        let l = limit("10r/s", 20, DelayPolicy::NoDelay);
        let outs = burst_at(&l, T0, 21);
        let full = outs[20].b();
        assert_eq!(full.level, 21.0);
        let later = evaluate(&l, Some(full), T0 + 365 * 24 * 3600 * SEC, 1);
        assert!(later.admitted);
        assert_eq!(later.b().level, 1.0);
        assert_eq!(later.remaining, 20);
    }

    #[test]
    fn clock_going_backwards_never_drains_or_rewinds() {
        let l = limit("1r/s", 1, DelayPolicy::NoDelay);
        let s = evaluate(&l, None, T0, 1).b();
        let out = evaluate(&l, Some(s), T0 - 10 * SEC, 1);
        assert!(out.admitted);
        assert_eq!(out.b(), BucketState { level: 2.0, last_us: T0 });
    }

    #[test]
    fn at_its_expiry_a_state_equals_no_state_despite_float_residue() {
        let l = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate { count: 125, period_us: 60_000_000 },
            burst: 5,
            delay: DelayPolicy::NoDelay,
        };
        let s = BucketState { level: 2.6361375000000002, last_us: T0 };
        let expires = T0 + ceil_us(l.rate.time_for_us(s.level));
        assert_eq!(evaluate(&l, Some(s), expires, 0), evaluate(&l, None, expires, 0));
    }

    #[test]
    fn cost_counts_as_several_requests() {
        let l = limit("10r/s", 9, DelayPolicy::NoDelay);
        let a = evaluate(&l, None, T0, 6);
        assert!(a.admitted);
        assert_eq!(a.remaining, 4);
        let b = evaluate(&l, Some(a.b()), T0, 5);
        assert!(!b.admitted);
        // 1 request must drain at 10r/s: 100 ms.
        assert_eq!(b.retry_after_us, Some(100_000));
        let never = evaluate(&l, None, T0, 11);
        assert!(!never.admitted);
        assert_eq!(never.retry_after_us, None);
    }

    #[test]
    fn reset_is_time_to_drain() {
        let l = limit("10r/s", 20, DelayPolicy::NoDelay);
        let outs = burst_at(&l, T0, 3);
        assert_eq!(outs[2].reset_us, 300_000);
        assert_eq!(outs[2].remaining, 18);
    }
}
