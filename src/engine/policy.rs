//! The steps limit_req and limit_conn share once a request's keyed zones are known: zones in dry
//! run are asked apart from enforced ones (so a shadow limit can never change an enforced
//! decision), a store that fails hands the decision to the route's failure policy, and `local`
//! decides with this instance's share of each limit. One copy, so a fix lands in both; the status
//! words they record are in `status`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::warn;

use super::observe::Observer;
use super::refusal::{Answer, Refusal};
use crate::config::{FailurePolicy, Route, Runtime, StoreSettings};
use crate::limit::{DelayPolicy, LimitReq, Rate};
use crate::store::{KeyedConn, KeyedZone, StoreError};

/// A zone of one request as both limit kinds key it (`KeyedZone`, `KeyedConn`).
pub trait Keyed: Sized {
    fn dry_run(&self) -> bool;
    /// The same zone with this instance's share of its fleet-wide limit (the `local` policy).
    fn fleet_share(&self, fleet_size: u64) -> Self;
}

impl Keyed for KeyedZone<'_> {
    fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// A bucket's rate divided exactly (the period stretched N times), a window's count divided
    /// (rounded down, at least 1) over the same window, burst and delay divided and rounded down.
    /// Approximate by nature: traffic is rarely spread evenly over the fleet.
    fn fleet_share(&self, fleet_size: u64) -> Self {
        let n = fleet_size.max(1);
        let limit = &self.limit;
        let rate = if limit.algorithm.is_window() {
            // A block (count 0) stays a block on every instance.
            Rate { count: (limit.rate.count / n).max(limit.rate.count.min(1)), period_us: limit.rate.period_us }
        } else {
            Rate { count: limit.rate.count, period_us: limit.rate.period_us * n }
        };
        let delay = match limit.delay {
            DelayPolicy::NoDelay => DelayPolicy::NoDelay,
            DelayPolicy::After(d) => DelayPolicy::After(d / n),
        };
        let limit = LimitReq { algorithm: limit.algorithm, rate, burst: limit.burst / n, delay };
        KeyedZone { limit, ..self.clone() }
    }
}

impl Keyed for KeyedConn<'_> {
    fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// Each cap divided, at least one request.
    fn fleet_share(&self, fleet_size: u64) -> Self {
        KeyedConn { max: (u64::from(self.max) / fleet_size.max(1)).max(1) as u32, ..self.clone() }
    }
}

/// A request's keyed zones of one kind, enforced ones first, so that each group is one slice:
/// one store call. Dry-run zones are asked apart so that a shadow limit can never change (or
/// charge) an enforced decision.
pub struct Groups<T> {
    all: Vec<T>,
    enforced: usize,
}

impl<T: Keyed> Groups<T> {
    pub fn new(mut all: Vec<T>) -> Self {
        // Stable, so each group keeps the route's order (and no heap for a route's few zones).
        if !all.is_sorted_by_key(Keyed::dry_run) {
            all.sort_by_key(Keyed::dry_run);
        }
        let enforced = all.iter().take_while(|z| !z.dry_run()).count();
        Groups { all, enforced }
    }

    pub fn enforced(&self) -> &[T] {
        &self.all[..self.enforced]
    }

    pub fn shadow(&self) -> &[T] {
        &self.all[self.enforced..]
    }

    /// (group, dry run): enforced first.
    pub fn each(&self) -> [(&[T], bool); 2] {
        [(self.enforced(), false), (self.shadow(), true)]
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Every zone: enforced ones in the route's order, then dry-run ones.
    pub fn all(&self) -> &[T] {
        &self.all
    }

    /// The zones themselves, in the order of `all`.
    pub fn into_all(self) -> Vec<T> {
        self.all
    }
}

/// This instance's share of each zone of a group whose store failed (the `local` policy). Clones
/// the keys: the failure path only.
pub fn fleet_shares<T: Keyed>(group: &[T], fleet_size: u64) -> Vec<T> {
    group.iter().map(|z| z.fleet_share(fleet_size)).collect()
}

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
            Answer::new(reject_status, Refusal::LimiterUnavailable { route: &route.name })
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
