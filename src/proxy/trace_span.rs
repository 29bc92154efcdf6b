//! The request's OpenTelemetry span (src/trace/) fed from the request's state: the proxy's phases
//! call [`start`] and [`finish`] and nothing else of tracing.

use pingora::proxy::Session;

use super::RequestCtx;
use crate::engine::status::LimitStatus;
use crate::trace::{self, Finished, RequestSpan};

/// The span of the request, begun when its head was read. Boxed: a span is ~400 bytes, and the
/// context lives inline in Pingora's per-request future, which is moved (copied) per request even
/// when tracing is off.
pub(super) fn start(session: &Session, ctx: &RequestCtx) -> Option<Box<RequestSpan>> {
    trace::start(session.req_header(), ctx.started).map(Box::new)
}

/// Records the decision and the upstream attempts on the span and ends it.
pub(super) fn finish(span: Option<Box<RequestSpan>>, ctx: &RequestCtx, route: &str, status: u16) {
    let Some(span) = span else { return };
    let zones = ctx
        .limit_statuses
        .zones
        .iter()
        .map(|(zone, s)| format!("{}={}", ctx.runtime.zones.get(*zone).map_or("?", |z| z.name.as_str()), s.as_str()))
        .collect();
    span.finish(Finished {
        route,
        outcome: ctx.outcome.label(),
        limit_req: ctx.limit_statuses.overall.map_or("-", LimitStatus::as_str),
        zones,
        decided_us: ctx.decided_us,
        upstream_addrs: ctx.upstream.tried().iter().map(|a| a.to_string()).collect(),
        upstream_time: ctx.upstream_time,
        status,
    });
}
