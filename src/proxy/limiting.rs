//! The limit step of one request: its keyed zones go to the store, the verdict becomes an action
//! (forward, delay, reject), response headers and nginx-style statuses for logs and metrics.
//!
//! Zones in dry run are decided in a separate atomic call from enforced ones, so a shadow limit
//! can never change what an enforced one decides (or charge it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bodies;
use super::headers::{self, ZoneInfo};
use super::policy::{self, Fallback};
use crate::config::{Cost, FailurePolicy, HeaderMode, Route, Runtime};
use crate::keys::RequestFacts;
use crate::limit::{DelayPolicy, LimitReq, Rate, Verdict};
use crate::metrics::METRICS;
use crate::store::{LimitStore, MemoryStore, StoreError, ZoneCheck};

/// A zone of the route whose key for this request is not empty.
pub struct KeyedZone {
    /// Index into `route.limits`.
    pub limit: usize,
    pub key: Vec<u8>,
    /// The reference's limit, or a matching per-key override of it.
    pub params: LimitReq,
    pub cost: u64,
}

/// The route's zones that limit this request, with their keys: empty keys are not limited
/// (nginx's allow-list idiom), nor are keys an override exempts (`rate = "unlimited"`); a
/// matching override replaces the rate (and burst) for this key.
pub fn keyed_zones(rt: &Runtime, route: &Route, facts: &RequestFacts<'_>, cost: u64) -> Vec<KeyedZone> {
    let mut keyed = Vec::with_capacity(route.limits.len());
    for (i, zl) in route.limits.iter().enumerate() {
        let zone = &rt.zones[zl.zone];
        let key = zone.key.extract(facts);
        if key.is_empty() {
            METRICS.empty_keys.with_label_values(&[&zone.name]).inc();
            continue;
        }
        let mut params = zl.limit;
        if let Some(o) = crate::request::override_for(zone, facts) {
            let Some(rate) = o.rate else { continue };
            params.rate = rate;
            if let Some(burst) = o.burst {
                params.burst = burst;
                if let DelayPolicy::After(d) = params.delay {
                    params.delay = DelayPolicy::After(d.min(burst));
                }
            }
        }
        keyed.push(KeyedZone { limit: i, key, params, cost });
    }
    keyed
}

/// nginx's `$limit_req_status` words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitStatus {
    Passed,
    Delayed,
    Rejected,
    DelayedDryRun,
    RejectedDryRun,
}

impl LimitStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitStatus::Passed => "PASSED",
            LimitStatus::Delayed => "DELAYED",
            LimitStatus::Rejected => "REJECTED",
            LimitStatus::DelayedDryRun => "DELAYED_DRY_RUN",
            LimitStatus::RejectedDryRun => "REJECTED_DRY_RUN",
        }
    }

    pub fn metric_label(self) -> &'static str {
        match self {
            LimitStatus::Passed => "passed",
            LimitStatus::Delayed => "delayed",
            LimitStatus::Rejected => "rejected",
            LimitStatus::DelayedDryRun => "delayed_dry_run",
            LimitStatus::RejectedDryRun => "rejected_dry_run",
        }
    }

    /// Which of two statuses describes the request as a whole: enforcement beats dry run,
    /// rejection beats delay beats pass.
    fn severity(self) -> u8 {
        match self {
            LimitStatus::Passed => 0,
            LimitStatus::DelayedDryRun => 1,
            LimitStatus::RejectedDryRun => 2,
            LimitStatus::Delayed => 3,
            LimitStatus::Rejected => 4,
        }
    }
}

pub enum Action {
    Forward,
    Delay(Duration),
    Reject { status: u16, body: String },
}

pub struct Enforcement {
    pub action: Action,
    /// Rate-limit fields for the response (rejection or upstream's), per the route's header mode.
    pub headers: Vec<(&'static str, String)>,
    /// The request's overall status; `None` when no zone had a key (nginx leaves it unset).
    pub status: Option<LimitStatus>,
    /// Per zone of the route: (zone index, status). Zones of a rejected request that did not
    /// reject are not listed (they were not charged).
    pub zones: Vec<(usize, LimitStatus)>,
    /// The failure policy that decided, when the store could not.
    pub fallback: Option<FailurePolicy>,
}

/// The stores a decision can use: the configured one, and the in-process one of the `local`
/// failure policy (kept across reloads like the main store).
pub struct Stores {
    pub primary: Arc<dyn LimitStore>,
    pub local: MemoryStore,
}

pub async fn enforce(rt: &Runtime, route: &Route, keyed: &[KeyedZone], stores: &Stores) -> Enforcement {
    let store = stores.primary.as_ref();
    let (shadow, enforced) = policy::split_dry_run(keyed, |k| route.limits[k.limit].dry_run);
    let enforced_checks = checks(rt, route, &enforced);
    let shadow_checks = checks(rt, route, &shadow);
    let (enforced_verdict, shadow_verdict) =
        tokio::join!(timed_decide(store, &enforced_checks), timed_decide(store, &shadow_checks));

    let mut result =
        Enforcement { action: Action::Forward, headers: Vec::new(), status: None, zones: Vec::new(), fallback: None };
    let shadow_verdict = match shadow_verdict {
        Some(Err(e)) => {
            policy::on_store_error(rt, route, store.kind(), &e, true, route.status);
            None
        }
        other => other.and_then(Result::ok),
    };
    let enforced_verdict = match enforced_verdict {
        Some(Err(e)) => match policy::on_store_error(rt, route, store.kind(), &e, false, route.status) {
            None | Some((_, Fallback::Allow)) => {
                result.fallback = Some(FailurePolicy::Allow);
                None
            }
            Some((policy, Fallback::Deny(rejection))) => {
                result.fallback = Some(policy);
                result.status = Some(LimitStatus::Rejected);
                result.headers = rejection.headers;
                result.action = Action::Reject { status: rejection.status, body: rejection.body };
                return result;
            }
            Some((policy, Fallback::Local { fleet_size })) => {
                result.fallback = Some(policy);
                let local_checks: Vec<ZoneCheck<'_>> = enforced_checks
                    .iter()
                    .map(|c| ZoneCheck { limit: fleet_share(&c.limit, fleet_size), ..*c })
                    .collect();
                Some(stores.local.decide_now(&local_checks))
            }
        },
        other => other.and_then(Result::ok),
    };
    if let Some(v) = &enforced_verdict {
        record_statuses(&mut result, route, &enforced, v, false);
    }
    if let Some(v) = &shadow_verdict {
        record_statuses(&mut result, route, &shadow, v, true);
    }

    if let Some(verdict) = &enforced_verdict {
        let infos: Vec<ZoneInfo<'_>> =
            enforced_checks.iter().map(|c| ZoneInfo { name: c.zone, limit: &c.limit, cost: c.cost }).collect();
        result.headers = match route.headers {
            HeaderMode::Draft => {
                vec![("RateLimit-Policy", headers::policy(&infos)), ("RateLimit", headers::remaining(&infos, verdict))]
            }
            HeaderMode::Legacy => headers::legacy(&infos, verdict),
            HeaderMode::None => Vec::new(),
        };
        result.action = if !verdict.admitted {
            let zone = headers::rejecting_zone(&infos, verdict).unwrap_or("");
            let retry = verdict.retry_after_us.map(headers::retry_after_secs);
            if let Some(secs) = retry {
                result.headers.push(("Retry-After", secs.to_string()));
            }
            Action::Reject { status: route.status, body: bodies::rate_limited(&route.name, zone, retry) }
        } else if verdict.delay_us > 0 {
            Action::Delay(Duration::from_micros(verdict.delay_us))
        } else {
            Action::Forward
        };
    }
    result
}

/// The store's view of a group of keyed zones (also used by `weir replay`).
pub fn checks<'a>(rt: &'a Runtime, route: &'a Route, group: &[&'a KeyedZone]) -> Vec<ZoneCheck<'a>> {
    group
        .iter()
        .map(|k| {
            let zl = &route.limits[k.limit];
            ZoneCheck { zone: &rt.zones[zl.zone].name, key: &k.key, limit: k.params, cost: k.cost }
        })
        .collect()
}

/// One atomic store call for a group of zones, timed; `None` for an empty group (no round trip).
async fn timed_decide(store: &dyn LimitStore, checks: &[ZoneCheck<'_>]) -> Option<Result<Verdict, StoreError>> {
    if checks.is_empty() {
        return None;
    }
    let started = Instant::now();
    let verdict = store.decide(checks).await;
    METRICS.store_duration.with_label_values(&[store.kind()]).observe(started.elapsed().as_secs_f64());
    Some(verdict)
}

/// The nginx status words of one decided group (enforced or dry run) into `result`; `weir replay`
/// calls it too, so replayed statuses are the live ones.
pub fn record_statuses(
    result: &mut Enforcement,
    route: &Route,
    group: &[&KeyedZone],
    verdict: &Verdict,
    dry_run: bool,
) {
    for (k, out) in group.iter().zip(&verdict.zones) {
        let status = match (verdict.admitted, out.admitted, out.delay_us > 0, dry_run) {
            (_, false, _, false) => LimitStatus::Rejected,
            (_, false, _, true) => LimitStatus::RejectedDryRun,
            // Another zone rejected: this one was not charged and has no say.
            (false, true, _, _) => continue,
            (true, true, true, false) => LimitStatus::Delayed,
            (true, true, true, true) => LimitStatus::DelayedDryRun,
            (true, true, false, _) => LimitStatus::Passed,
        };
        result.zones.push((route.limits[k.limit].zone, status));
        if result.status.is_none_or(|s| status.severity() > s.severity()) {
            result.status = Some(status);
        }
    }
    if !dry_run && verdict.admitted && verdict.delay_us == 0 && result.status.is_none() {
        result.status = Some(LimitStatus::Passed);
    }
}

/// This instance's share of a fleet-wide limit: a bucket's rate divided exactly (the period
/// stretched N times), a window's count divided (rounded down, at least 1) over the same window,
/// burst and delay divided and rounded down. Approximate by nature: traffic is rarely spread
/// evenly over the fleet.
fn fleet_share(limit: &LimitReq, fleet_size: u64) -> LimitReq {
    let n = fleet_size.max(1);
    let rate = if limit.algorithm.is_window() {
        Rate { count: (limit.rate.count / n).max(1), period_us: limit.rate.period_us }
    } else {
        Rate { count: limit.rate.count, period_us: limit.rate.period_us * n }
    };
    LimitReq {
        algorithm: limit.algorithm,
        rate,
        burst: limit.burst / n,
        delay: match limit.delay {
            DelayPolicy::NoDelay => DelayPolicy::NoDelay,
            DelayPolicy::After(d) => DelayPolicy::After(d / n),
        },
    }
}

/// The cost of a request: the route's `cost`, or the value of its `cost_header` clamped to
/// `min_cost`..`max_cost`. A header that is not a non-negative integer is the client's error (400).
pub fn request_cost(cost: &Cost, headers: &http::HeaderMap) -> std::result::Result<u64, String> {
    let Some(name) = &cost.header else { return Ok(cost.default) };
    let Some(value) = headers.get(name) else { return Ok(cost.default) };
    let text = std::str::from_utf8(value.as_bytes()).map_err(|_| format!("{name} is not a number"))?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{name} must be a non-negative integer"));
    }
    // All digits: only overflow can fail, and an overflowing cost is clamped like any large one.
    Ok(text.parse::<u64>().unwrap_or(u64::MAX).clamp(cost.min, cost.max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_from_header_is_validated_and_clamped() {
        let cost = Cost { default: 2, header: Some(http::HeaderName::from_static("x-cost")), max: 10, min: 1 };
        let mut h = http::HeaderMap::new();
        assert_eq!(request_cost(&cost, &h), Ok(2));
        h.insert("x-cost", http::HeaderValue::from_static("7"));
        assert_eq!(request_cost(&cost, &h), Ok(7));
        h.insert("x-cost", http::HeaderValue::from_static("99999999999999999999999"));
        assert_eq!(request_cost(&cost, &h), Ok(10));
        h.insert("x-cost", http::HeaderValue::from_static("0"));
        assert_eq!(request_cost(&cost, &h), Ok(1), "min_cost: zero is not free");
        for bad in ["-1", "1.5", "abc", "", " "] {
            h.insert("x-cost", http::HeaderValue::from_static(bad));
            assert!(request_cost(&cost, &h).is_err(), "{bad:?}");
        }
        let fixed = Cost { default: 5, header: None, max: 100, min: 1 };
        assert_eq!(request_cost(&fixed, &h), Ok(5));
    }
}
