//! Prometheus metrics, served on the admin listener at `/metrics`. Base units, `_total` counters,
//! histograms for times. Labels are routes, zones and outcomes — never client keys, whose
//! cardinality is unbounded.

mod adaptive;
mod implied;
mod meters;
mod process;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::LazyLock;

pub use implied::{Implied, StoresInUse};
pub use meters::{Meters, RouteMeters, ZoneMeters, OUTCOME_SLOTS};

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Buckets for store round trips and upstream times: 100 µs to 10 s.
const LATENCY_BUCKETS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Buckets for limit_req delays: 1 ms to 60 s.
const DELAY_BUCKETS: &[f64] = &[0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

pub struct Metrics {
    registry: Registry,
    /// Requests by route and outcome: passed, delayed, rejected, delayed_dry_run, rejected_dry_run,
    /// unlimited, fail_open / fail_closed (store failed; `on_error` allow / deny decided; `local`
    /// reports its own decision's word), conn_rejected, upstream_busy, client_gone, denied,
    /// bad_request, no_route (the labels set in `src/proxy/`).
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
    /// Requests in flight per upstream server on this instance.
    pub upstream_in_flight: IntGaugeVec,
    /// 1 while a server may get traffic (active check up, not out for `max_fails`).
    pub upstream_server_up: IntGaugeVec,
    /// Active health flips per server, `to` = `up` | `down`.
    pub upstream_health_changes: IntCounterVec,
    /// Failures counted toward `max_fails` (connect errors, timeouts, `next_upstream` statuses).
    pub upstream_passive_failures: IntCounterVec,
    /// Connections to a server that could not be established.
    pub upstream_connect_errors: IntCounterVec,
    /// Requests sent to another server, by what failed (`error`, `timeout`, `http_502`, …).
    pub upstream_retries: IntCounterVec,
    /// Requests answered without any server: `down` (502) or `busy` (503, `max_conns`).
    pub upstream_unavailable: IntCounterVec,
    /// Re-resolutions of a server name that failed (its last good addresses stay).
    pub upstream_resolve_failures: IntCounterVec,
    /// Client connections open now.
    pub connections_open: IntGauge,
    /// Bytes of responses buffered for slow readers now, by `medium` (`memory`, `temp_file`):
    /// what the process-wide `response_buffering` budgets hold.
    pub response_buffer_bytes: IntGaugeVec,
    /// Client connections refused at accept, by cap (`max_connections`, `max_connections_per_ip`).
    pub connections_refused: IntCounterVec,
    /// Failed accepts on a listener Weir serves itself (descriptor shortage), each backed off.
    pub accept_errors: IntCounter,
    /// Rate limit service calls answered UNAVAILABLE at once: the calls in flight were at their cap.
    pub rls_calls_shed: IntCounter,
    /// Client connections closed by a timeout or size cap, by cause (`header_timeout`,
    /// `keepalive_timeout`, `header_size`), and HTTP/2 streams cut by `body_timeout`.
    pub connections_cut: IntCounterVec,
    /// In-process stores (`memory`, and the `local` fallback): keys held per zone.
    pub memory_keys: IntGaugeVec,
    /// Leased zones (docs/leases.md): answers to this instance's asks for a lease, by `answer`
    /// (`granted`, `refused`, `dead_on_arrival`).
    pub lease_grants: IntCounterVec,
    /// Leased zones: tokens by `fate` (`leased`, `returned`, `expired_unused`).
    pub lease_tokens: IntCounterVec,
    /// Leased zones: decisions made from this instance's lease, no round trip, by `decision`
    /// (`admitted`, `rejected`: the store said the budget is empty until then).
    pub lease_local_decisions: IntCounterVec,
    /// In-process stores: each zone's capacity (`max_keys`, rounded up to whole shards).
    pub memory_max_keys: IntGaugeVec,
    /// In-process stores: entries dropped to make room, by zone and reason (`expired`, `live`).
    pub memory_evictions: IntCounterVec,
    /// In-process stores: requests refused because their zone was full of protected keys.
    pub memory_zone_full: IntCounterVec,
    /// 1 while Redis's maxmemory-policy can evict limit state (anything but noeviction, with a
    /// maxmemory).
    pub redis_eviction_risk: IntGauge,
    /// Times the store's circuit breaker opened.
    pub store_circuit_opens: IntCounter,
    /// TLS handshakes on `listen_tls`, by result (`ok`, `failed`, `timeout`).
    pub tls_handshakes: IntCounterVec,
    /// Requests whose client closed or broke its connection before the response was written (a
    /// normal event for a proxy: every load generator does it at the end of a run), by what
    /// failed (`closed`, `read`, `write`, `timeout`).
    pub client_disconnects: IntCounterVec,
    /// Requests per `lua/limit_req.lua` call of the Redis decision lane (coalescing).
    pub redis_batch_size: prometheus::Histogram,
    /// Rate limit service calls by domain (`-`: one the config does not have) and outcome
    /// in the proxy's outcome words (`passed`, `delayed`, `rejected`, `unlimited`, `fail_open`,
    /// `fail_closed`, `bad_request`, ...; `engine::Outcome`).
    pub rls_requests: IntCounterVec,
    /// Rate limit service descriptors no rule limits (allowed), by domain.
    pub rls_unmatched: IntCounterVec,
    pub rls_duration: HistogramVec,
    /// RLQS (docs/rlqs.md), by domain: streams open, buckets held, bucket reports, assignments
    /// changed, buckets abandoned, reports no bucket rule matched, streams refused, ledger errors
    /// and the ledger's time per report.
    pub rlqs_streams: IntGaugeVec,
    pub rlqs_buckets: IntGaugeVec,
    pub rlqs_reports: IntCounterVec,
    pub rlqs_assignments: IntCounterVec,
    pub rlqs_abandoned: IntCounterVec,
    pub rlqs_unmatched: IntCounterVec,
    pub rlqs_refused: IntCounterVec,
    pub rlqs_ledger_errors: IntCounterVec,
    pub rlqs_ledger_duration: HistogramVec,
    /// 1, labelled with the version and commit built (`weir --version`).
    pub build_info: IntGaugeVec,
    /// Which store-specific families `render` shows: `STORES_*` bits, set by [`Metrics::seed`];
    /// until then every family.
    stores_in_use: AtomicU8,
    /// Adaptive concurrency per upstream (`weir_adaptive_*`).
    pub adaptive: adaptive::AdaptiveMetrics,
}

const STORES_KNOWN: u8 = 1;
const STORES_REDIS: u8 = 2;
const STORES_MEMORY: u8 = 4;

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

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(registry, IntGaugeVec::new(Opts::new(name, help), labels))
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
        let build_info = gauge(
            &registry,
            "weir_build_info",
            "1, labelled with the version and the commit this binary was built from.",
            &["version", "commit"],
        );
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION"), env!("WEIR_COMMIT")]).set(1);
        let process = process::ProcessCollector::new().expect("static metric definition");
        registry.register(Box::new(process)).expect("metric registered once");
        Metrics {
            build_info,
            stores_in_use: AtomicU8::new(0),
            connections_open,
            response_buffer_bytes: gauge(
                &registry,
                "weir_response_buffer_bytes",
                "Bytes of responses buffered for slow readers now, in memory or in temp files.",
                &["medium"],
            ),
            connections_refused: counter(
                &registry,
                "weir_connections_refused_total",
                "Client connections refused at accept, by the cap they hit.",
                &["cap"],
            ),
            accept_errors: register(
                &registry,
                IntCounter::new("weir_accept_errors_total", "Failed accepts (descriptor shortage), each backed off."),
            ),
            rls_calls_shed: register(
                &registry,
                IntCounter::new(
                    "weir_rls_calls_shed_total",
                    "Rate limit service calls answered UNAVAILABLE because the calls in flight were at their cap.",
                ),
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
            rls_requests: counter(
                &registry,
                "weir_rls_requests_total",
                "Rate limit service (gRPC) calls by domain and outcome.",
                &["domain", "outcome"],
            ),
            rls_unmatched: counter(
                &registry,
                "weir_rls_unmatched_descriptors_total",
                "Rate limit service descriptors that no rule limits (allowed), by domain.",
                &["domain"],
            ),
            rls_duration: histogram(
                &registry,
                "weir_rls_request_duration_seconds",
                "Rate limit service (gRPC) calls, from the decoded request to the answer, by domain.",
                &["domain"],
                LATENCY_BUCKETS,
            ),
            rlqs_streams: gauge(&registry, "weir_rlqs_streams", "RLQS streams open now, by domain.", &["domain"]),
            rlqs_buckets: gauge(
                &registry,
                "weir_rlqs_buckets",
                "RLQS buckets held by the open streams, by domain.",
                &["domain"],
            ),
            rlqs_reports: counter(
                &registry,
                "weir_rlqs_reports_total",
                "RLQS bucket usage reports received, by domain.",
                &["domain"],
            ),
            rlqs_assignments: counter(
                &registry,
                "weir_rlqs_assignments_total",
                "RLQS assignments sent that differ from the bucket's previous one, by domain.",
                &["domain"],
            ),
            rlqs_abandoned: counter(
                &registry,
                "weir_rlqs_abandoned_total",
                "RLQS buckets abandoned after going quiet, by domain.",
                &["domain"],
            ),
            rlqs_unmatched: counter(
                &registry,
                "weir_rlqs_unmatched_reports_total",
                "RLQS bucket reports that no bucket rule matched (Envoy's no_assignment_behavior applies), by domain.",
                &["domain"],
            ),
            rlqs_refused: counter(
                &registry,
                "weir_rlqs_streams_refused_total",
                "RLQS streams ended for a malformed report or a bound, by domain.",
                &["domain"],
            ),
            rlqs_ledger_errors: counter(
                &registry,
                "weir_rlqs_ledger_errors_total",
                "RLQS reports the ledger (the store) did not answer; no assignment was sent, by domain.",
                &["domain"],
            ),
            rlqs_ledger_duration: histogram(
                &registry,
                "weir_rlqs_ledger_duration_seconds",
                "Time of one RLQS report's ledger steps (report and claim), by domain.",
                &["domain"],
                LATENCY_BUCKETS,
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
            upstream_in_flight: gauge(
                &registry,
                "weir_upstream_in_flight",
                "Requests in flight per upstream server on this instance.",
                &["upstream", "server"],
            ),
            upstream_server_up: gauge(
                &registry,
                "weir_upstream_server_up",
                "1 while the server may get traffic: active check up and not out for max_fails.",
                &["upstream", "server"],
            ),
            upstream_health_changes: counter(
                &registry,
                "weir_upstream_health_changes_total",
                "Active health check flips per server.",
                &["upstream", "server", "to"],
            ),
            upstream_passive_failures: counter(
                &registry,
                "weir_upstream_passive_failures_total",
                "Failed attempts counted toward max_fails (errors, timeouts, next_upstream statuses).",
                &["upstream", "server"],
            ),
            upstream_connect_errors: counter(
                &registry,
                "weir_upstream_connect_errors_total",
                "Connections to an upstream server that could not be established.",
                &["upstream", "server"],
            ),
            upstream_retries: counter(
                &registry,
                "weir_upstream_retries_total",
                "Requests sent to another server after a failed attempt, by cause.",
                &["upstream", "reason"],
            ),
            upstream_unavailable: counter(
                &registry,
                "weir_upstream_unavailable_total",
                "Requests answered without a server: down (502) or busy (503, max_conns).",
                &["upstream", "reason"],
            ),
            upstream_resolve_failures: counter(
                &registry,
                "weir_upstream_resolve_failures_total",
                "Failed re-resolutions of an upstream server name (its last good addresses stay).",
                &["upstream", "server"],
            ),
            memory_keys: register(
                &registry,
                IntGaugeVec::new(
                    Opts::new("weir_memory_keys", "Keys held per zone by the in-process store."),
                    &["zone"],
                ),
            ),
            memory_max_keys: register(
                &registry,
                IntGaugeVec::new(
                    Opts::new("weir_memory_max_keys", "Capacity of each zone of the in-process store (max_keys)."),
                    &["zone"],
                ),
            ),
            memory_evictions: counter(
                &registry,
                "weir_memory_evictions_total",
                "Entries the in-process store dropped to make room: expired ones, or live ones closest to expiry.",
                &["zone", "reason"],
            ),
            redis_eviction_risk: register(
                &registry,
                IntGauge::new(
                    "weir_redis_eviction_risk",
                    "1 while Redis's maxmemory-policy can evict rate-limit state (set noeviction).",
                ),
            ),
            store_circuit_opens: register(
                &registry,
                IntCounter::new("weir_store_circuit_opens_total", "Times the store's circuit breaker opened."),
            ),
            redis_batch_size: register(
                &registry,
                prometheus::Histogram::with_opts(
                    HistogramOpts::new(
                        "weir_redis_batch_size",
                        "Requests decided per call of lua/limit_req.lua (decisions ready together are coalesced).",
                    )
                    .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
                ),
            ),
            client_disconnects: counter(
                &registry,
                "weir_client_disconnects_total",
                "Requests whose client closed or broke the connection before the response was written.",
                &["error"],
            ),
            memory_zone_full: counter(
                &registry,
                "weir_memory_zone_full_total",
                "Requests refused because their zone was full and no entry could be evicted.",
                &["zone"],
            ),
            lease_grants: counter(
                &registry,
                "weir_lease_grants_total",
                "Asks for a lease of a leased zone's key, by the store's answer.",
                &["zone", "answer"],
            ),
            lease_tokens: counter(
                &registry,
                "weir_lease_tokens_total",
                "Tokens of leased zones: leased, returned unused, or expired unused.",
                &["zone", "fate"],
            ),
            lease_local_decisions: counter(
                &registry,
                "weir_lease_local_decisions_total",
                "Decisions of leased zones made from this instance's lease, without a store call.",
                &["zone", "decision"],
            ),
            adaptive: adaptive::AdaptiveMetrics::new(&registry),
            registry,
        }
    }

    /// Drops the per-server series of an address that left an upstream.
    pub fn forget_upstream_server(&self, upstream: &str, server: &str) {
        let _ = self.upstream_in_flight.remove_label_values(&[upstream, server]);
        let _ = self.upstream_server_up.remove_label_values(&[upstream, server]);
    }

    /// Creates at zero the series a config implies (`process::implied_series`), and shows only
    /// the store-specific families of its store. Called with each config applied (at start and on
    /// reloads); series of routes or zones a reload removed stay, as counters do.
    pub fn seed(&self, implied: &Implied) {
        let pairs = |vec: &IntCounterVec, sets: &[[String; 2]]| {
            for [a, b] in sets {
                vec.with_label_values(&[a.as_str(), b.as_str()]);
            }
        };
        let singles = |vec: &IntCounterVec, values: &[String]| {
            for v in values {
                vec.with_label_values(&[v.as_str()]);
            }
        };
        pairs(&self.requests, &implied.requests);
        pairs(&self.zone_decisions, &implied.zone_decisions);
        pairs(&self.conn_decisions, &implied.conn_decisions);
        pairs(&self.store_errors, &implied.store_errors);
        pairs(&self.memory_evictions, &implied.memory_evictions);
        pairs(&self.upstream_unavailable, &implied.upstream_unavailable);
        pairs(&self.rls_requests, &implied.rls_requests);
        singles(&self.store_fallbacks, &implied.store_fallbacks);
        singles(&self.memory_zone_full, &implied.memory_zone_full);
        singles(&self.connections_refused, &implied.connections_refused);
        singles(&self.connections_cut, &implied.connections_cut);
        singles(&self.client_disconnects, &implied.client_disconnects);
        singles(&self.tls_handshakes, &implied.tls_handshakes);
        for store in &implied.store_duration {
            self.store_duration.with_label_values(&[store.as_str()]);
        }
        let mut bits = STORES_KNOWN;
        if implied.stores.redis {
            bits |= STORES_REDIS;
        }
        if implied.stores.memory {
            bits |= STORES_MEMORY;
        }
        self.stores_in_use.store(bits, Ordering::Relaxed);
    }

    /// Whether `/metrics` shows the family `name`: store-specific ones only for the store in use.
    fn shows(&self, name: &str) -> bool {
        let bits = self.stores_in_use.load(Ordering::Relaxed);
        if bits & STORES_KNOWN == 0 {
            return true;
        }
        let in_use = StoresInUse { redis: bits & STORES_REDIS != 0, memory: bits & STORES_MEMORY != 0 };
        implied::shown_with(name, in_use)
    }

    /// The series of one counter family, as (labels, value): for `/top`'s per-route and per-zone
    /// counts, read from the same counters `/metrics` shows.
    pub fn counter_values(&self, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
        self.registry
            .gather()
            .iter()
            .filter(|family| family.name() == name)
            .flat_map(|family| family.get_metric().iter())
            .map(|m| {
                let labels = m.get_label().iter().map(|l| (l.name().to_string(), l.value().to_string())).collect();
                (labels, m.get_counter().get_value())
            })
            .collect()
    }

    /// The Prometheus text exposition of every metric shown (see [`Metrics::shows`]).
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let families: Vec<_> = self.registry.gather().into_iter().filter(|f| self.shows(f.name())).collect();
        // Encoding into a Vec cannot fail for well-formed metrics.
        let _ = TextEncoder::new().encode(&families, &mut out);
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
