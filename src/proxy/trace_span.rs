//! The request's OpenTelemetry span (src/trace/) fed from the request's state: the proxy's phases
//! call these functions and nothing else of tracing. Each does nothing (reads no clock) for a
//! request that is not traced.

use std::time::SystemTime;

use pingora::proxy::Session;

use super::RequestCtx;
use crate::engine::LimitStatus;
use crate::routes::PathMatch;
use crate::trace::{self, Finished, Incoming, RequestSpan};

/// The span of the request, begun when its head was read. Boxed: a span is ~400 bytes, and the
/// context lives inline in Pingora's per-request future, which is moved (copied) per request even
/// when tracing is off.
pub(super) fn start(session: &Session, ctx: &RequestCtx) -> Option<Box<RequestSpan>> {
    // Off: not even the connection's digest is read (every request passes here).
    if !trace::is_on() {
        return None;
    }
    let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
    let local_port = session.server_addr().and_then(|a| a.as_inet()).map(|a| a.port());
    trace::start(Incoming { req: session.req_header(), started: ctx.started, tls, local_port }).map(Box::new)
}

/// Now, when the request is traced: the start of a store decision.
pub(super) fn clock(ctx: &RequestCtx) -> Option<SystemTime> {
    ctx.trace.as_ref().map(|_| SystemTime::now())
}

/// The store decision `name` that began at `from` (from [`clock`]) is over. Takes the span
/// alone, so a caller holding a borrow of the request's ticket (an answer to send) can record it.
pub(super) fn decided(span: Option<&mut RequestSpan>, name: &'static str, from: Option<SystemTime>) {
    if let (Some(span), Some(from)) = (span, from) {
        span.decided(name, from);
    }
}

/// An upstream attempt begins.
pub(super) fn attempt_started(ctx: &mut RequestCtx) {
    if let Some(span) = ctx.trace.as_mut() {
        span.attempt_started();
    }
}

/// The current upstream attempt failed with `error` (Pingora's error type).
pub(super) fn attempt_failed(ctx: &mut RequestCtx, error: &str) {
    if let Some(span) = ctx.trace.as_mut() {
        span.attempt_failed(error);
    }
}

/// The current upstream attempt's response head arrived.
pub(super) fn attempt_answered(ctx: &mut RequestCtx, status: u16) {
    if let Some(span) = ctx.trace.as_mut() {
        span.attempt_answered(status);
    }
}

/// Records the decision and the upstream attempts on the span and ends it.
pub(super) fn finish(span: Option<Box<RequestSpan>>, ctx: &RequestCtx, route: &str, status: u16) {
    let Some(span) = span else { return };
    let (report, rt) = (ctx.ticket.report(), ctx.ticket.runtime());
    let zones = report
        .zone_words()
        .map(|(zone, s)| format!("{}={}", rt.zones.get(zone).map_or("?", |z| z.name.as_str()), s.as_str()))
        .collect();
    let http_route = report.route.and_then(|i| rt.matchers.get(i)).map(|m| match &m.path {
        PathMatch::Exact(path) => path.clone(),
        PathMatch::Prefix(prefix) => format!("{prefix}*"),
        PathMatch::Regex(regex) => regex.as_str().to_string(),
    });
    span.finish(Finished {
        route,
        http_route,
        outcome: report.outcome.label(),
        limit_req: report.limit_req.map_or("-", LimitStatus::as_str),
        zones,
        decided_us: report.decided_us,
        store: crate::config::store_label(&rt.store),
        delay: report.delay,
        client: report.client_ip,
        peer: ctx.peer,
        upstream_addrs: ctx.upstream.tried().to_vec(),
        upstream_time: ctx.upstream_time,
        status,
    });
}
