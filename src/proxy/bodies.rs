//! Every JSON body Weir writes in place of an upstream response, in one place so they stay one
//! family: `{"error": <code>, ...}` plus what a client needs to act (route, zone, retry_after).
//! Route and zone names are restricted to `[A-Za-z0-9_.-]` by config validation; free text goes
//! through `serde_json`.

use serde_json::json;

use crate::engine::refusal::line;
pub use crate::engine::Refusal;

pub fn no_route() -> String {
    line(json!({ "error": "no_route", "detail": "no route matches this request" }))
}

/// `allow`/`deny` refused the client address.
pub fn forbidden(route: &str) -> String {
    line(json!({ "error": "forbidden", "route": route }))
}

/// 401: a zone keyed on a verified JWT claim, and the request's token is absent or refused.
pub fn unauthorized(route: &str, zone: &str, detail: &str) -> String {
    line(json!({ "error": "invalid_token", "route": route, "zone": zone, "detail": detail }))
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

/// The upstream's adaptive concurrency limit refused the request (`reason`: over_limit,
/// queue_full, queue_timeout, displaced).
pub fn upstream_overloaded(upstream: &str, route: &str, reason: &str) -> String {
    line(
        json!({ "error": "upstream_overloaded", "upstream": upstream, "route": route, "reason": reason, "retry_after": 1 }),
    )
}

/// No server of the upstream is up: 502.
pub fn no_healthy_upstream(upstream: &str, route: &str) -> String {
    line(json!({ "error": "no_healthy_upstream", "upstream": upstream, "route": route }))
}

/// The last attempt failed: `error` is `upstream_error` (502) or `upstream_timeout` (504).
pub fn upstream_failed(error: &str, upstream: &str, route: &str, tries: usize) -> String {
    line(json!({ "error": error, "upstream": upstream, "route": route, "tries": tries }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_one_json_object_per_line() {
        for body in [
            Refusal::RateLimited { route: "api", zone: "per_ip", retry_after: Some(3) }.body(),
            Refusal::RateLimited { route: "api", zone: "per_ip", retry_after: None }.body(),
            Refusal::LimiterUnavailable { route: "api" }.body(),
            Refusal::TooManyConcurrent { route: "api", zone: "c", max: 10 }.body(),
            no_route(),
            forbidden("api"),
            bad_request("bad_path", "a \"quoted\" detail", None),
            bad_request("bad_cost", "x", Some("api")),
            upstream_busy("api"),
            no_healthy_upstream("app", "api"),
            upstream_failed("upstream_timeout", "app", "api", 2),
        ] {
            assert!(body.ends_with('\n') && body.matches('\n').count() == 1, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert!(v["error"].is_string(), "{body}");
        }
        let limited = Refusal::RateLimited { route: "api", zone: "per_ip", retry_after: Some(3) };
        let v: serde_json::Value = serde_json::from_str(&limited.body()).unwrap();
        assert_eq!(v, json!({"error": "rate_limited", "route": "api", "zone": "per_ip", "retry_after": 3}));
        let costly = Refusal::RateLimited { route: "api", zone: "per_ip", retry_after: None };
        let v: serde_json::Value = serde_json::from_str(&costly.body()).unwrap();
        assert_eq!(v["retry_after"], serde_json::Value::Null);
    }

    /// The gRPC message says what the JSON body says (as the message parsed back from the body
    /// used to).
    #[test]
    fn grpc_messages_carry_the_body_facts() {
        let cases = [
            (
                Refusal::RateLimited { route: "api", zone: "per_ip", retry_after: Some(3) },
                "rate limited: route api, zone per_ip, retry after 3s",
            ),
            (
                Refusal::RateLimited { route: "api", zone: "per_ip", retry_after: None },
                "request too costly: route api, zone per_ip",
            ),
            (Refusal::LimiterUnavailable { route: "api" }, "limiter unavailable: route api, retry after 1s"),
            (
                Refusal::TooManyConcurrent { route: "api", zone: "c", max: 2 },
                "too many concurrent requests: route api, zone c, max 2, retry after 1s",
            ),
        ];
        for (refusal, message) in cases {
            assert_eq!(refusal.grpc_message(), message);
            let v: serde_json::Value = serde_json::from_str(&refusal.body()).unwrap();
            assert!(message.starts_with(&v["error"].as_str().unwrap().replace('_', " ")), "{message}");
        }
    }
}
