//! Why a limit refused a request: the engine's answer, which each front door renders (the proxy
//! as a JSON body or a `grpc-message`).

use serde_json::json;

/// One JSON object on one line: the shape of every body Weir writes.
pub(crate) fn line(value: serde_json::Value) -> String {
    value.to_string() + "\n"
}

/// Why a limit refused a request. Both of its answers are written from it: the JSON body, and
/// for a gRPC request the `grpc-message`, so neither is parsed back from the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal<'a> {
    /// 429 (or `limit_req_status`): `retry_after` is `None` when the request can never pass.
    RateLimited { route: &'a str, zone: &'a str, retry_after: Option<u64> },
    /// The limits could not be decided and the failure policy is `deny`.
    LimiterUnavailable { route: &'a str },
    /// 503 (or `limit_conn_status`): a concurrency cap is full.
    TooManyConcurrent { route: &'a str, zone: &'a str, max: u32 },
}

impl Refusal<'_> {
    pub fn body(&self) -> String {
        match *self {
            Refusal::RateLimited { route, zone, retry_after: Some(secs) } => {
                line(json!({ "error": "rate_limited", "route": route, "zone": zone, "retry_after": secs }))
            }
            Refusal::RateLimited { route, zone, retry_after: None } => line(json!({
                "error": "request_too_costly", "route": route, "zone": zone, "retry_after": null,
                "detail": "the request costs more than the zone can ever admit at once, so it can never pass",
            })),
            Refusal::LimiterUnavailable { route } => {
                line(json!({ "error": "limiter_unavailable", "route": route, "retry_after": 1 }))
            }
            Refusal::TooManyConcurrent { route, zone, max } => line(json!({
                "error": "too_many_concurrent_requests", "route": route, "zone": zone, "max": max, "retry_after": 1
            })),
        }
    }

    /// The body's facts on one line, for `grpc-message`:
    /// `rate limited: route api, zone per_ip, retry after 3s`.
    pub fn grpc_message(&self) -> String {
        match *self {
            Refusal::RateLimited { route, zone, retry_after: Some(secs) } => {
                format!("rate limited: route {route}, zone {zone}, retry after {secs}s")
            }
            Refusal::RateLimited { route, zone, retry_after: None } => {
                format!("request too costly: route {route}, zone {zone}")
            }
            Refusal::LimiterUnavailable { route } => format!("limiter unavailable: route {route}, retry after 1s"),
            Refusal::TooManyConcurrent { route, zone, max } => {
                format!("too many concurrent requests: route {route}, zone {zone}, max {max}, retry after 1s")
            }
        }
    }
}
