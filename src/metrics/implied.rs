//! The series a config implies, as plain label values: created at zero when a config is applied
//! (`Metrics::seed`). What a config implies is worked out above this floor, where config is read
//! (`process/implied_series.rs`): metrics stand on the ground and import no config.

/// Which store-specific families `/metrics` shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoresInUse {
    /// `weir_redis_*`, the circuit breaker and the deny cache: the store is Redis.
    pub redis: bool,
    /// `weir_memory_*`: the memory store, or Redis with a `local` failure policy somewhere.
    pub memory: bool,
}

/// The label values of each counter family the config implies.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Implied {
    /// `weir_requests_total{route, outcome}`.
    pub requests: Vec<[String; 2]>,
    /// `weir_limit_req_decisions_total{zone, status}`.
    pub zone_decisions: Vec<[String; 2]>,
    /// `weir_limit_conn_decisions_total{zone, status}`.
    pub conn_decisions: Vec<[String; 2]>,
    /// `weir_store_errors_total{store, cause}`.
    pub store_errors: Vec<[String; 2]>,
    /// `weir_store_request_duration_seconds{store}`.
    pub store_duration: Vec<String>,
    /// `weir_store_fallback_total{policy}`.
    pub store_fallbacks: Vec<String>,
    /// `weir_memory_evictions_total{zone, reason}`.
    pub memory_evictions: Vec<[String; 2]>,
    /// `weir_memory_zone_full_total{zone}`.
    pub memory_zone_full: Vec<String>,
    /// `weir_upstream_unavailable_total{upstream, reason}`.
    pub upstream_unavailable: Vec<[String; 2]>,
    /// `weir_rls_requests_total{domain, outcome}`.
    pub rls_requests: Vec<[String; 2]>,
    /// `weir_connections_refused_total{cap}`.
    pub connections_refused: Vec<String>,
    /// `weir_connections_cut_total{cause}`.
    pub connections_cut: Vec<String>,
    /// `weir_client_disconnects_total{error}`.
    pub client_disconnects: Vec<String>,
    /// `weir_tls_handshakes_total{result}`.
    pub tls_handshakes: Vec<String>,
    pub stores: StoresInUse,
}

/// Whether the family `name` belongs on `/metrics` with the stores `in_use`: Redis's own
/// families, its circuit breaker and deny cache only with Redis; the in-process store's only when
/// it decides something.
pub fn shown_with(name: &str, in_use: StoresInUse) -> bool {
    let redis_only = name.starts_with("weir_redis_")
        || name.starts_with("weir_store_circuit_")
        || name == "weir_deny_cache_hits_total";
    if redis_only {
        return in_use.redis;
    }
    if name.starts_with("weir_memory_") {
        return in_use.memory;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_specific_families_follow_the_stores_in_use() {
        let memory = StoresInUse { redis: false, memory: true };
        let redis = StoresInUse { redis: true, memory: false };
        for name in ["weir_redis_batch_size", "weir_store_circuit_open", "weir_deny_cache_hits_total"] {
            assert!(!shown_with(name, memory) && shown_with(name, redis), "{name}");
        }
        assert!(shown_with("weir_memory_keys", memory) && !shown_with("weir_memory_keys", redis));
        for name in ["weir_store_errors_total", "weir_requests_total", "process_open_fds"] {
            assert!(shown_with(name, memory) && shown_with(name, redis), "{name}");
        }
    }
}
