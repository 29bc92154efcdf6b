//! Several `limit_req` zones on one request, decided all-or-nothing like nginx: if any zone rejects,
//! no zone is charged; otherwise every zone is charged and the largest delay wins.

use super::{charge, evaluate, LimitReq, State, ZoneOutcome};

/// One zone's part of a request: its parameters, the key's current state and the request's cost.
#[derive(Debug, Clone)]
pub struct ZoneInput<'a> {
    pub limit: &'a LimitReq,
    pub state: Option<State>,
    pub cost: u64,
}

/// The decision for a whole request.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub admitted: bool,
    /// The largest delay of all zones (0 when rejected).
    pub delay_us: u64,
    /// When rejected: the largest retry time among the rejecting zones; `None` if one of them can
    /// never admit the request.
    pub retry_after_us: Option<u64>,
    /// Per zone, in the order given.
    pub zones: Vec<ZoneOutcome>,
    /// The store's time of the decision (µs since the epoch; Redis's clock for the Redis store).
    /// The access log writes it as `decided_us` and `weir replay` orders requests by it: the
    /// order the store decided in, which the proxy's own clock readings may not show.
    pub decided_us: u64,
}

impl Verdict {
    /// The states to store: `Some` only when the request was admitted (rejections are free).
    pub fn states_to_store(&self) -> Option<impl Iterator<Item = &State>> {
        self.admitted.then(|| self.zones.iter().map(|z| &z.next))
    }
}

pub fn decide_all(inputs: &[ZoneInput<'_>], now_us: u64) -> Verdict {
    let zones: Vec<ZoneOutcome> = inputs.iter().map(|z| evaluate(z.limit, z.state.as_ref(), now_us, z.cost)).collect();
    Verdict::combine(zones, now_us)
}

/// Charges every zone after the response (`state::charge`): all admitted unless a zone is not
/// a leaky bucket and has no room; then, as for a request, none is charged.
pub fn charge_all(inputs: &[ZoneInput<'_>], now_us: u64) -> Verdict {
    let zones: Vec<ZoneOutcome> = inputs.iter().map(|z| charge(z.limit, z.state.as_ref(), now_us, z.cost)).collect();
    Verdict::combine(zones, now_us)
}

impl Verdict {
    /// The request's verdict from its zones' outcomes: admitted only if every zone admits, the
    /// largest delay, and when rejected the largest retry of the rejecting zones (`None` if one
    /// of them never admits). Also used by stores that decide zones in several calls.
    pub fn combine(zones: Vec<ZoneOutcome>, decided_us: u64) -> Verdict {
        let admitted = zones.iter().all(|z| z.admitted);
        let (delay_us, retry_after_us) = if admitted {
            (zones.iter().map(|z| z.delay_us).max().unwrap_or(0), None)
        } else {
            let mut retry = Some(0);
            for z in zones.iter().filter(|z| !z.admitted) {
                retry = match (retry, z.retry_after_us) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
            }
            (0, retry)
        };
        Verdict { admitted, delay_us, retry_after_us, zones, decided_us }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, BucketState, DelayPolicy, Rate};

    const T0: u64 = 1_700_000_000_000_000;

    #[test]
    fn a_rejection_in_one_zone_charges_none() {
        let loose = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("100r/s").unwrap(),
            burst: 100,
            delay: DelayPolicy::NoDelay,
        };
        let tight = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("1r/s").unwrap(),
            burst: 0,
            delay: DelayPolicy::NoDelay,
        };
        let first = decide_all(
            &[ZoneInput { limit: &loose, state: None, cost: 1 }, ZoneInput { limit: &tight, state: None, cost: 1 }],
            T0,
        );
        assert!(first.admitted);
        let loose_state = first.zones[0].next.clone();
        let second = decide_all(
            &[
                ZoneInput { limit: &loose, state: Some(loose_state.clone()), cost: 1 },
                ZoneInput { limit: &tight, state: Some(first.zones[1].next.clone()), cost: 1 },
            ],
            T0,
        );
        assert!(!second.admitted);
        assert!(second.states_to_store().is_none());
        assert!(second.zones[0].admitted, "the loose zone alone would admit");
        assert_eq!(second.retry_after_us, Some(1_000_000));
    }

    #[test]
    fn the_largest_delay_wins() {
        let a = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("1r/s").unwrap(),
            burst: 5,
            delay: DelayPolicy::After(0),
        };
        let b = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("2r/s").unwrap(),
            burst: 5,
            delay: DelayPolicy::After(0),
        };
        let sa = State::Bucket(BucketState { level: 2.0, last_us: T0 });
        let v = decide_all(
            &[
                ZoneInput { limit: &a, state: Some(sa.clone()), cost: 1 },
                ZoneInput { limit: &b, state: Some(sa), cost: 1 },
            ],
            T0,
        );
        assert!(v.admitted);
        assert_eq!(v.delay_us, 2_000_000);
    }

    #[test]
    fn no_zones_admits() {
        let v = decide_all(&[], T0);
        assert!(v.admitted && v.delay_us == 0);
    }
}
