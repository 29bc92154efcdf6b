//! Adaptive concurrency (`src/adaptive/`): the learned limit, places in flight and waiting, the
//! learned ideal latency, and requests shed, per upstream.

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::{counter, gauge, register};

pub struct AdaptiveMetrics {
    pub limit: IntGaugeVec,
    pub in_flight: IntGaugeVec,
    pub waiting: IntGaugeVec,
    pub ideal_latency: GaugeVec,
    /// By upstream, priority and reason (`over_limit`, `queue_full`, `queue_timeout`, `displaced`).
    pub shed: IntCounterVec,
}

impl AdaptiveMetrics {
    pub(super) fn new(registry: &Registry) -> Self {
        Self {
            limit: gauge(
                registry,
                "weir_adaptive_limit",
                "The adaptive concurrency limit learned per upstream.",
                &["upstream"],
            ),
            in_flight: gauge(
                registry,
                "weir_adaptive_in_flight",
                "Requests holding a place under the adaptive limit, per upstream.",
                &["upstream"],
            ),
            waiting: gauge(
                registry,
                "weir_adaptive_waiting",
                "Requests waiting in the adaptive limit's queue, per upstream.",
                &["upstream"],
            ),
            ideal_latency: register(
                registry,
                GaugeVec::new(
                    Opts::new(
                        "weir_adaptive_ideal_latency_seconds",
                        "The upstream's latency without a queue, as the adaptive limit learned it.",
                    ),
                    &["upstream"],
                ),
            ),
            shed: counter(
                registry,
                "weir_adaptive_shed_total",
                "Requests refused by the adaptive limit, by priority and reason.",
                &["upstream", "priority", "reason"],
            ),
        }
    }
}
