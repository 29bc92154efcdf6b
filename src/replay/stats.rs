//! What a replay did, counted per route and per `limit_req` reference (route + zone), per key,
//! and per second per zone (offered vs admitted).

use std::collections::BTreeMap;

use super::hash::FastMap;

use super::replayer::Decision;
use crate::config::Runtime;
use crate::engine::LimitStatus;
use crate::engine::Outcome;

/// One key of one zone reference.
#[derive(Debug, Clone, Default)]
pub struct KeyStats {
    pub requests: u64,
    pub rejected: u64,
    /// Requests in the busiest second (peak rate, r/s).
    pub peak: u32,
    second: u64,
    in_second: u32,
}

/// One `limit_req` reference of a route.
#[derive(Debug, Clone, Default)]
pub struct RefStats {
    /// Requests with a key for this zone.
    pub requests: u64,
    pub passed: u64,
    pub delayed: u64,
    pub rejected: u64,
    /// Another zone of the route rejected the request; this one was not charged.
    pub not_charged: u64,
    /// This zone's delays of delayed requests (µs).
    pub delays: Vec<u64>,
    pub keys: FastMap<Vec<u8>, KeyStats>,
}

/// One `limit_conn` reference, estimated from durations.
#[derive(Debug, Clone, Default)]
pub struct ConnStats {
    pub requests: u64,
    pub rejected: u64,
    /// Per key: the most requests in flight at once and whether it was ever full.
    pub keys: FastMap<Vec<u8>, (u32, bool)>,
}

#[derive(Debug, Clone, Default)]
pub struct RouteStats {
    pub requests: u64,
    pub denied: u64,
    pub bad_cost: u64,
    /// Refused with 401: a zone keyed on a JWT claim, and no valid token.
    pub unauthorized: u64,
    /// Refused with 400 once routed (a key given twice with different values).
    pub bad_request: u64,
    /// No zone of the route had a key (or every key was exempt).
    pub unlimited: u64,
    pub passed: u64,
    pub delayed: u64,
    pub rejected: u64,
    pub limits: Vec<RefStats>,
    pub conns: Vec<ConnStats>,
}

/// Per second: (offered, admitted).
pub type Series = BTreeMap<u64, (u64, u64)>;

#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub requests: u64,
    pub no_route: u64,
    /// Refused with 400 before a route was known (target, host, method, headers).
    pub bad_request: u64,
    pub first_us: Option<u64>,
    pub last_us: Option<u64>,
    pub routes: Vec<RouteStats>,
    /// Per zone (index into `Runtime::zones`).
    pub series: Vec<Series>,
    /// Entries in the per-key tables of every reference (`RefStats::keys`, `ConnStats::keys`):
    /// what bounds the replay's memory (`--max-keys`).
    pub keys: u64,
}

impl Stats {
    pub fn new(rt: &Runtime) -> Self {
        let routes = rt
            .routes
            .iter()
            .map(|r| RouteStats {
                limits: vec![RefStats::default(); r.limits.len()],
                conns: vec![ConnStats::default(); r.conn_limits.len()],
                ..RouteStats::default()
            })
            .collect();
        Stats { routes, series: vec![Series::new(); rt.zones.len()], ..Stats::default() }
    }

    pub fn record(&mut self, rt: &Runtime, d: &Decision, now_us: u64) {
        self.requests += 1;
        self.first_us = Some(self.first_us.map_or(now_us, |f| f.min(now_us)));
        self.last_us = Some(self.last_us.map_or(now_us, |l| l.max(now_us)));
        let Some(ri) = d.route else {
            match d.outcome {
                Outcome::BadRequest => self.bad_request += 1,
                _ => self.no_route += 1,
            }
            return;
        };
        let route = &mut self.routes[ri];
        route.requests += 1;
        match d.outcome {
            Outcome::Denied => route.denied += 1,
            Outcome::BadRequest if d.bad_cost => route.bad_cost += 1,
            Outcome::Unauthorized => route.unauthorized += 1,
            Outcome::BadRequest => route.bad_request += 1,
            _ => {}
        }
        if !d.limited() {
            return;
        }
        match d.status {
            None => route.unlimited += 1,
            Some(LimitStatus::Passed | LimitStatus::DelayedDryRun | LimitStatus::RejectedDryRun) => route.passed += 1,
            Some(LimitStatus::Delayed) => route.delayed += 1,
            Some(LimitStatus::Rejected) => route.rejected += 1,
        }
        for c in &d.conns {
            let s = &mut route.conns[c.limit];
            s.requests += 1;
            s.rejected += u64::from(c.rejected);
            let key = match s.keys.get_mut(&c.key) {
                Some(k) => k,
                None => {
                    self.keys += 1;
                    s.keys.entry(c.key.clone()).or_default()
                }
            };
            key.0 = key.0.max(c.in_flight + u32::from(!c.rejected));
            key.1 |= c.rejected;
        }
        let second = now_us / 1_000_000;
        for z in &d.zones {
            let s = &mut route.limits[z.reference];
            s.requests += 1;
            let rejected = matches!(z.status, Some(LimitStatus::Rejected | LimitStatus::RejectedDryRun));
            match z.status {
                None => s.not_charged += 1,
                Some(LimitStatus::Passed) => s.passed += 1,
                Some(LimitStatus::Delayed | LimitStatus::DelayedDryRun) => {
                    s.delayed += 1;
                    s.delays.push(z.delay_us);
                }
                Some(LimitStatus::Rejected | LimitStatus::RejectedDryRun) => s.rejected += 1,
            }
            let key = match s.keys.get_mut(&z.key) {
                Some(k) => k,
                None => {
                    self.keys += 1;
                    s.keys.entry(z.key.clone()).or_default()
                }
            };
            key.requests += 1;
            key.rejected += u64::from(rejected);
            if key.second != second || key.in_second == 0 {
                key.second = second;
                key.in_second = 0;
            }
            key.in_second += 1;
            key.peak = key.peak.max(key.in_second);
            let admitted = !rejected && z.status.is_some();
            let point = self.series[rt.routes[ri].limits[z.reference].zone].entry(second).or_default();
            point.0 += 1;
            point.1 += u64::from(admitted);
        }
    }
}

/// Nearest-rank percentile of sorted values (0 for none).
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }
}
