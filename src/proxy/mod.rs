//! The Pingora `ProxyHttp` implementation. Each phase only calls into the modules of the data path:
//! route match → key extraction → limit decision (`limiting`) → forward, delay or reject; then the
//! access log and metrics when the request ends.

mod access_log;
pub(crate) mod bodies;
mod outcome;
mod respond;
mod trace_span;
mod upstreaming;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use http::header::HOST;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};

use crate::config::Runtime;
use crate::edge::GuardedStream;
use crate::engine::after_response::{Ending, ResponseCharges};
use crate::engine::lease::Lease;
use crate::engine::limit_conn::{self, ConnStores};
use crate::engine::limit_req::{self, Action, Stores};
use crate::engine::pacing::Pace;
use crate::engine::status::Statuses;
use crate::engine::{self, Refused};
use crate::keys;
use crate::metrics::METRICS;
use crate::request::{forwarded, hygiene};

use outcome::Outcome;

pub struct WeirProxy {
    runtime: Arc<ArcSwap<Runtime>>,
    stores: Stores,
    conn_stores: ConnStores,
}

impl WeirProxy {
    /// The proxy decides with stores that outlive every reload (the process makes them once).
    pub fn new(runtime: Arc<ArcSwap<Runtime>>, stores: Stores, conn_stores: ConnStores) -> Self {
        Self { runtime, stores, conn_stores }
    }
}

/// Per-request state. `runtime` is the config snapshot the request started with, kept to its end,
/// so a reload never changes a request mid-flight.
pub struct RequestCtx {
    runtime: Arc<Runtime>,
    started: Instant,
    route: Option<usize>,
    client_ip: Option<IpAddr>,
    /// Rate-limit fields to add to the upstream's response.
    rate_headers: Vec<(&'static str, String)>,
    /// limit_req's words: the request's and its zones'.
    limit_statuses: Statuses,
    outcome: Outcome,
    delay: Duration,
    /// When the limits were decided (µs since the epoch), for the access log and `weir replay`.
    decided_us: Option<u64>,
    upstream_sent: Option<Instant>,
    upstream_time: Option<Duration>,
    /// Concurrency leases held until the request ends.
    leases: Vec<Lease>,
    conn_statuses: Statuses,
    /// The upstream servers chosen and tried; the current one holds its `max_conns` place.
    upstream: upstreaming::Attempts,
    /// The TCP peer, and whether it is a trusted proxy (for the forwarded headers).
    peer: Option<IpAddr>,
    peer_trusted: bool,
    /// The request's OpenTelemetry span (src/trace/); `None` when tracing is off or unsampled.
    trace: Option<Box<crate::trace::RequestSpan>>,
    /// Zones charged after the response (`count_statuses`, `cost_from_response`): owed from the
    /// moment the request is forwarded, whatever the client does (engine/after_response.rs).
    charges: ResponseCharges,
    /// The client left after the request was forwarded and before its answer was complete, with
    /// response-decided charges owed (the access log says so; replay charges the same).
    client_left_owing: bool,
    /// `limit_rate`: the response body's pace, started when the response head goes out (boxed:
    /// rare, and the context is moved with every request).
    pace: Option<Box<Pace>>,
}

#[async_trait]
impl ProxyHttp for WeirProxy {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            runtime: self.runtime.load_full(),
            started: Instant::now(),
            route: None,
            client_ip: None,
            rate_headers: Vec::new(),
            limit_statuses: Statuses::default(),
            outcome: Outcome::Unlimited,
            delay: Duration::ZERO,
            decided_us: None,
            upstream_sent: None,
            upstream_time: None,
            leases: Vec::new(),
            conn_statuses: Statuses::default(),
            upstream: upstreaming::Attempts::default(),
            peer: None,
            peer_trusted: false,
            trace: None,
            charges: ResponseCharges::default(),
            client_left_owing: false,
            pace: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        ctx.trace = trace_span::start(session, ctx);
        let rt = ctx.runtime.clone();
        let clients = &rt.server.clients;
        // The head is in: from here its body and response are bounded by Pingora's per-read
        // timeouts, not by the connection's head deadline.
        if let Some(guarded) = session.stream().and_then(GuardedStream::of) {
            guarded.request_started();
        }
        session.set_read_timeout(Some(clients.body_timeout));
        session.set_write_timeout(Some(clients.send_timeout));
        session.set_pipelining_enabled(true);

        let req = session.req_header();
        let peer = session.client_addr().and_then(|a| a.as_inet()).map(|a| a.ip());
        ctx.peer = peer;
        ctx.peer_trusted = keys::peer_is_trusted(peer, rt.real_ip.as_ref());
        ctx.client_ip = engine::client_ip(&rt, peer, &req.headers);

        // Framing an upstream could read differently is refused before anything is counted; the
        // connection is closed, as its framing is in doubt.
        let h2 = req.version == http::Version::HTTP_2;
        if let Err(e) = hygiene::check(req.version, &req.headers, req.uri.authority().map(|a| a.as_str())) {
            return bad_request(session, ctx, "bad_framing", &e.to_string(), true).await;
        }
        let head = engine::Head {
            method: &req.method,
            target: req.raw_path(),
            authority: if h2 { req.uri.authority().map(|a| a.as_str()) } else { None },
            headers: &req.headers,
            client_ip: ctx.client_ip,
            route: None,
            unix_secs: None,
        };
        let plan = match engine::admit(&rt, &head) {
            Ok(plan) => plan,
            Err(refused) => return self.refuse(session, ctx, refused).await,
        };
        ctx.route = Some(plan.route);
        // The clock starts with the response (see response_filter); the rate is decided now.
        ctx.pace = plan.pace.map(|p| Box::new(Pace::new(p, ctx.started)));
        let route = &rt.routes[plan.route];
        if let Err(e) = forward_as_decided(session.req_header_mut(), &plan.forward) {
            return bad_request(session, ctx, "bad_target", &e.to_string(), false).await;
        }

        if !plan.zones.is_empty() {
            let asked = trace_span::clock(ctx);
            let enforcement = limit_req::enforce(&rt, route, &plan.zones, &self.stores).await;
            trace_span::decided(ctx, "limit_req", asked);
            // The store's own time orders the decisions; the proxy's clock when no store decided
            // (read only then: it is not needed on the usual path).
            ctx.decided_us =
                Some(enforcement.decided_us.unwrap_or_else(|| crate::limit::Clock::now_us(&crate::limit::SystemClock)));
            ctx.outcome = Outcome::of_limit_req(enforcement.fallback, enforcement.statuses.overall);
            ctx.limit_statuses = enforcement.statuses;
            match enforcement.action {
                Action::Reject { status, refusal } => {
                    return respond::rejection(session, route.grpc_status, status, &enforcement.headers, refusal).await;
                }
                Action::Delay(delay) => {
                    // A timer on the proxy's runtime: this request waits, nothing else does.
                    ctx.delay = delay;
                    rt.meters.route(ctx.route).delay(delay.as_secs_f64());
                    let watch_client = !hygiene::has_body(&session.req_header().headers);
                    if !wait_unless_client_leaves(session, delay, watch_client).await {
                        // nginx drops a delayed request whose client has gone; so do we, and
                        // nothing further is taken for it (no lease, no upstream place).
                        ctx.outcome = Outcome::ClientGone;
                        return Err(Error::explain(
                            ErrorType::ConnectionClosed,
                            "client left during the limit_req delay",
                        ));
                    }
                }
                Action::Forward => {}
            }
            ctx.rate_headers = enforcement.headers;
        }

        // limit_conn after limit_req, like nginx: a delayed request is not counted while it waits,
        // and a rejected one never takes a lease.
        if !plan.conns.is_empty() {
            let asked = trace_span::clock(ctx);
            let conn = limit_conn::acquire(&rt, route, &plan.conns, &self.conn_stores).await;
            trace_span::decided(ctx, "limit_conn", asked);
            ctx.leases = conn.leases;
            ctx.conn_statuses = conn.statuses;
            if let Some(reject) = conn.reject {
                ctx.outcome = Outcome::of_conn_rejection(conn.fallback);
                return respond::rejection(session, route.grpc_status, reject.status, &reject.headers, reject.refusal)
                    .await;
            }
        }

        ctx.charges = ResponseCharges::new(&rt, route, &plan.zones);
        let upstream = &rt.upstreams[route.upstream];
        if let Err(reason) = ctx.upstream.admit(upstream, plan.priority).await {
            ctx.outcome = Outcome::AdaptiveShed;
            return upstreaming::shed(session, reason, &upstream.name, route).await;
        }
        if let Err(why) = ctx.upstream.first(upstream) {
            ctx.outcome = match why {
                crate::upstream::Unavailable::Busy => Outcome::UpstreamBusy,
                crate::upstream::Unavailable::Down => Outcome::UpstreamDown,
            };
            return upstreaming::unavailable(session, why, &upstream.name, &route.name).await;
        }
        Ok(false)
    }

    /// No downstream modules: Pingora's default adds its response compression (disabled), which
    /// Weir never enables, yet is built, called at every phase and dropped for every request
    /// (~700 instructions a request).
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut RequestCtx) -> Result<Box<HttpPeer>> {
        let peer = ctx.upstream.peer();
        if peer.is_ok() {
            trace_span::attempt_started(ctx);
        }
        peer
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        e: Box<Error>,
    ) -> Box<Error> {
        trace_span::attempt_failed(ctx, e.etype().as_str());
        ctx.upstream.connect_failed(e)
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut RequestCtx,
        client_reused: bool,
    ) -> Box<Error> {
        let e = e.more_context(format!("Peer: {peer}"));
        trace_span::attempt_failed(ctx, e.etype().as_str());
        ctx.upstream.proxy_failed(session, e, client_reused)
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.upstream.response_status(session, upstream_response.status.as_u16())
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut RequestCtx) -> FailToProxy {
        let rt = ctx.runtime.clone();
        let route = ctx.route.and_then(|i| rt.routes.get(i)).map_or("-", |r| r.name.as_str());
        upstreaming::fail_to_proxy(session, e, &ctx.upstream, route).await
    }

    /// A client that leaves mid-request is a normal event, not an error: counted and logged at
    /// debug instead of Pingora's ERROR line.
    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, e: &Error) -> bool {
        let Some(kind) = client_disconnect(e) else { return false };
        METRICS.client_disconnects.with_label_values(&[kind]).inc();
        tracing::debug!(error = %e, "client disconnected before the response was complete");
        true
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // HTTP/2: the body deadline (body_timeout) starts with forwarding; see edge/streams.rs.
        if session.is_http2() {
            crate::edge::awaiting_body(!session.is_body_done());
        }
        if let (true, Some(peer)) = (ctx.runtime.server.clients.forwarded_headers, ctx.peer) {
            let fwd = forwarded::compute(&upstream_request.headers, peer, ctx.client_ip, ctx.peer_trusted);
            upstream_request.insert_header(forwarded::X_FORWARDED_FOR, fwd.x_forwarded_for)?;
            match fwd.x_real_ip {
                Some(ip) => upstream_request.insert_header(forwarded::X_REAL_IP, ip)?,
                None => drop(upstream_request.remove_header(&forwarded::X_REAL_IP_NAME)),
            }
            if !fwd.keep_forwarded {
                upstream_request.remove_header(&forwarded::FORWARDED);
            }
        }
        if ctx.upstream.close_after() {
            upstream_request.insert_header(http::header::CONNECTION, "close")?;
        }
        if let Some(span) = &ctx.trace {
            span.inject(upstream_request);
        }
        ctx.upstream_sent = Some(Instant::now());
        ctx.charges.forwarded();
        Ok(())
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        _ctx: &mut RequestCtx,
    ) -> Result<()> {
        crate::edge::body_progress(end_of_stream);
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.upstream_time = ctx.upstream_sent.map(|t| t.elapsed());
        trace_span::attempt_answered(ctx, resp.status.as_u16());
        // Count by response: charged before the client sees the status (and before any lease is
        // released), so its next request is checked against this charge.
        if !ctx.charges.is_empty() {
            ctx.charges.at_head(resp.status.as_u16(), &resp.headers, &self.stores).await;
        }
        for (name, value) in ctx.rate_headers.drain(..) {
            resp.insert_header(name, value)?;
        }
        if let Some(pace) = &mut ctx.pace {
            // No head start for the time spent waiting on the upstream.
            pace.restart(Instant::now());
        }
        Ok(())
    }

    /// `limit_rate`: each chunk of the body waits until the pace allows it (Pingora sleeps on a
    /// timer; the leases stay held).
    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<Duration>> {
        match (&mut ctx.pace, body) {
            (Some(pace), Some(chunk)) => Ok(pace.before(chunk.len(), Instant::now())),
            _ => Ok(None),
        }
    }

    /// Charge from the response's trailers (`cost_from_response` with `trailer`; HTTP/2 upstreams).
    async fn response_trailer_filter(
        &self,
        _session: &mut Session,
        trailers: &mut http::HeaderMap,
        ctx: &mut RequestCtx,
    ) -> Result<Option<bytes::Bytes>> {
        if !ctx.charges.is_empty() {
            ctx.charges.at_trailers(trailers, &self.stores).await;
        }
        Ok(None)
    }

    /// The upstream's answer is complete once its body ends: what is still owed is what it
    /// reported, whatever the client does next.
    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<Duration>> {
        if end_of_stream {
            ctx.charges.body_ended();
        }
        Ok(None)
    }

    async fn logging(&self, session: &mut Session, error: Option<&Error>, ctx: &mut RequestCtx) {
        if let Some(guarded) = session.stream().and_then(GuardedStream::of) {
            guarded.request_finished();
        }
        // What the response still owes (before the leases go): its end's charge, or the most
        // the answer could have cost when the client left before it was complete.
        if !ctx.charges.is_empty() {
            // Whatever failed on the client's side (closed, reset its stream, timed out) ended
            // the answer for it; the upstream's own failures are not the client leaving.
            let left = error.is_some_and(|e| *e.esource() == pingora::ErrorSource::Downstream);
            ctx.client_left_owing = left && ctx.charges.unfinished();
            let ending = if left { Ending::ClientLeft } else { Ending::Over };
            ctx.charges.finish(ending, session.body_bytes_sent() as u64, &self.stores).await;
        }
        // The request is over, however it ended: give back its concurrency slots first.
        for lease in ctx.leases.drain(..) {
            lease.release().await;
        }
        ctx.upstream.release();
        let rt = &ctx.runtime;
        let route = ctx.route.and_then(|i| rt.routes.get(i)).map_or("-", |r| r.name.as_str());
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let meters = rt.meters.route(ctx.route);
        meters.request(ctx.outcome.slot(), ctx.outcome.label());
        ctx.limit_statuses.count(|zone| rt.meters.zone(zone));
        ctx.conn_statuses.count(|zone| rt.meters.conn_zone(zone));
        if let Some(upstream_time) = ctx.upstream_time {
            meters.upstream_response(status, upstream_time.as_secs_f64());
        }
        if rt.log.access_log {
            access_log::write(session, error, ctx, route, status);
        }
        trace_span::finish(ctx.trace.take(), ctx, route, status);
    }
}

impl WeirProxy {
    /// The engine's refusal as an answer: 400, 403 or 404.
    async fn refuse(&self, session: &mut Session, ctx: &mut RequestCtx, refused: Refused) -> Result<bool> {
        match refused {
            Refused::BadRequest { error, detail, route } => {
                ctx.route = route;
                bad_request(session, ctx, error.code(), &detail, false).await
            }
            Refused::NoRoute => {
                ctx.outcome = Outcome::NoRoute;
                respond::json(session, 404, &[], bodies::no_route()).await
            }
            Refused::Denied { route } => {
                ctx.route = Some(route);
                ctx.outcome = Outcome::Denied;
                let name = ctx.runtime.routes.get(route).map_or("-", |r| r.name.as_str());
                let body = bodies::forbidden(name);
                respond::json(session, 403, &[], body).await
            }
            Refused::Unauthorized { route, zone, detail, absent } => {
                ctx.route = Some(route);
                ctx.outcome = Outcome::Unauthorized;
                let name = ctx.runtime.routes.get(route).map_or("-", |r| r.name.as_str());
                // RFC 6750 §3.1: no error code when the request carried no token at all.
                let challenge = if absent { "Bearer" } else { "Bearer error=\"invalid_token\"" };
                let body = bodies::unauthorized(name, &zone, &detail);
                respond::json(session, 401, &[("WWW-Authenticate", challenge.to_string())], body).await
            }
        }
    }
}

/// Rewrites the request Pingora forwards into what the engine decided on: the canonical
/// origin-form target, the decided host, without the headers the engine strips. HTTP/2 names
/// its host in the URI (`:authority`), HTTP/1 in `Host`.
fn forward_as_decided(req: &mut RequestHeader, forward: &engine::Forward) -> Result<()> {
    let invalid = |e: http::Error| Error::because(ErrorType::InvalidHTTPHeader, "the decided target", e);
    for name in &forward.strip {
        req.remove_header(name);
    }
    if forward.target.is_none() && forward.host.is_none() {
        return Ok(());
    }
    let path_and_query = match &forward.target {
        Some(target) => target.clone(),
        None => req.uri.path_and_query().map_or_else(|| "/".to_string(), |pq| pq.as_str().to_string()),
    };
    match (req.uri.authority().cloned(), req.uri.scheme().cloned()) {
        (Some(authority), Some(scheme)) => {
            let authority = forward.host.as_deref().unwrap_or(authority.as_str());
            let uri = http::Uri::builder()
                .scheme(scheme)
                .authority(authority)
                .path_and_query(path_and_query)
                .build()
                .map_err(invalid)?;
            req.set_uri(uri);
            if forward.host.is_some() && req.headers.contains_key(HOST) {
                req.remove_header(&HOST);
            }
        }
        _ => {
            req.set_uri(http::Uri::builder().path_and_query(path_and_query).build().map_err(invalid)?);
            if let Some(host) = &forward.host {
                req.insert_header(HOST, host.as_str())?;
            }
        }
    }
    Ok(())
}

/// A 400 naming what is wrong. `close`: the connection is not reused (its framing is in doubt).
async fn bad_request(
    session: &mut Session,
    ctx: &mut RequestCtx,
    error: &str,
    detail: &str,
    close: bool,
) -> Result<bool> {
    ctx.outcome = Outcome::BadRequest;
    if close {
        session.set_keepalive(None);
    }
    let route = ctx.route.and_then(|i| ctx.runtime.routes.get(i)).map(|r| r.name.as_str());
    let body = bodies::bad_request(error, detail, route);
    respond::json(session, 400, &[], body).await
}

/// Sleeps `delay`; returns false as soon as the client closes its connection (`watch_client`:
/// only for requests without a body, whose connection can be read without consuming anything).
async fn wait_unless_client_leaves(session: &mut Session, delay: Duration, watch_client: bool) -> bool {
    if !watch_client {
        tokio::time::sleep(delay).await;
        return true;
    }
    let timer = tokio::time::sleep(delay);
    tokio::pin!(timer);
    tokio::select! {
        _ = &mut timer => true,
        read = session.downstream_session.read_body_or_idle(true) => match read {
            // Closed (or broken): the client is gone.
            Err(_) => false,
            // Anything else (e.g. a pipelined next request) is kept for later; wait out the delay.
            Ok(_) => {
                timer.await;
                true
            }
        },
    }
}

/// The `weir_client_disconnects_total` label of an error that only says the client went away.
fn client_disconnect(e: &Error) -> Option<&'static str> {
    if *e.esource() != pingora::ErrorSource::Downstream {
        return None;
    }
    match e.etype() {
        ErrorType::ConnectionClosed => Some("closed"),
        ErrorType::ReadError => Some("read"),
        ErrorType::WriteError => Some("write"),
        ErrorType::ReadTimedout | ErrorType::WriteTimedout => Some("timeout"),
        _ => None,
    }
}
#[cfg(test)]
mod tests {
    /// The context lives inline in Pingora's per-request future, which is moved (copied) twice per
    /// request and kept per keep-alive connection: what is large and rare (a trace span) is boxed.
    #[test]
    fn the_request_context_stays_small() {
        let size = std::mem::size_of::<super::RequestCtx>();
        assert!(size <= 384, "RequestCtx is {size} bytes: box what is large and rarely used");
    }
}
