//! The Pingora `ProxyHttp` implementation, the HTTP front door of the engine. `request_filter`
//! refuses bad framing (`request::hygiene`), then hands the request head to the engine's
//! [`Ticket`], which routes, keys and decides it (src/engine/); the phase carries out the ruling:
//! reject (`respond`), or wait out the delay and forward to the upstream (`upstreaming`: the
//! peer, retries on the next server). The later phases pass the response through the ticket
//! (charges from the response, pacing); `logging` finishes the ticket (its leases, its report to
//! the observer) and writes the access line (`access_log`) and the trace span (`trace_span`).

mod access_log;
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
use crate::engine::ConnStores;
use crate::engine::Stores;
use crate::engine::{self, Answer, Ending, Outcome, Refusal, Ruling, Ticket};
use crate::keys;
use crate::metrics::METRICS;
use crate::request::{forwarded, hygiene};
use crate::upstream::Registry;

pub struct WeirProxy {
    runtime: Arc<ArcSwap<Runtime>>,
    stores: Stores,
    conn_stores: ConnStores,
    upstreams: Arc<Registry>,
}

impl WeirProxy {
    /// The proxy decides with stores and upstream state that outlive every reload (the process
    /// makes them once).
    pub fn new(
        runtime: Arc<ArcSwap<Runtime>>,
        stores: Stores,
        conn_stores: ConnStores,
        upstreams: Arc<Registry>,
    ) -> Self {
        Self { runtime, stores, conn_stores, upstreams }
    }
}

/// Per-request state: the engine's ticket (which holds the config snapshot the request started
/// with, kept to its end, so a reload never changes a request mid-flight) and what is Pingora's.
pub struct RequestCtx {
    ticket: Ticket,
    started: Instant,
    upstream_sent: Option<Instant>,
    upstream_time: Option<Duration>,
    /// The upstream servers chosen and tried; the current one holds its `max_conns` place.
    upstream: upstreaming::Attempts,
    /// The TCP peer, and whether it is a trusted proxy (for the forwarded headers).
    peer: Option<IpAddr>,
    peer_trusted: bool,
    /// The request's OpenTelemetry span (src/trace/); `None` when tracing is off or unsampled.
    trace: Option<Box<crate::trace::RequestSpan>>,
}

#[async_trait]
impl ProxyHttp for WeirProxy {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            ticket: Ticket::new(self.runtime.load_full(), None, self.stores.observer),
            started: Instant::now(),
            upstream_sent: None,
            upstream_time: None,
            upstream: upstreaming::Attempts::default(),
            peer: None,
            peer_trusted: false,
            trace: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        ctx.trace = trace_span::start(session, ctx);
        let rt = ctx.ticket.runtime().clone();
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
        let client_ip = engine::client_ip(&rt, peer, &req.headers);
        ctx.ticket.counts_against(client_ip);

        // Framing an upstream could read differently is refused before anything is counted; the
        // connection is closed, as its framing is in doubt.
        let h2 = req.version == http::Version::HTTP_2;
        if let Err(e) = hygiene::check(req.version, &req.headers, req.uri.authority().map(|a| a.as_str())) {
            ctx.ticket.settle_as(Outcome::BadRequest);
            session.set_keepalive(None);
            let refusal = Refusal::BadRequest { error: "bad_framing", detail: e.to_string(), route: None };
            return respond::answer(session, &Answer::new(400, refusal)).await;
        }
        let head = engine::Head {
            method: &req.method,
            target: req.raw_path(),
            authority: if h2 { req.uri.authority().map(|a| a.as_str()) } else { None },
            headers: &req.headers,
            client_ip,
            route: None,
            unix_secs: None,
        };
        let asked = trace_span::clock(ctx);
        let (forward, delay) = match ctx.ticket.rule(&head, &self.stores).await {
            Ruling::Refuse(answer) => {
                if answer.refusal.by_limit_req() {
                    trace_span::decided(ctx.trace.as_deref_mut(), "limit_req", asked);
                }
                return respond::answer(session, &answer).await;
            }
            Ruling::Forward { forward, delay } => (forward, delay),
        };
        if ctx.ticket.report().decided_us.is_some() {
            trace_span::decided(ctx.trace.as_deref_mut(), "limit_req", asked);
        }
        if let Err(e) = forward_as_decided(session.req_header_mut(), &forward) {
            ctx.ticket.settle_as(Outcome::BadRequest);
            let refusal = Refusal::BadRequest {
                error: "bad_target",
                detail: e.to_string(),
                route: Some(route_name(&ctx.ticket)),
            };
            return respond::answer(session, &Answer::new(400, refusal)).await;
        }
        if !delay.is_zero() {
            // A timer on the proxy's runtime: this request waits, nothing else does.
            let watch_client = !hygiene::has_body(&session.req_header().headers);
            if !wait_unless_client_leaves(session, delay, watch_client).await {
                // nginx drops a delayed request whose client has gone; so do we, and nothing
                // further is taken for it (no lease, no upstream place).
                ctx.ticket.client_gone();
                return Err(Error::explain(ErrorType::ConnectionClosed, "client left during the limit_req delay"));
            }
        }

        if ctx.ticket.wants_leases() {
            let asked = trace_span::clock(ctx);
            if let Err(answer) = ctx.ticket.hold(&self.conn_stores).await {
                trace_span::decided(ctx.trace.as_deref_mut(), "limit_conn", asked);
                return respond::answer(session, &answer).await;
            }
            trace_span::decided(ctx.trace.as_deref_mut(), "limit_conn", asked);
        }

        let Some(route) = ctx.ticket.report().route.and_then(|i| rt.routes.get(i)) else { return Ok(false) };
        let upstream = &rt.upstreams[route.upstream];
        ctx.upstream.found(self.upstreams.of(upstream));
        if let Err(reason) = ctx.upstream.admit(ctx.ticket.priority()).await {
            ctx.ticket.settle_as(Outcome::AdaptiveShed);
            return upstreaming::shed(session, reason, &upstream.name, route).await;
        }
        if let Err(why) = ctx.upstream.first() {
            ctx.ticket.settle_as(match why {
                crate::upstream::Unavailable::Busy => Outcome::UpstreamBusy,
                crate::upstream::Unavailable::Down => Outcome::UpstreamDown,
            });
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
        upstreaming::fail_to_proxy(session, e, &ctx.upstream, route_name(&ctx.ticket)).await
    }

    /// A client that leaves mid-request is a normal event, not an error: counted and logged at
    /// debug instead of Pingora's ERROR line.
    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, e: &Error) -> bool {
        if respond::is_close_444(e) {
            return true;
        }
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
        if let (true, Some(peer)) = (ctx.ticket.runtime().server.clients.forwarded_headers, ctx.peer) {
            let fwd =
                forwarded::compute(&upstream_request.headers, peer, ctx.ticket.report().client_ip, ctx.peer_trusted);
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
        ctx.ticket.forwarded();
        Ok(())
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        crate::edge::body_progress(end_of_stream);
        if end_of_stream {
            ctx.upstream.sent();
        }
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
        if ctx.ticket.owes() {
            ctx.ticket.charge_at_head(resp.status.as_u16(), &resp.headers, &self.stores).await;
        }
        for (name, value) in ctx.ticket.head_fields() {
            resp.insert_header(name, value)?;
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
        match (ctx.ticket.pace(), body) {
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
        if ctx.ticket.owes() {
            ctx.ticket.at_trailers(trailers, &self.stores).await;
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
            ctx.ticket.body_ended();
            ctx.upstream.upstream_finished();
        }
        Ok(None)
    }

    async fn logging(&self, session: &mut Session, error: Option<&Error>, ctx: &mut RequestCtx) {
        if let Some(guarded) = session.stream().and_then(GuardedStream::of) {
            guarded.request_finished();
        }
        // What the response still owes, then the leases, then the report (engine/ticket.rs).
        // Whatever failed on the client's side (closed, reset its stream, timed out) ended the
        // answer for it; the upstream's own failures are not the client leaving.
        let closed_444 = error.is_some_and(respond::is_close_444);
        let left = error.is_some_and(|e| *e.esource() == pingora::ErrorSource::Downstream) && !closed_444;
        let ending = if left { Ending::ClientLeft } else { Ending::Over };
        if !ctx.ticket.finish_settled() {
            ctx.ticket.finish(ending, session.body_bytes_sent() as u64, &self.stores).await;
        }
        ctx.upstream.release();
        let trace = ctx.trace.take();
        let ctx = &*ctx;
        let rt = ctx.ticket.runtime();
        let route = route_name(&ctx.ticket);
        // A 444 wrote nothing; it is logged as 444, as nginx does.
        let status = match closed_444 {
            true => respond::CLOSE_STATUS,
            false => session.response_written().map_or(0, |r| r.status.as_u16()),
        };
        if let Some(upstream_time) = ctx.upstream_time {
            rt.meters.route(ctx.ticket.report().route).upstream_response(status, upstream_time.as_secs_f64());
        }
        if rt.log.access_log {
            access_log::write(session, error, ctx, route, status);
        }
        trace_span::finish(trace, ctx, route, status);
    }
}

/// Rewrites the request Pingora forwards into what the engine decided on: the canonical
/// origin-form target, the decided host, without the headers the engine strips. HTTP/2 names
/// its host in the URI (`:authority`), HTTP/1 in `Host`.
/// The request's route's name, `-` before one matched.
fn route_name(ticket: &Ticket) -> &str {
    ticket.route().map_or("-", |r| r.name.as_str())
}

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
    /// request and kept per keep-alive connection: what is large and rare (a trace span, a pace,
    /// the ticket's limit_conn part and response-decided charges) is boxed. The engine's ticket is
    /// most of it (~220 bytes): copying it costs less than a heap allocation per request would
    /// (so the first upstream address tried is kept in place: 24 bytes more, one allocation less).
    #[test]
    fn the_request_context_stays_small() {
        let size = std::mem::size_of::<super::RequestCtx>();
        assert!(size <= 400, "RequestCtx is {size} bytes: box what is large and rarely used");
    }
}
