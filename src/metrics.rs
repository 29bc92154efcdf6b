//! Prometheus metrics, served on the admin listener at `/metrics`. Base units, `_total` counters,
//! histograms for times. Labels are routes, zones and outcomes — never client keys, whose
//! cardinality is unbounded.

use std::sync::LazyLock;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

/// Buckets for store round trips and upstream times: 100 µs to 10 s.
const LATENCY_BUCKETS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Buckets for limit_req delays: 1 ms to 60 s.
const DELAY_BUCKETS: &[f64] = &[0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

pub struct Metrics {
    registry: Registry,
    /// Requests by route and limit outcome: passed, delayed, rejected, delayed_dry_run,
    /// rejected_dry_run, unlimited, store_error (decided by the failure policy), no_route.
    pub requests: IntCounterVec,
    /// Per-zone decisions, in nginx's `$limit_req_status` words (lowercase).
    pub zone_decisions: IntCounterVec,
    /// Requests whose key for a zone was empty, hence not limited by it.
    pub empty_keys: IntCounterVec,
    pub delay_seconds: HistogramVec,
    pub store_duration: HistogramVec,
    pub store_errors: IntCounterVec,
    pub upstream_responses: IntCounterVec,
    pub upstream_duration: HistogramVec,
    pub config_generation: IntGauge,
    /// 1 while the shared store's circuit breaker is open.
    pub store_circuit_open: IntGauge,
    pub deny_cache_hits: IntCounter,
    /// Concurrency leases this instance holds now.
    pub active_leases: IntGauge,
    /// Per-zone limit_conn decisions: passed, rejected, rejected_dry_run.
    pub conn_decisions: IntCounterVec,
    /// Decisions made by the failure policy, by policy (`allow`, `deny`, `local`).
    pub store_fallbacks: IntCounterVec,
    pub config_reloads: IntCounter,
    pub config_reload_failures: IntCounter,
    /// Client connections open now.
    pub connections_open: IntGauge,
    /// Client connections refused at accept, by cap (`max_connections`, `max_connections_per_ip`).
    pub connections_refused: IntCounterVec,
    /// Client connections closed by a timeout or size cap, by cause (`header_timeout`,
    /// `keepalive_timeout`, `header_size`).
    pub connections_cut: IntCounterVec,
    /// TLS handshakes on `listen_tls`, by result (`ok`, `failed`, `timeout`).
    pub tls_handshakes: IntCounterVec,
}

pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// Registers a metric. Definitions are static: a failure is a programming error every test catches.
fn register<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: Result<M, prometheus::Error>,
) -> M {
    let metric = metric.expect("static metric definition");
    registry.register(Box::new(metric.clone())).expect("metric registered once");
    metric
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(registry, IntCounterVec::new(Opts::new(name, help), labels))
}

fn histogram(registry: &Registry, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    register(registry, HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels))
}

impl Metrics {
    fn new() -> Self {
        let registry = Registry::new();
        let config_generation = register(
            &registry,
            IntGauge::new(
                "weir_config_generation",
                "Generation of the running config (1 at start, +1 per applied reload).",
            ),
        );
        let config_reloads =
            register(&registry, IntCounter::new("weir_config_reloads_total", "Config reloads applied."));
        let config_reload_failures = register(
            &registry,
            IntCounter::new(
                "weir_config_reload_failures_total",
                "Config reloads refused (the running config kept serving).",
            ),
        );
        let store_circuit_open = register(
            &registry,
            IntGauge::new("weir_store_circuit_open", "1 while the shared store's circuit breaker is open."),
        );
        let deny_cache_hits = register(
            &registry,
            IntCounter::new(
                "weir_deny_cache_hits_total",
                "Requests rejected by the local deny cache without asking the store.",
            ),
        );
        let active_leases = register(
            &registry,
            IntGauge::new("weir_limit_conn_active_leases", "Concurrency leases this instance holds now."),
        );
        let connections_open =
            register(&registry, IntGauge::new("weir_connections_open", "Client connections open now."));
        Metrics {
            connections_open,
            connections_refused: counter(
                &registry,
                "weir_connections_refused_total",
                "Client connections refused at accept, by the cap they hit.",
                &["cap"],
            ),
            connections_cut: counter(
                &registry,
                "weir_connections_cut_total",
                "Client connections closed by a timeout or size cap, by cause.",
                &["cause"],
            ),
            tls_handshakes: counter(
                &registry,
                "weir_tls_handshakes_total",
                "TLS handshakes on listen_tls addresses, by result (ok, failed, timeout).",
                &["result"],
            ),
            active_leases,
            conn_decisions: counter(
                &registry,
                "weir_limit_conn_decisions_total",
                "limit_conn decisions per zone and status.",
                &["zone", "status"],
            ),
            store_circuit_open,
            deny_cache_hits,
            store_fallbacks: counter(
                &registry,
                "weir_store_fallback_total",
                "Decisions made by the failure policy because the store failed.",
                &["policy"],
            ),
            requests: counter(
                &registry,
                "weir_requests_total",
                "Requests by route and limit outcome.",
                &["route", "outcome"],
            ),
            zone_decisions: counter(
                &registry,
                "weir_limit_req_decisions_total",
                "limit_req decisions per zone and status.",
                &["zone", "status"],
            ),
            empty_keys: counter(
                &registry,
                "weir_limit_req_empty_key_total",
                "Requests not limited by a zone because their key was empty.",
                &["zone"],
            ),
            delay_seconds: histogram(
                &registry,
                "weir_limit_req_delay_seconds",
                "Delays imposed on requests by limit_req.",
                &["route"],
                DELAY_BUCKETS,
            ),
            store_duration: histogram(
                &registry,
                "weir_store_request_duration_seconds",
                "Time of one limit decision in the store, round trip included.",
                &["store"],
                LATENCY_BUCKETS,
            ),
            store_errors: counter(
                &registry,
                "weir_store_errors_total",
                "Limit decisions the store failed to make, by cause.",
                &["store", "cause"],
            ),
            upstream_responses: counter(
                &registry,
                "weir_upstream_responses_total",
                "Responses from upstreams by route and status code.",
                &["route", "code"],
            ),
            upstream_duration: histogram(
                &registry,
                "weir_upstream_response_duration_seconds",
                "Time from sending a request upstream to its response header.",
                &["route"],
                LATENCY_BUCKETS,
            ),
            config_generation,
            config_reloads,
            config_reload_failures,
            registry,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metrics.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_with_labels() {
        METRICS.requests.with_label_values(&["api", "passed"]).inc_by(3);
        METRICS.store_duration.with_label_values(&["memory"]).observe(0.001);
        let text = METRICS.render();
        assert!(text.contains("weir_requests_total{outcome=\"passed\",route=\"api\"} 3"), "{text}");
        assert!(text.contains("# TYPE weir_store_request_duration_seconds histogram"));
    }
}
