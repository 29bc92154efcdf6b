//! The concurrency step of one request (nginx `limit_conn`, after `limit_req`): take a lease in
//! every conn zone of the route, all or none, or reject with `limit_conn_status`. Dry-run zones
//! are asked apart: a would-be rejection passes without a lease, as in nginx.

use std::sync::Arc;

use super::bodies;
use super::lease::{new_lease_id, Lease};
use super::limiting::LimitStatus;
use super::policy::{self, Fallback, Rejection};
use crate::config::{FailurePolicy, Route, Runtime};
use crate::keys::RequestFacts;
use crate::metrics::METRICS;
use crate::store::{ConnCheck, ConnStore, LeaseKey, MemoryConnStore};

/// A conn zone of the route whose key for this request is not empty.
pub struct KeyedConn {
    /// Index into `route.conn_limits`.
    pub limit: usize,
    pub key: Vec<u8>,
}

/// The route's conn zones whose key for this request is not empty (empty keys are not limited).
pub fn keyed_conns(rt: &Runtime, route: &Route, facts: &RequestFacts<'_>) -> Vec<KeyedConn> {
    let mut keyed = Vec::with_capacity(route.conn_limits.len());
    for (i, cl) in route.conn_limits.iter().enumerate() {
        let zone = &rt.conn_zones[cl.zone];
        let key = zone.key.extract(facts);
        if key.is_empty() {
            METRICS.empty_keys.with_label_values(&[&zone.name]).inc();
        } else {
            keyed.push(KeyedConn { limit: i, key });
        }
    }
    keyed
}

pub struct ConnStores {
    pub primary: Arc<dyn ConnStore>,
    /// The store's kind for metrics and logs (`memory`, `redis`, …).
    pub kind: &'static str,
    /// The `local` failure policy's in-process counters.
    pub local: Arc<MemoryConnStore>,
}

pub struct ConnOutcome {
    /// Leases to hold until the request ends (one per group of zones asked together).
    pub leases: Vec<Lease>,
    /// Set when the request must be rejected.
    pub reject: Option<Rejection>,
    /// Per conn zone: (conn zone index, status).
    pub zones: Vec<(usize, LimitStatus)>,
    pub fallback: Option<FailurePolicy>,
}

pub async fn acquire(rt: &Runtime, route: &Route, keyed: &[KeyedConn], stores: &ConnStores) -> ConnOutcome {
    let mut outcome = ConnOutcome { leases: Vec::new(), reject: None, zones: Vec::new(), fallback: None };
    let (shadow, enforced) = policy::split_dry_run(keyed, |k| route.conn_limits[k.limit].dry_run);
    // Enforced first: a request they reject takes no shadow lease either.
    for (group, dry_run) in [(enforced, false), (shadow, true)] {
        if group.is_empty() {
            continue;
        }
        let checks: Vec<ConnCheck<'_>> = group
            .iter()
            .map(|k| {
                let limit = &route.conn_limits[k.limit];
                ConnCheck { zone: &rt.conn_zones[limit.zone].name, key: &k.key, max: limit.max }
            })
            .collect();
        let lease_id = new_lease_id();
        let mut store: Arc<dyn ConnStore> = stores.primary.clone();
        let verdict = match stores.primary.acquire(&checks, &lease_id).await {
            Ok(v) => v,
            Err(e) => match policy::on_store_error(rt, route, stores.kind, &e, dry_run, route.conn_status) {
                None => continue,
                Some((policy, fallback)) => {
                    outcome.fallback = Some(policy);
                    match fallback {
                        Fallback::Allow => continue,
                        Fallback::Deny(rejection) => {
                            outcome.reject = Some(rejection);
                            return outcome;
                        }
                        Fallback::Local { fleet_size } => {
                            // This instance's share of each cap, at least one request.
                            let local: Vec<ConnCheck<'_>> = checks
                                .iter()
                                .map(|c| ConnCheck { max: (c.max as u64 / fleet_size).max(1) as u32, ..*c })
                                .collect();
                            store = stores.local.clone();
                            stores.local.acquire_now(&local)
                        }
                    }
                }
            },
        };
        for (i, (k, c)) in group.iter().zip(&checks).enumerate() {
            let status = match (verdict.admitted, verdict.rejected == Some(i), dry_run) {
                (true, _, _) => LimitStatus::Passed,
                (false, true, false) => LimitStatus::Rejected,
                (false, true, true) => LimitStatus::RejectedDryRun,
                // Another zone was full: this one took nothing and had no say.
                (false, false, _) => continue,
            };
            outcome.zones.push((route.conn_limits[k.limit].zone, status));
            if !verdict.admitted && !dry_run {
                let body = bodies::too_many_concurrent(&route.name, c.zone, c.max);
                let headers = vec![
                    ("RateLimit-Policy", format!("\"{}\";q={};qu=\"concurrent-requests\"", c.zone, c.max)),
                    ("RateLimit", format!("\"{}\";r=0", c.zone)),
                    // When a slot frees is unknown: ask for a short wait (the IETF draft's advice).
                    ("Retry-After", "1".to_string()),
                ];
                outcome.reject = Some(Rejection { status: route.conn_status, body, headers });
            }
        }
        if outcome.reject.is_some() {
            return outcome;
        }
        if verdict.admitted {
            let keys = checks.iter().map(|c| LeaseKey { zone: c.zone.to_string(), key: c.key.to_vec() }).collect();
            outcome.leases.push(Lease::hold(store, keys, lease_id));
        }
    }
    outcome
}
