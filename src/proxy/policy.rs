//! The steps limit_req and limit_conn share once a request's keyed zones are known: zones in dry
//! run are asked apart from enforced ones (so a shadow limit can never change an enforced
//! decision), and a store that fails hands the decision to the route's failure policy. One copy,
//! so a fix lands in both.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::warn;

use super::bodies;
use crate::config::{FailurePolicy, Route, Runtime, StoreSettings};
use crate::metrics::METRICS;
use crate::store::StoreError;

/// A response to send instead of forwarding: status, JSON body, headers.
pub struct Rejection {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(&'static str, String)>,
}

/// What the failure policy makes of a store error on an enforced group of zones.
pub enum Fallback {
    /// `allow`: the zones have no say in this request.
    Allow,
    /// `deny`: reject with the route's status for this kind of limit.
    Deny(Rejection),
    /// `local`: decide in process, each limit divided by the fleet size.
    Local { fleet_size: u64 },
}

/// Splits keyed zones into (shadow, enforced) by their dry-run flag.
pub fn split_dry_run<T>(items: &[T], dry_run: impl Fn(&T) -> bool) -> (Vec<&T>, Vec<&T>) {
    items.iter().partition(|item| dry_run(item))
}

/// Counts and (at most once a second) logs a store error; then, for an enforced group, the
/// route's failure policy decides, and the decision is counted. A failed shadow group only
/// costs the report: `None`.
pub fn on_store_error(
    rt: &Runtime,
    route: &Route,
    store_kind: &'static str,
    error: &StoreError,
    dry_run: bool,
    reject_status: u16,
) -> Option<(FailurePolicy, Fallback)> {
    report_store_error(store_kind, &route.name, error);
    if dry_run {
        return None;
    }
    let policy = failure_policy(rt, route);
    METRICS.store_fallbacks.with_label_values(&[policy.as_str()]).inc();
    let fallback = match policy {
        FailurePolicy::Allow => Fallback::Allow,
        FailurePolicy::Deny => Fallback::Deny(Rejection {
            status: reject_status,
            body: bodies::limiter_unavailable(&route.name),
            headers: vec![("Retry-After", "1".to_string())],
        }),
        FailurePolicy::Local => Fallback::Local { fleet_size: fleet_size(rt) },
    };
    Some((policy, fallback))
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
fn report_store_error(store: &'static str, route: &str, error: &StoreError) {
    let cause = match error {
        StoreError::Timeout(_) => "timeout",
        StoreError::Redis(_) | StoreError::Connection(_) | StoreError::Server(_) => "redis",
        StoreError::Reply(_) => "reply",
        StoreError::CircuitOpen => "circuit_open",
    };
    METRICS.store_errors.with_label_values(&[store, cause]).inc();
    static LAST_LOG_SECS: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    if LAST_LOG_SECS.swap(now, Ordering::Relaxed) != now {
        warn!(route, store, error = %error, "limit store failed; the failure policy decides");
    }
}
