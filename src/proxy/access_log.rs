//! One access-log line per request through `tracing` (target `weir::access`), with the limit
//! outcome in nginx's `$limit_req_status` words. With `[log] format = "json"` each line is a JSON
//! object; rejections are logged at `info` like every other request, never at `error`.

use pingora::prelude::*;
use pingora::proxy::Session;

use super::status::LimitStatus;
use super::RequestCtx;

pub fn write(session: &Session, error: Option<&Error>, ctx: &RequestCtx, route: &str, status: u16) {
    let req = session.req_header();
    let zones: Vec<String> = ctx
        .limit_statuses
        .zones
        .iter()
        .map(|(zone, s)| format!("{}={}", ctx.runtime.zones[*zone].name, s.as_str()))
        .collect();
    tracing::info!(
        target: "weir::access",
        route,
        client = %ctx.client_ip.map_or_else(|| "-".to_string(), |ip| ip.to_string()),
        method = %req.method,
        path = %req.uri.path(),
        status,
        limit_req = ctx.limit_statuses.overall.map_or("-", LimitStatus::as_str),
        // nginx's `$limit_conn_status`: REJECTED if a zone rejected, else PASSED once a zone had
        // a key (the most severe word, as for limit_req).
        limit_conn = ctx.conn_statuses.overall.map_or("-", LimitStatus::as_str),
        zones = %zones.join(","),
        delay_ms = ctx.delay.as_millis() as u64,
        decided_us = ctx.decided_us,
        upstream_ms = ctx.upstream_time.map_or(-1.0, |d| d.as_secs_f64() * 1000.0),
        upstream_addr = %ctx.upstream.addrs(),
        duration_ms = ctx.started.elapsed().as_secs_f64() * 1000.0,
        error = error.map(|e| e.to_string()),
        "request"
    );
}
