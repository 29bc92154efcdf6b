//! What a failed store call becomes: the failure is counted and (at most once a second) logged,
//! then the route's failure policy (`on_error`: allow, deny, local) decides an enforced group.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::warn;

use super::observe::Observer;
use super::refusal::{Answer, Refusal};
use crate::config::{FailurePolicy, Route, Runtime, StoreSettings};
use crate::store::StoreError;

/// What became of one group's store call once the failure policy had its say.
pub enum Resolved<'a, V> {
    /// The store decided.
    Decided(V),
    /// No say in this request: a failed shadow group, or `allow`.
    Skipped,
    /// `deny`: reject with the route's status for this kind of limit.
    Denied(Answer<'a>),
    /// `local`: decide in process with `fleet_shares` of the group.
    Local { fleet_size: u64 },
}

/// One group's store result through the failure policy: a store error is counted and (at most
/// once a second) logged; for an enforced group the route's policy then decides, and `fallback`
/// records which one did. A failed shadow group only costs the report.
#[allow(clippy::too_many_arguments)] // the decision's context, each read once
pub fn resolve<'a, V>(
    result: Result<V, StoreError>,
    rt: &Runtime,
    route: &'a Route,
    store_kind: &'static str,
    dry_run: bool,
    reject_status: u16,
    fallback: &mut Option<FailurePolicy>,
    observer: &dyn Observer,
) -> Resolved<'a, V> {
    let error = match result {
        Ok(verdict) => return Resolved::Decided(verdict),
        Err(e) => e,
    };
    report_store_error(store_kind, &route.name, &error, observer);
    if dry_run {
        return Resolved::Skipped;
    }
    let policy = failure_policy(rt, route);
    observer.fell_back(policy);
    *fallback = Some(policy);
    match policy {
        FailurePolicy::Allow => Resolved::Skipped,
        FailurePolicy::Deny => Resolved::Denied(
            Answer::new(
                reject_status,
                Refusal::LimiterUnavailable { route: &route.name, own_body: route.rejection.as_ref() },
            )
            .with_header("Retry-After", "1")
            .for_grpc(route.grpc_status),
        ),
        FailurePolicy::Local => Resolved::Local { fleet_size: fleet_size(rt) },
    }
}

fn failure_policy(rt: &Runtime, route: &Route) -> FailurePolicy {
    let default = match &rt.store {
        StoreSettings::Redis(_, resilience) => resilience.on_error,
        StoreSettings::Memory => FailurePolicy::Local,
    };
    route.on_error.unwrap_or(default)
}

fn fleet_size(rt: &Runtime) -> u64 {
    match &rt.store {
        StoreSettings::Redis(_, resilience) => resilience.fleet_size,
        StoreSettings::Memory => 1,
    }
}

/// Logs store failures at most once a second: a dead Redis must not flood the log.
fn report_store_error(store: &'static str, route: &str, error: &StoreError, observer: &dyn Observer) {
    let cause = match error {
        StoreError::Timeout(_) => "timeout",
        StoreError::Redis(_) | StoreError::Connection(_) | StoreError::Server(_) => "redis",
        StoreError::Reply(_) => "reply",
        StoreError::CircuitOpen => "circuit_open",
    };
    observer.store_failed(store, cause);
    static LAST_LOG_SECS: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    if LAST_LOG_SECS.swap(now, Ordering::Relaxed) != now {
        warn!(route, store, error = %error, "limit store failed; the failure policy decides");
    }
}
