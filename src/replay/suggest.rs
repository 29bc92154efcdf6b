//! `--suggest`: per `limit_req` reference, the smallest limit that keeps rejections under the
//! targets (a share of requests and a share of keys), found by replaying candidates through the
//! limit model (`limit::evaluate`, the function the memory store and `decide_all` use).
//!
//! Each reference is searched on its own traffic alone (the keyed requests it saw in the replay,
//! at the times they were decided): for each burst of a fixed ladder, a binary search over the
//! rate finds the lowest rate that meets the targets; the pair with the smallest allowance over
//! ten seconds (`burst + 10 s × rate`) wins. Window algorithms have no burst: their count is
//! searched over the zone's window. The delay policy is kept (a `delay` is capped at the new
//! burst): delay never changes what is rejected, only what waits. Per-key overrides keep their
//! own limits. A zone shared by several routes gets the largest rate any of them needs.

use std::collections::HashMap;

use super::hash::FastMap;
use super::replayer::Decision;
use crate::config::Runtime;
use crate::limit::{evaluate, DelayPolicy, LimitReq, Rate, State};

const BURSTS: [u64; 12] = [0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000];
const MAX_PER_SECOND: u64 = 1_000_000;
const MINUTE_US: u64 = 60_000_000;
const SECOND_US: u64 = 1_000_000;
/// The horizon over which candidates are compared: `burst + rate × 10 s`.
const HORIZON_S: f64 = 10.0;

/// The rejection targets, as fractions (0.001 for `0.1%`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Targets {
    pub max_rejected: f64,
    pub max_keys_hit: f64,
}

/// `0.1%` or `0.001`.
pub fn parse_share(text: &str) -> Result<f64, String> {
    let (number, scale) = match text.trim().strip_suffix('%') {
        Some(n) => (n, 100.0),
        None => (text.trim(), 1.0),
    };
    let v: f64 = number.parse().map_err(|_| format!("{text:?} is not a share like 0.1% or 0.001"))?;
    let share = v / scale;
    if !(0.0..=1.0).contains(&share) {
        return Err(format!("{text:?} is not between 0% and 100%"));
    }
    Ok(share)
}

#[derive(Debug, Clone, Copy)]
struct Event {
    at_us: u64,
    key: u32,
    cost: u64,
    /// An override's limit, kept as is.
    fixed: Option<LimitReq>,
}

#[derive(Default)]
struct Trace {
    events: Vec<Event>,
    keys: FastMap<Vec<u8>, u32>,
}

/// The keyed requests of every reference, recorded during the replay.
pub struct Collector {
    /// Per route, per reference.
    traces: Vec<Vec<Trace>>,
    base: Vec<Vec<LimitReq>>,
}

impl Collector {
    pub fn new(rt: &Runtime) -> Self {
        Collector {
            traces: rt.routes.iter().map(|r| r.limits.iter().map(|_| Trace::default()).collect()).collect(),
            base: rt.routes.iter().map(|r| r.limits.iter().map(|l| l.limit).collect()).collect(),
        }
    }

    pub fn observe(&mut self, d: &Decision, now_us: u64) {
        let Some(route) = d.route else { return };
        for z in &d.zones {
            let trace = &mut self.traces[route][z.reference];
            let next = trace.keys.len() as u32;
            let key = *trace.keys.entry(z.key.clone()).or_insert(next);
            let fixed = (z.limit != self.base[route][z.reference]).then_some(z.limit);
            trace.events.push(Event { at_us: now_us, key, cost: z.cost, fixed });
        }
    }
}

/// What a limit does to one reference's traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Eval {
    pub requests: u64,
    pub keys: u64,
    pub rejected: u64,
    pub keys_hit: u64,
    pub delayed: u64,
}

impl Eval {
    pub fn meets(&self, t: &Targets) -> bool {
        self.rejected as f64 <= t.max_rejected * self.requests as f64
            && self.keys_hit as f64 <= t.max_keys_hit * self.keys as f64
    }
}

fn eval(trace: &Trace, limit: &LimitReq) -> Eval {
    let mut states: Vec<Option<(State, u64)>> = vec![None; trace.keys.len()];
    let mut hit = vec![false; trace.keys.len()];
    let mut e = Eval { requests: trace.events.len() as u64, keys: trace.keys.len() as u64, ..Eval::default() };
    for ev in &trace.events {
        let limit = ev.fixed.as_ref().unwrap_or(limit);
        let slot = &mut states[ev.key as usize];
        // As the memory store: expired state is no state.
        let state = slot.as_ref().filter(|(_, exp)| *exp > ev.at_us).map(|(s, _)| s);
        let out = evaluate(limit, state, ev.at_us, ev.cost);
        if out.admitted {
            e.delayed += u64::from(out.delay_us > 0);
            *slot = Some((out.next, out.expires_us));
        } else {
            e.rejected += 1;
            hit[ev.key as usize] = true;
        }
    }
    e.keys_hit = hit.iter().filter(|h| **h).count() as u64;
    e
}

/// One reference's answer.
#[derive(Debug, Clone)]
pub struct Suggestion {
    pub route: usize,
    pub limit: usize,
    pub current: LimitReq,
    pub current_eval: Eval,
    /// `None`: no candidate meets the targets (e.g. simultaneous requests of one key beyond the
    /// largest burst tried).
    pub proposed: Option<(LimitReq, Eval)>,
}

pub struct Proposals {
    pub targets: Targets,
    pub suggestions: Vec<Suggestion>,
    /// The whole log replayed again with every proposal at once (zones all-or-nothing, as
    /// live), per suggestion in the same order; `None` when the input cannot be read twice (stdin).
    pub verified: Option<Vec<Eval>>,
}

/// Puts every proposal into `rt`: the zone's rate and the reference's limit.
pub fn apply(rt: &mut Runtime, outcome: &Proposals) {
    for s in &outcome.suggestions {
        if let Some((limit, _)) = &s.proposed {
            let zone = rt.routes[s.route].limits[s.limit].zone;
            rt.zones[zone].rate = limit.rate;
            rt.routes[s.route].limits[s.limit].limit = *limit;
        }
    }
}

/// What a replay with the proposals did to each suggestion's reference.
pub fn verify(stats: &super::stats::Stats, outcome: &Proposals) -> Vec<Eval> {
    outcome
        .suggestions
        .iter()
        .map(|s| {
            let r = &stats.routes[s.route].limits[s.limit];
            Eval {
                requests: r.requests,
                keys: r.keys.len() as u64,
                rejected: r.rejected,
                keys_hit: r.keys.values().filter(|k| k.rejected > 0).count() as u64,
                delayed: r.delayed,
            }
        })
        .collect()
}

/// The i-th rate of the ladder 1r/m … 59r/m, 1r/s … 1000000r/s (increasing).
fn bucket_rate(i: u64) -> Rate {
    if i < 59 {
        Rate { count: i + 1, period_us: MINUTE_US }
    } else {
        Rate { count: i - 58, period_us: SECOND_US }
    }
}

/// The smallest `i` in `0..len` for which `ok(i)`, assuming `ok` is monotone; `None` if not even the last.
fn lowest(len: u64, mut ok: impl FnMut(u64) -> bool) -> Option<u64> {
    if len == 0 || !ok(len - 1) {
        return None;
    }
    let (mut lo, mut hi) = (0, len - 1);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if ok(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo)
}

fn per_second(rate: &Rate) -> f64 {
    rate.count as f64 * SECOND_US as f64 / rate.period_us as f64
}

/// The delay policy kept, a `delay` no larger than the burst.
fn capped(delay: DelayPolicy, burst: u64) -> DelayPolicy {
    match delay {
        DelayPolicy::NoDelay => DelayPolicy::NoDelay,
        DelayPolicy::After(d) => DelayPolicy::After(d.min(burst)),
    }
}

fn search_one(trace: &Trace, current: &LimitReq, targets: &Targets) -> Option<(LimitReq, Eval)> {
    if current.algorithm.is_window() {
        let at = |count: u64| LimitReq { rate: Rate { count, period_us: current.rate.period_us }, ..*current };
        let i = lowest(MAX_PER_SECOND, |i| eval(trace, &at(i + 1)).meets(targets))?;
        let limit = at(i + 1);
        return Some((limit, eval(trace, &limit)));
    }
    let ladder = 59 + MAX_PER_SECOND;
    let mut best: Option<(f64, LimitReq, Eval)> = None;
    for burst in BURSTS {
        let at = |i: u64| LimitReq {
            algorithm: current.algorithm,
            rate: bucket_rate(i),
            burst,
            delay: capped(current.delay, burst),
        };
        let Some(i) = lowest(ladder, |i| eval(trace, &at(i)).meets(targets)) else { continue };
        let limit = at(i);
        let allowance = burst as f64 + HORIZON_S * per_second(&limit.rate);
        if best.as_ref().is_none_or(|(a, _, _)| allowance < *a) {
            best = Some((allowance, limit, eval(trace, &limit)));
        }
    }
    best.map(|(_, l, e)| (l, e))
}

pub fn search(rt: &Runtime, c: &Collector, targets: &Targets) -> Proposals {
    let mut suggestions = Vec::new();
    for (ri, route) in rt.routes.iter().enumerate() {
        for (li, zl) in route.limits.iter().enumerate() {
            let trace = &c.traces[ri][li];
            if trace.events.is_empty() {
                continue;
            }
            suggestions.push(Suggestion {
                route: ri,
                limit: li,
                current: zl.limit,
                current_eval: eval(trace, &zl.limit),
                proposed: search_one(trace, &zl.limit, targets),
            });
        }
    }
    // One rate per zone: the largest any reference needs (a higher rate never rejects more).
    let mut zone_rate: HashMap<usize, Rate> = HashMap::new();
    for s in &suggestions {
        if let Some((p, _)) = &s.proposed {
            let zone = rt.routes[s.route].limits[s.limit].zone;
            let r = zone_rate.entry(zone).or_insert(p.rate);
            if per_second(&p.rate) > per_second(r) {
                *r = p.rate;
            }
        }
    }
    for s in &mut suggestions {
        let zone = rt.routes[s.route].limits[s.limit].zone;
        if let (Some((p, e)), Some(rate)) = (s.proposed.as_mut(), zone_rate.get(&zone)) {
            if p.rate != *rate && !p.algorithm.is_window() {
                // At the zone's higher rate a smaller burst may do: the smallest that still meets.
                let trace = &c.traces[s.route][s.limit];
                let at = |burst: u64| LimitReq { rate: *rate, burst, delay: capped(p.delay, burst), ..*p };
                let burst = BURSTS.into_iter().find(|&b| b <= p.burst && eval(trace, &at(b)).meets(targets));
                *p = at(burst.unwrap_or(p.burst));
                *e = eval(trace, p);
            }
        }
    }
    Proposals { targets: *targets, suggestions, verified: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;

    fn trace(times_s: &[(f64, u32)]) -> Trace {
        let mut t = Trace::default();
        for &(at, key) in times_s {
            t.keys.entry(key.to_be_bytes().to_vec()).or_insert(key);
            t.events.push(Event { at_us: 1_700_000_000_000_000 + (at * 1e6) as u64, key, cost: 1, fixed: None });
        }
        t
    }

    fn leaky(rate: &str, burst: u64) -> LimitReq {
        LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse(rate).unwrap(),
            burst,
            delay: DelayPolicy::NoDelay,
        }
    }

    #[test]
    fn shares_parse() {
        assert_eq!(parse_share("0.1%"), Ok(0.001));
        assert_eq!(parse_share("0.02"), Ok(0.02));
        assert!(parse_share("120%").is_err());
        assert!(parse_share("lots").is_err());
    }

    #[test]
    fn eval_counts_rejections_and_keys() {
        // Key 0 at 0, 0.5, 1.0 under 1r/s burst 0: the middle one is rejected. Key 1 once.
        let t = trace(&[(0.0, 0), (0.5, 0), (1.0, 0), (0.2, 1)]);
        let mut sorted = t.events.clone();
        sorted.sort_by_key(|e| e.at_us);
        let t = Trace { events: sorted, keys: t.keys };
        let e = eval(&t, &leaky("1r/s", 0));
        assert_eq!((e.requests, e.keys, e.rejected, e.keys_hit), (4, 2, 1, 1));
    }

    #[test]
    fn finds_the_smallest_rate_for_a_steady_key() {
        // One key, a request every 100 ms for 10 s: 10r/s with burst 0 admits all; 9r/s does not.
        let times: Vec<(f64, u32)> = (0..100).map(|i| (i as f64 * 0.1, 0)).collect();
        let t = trace(&times);
        let zero = Targets { max_rejected: 0.0, max_keys_hit: 0.0 };
        let (best, e) = search_one(&t, &leaky("1r/s", 0), &zero).unwrap();
        assert_eq!(e.rejected, 0);
        assert!(eval(&t, &leaky("10r/s", 0)).meets(&zero));
        assert!(!eval(&t, &leaky("9r/s", 0)).meets(&zero));
        // The winner has the smallest allowance burst + 10 s × rate among all bursts: at most 100.
        assert!(best.burst as f64 + 10.0 * per_second(&best.rate) <= 100.0, "{best:?}");
    }

    #[test]
    fn simultaneous_requests_need_a_burst() {
        // 5 requests of one key at the same instant: only burst >= 4 admits all, whatever the rate.
        let t = trace(&[(0.0, 0); 5]);
        let zero = Targets { max_rejected: 0.0, max_keys_hit: 0.0 };
        let (best, _) = search_one(&t, &leaky("1r/s", 0), &zero).unwrap();
        assert_eq!((best.burst, best.rate), (5, Rate { count: 1, period_us: MINUTE_US }));
        let many = trace(&[(0.0, 0); 1002]);
        assert!(search_one(&many, &leaky("1r/s", 0), &zero).is_none());
    }
}
