//! The concurrency step of one request (nginx `limit_conn`, after `limit_req`): take a lease in
//! every conn zone of the route, all or none, or reject with `limit_conn_status`. Dry-run zones
//! are asked apart: a would-be rejection passes without a lease, as in nginx.

use std::sync::Arc;

use super::dry_run::Groups;
use super::fleet_share::fleet_shares;
use super::lease::{new_lease_id, Lease};
use super::refusal::{Answer, Refusal};
use super::status::Statuses;
use super::store_failure::{self, Resolved};
use super::stores::ConnStores;
use crate::config::{FailurePolicy, Route, Runtime};
use crate::store::{ConnStore, KeyedConn, LeaseKey};

pub struct ConnOutcome<'a> {
    /// Leases to hold until the request ends (one per group of zones asked together).
    pub leases: Vec<Lease>,
    /// Set when the request must be rejected.
    pub reject: Option<Answer<'a>>,
    /// Per conn zone (by index in `Runtime::conn_zones`), and the worst of them.
    pub statuses: Statuses,
    pub fallback: Option<FailurePolicy>,
}

pub async fn acquire<'a>(
    rt: &Runtime,
    route: &'a Route,
    keyed: &Groups<KeyedConn<'a>>,
    stores: &ConnStores,
) -> ConnOutcome<'a> {
    let mut outcome = ConnOutcome { leases: Vec::new(), reject: None, statuses: Statuses::default(), fallback: None };
    // Enforced first: a request they reject takes no shadow lease either.
    for (group, dry_run) in keyed.each() {
        if group.is_empty() {
            continue;
        }
        let lease_id = new_lease_id();
        let result = stores.primary.acquire(group, &lease_id).await;
        let resolved = store_failure::resolve(
            result,
            rt,
            route,
            stores.kind,
            dry_run,
            route.conn_status,
            &mut outcome.fallback,
            stores.observer,
        );
        let (verdict, store): (_, Arc<dyn ConnStore>) = match resolved {
            Resolved::Decided(v) => (v, stores.primary.clone()),
            Resolved::Skipped => continue,
            Resolved::Denied(answer) => {
                outcome.reject = Some(answer);
                return outcome;
            }
            Resolved::Local { fleet_size } => {
                (stores.local.acquire_now(&fleet_shares(group, fleet_size)), stores.local.clone())
            }
        };
        let zones = group
            .iter()
            .enumerate()
            .map(|(i, z)| (route.conn_limits[z.reference].zone, verdict.rejected != Some(i), false));
        outcome.statuses.record_group(verdict.admitted, dry_run, zones);
        if !verdict.admitted && !dry_run {
            // The full zone the store names answers.
            if let Some(full) = verdict.rejected.and_then(|i| group.get(i)) {
                outcome.reject = Some(rejection(route, full));
                return outcome;
            }
        }
        if verdict.admitted {
            let keys = group.iter().map(|z| LeaseKey { zone: z.zone.to_string(), key: z.key.clone() }).collect();
            outcome.leases.push(Lease::hold(store, keys, lease_id, stores.observer, &stores.keeper));
        }
    }
    outcome
}

/// limit_conn's answer for a full zone: `limit_conn_status`, the cap in the RateLimit fields.
fn rejection<'a>(route: &'a Route, full: &KeyedConn<'a>) -> Answer<'a> {
    let own_body = route.rejection.as_ref();
    let refusal = Refusal::TooManyConcurrent { route: &route.name, zone: full.zone, max: full.max, own_body };
    Answer::new(route.conn_status, refusal)
        .for_grpc(route.grpc_status)
        .with_header("RateLimit-Policy", format!("\"{}\";q={};qu=\"concurrent-requests\"", full.zone, full.max))
        .with_header("RateLimit", format!("\"{}\";r=0", full.zone))
        // When a slot frees is unknown: ask for a short wait (the IETF draft's advice).
        .with_header("Retry-After", "1")
}
