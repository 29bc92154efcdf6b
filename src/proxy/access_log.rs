//! One access-log line per request, target `weir::access` at `info`, with the limit outcome in
//! nginx's `$limit_req_status` words; rejections are logged at `info` like every other request,
//! never at `error`. Whether a line is written is `tracing`'s filter's choice (`[log] level`,
//! `RUST_LOG`) as for every event. With `[log] format = "json"` the line is formatted here and
//! written at once (`logging::line`): the same object `tracing`'s JSON formatter wrote, at a
//! fraction of its cost. Text lines still go through `tracing`.

use pingora::prelude::*;
use pingora::proxy::Session;
use tracing::Level;

use super::RequestCtx;
use crate::config::Runtime;
use crate::engine::LimitStatus;
use crate::engine::Report;
use crate::logging::json::{JsonObject, JsonStr};
use crate::logging::{self, line};

const TARGET: &str = "weir::access";

pub fn write(session: &Session, error: Option<&Error>, ctx: &RequestCtx, route: &str, status: u16) {
    // A cached callsite interest after the first request: cheap when the level drops the line.
    if !tracing::enabled!(target: "weir::access", Level::INFO) {
        return;
    }
    if logging::json_lines() {
        line::write_json(Level::INFO, TARGET, "request", |o| json_fields(o, session, error, ctx, route, status));
    } else {
        text_line(session, error, ctx, route, status);
    }
}

/// The fields in the order `text_line` names them (and `tracing`'s JSON formatter wrote them);
/// `decided_us` and `error` only when there is one.
fn json_fields(
    o: &mut JsonObject<'_>,
    session: &Session,
    error: Option<&Error>,
    ctx: &RequestCtx,
    route: &str,
    status: u16,
) {
    let req = session.req_header();
    o.str("route", route);
    let (ticket, report) = (&ctx.ticket, ctx.ticket.report());
    o.string_with("client", |s| match report.client_ip {
        Some(ip) => s.push_ip(ip),
        None => s.push_str("-"),
    });
    o.str("method", req.method.as_str());
    o.str("path", req.uri.path());
    o.u64("status", u64::from(status));
    o.str("limit_req", report.limit_req.map_or("-", LimitStatus::as_str));
    o.str("limit_conn", report.limit_conn.overall.map_or("-", LimitStatus::as_str));
    o.string_with("zones", |s| push_zones(s, ticket.runtime(), &report));
    o.u64("delay_ms", report.delay.as_millis() as u64);
    if let Some(decided_us) = report.decided_us {
        o.u64("decided_us", decided_us);
    }
    if let (Some(route), Some(resp)) = (report.route, session.response_written()) {
        crate::engine::response_cost_fields(ticket.runtime(), route, &resp.headers, |f, v| o.str(f, v));
    }
    if let Some(reason) = ctx.upstream.shed() {
        // The adaptive limit refused it, and why (docs/adaptive.md).
        o.str("shed", reason.as_str());
    }
    if report.client_left_owing {
        // Charged the most its answer could have cost (docs/charges.md): replay does the same.
        o.bool("client_left", true);
    }
    // nginx's $body_bytes_sent: replay charges byte quotas from it.
    o.u64(crate::config::BODY_BYTES_FIELD, session.body_bytes_sent() as u64);
    o.f64("upstream_ms", ctx.upstream_time.map_or(-1.0, |d| d.as_secs_f64() * 1000.0));
    o.string_with("upstream_addr", |s| match ctx.upstream.tried() {
        [] => s.push_str("-"),
        tried => {
            for (i, addr) in tried.iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                s.push_socket_addr(*addr);
            }
        }
    });
    o.f64("duration_ms", ctx.started.elapsed().as_secs_f64() * 1000.0);
    if let Some(e) = error {
        o.display("error", e);
    }
}

/// `zone=STATUS` per zone that had a say, comma-separated.
fn push_zones(s: &mut JsonStr<'_>, rt: &Runtime, report: &Report<'_>) {
    for (i, (zone, status)) in report.zone_words().enumerate() {
        if i > 0 {
            s.push_str(",");
        }
        s.push_str(rt.zones.get(zone).map_or("?", |z| z.name.as_str()));
        s.push_str("=");
        s.push_str(status.as_str());
    }
}

fn text_line(session: &Session, error: Option<&Error>, ctx: &RequestCtx, route: &str, status: u16) {
    let req = session.req_header();
    let (rt, report) = (ctx.ticket.runtime(), ctx.ticket.report());
    let zones: Vec<String> = report
        .zone_words()
        .map(|(zone, s)| format!("{}={}", rt.zones.get(zone).map_or("?", |z| z.name.as_str()), s.as_str()))
        .collect();
    tracing::info!(
        target: "weir::access",
        route,
        client = %report.client_ip.map_or_else(|| "-".to_string(), |ip| ip.to_string()),
        method = %req.method,
        path = %req.uri.path(),
        status,
        limit_req = report.limit_req.map_or("-", LimitStatus::as_str),
        // nginx's `$limit_conn_status`: REJECTED if a zone rejected, else PASSED once a zone had
        // a key (the most severe word, as for limit_req).
        limit_conn = report.limit_conn.overall.map_or("-", LimitStatus::as_str),
        zones = %zones.join(","),
        delay_ms = report.delay.as_millis() as u64,
        decided_us = report.decided_us,
        shed = ctx.upstream.shed().map(|r| r.as_str()),
        upstream_ms = ctx.upstream_time.map_or(-1.0, |d| d.as_secs_f64() * 1000.0),
        upstream_addr = %ctx.upstream.addrs(),
        duration_ms = ctx.started.elapsed().as_secs_f64() * 1000.0,
        error = error.map(|e| e.to_string()),
        "request"
    );
}
