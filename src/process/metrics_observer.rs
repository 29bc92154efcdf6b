//! The metrics' view of the engine: what the engine reports through `engine::Observer` becomes
//! counters and histograms here, so the engine never names a metric. It reads the engine and the
//! config, so it lives beside the process that wires them, not in `metrics/` (the ground floor).

use std::time::Duration;

use prometheus::Histogram;

use crate::config::{FailurePolicy, Runtime};
use crate::engine::LimitStatus;
use crate::engine::{Door, Observer, Report};
use crate::metrics::ZoneMeters;
use crate::metrics::METRICS;

/// Counts what the engine decides with one kind of limit store.
pub struct MetricsObserver {
    /// `weir_store_duration_seconds` of the store, looked up once rather than per decision.
    store_duration: Histogram,
}

impl MetricsObserver {
    /// For decisions made with a store of `store_kind` (`memory`, `redis`, …).
    pub fn new(store_kind: &str) -> Self {
        MetricsObserver { store_duration: METRICS.store_duration.with_label_values(&[store_kind]) }
    }
}

impl Observer for MetricsObserver {
    fn empty_key(&self, zone: &str) {
        METRICS.empty_keys.with_label_values(&[zone]).inc();
    }

    fn store_call(&self, took: Duration) {
        self.store_duration.observe(took.as_secs_f64());
    }

    fn store_failed(&self, store: &'static str, cause: &'static str) {
        METRICS.store_errors.with_label_values(&[store, cause]).inc();
    }

    fn fell_back(&self, policy: FailurePolicy) {
        METRICS.store_fallbacks.with_label_values(&[policy.as_str()]).inc();
    }

    fn lease(&self, held: bool) {
        if held {
            METRICS.active_leases.inc();
        } else {
            METRICS.active_leases.dec();
        }
    }

    fn delayed(&self, rt: &Runtime, route: usize, delay: Duration) {
        rt.meters.route(Some(route)).delay(delay.as_secs_f64());
    }

    fn finished(&self, rt: &Runtime, report: &Report<'_>) {
        match report.door {
            Door::Proxy => {
                let meters = rt.meters.route(report.route);
                meters.request(report.outcome.slot(), report.outcome.label());
            }
            Door::Rls { domain } => {
                METRICS.rls_requests.with_label_values(&[domain.as_str(), report.outcome.label()]).inc();
            }
        }
        count(report.zone_words(), |zone| rt.meters.zone(zone));
        count(report.limit_conn.zones.iter().copied(), |zone| rt.meters.conn_zone(zone));
    }
}

/// Each zone's word through the zone's handles (zone indices and handles come from the same
/// config snapshot).
fn count<'a>(words: impl Iterator<Item = (usize, LimitStatus)>, meters: impl Fn(usize) -> Option<&'a ZoneMeters>) {
    for (zone, status) in words {
        if let Some(m) = meters(zone) {
            m.decision(status.slot(), status.metric_label());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_outcome_has_a_metric_handle() {
        use crate::engine::Outcome;
        assert!(Outcome::ALL.iter().all(|o| o.slot() < crate::metrics::OUTCOME_SLOTS));
    }
}
