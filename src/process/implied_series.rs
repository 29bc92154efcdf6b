//! The series a config implies, created at zero when it is applied: a counter that appears only
//! with its first event has no rate before it (`rate(weir_store_errors_total[5m])` is empty, not
//! 0), so an alert on it cannot fire on the first burst of errors and a dashboard shows gaps.
//! Label sets come from the config alone (routes, zones, store, upstreams, domains); series that
//! depend on traffic (upstream status codes, server addresses) still appear when first counted.
//! Here, beside the reload that seeds them, so that `metrics/` never reads config.

use crate::config::{store_label, FailurePolicy, Runtime, StoreSettings};
use crate::limit::DelayPolicy;
use crate::metrics::{Implied, StoresInUse};

fn pair(a: &str, b: &str) -> [String; 2] {
    [a.to_string(), b.to_string()]
}

/// Appends the items of `new` that `list` does not hold yet, in order.
fn add<T: Copy + PartialEq>(list: &mut Vec<T>, new: &[T]) {
    for item in new {
        if !list.contains(item) {
            list.push(*item);
        }
    }
}

fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// What `rt` implies. Pure: the config in, label values out.
pub fn implied(rt: &Runtime) -> Implied {
    let store = store_label(&rt.store);
    let (redis, default_policy) = match &rt.store {
        StoreSettings::Memory => (false, FailurePolicy::Local),
        StoreSettings::Redis(_, resilience) => (true, resilience.on_error),
    };
    let mut out = Implied::default();
    let mut policies: Vec<FailurePolicy> = Vec::new();
    // Each zone's status words, from the references to it (limit_req's `$limit_req_status`).
    let mut zone_statuses: Vec<Vec<&'static str>> = vec![Vec::new(); rt.zones.len()];
    let routes = rt.routes.iter().chain(rt.rls.iter().flat_map(|r| r.domains.iter().map(|d| &d.route)));
    for route in routes {
        let mut outcomes = vec!["passed"];
        for zl in &route.limits {
            let delays = matches!(zl.limit.delay, DelayPolicy::After(n) if n < zl.limit.burst);
            let words: &[&'static str] = match (zl.dry_run, delays) {
                (false, false) => &["passed", "rejected"],
                (false, true) => &["passed", "rejected", "delayed"],
                (true, _) => &["passed", "rejected_dry_run"],
            };
            if let Some(statuses) = zone_statuses.get_mut(zl.zone) {
                add(statuses, words);
            }
            add(&mut outcomes, &words[1..]);
        }
        if route.limits.is_empty() && route.conn_limits.is_empty() {
            outcomes = vec!["unlimited"];
        }
        if !route.conn_limits.is_empty() {
            outcomes.push("conn_rejected");
        }
        let policy = route.on_error.unwrap_or(default_policy);
        if redis && !(route.limits.is_empty() && route.conn_limits.is_empty()) {
            add(&mut policies, &[policy]);
            match policy {
                FailurePolicy::Allow => outcomes.push("fail_open"),
                FailurePolicy::Deny => outcomes.push("fail_closed"),
                FailurePolicy::Local => {}
            }
        }
        out.requests.extend(outcomes.into_iter().map(|o| pair(&route.name, o)));
    }
    out.requests.push(pair("-", "no_route"));

    for (zone, statuses) in rt.zones.iter().zip(zone_statuses) {
        out.zone_decisions.extend(statuses.into_iter().map(|status| pair(&zone.name, status)));
    }
    for zone in &rt.conn_zones {
        for status in ["passed", "rejected"] {
            out.conn_decisions.push(pair(&zone.name, status));
        }
    }
    out.store_duration.push(store.to_string());
    if redis {
        for cause in ["timeout", "redis", "reply", "circuit_open"] {
            out.store_errors.push(pair(store, cause));
        }
        out.store_fallbacks = policies.iter().map(|p| p.as_str().to_string()).collect();
    }
    let memory = !redis || policies.contains(&FailurePolicy::Local);
    if memory {
        for zone in rt.zones.iter().map(|z| &z.name).chain(rt.conn_zones.iter().map(|z| &z.name)) {
            for reason in ["expired", "live"] {
                out.memory_evictions.push(pair(zone, reason));
            }
            out.memory_zone_full.push(zone.clone());
        }
    }
    for upstream in &rt.upstreams {
        for reason in ["down", "busy"] {
            out.upstream_unavailable.push(pair(&upstream.spec.name, reason));
        }
    }
    for domain in rt.rls.iter().flat_map(|r| r.domains.iter()) {
        for outcome in ["passed", "rejected"] {
            out.rls_requests.push(pair(&domain.name, outcome));
        }
    }
    let clients = &rt.server.clients;
    out.connections_refused = words(&["max_connections"]);
    if clients.max_connections_per_ip.is_some() {
        out.connections_refused.push("max_connections_per_ip".to_string());
    }
    out.connections_cut = words(&["header_timeout", "keepalive_timeout", "header_size"]);
    out.client_disconnects = words(&["closed", "read", "write", "timeout"]);
    let tls = !rt.server.listen_tls.is_empty() || rt.rls.as_ref().is_some_and(|r| !r.listen_tls.is_empty());
    if tls {
        out.tls_handshakes = words(&["ok", "failed", "timeout"]);
    }
    out.stores = StoresInUse { redis, memory };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(text: &str) -> Runtime {
        crate::config::from_text(text, "implied-test.toml").unwrap_or_else(|e| panic!("{e}"))
    }

    const ROUTES: &str = r#"
        [server]
        listen = ["127.0.0.1:8080"]
        [[upstream]]
        name = "app"
        servers = ["127.0.0.1:9000"]
        [[limit_req_zone]]
        name = "per_ip"
        key = "ip"
        rate = "2r/s"
        [[limit_conn_zone]]
        name = "conns"
        key = "ip"
        [[route]]
        name = "login"
        path = "/login"
        upstream = "app"
        limit_req = [ { zone = "per_ip", burst = 3 } ]
        [[route]]
        name = "api"
        path_prefix = "/api/"
        upstream = "app"
        limit_req = [ { zone = "per_ip", burst = 5, nodelay = true } ]
        limit_conn = [ { zone = "conns", max = 2 } ]
        [[route]]
        name = "shadow"
        path_prefix = "/shadow/"
        upstream = "app"
        dry_run = true
        limit_req = [ { zone = "per_ip", burst = 5, nodelay = true } ]
        [[route]]
        name = "free"
        path_prefix = "/"
        upstream = "app"
    "#;

    fn outcomes(implied: &Implied, route: &str) -> Vec<String> {
        implied.requests.iter().filter(|[r, _]| r == route).map(|[_, o]| o.clone()).collect()
    }

    #[test]
    fn memory_store_implies_its_routes_zones_and_no_redis_series() {
        let got = implied(&compile(&format!("[store]\nkind = \"memory\"\n{ROUTES}")));
        assert_eq!(outcomes(&got, "login"), ["passed", "rejected", "delayed"]);
        assert_eq!(outcomes(&got, "api"), ["passed", "rejected", "conn_rejected"]);
        assert_eq!(outcomes(&got, "shadow"), ["passed", "rejected_dry_run"]);
        assert_eq!(outcomes(&got, "free"), ["unlimited"]);
        assert_eq!(outcomes(&got, "-"), ["no_route"]);
        let statuses: Vec<&str> = got.zone_decisions.iter().map(|[_, s]| s.as_str()).collect();
        assert_eq!(statuses, ["passed", "rejected", "delayed", "rejected_dry_run"], "per_ip: login delays, shadow");
        assert_eq!(got.conn_decisions, [pair("conns", "passed"), pair("conns", "rejected")]);
        assert_eq!(got.store_duration, ["memory"]);
        assert!(got.store_errors.is_empty() && got.store_fallbacks.is_empty(), "{got:?}");
        assert_eq!(got.memory_zone_full, ["per_ip", "conns"]);
        assert_eq!(got.upstream_unavailable, [pair("app", "down"), pair("app", "busy")]);
        assert_eq!(got.stores, StoresInUse { redis: false, memory: true });
        assert!(got.tls_handshakes.is_empty(), "no TLS listener");
    }

    #[test]
    fn redis_store_implies_its_errors_and_failure_policies() {
        let text = format!(
            "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6399/0\"\non_error = \"allow\"\n{}",
            ROUTES.replace("name = \"api\"", "name = \"api\"\non_error = \"deny\"")
        );
        let got = implied(&compile(&text));
        assert_eq!(got.store_duration, ["redis"]);
        let causes: Vec<&str> = got.store_errors.iter().map(|[_, c]| c.as_str()).collect();
        assert_eq!(causes, ["timeout", "redis", "reply", "circuit_open"]);
        assert!(got.store_errors.iter().all(|[s, _]| s == "redis"));
        assert_eq!(got.store_fallbacks, ["allow", "deny"]);
        assert!(outcomes(&got, "login").contains(&"fail_open".to_string()));
        assert!(outcomes(&got, "api").contains(&"fail_closed".to_string()));
        assert_eq!(outcomes(&got, "free"), ["unlimited"], "a route without limits never asks the store");
        assert_eq!(got.stores, StoresInUse { redis: true, memory: false });
        assert!(got.memory_evictions.is_empty());

        let local = implied(&compile(&text.replace("on_error = \"allow\"", "on_error = \"local\"")));
        assert_eq!(local.stores, StoresInUse { redis: true, memory: true }, "local decides in memory");
        assert_eq!(local.store_fallbacks, ["local", "deny"]);
    }
}
