//! The limit step of one request (nginx `limit_req`): its keyed zones go to the store, the verdict
//! becomes an action (forward, delay, reject), response headers and nginx-style statuses for logs
//! and metrics.
//!
//! Zones in dry run are decided in a separate atomic call from enforced ones, so a shadow limit
//! can never change what an enforced one decides (or charge it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::Histogram;

use super::bodies::Refusal;
use super::headers;
use super::policy::{self, Groups, Resolved};
use super::status::{LimitStatus, Statuses};
use crate::config::{Cost, FailurePolicy, HeaderMode, Route, Runtime};
use crate::keys::RequestFacts;
use crate::limit::{DelayPolicy, Verdict};
use crate::metrics::METRICS;
use crate::store::{KeyedZone, LimitStore, MemoryStore, StoreError};

/// The key step of limit_req: the route's zones that limit this request, each with its key,
/// effective limit, cost and dry-run flag, enforced ones first. Empty keys are not limited
/// (nginx's allow-list idiom), nor are keys an override exempts (`rate = "unlimited"`); a matching
/// override replaces the rate (and burst) for this key.
pub fn keyed_zones<'a>(rt: &'a Runtime, route: &Route, facts: &RequestFacts<'_>, cost: u64) -> Groups<KeyedZone<'a>> {
    let mut keyed = Vec::with_capacity(route.limits.len());
    for (i, zl) in route.limits.iter().enumerate() {
        let zone = &rt.zones[zl.zone];
        let Some(key) = policy::request_key(&zone.name, &zone.key, facts) else { continue };
        let mut limit = zl.limit;
        if let Some(o) = crate::request::override_for(zone, facts) {
            let Some(rate) = o.rate else { continue };
            limit.rate = rate;
            if let Some(burst) = o.burst {
                limit.burst = burst;
                if let DelayPolicy::After(d) = limit.delay {
                    limit.delay = DelayPolicy::After(d.min(burst));
                }
            }
        }
        keyed.push(KeyedZone { zone: &zone.name, key, limit, cost, dry_run: zl.dry_run, reference: i });
    }
    Groups::new(keyed)
}

pub enum Action<'a> {
    Forward,
    Delay(Duration),
    Reject { status: u16, refusal: Refusal<'a> },
}

pub struct Enforcement<'a> {
    pub action: Action<'a>,
    /// Rate-limit fields for the response (rejection or upstream's), per the route's header mode.
    pub headers: Vec<(&'static str, String)>,
    /// The request's status and its zones' (by index in `Runtime::zones`). Zones of a rejected
    /// request that did not reject are not listed (they were not charged).
    pub statuses: Statuses,
    /// The failure policy that decided, when the store could not.
    pub fallback: Option<FailurePolicy>,
    /// When the store decided (`Verdict::decided_us`); `None` when no store did.
    pub decided_us: Option<u64>,
}

/// The stores a decision can use: the configured one, and the in-process one of the `local`
/// failure policy (kept across reloads like the main store).
pub struct Stores {
    pub primary: Arc<dyn LimitStore>,
    pub local: MemoryStore,
    /// `weir_store_duration_seconds` of `primary`, looked up once rather than per decision.
    pub duration: Histogram,
}

impl Stores {
    pub fn new(primary: Arc<dyn LimitStore>, local: MemoryStore) -> Self {
        let duration = METRICS.store_duration.with_label_values(&[primary.kind()]);
        Self { primary, local, duration }
    }
}

pub async fn enforce<'a>(
    rt: &Runtime,
    route: &'a Route,
    keyed: &Groups<KeyedZone<'a>>,
    stores: &Stores,
) -> Enforcement<'a> {
    let store = stores.primary.as_ref();
    let (enforced, shadow) = (keyed.enforced(), keyed.shadow());
    let (enforced_result, shadow_result) =
        tokio::join!(timed_decide(store, enforced, &stores.duration), timed_decide(store, shadow, &stores.duration));

    let mut result = Enforcement {
        action: Action::Forward,
        headers: Vec::new(),
        statuses: Statuses::default(),
        fallback: None,
        decided_us: None,
    };
    let mut resolve =
        |r, dry_run| policy::resolve(r, rt, route, store.kind(), dry_run, route.status, &mut result.fallback);
    let shadow_verdict = match shadow_result.map(|r| resolve(r, true)) {
        Some(Resolved::Decided(v)) => Some(v),
        _ => None,
    };
    let enforced_verdict = match enforced_result.map(|r| resolve(r, false)) {
        None | Some(Resolved::Skipped) => None,
        Some(Resolved::Decided(v)) => Some(v),
        Some(Resolved::Local { fleet_size }) => {
            Some(stores.local.decide_now(&policy::fleet_shares(enforced, fleet_size)))
        }
        Some(Resolved::Denied(rejection)) => {
            result.statuses.overall = Some(LimitStatus::Rejected);
            result.headers = rejection.headers;
            result.action = Action::Reject { status: rejection.status, refusal: rejection.refusal };
            return result;
        }
    };
    result.decided_us = enforced_verdict.as_ref().or(shadow_verdict.as_ref()).map(|v| v.decided_us);
    if let Some(v) = &enforced_verdict {
        record_statuses(&mut result.statuses, route, enforced, v, false);
        crate::top::record(rt, enforced, v);
    }
    if let Some(v) = &shadow_verdict {
        record_statuses(&mut result.statuses, route, shadow, v, true);
    }

    if let Some(verdict) = &enforced_verdict {
        result.headers = match route.headers {
            HeaderMode::Draft => vec![
                ("RateLimit-Policy", headers::policy(enforced)),
                ("RateLimit", headers::remaining(enforced, verdict)),
            ],
            HeaderMode::Legacy => headers::legacy(enforced, verdict),
            HeaderMode::None => Vec::new(),
        };
        result.action = if !verdict.admitted {
            let zone = headers::rejecting_zone(enforced, verdict).unwrap_or("");
            let retry = verdict.retry_after_us.map(headers::retry_after_secs);
            if let Some(secs) = retry {
                result.headers.push(("Retry-After", secs.to_string()));
            }
            Action::Reject {
                status: route.status,
                refusal: Refusal::RateLimited { route: &route.name, zone, retry_after: retry },
            }
        } else if verdict.delay_us > 0 {
            Action::Delay(Duration::from_micros(verdict.delay_us))
        } else {
            Action::Forward
        };
    }
    result
}

/// One atomic store call for a group of zones, timed; `None` for an empty group (no round trip).
async fn timed_decide(
    store: &dyn LimitStore,
    group: &[KeyedZone<'_>],
    duration: &Histogram,
) -> Option<Result<Verdict, StoreError>> {
    if group.is_empty() {
        return None;
    }
    let started = Instant::now();
    let verdict = store.decide(group).await;
    duration.observe(started.elapsed().as_secs_f64());
    Some(verdict)
}

/// The nginx status words of one decided group (enforced or dry run); `weir replay` calls it too,
/// so replayed statuses are the live ones.
pub fn record_statuses(
    statuses: &mut Statuses,
    route: &Route,
    group: &[KeyedZone<'_>],
    verdict: &Verdict,
    dry_run: bool,
) {
    let zones = group
        .iter()
        .zip(&verdict.zones)
        .map(|(z, out)| (route.limits[z.reference].zone, out.admitted, out.delay_us > 0));
    statuses.record_group(verdict.admitted, dry_run, zones);
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
