//! Weir's own answers, in place of the upstream's: one type ([`Answer`]: status, headers, why)
//! for every refusal the engine decides and the proxy's upstream and edge refusals, and every
//! JSON body Weir writes, here, so they stay one family: `{"error": <code>, ...}` plus what a
//! client needs to act (route, zone, retry_after). Route and zone names are restricted to
//! `[A-Za-z0-9_.-]` by config validation; free text goes through `serde_json`.

use serde_json::json;

/// One JSON object on one line: the shape of every body Weir writes.
pub(crate) fn line(value: serde_json::Value) -> String {
    value.to_string() + "\n"
}

/// A response to send instead of forwarding: the status, the headers (`RateLimit` fields,
/// `Retry-After`, a challenge) and why, from which the body is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer<'a> {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub refusal: Refusal<'a>,
    /// The gRPC status a gRPC request gets instead (the route's `grpc_status`, for the limits'
    /// refusals); `None`: the JSON answer for every client.
    pub grpc_status: Option<u8>,
}

impl<'a> Answer<'a> {
    pub fn new(status: u16, refusal: Refusal<'a>) -> Self {
        Answer { status, headers: Vec::new(), refusal, grpc_status: None }
    }

    /// Answered as a gRPC status to gRPC requests (`grpc_status`: the route's).
    pub fn for_grpc(mut self, grpc_status: Option<u8>) -> Self {
        self.grpc_status = grpc_status;
        self
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

/// Why Weir answered a request itself. Both of its renderings are written from it: the JSON
/// body, and for a gRPC request the `grpc-message`, so neither is parsed back from the other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal<'a> {
    /// 429 (or `limit_req_status`): `retry_after` is `None` when the request can never pass.
    /// `own_body`: the route's `rejection_body`, written instead of the JSON (on these three).
    RateLimited { route: &'a str, zone: &'a str, retry_after: Option<u64>, own_body: OwnBody<'a> },
    /// The limits could not be decided and the failure policy is `deny`.
    LimiterUnavailable { route: &'a str, own_body: OwnBody<'a> },
    /// 503 (or `limit_conn_status`): a concurrency cap is full.
    TooManyConcurrent { route: &'a str, zone: &'a str, max: u32, own_body: OwnBody<'a> },
    /// 400: `error` says which check failed, `detail` what was wrong; `route` once one matched.
    BadRequest { error: &'static str, detail: String, route: Option<&'a str> },
    /// 404: no route matches.
    NoRoute,
    /// 403: `allow`/`deny` refused the client address.
    Forbidden { route: &'a str },
    /// 401: a zone keyed on a verified JWT claim, and the request's token is absent or refused.
    InvalidToken { route: &'a str, zone: String, detail: String },
    /// 503: every upstream server is at `max_conns`.
    UpstreamBusy { route: &'a str },
    /// The upstream's adaptive concurrency limit refused the request (`reason`: over_limit,
    /// queue_full, queue_timeout, displaced).
    UpstreamOverloaded { upstream: &'a str, route: &'a str, reason: &'static str },
    /// 502: no server of the upstream is up.
    NoHealthyUpstream { upstream: &'a str, route: &'a str },
    /// The last attempt failed: `error` is `upstream_error` (502), `upstream_timeout` (504), ...
    UpstreamFailed { error: &'static str, upstream: &'a str, route: &'a str, tries: usize },
    /// 503 at accept: a connection cap (`max_connections`, `max_connections_per_ip`) is full.
    TooManyConnections { cap: &'static str },
}

/// A route's `rejection_body`, when it has one.
pub type OwnBody<'a> = Option<&'a crate::config::OwnBody>;

impl<'a> Refusal<'a> {
    /// The route's own body for this refusal (`rejection_body`), instead of the JSON.
    pub fn own_body(&self) -> OwnBody<'a> {
        match self {
            Refusal::RateLimited { own_body, .. }
            | Refusal::LimiterUnavailable { own_body, .. }
            | Refusal::TooManyConcurrent { own_body, .. } => *own_body,
            _ => None,
        }
    }

    /// Refused by limit_req's zones (or, for them, by the `deny` failure policy): the store was
    /// asked.
    pub fn by_limit_req(&self) -> bool {
        matches!(self, Refusal::RateLimited { .. } | Refusal::LimiterUnavailable { .. })
    }

    pub fn body(&self) -> String {
        line(match self {
            Refusal::RateLimited { route, zone, retry_after: Some(secs), .. } => {
                json!({ "error": "rate_limited", "route": route, "zone": zone, "retry_after": secs })
            }
            Refusal::RateLimited { route, zone, retry_after: None, .. } => json!({
                "error": "request_too_costly", "route": route, "zone": zone, "retry_after": null,
                "detail": "the request costs more than the zone can ever admit at once, so it can never pass",
            }),
            Refusal::LimiterUnavailable { route, .. } => {
                json!({ "error": "limiter_unavailable", "route": route, "retry_after": 1 })
            }
            Refusal::TooManyConcurrent { route, zone, max, .. } => json!({
                "error": "too_many_concurrent_requests", "route": route, "zone": zone, "max": max, "retry_after": 1
            }),
            Refusal::BadRequest { error, detail, route: Some(route) } => {
                json!({ "error": error, "route": route, "detail": detail })
            }
            Refusal::BadRequest { error, detail, route: None } => json!({ "error": error, "detail": detail }),
            Refusal::NoRoute => json!({ "error": "no_route", "detail": "no route matches this request" }),
            Refusal::Forbidden { route } => json!({ "error": "forbidden", "route": route }),
            Refusal::InvalidToken { route, zone, detail } => {
                json!({ "error": "invalid_token", "route": route, "zone": zone, "detail": detail })
            }
            Refusal::UpstreamBusy { route } => json!({ "error": "upstream_busy", "route": route, "retry_after": 1 }),
            Refusal::UpstreamOverloaded { upstream, route, reason } => json!({
                "error": "upstream_overloaded", "upstream": upstream, "route": route, "reason": reason, "retry_after": 1
            }),
            Refusal::NoHealthyUpstream { upstream, route } => {
                json!({ "error": "no_healthy_upstream", "upstream": upstream, "route": route })
            }
            Refusal::UpstreamFailed { error, upstream, route, tries } => {
                json!({ "error": error, "upstream": upstream, "route": route, "tries": tries })
            }
            Refusal::TooManyConnections { cap } => {
                json!({ "error": "too_many_connections", "cap": cap, "retry_after": 1 })
            }
        })
    }

    /// The body's facts on one line, for `grpc-message`:
    /// `rate limited: route api, zone per_ip, retry after 3s`.
    pub fn grpc_message(&self) -> String {
        match self {
            Refusal::RateLimited { route, zone, retry_after: Some(secs), .. } => {
                format!("rate limited: route {route}, zone {zone}, retry after {secs}s")
            }
            Refusal::RateLimited { route, zone, retry_after: None, .. } => {
                format!("request too costly: route {route}, zone {zone}")
            }
            Refusal::LimiterUnavailable { route, .. } => format!("limiter unavailable: route {route}, retry after 1s"),
            Refusal::TooManyConcurrent { route, zone, max, .. } => {
                format!("too many concurrent requests: route {route}, zone {zone}, max {max}, retry after 1s")
            }
            Refusal::UpstreamOverloaded { .. } => "upstream overloaded: adaptive concurrency limit".to_string(),
            // The others never reach a gRPC rendering; their body's first facts serve.
            other => other.body().trim_end().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_one_json_object_per_line() {
        for refusal in [
            Refusal::RateLimited { route: "api", zone: "per_ip", retry_after: Some(3), own_body: None },
            Refusal::RateLimited { route: "api", zone: "per_ip", retry_after: None, own_body: None },
            Refusal::LimiterUnavailable { route: "api", own_body: None },
            Refusal::TooManyConcurrent { route: "api", zone: "c", max: 10, own_body: None },
            Refusal::NoRoute,
            Refusal::Forbidden { route: "api" },
            Refusal::BadRequest { error: "bad_path", detail: "a \"quoted\" detail".into(), route: None },
            Refusal::BadRequest { error: "bad_cost", detail: "x".into(), route: Some("api") },
            Refusal::InvalidToken { route: "api", zone: "z".into(), detail: "expired".into() },
            Refusal::UpstreamBusy { route: "api" },
            Refusal::UpstreamOverloaded { upstream: "app", route: "api", reason: "over_limit" },
            Refusal::NoHealthyUpstream { upstream: "app", route: "api" },
            Refusal::UpstreamFailed { error: "upstream_timeout", upstream: "app", route: "api", tries: 2 },
            Refusal::TooManyConnections { cap: "max_connections" },
        ] {
            let body = refusal.body();
            assert!(body.ends_with('\n') && body.matches('\n').count() == 1, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert!(v["error"].is_string(), "{body}");
        }
        let limited = Refusal::RateLimited { route: "api", zone: "per_ip", retry_after: Some(3), own_body: None };
        let v: serde_json::Value = serde_json::from_str(&limited.body()).unwrap();
        assert_eq!(v, json!({"error": "rate_limited", "route": "api", "zone": "per_ip", "retry_after": 3}));
        let costly = Refusal::RateLimited { route: "api", zone: "per_ip", retry_after: None, own_body: None };
        let v: serde_json::Value = serde_json::from_str(&costly.body()).unwrap();
        assert_eq!(v["retry_after"], serde_json::Value::Null);
    }

    /// The gRPC message says what the JSON body says (as the message parsed back from the body
    /// used to).
    #[test]
    fn grpc_messages_carry_the_body_facts() {
        let cases = [
            (
                Refusal::RateLimited { route: "api", zone: "per_ip", retry_after: Some(3), own_body: None },
                "rate limited: route api, zone per_ip, retry after 3s",
            ),
            (
                Refusal::RateLimited { route: "api", zone: "per_ip", retry_after: None, own_body: None },
                "request too costly: route api, zone per_ip",
            ),
            (
                Refusal::LimiterUnavailable { route: "api", own_body: None },
                "limiter unavailable: route api, retry after 1s",
            ),
            (
                Refusal::TooManyConcurrent { route: "api", zone: "c", max: 2, own_body: None },
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
