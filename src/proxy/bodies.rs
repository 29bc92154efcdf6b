//! Every JSON body Weir writes in place of an upstream response, in one place so they stay one
//! family: `{"error": <code>, ...}` plus what a client needs to act (route, zone, retry_after).
//! Route and zone names are restricted to `[A-Za-z0-9_.-]` by config validation; free text goes
//! through `serde_json`.

use serde_json::json;

fn line(value: serde_json::Value) -> String {
    value.to_string() + "\n"
}

/// 429 (or `limit_req_status`): `retry_after` is `None` when the request can never pass.
pub fn rate_limited(route: &str, zone: &str, retry_after: Option<u64>) -> String {
    match retry_after {
        Some(secs) => line(json!({ "error": "rate_limited", "route": route, "zone": zone, "retry_after": secs })),
        None => line(json!({
            "error": "request_too_costly", "route": route, "zone": zone, "retry_after": null,
            "detail": "the request costs more than the zone can ever admit at once, so it can never pass",
        })),
    }
}

/// The limits could not be decided and the failure policy is `deny`.
pub fn limiter_unavailable(route: &str) -> String {
    line(json!({ "error": "limiter_unavailable", "route": route, "retry_after": 1 }))
}

/// 503 (or `limit_conn_status`): a concurrency cap is full.
pub fn too_many_concurrent(route: &str, zone: &str, max: u32) -> String {
    line(json!({ "error": "too_many_concurrent_requests", "route": route, "zone": zone, "max": max, "retry_after": 1 }))
}

pub fn no_route() -> String {
    line(json!({ "error": "no_route", "detail": "no route matches this request" }))
}

/// `allow`/`deny` refused the client address.
pub fn forbidden(route: &str) -> String {
    line(json!({ "error": "forbidden", "route": route }))
}

/// 400: `error` says which check failed, `detail` what was wrong; `route` once one matched.
pub fn bad_request(error: &str, detail: &str, route: Option<&str>) -> String {
    match route {
        Some(route) => line(json!({ "error": error, "route": route, "detail": detail })),
        None => line(json!({ "error": error, "detail": detail })),
    }
}

/// Every upstream server is at `max_conns`.
pub fn upstream_busy(route: &str) -> String {
    line(json!({ "error": "upstream_busy", "route": route, "retry_after": 1 }))
}

/// No server of the upstream is up: 502.
pub fn no_healthy_upstream(upstream: &str, route: &str) -> String {
    line(json!({ "error": "no_healthy_upstream", "upstream": upstream, "route": route }))
}

/// The last attempt failed: `error` is `upstream_error` (502) or `upstream_timeout` (504).
pub fn upstream_failed(error: &str, upstream: &str, route: &str, tries: usize) -> String {
    line(json!({ "error": error, "upstream": upstream, "route": route, "tries": tries }))
}

/// A connection over `max_connections` / `max_connections_per_ip`, refused at accept.
pub fn too_many_connections(cap: &str) -> String {
    line(json!({ "error": "too_many_connections", "cap": cap, "retry_after": 1 }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_one_json_object_per_line() {
        for body in [
            rate_limited("api", "per_ip", Some(3)),
            rate_limited("api", "per_ip", None),
            limiter_unavailable("api"),
            too_many_concurrent("api", "c", 10),
            no_route(),
            forbidden("api"),
            bad_request("bad_path", "a \"quoted\" detail", None),
            bad_request("bad_cost", "x", Some("api")),
            upstream_busy("api"),
            no_healthy_upstream("app", "api"),
            upstream_failed("upstream_timeout", "app", "api", 2),
            too_many_connections("max_connections"),
        ] {
            assert!(body.ends_with('\n') && body.matches('\n').count() == 1, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert!(v["error"].is_string(), "{body}");
        }
        let v: serde_json::Value = serde_json::from_str(&rate_limited("api", "per_ip", Some(3))).unwrap();
        assert_eq!(v, json!({"error": "rate_limited", "route": "api", "zone": "per_ip", "retry_after": 3}));
        let v: serde_json::Value = serde_json::from_str(&rate_limited("api", "per_ip", None)).unwrap();
        assert_eq!(v["retry_after"], serde_json::Value::Null);
    }
}
