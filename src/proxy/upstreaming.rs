//! One request's way to an upstream server: the first pick (in `request_filter`), the peer with
//! the upstream's timeouts, and nginx's `proxy_next_upstream`: on a connect error, a timeout or a
//! listed status, the next server is picked — at most `tries` servers within
//! `next_upstream_timeout`, and once the request was sent only for idempotent methods unless
//! `non_idempotent` is set. Failures count toward the server's `max_fails`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use pingora::prelude::*;
use pingora::proxy::{FailToProxy, Session};
use pingora::{ErrorSource, RetryType};
use smallvec::SmallVec;

use super::respond;
use crate::adaptive::{Permit, Priority, ShedReason};
use crate::engine::{Answer, Refusal};
use crate::metrics::METRICS;
use crate::upstream::{Kept, Pool, ServerSlot, Unavailable, UpstreamSpec, MAX_TRIES};

/// The upstream part of the request context.
#[derive(Default)]
pub struct Attempts {
    /// The upstream's lasting state (pool, adaptive limit), found once per request.
    kept: Option<Arc<Kept>>,
    /// The server of the current (or next) attempt, holding its `max_conns` place.
    slot: Option<ServerSlot>,
    /// Servers this request was sent to, in order (the first in place: nearly every request has
    /// one, and a `Vec` would allocate for it).
    tried: SmallVec<[SocketAddr; 1]>,
    first_at: Option<Instant>,
    /// Set when a response status asked for the next server: the error it raised is ours.
    status_retry: bool,
    /// The place under the upstream's adaptive limit (boxed: only upstreams with one pay).
    permit: Option<Box<Permit>>,
    /// Why the adaptive limit refused the request (the access log's `shed`).
    shed: Option<ShedReason>,
}

impl Attempts {
    /// The request goes to the upstream whose lasting state is `kept`.
    pub fn found(&mut self, kept: Arc<Kept>) {
        self.kept = Some(kept);
    }

    /// Takes a place under the upstream's adaptive limit, if it has one (after limit_req and
    /// limit_conn decided: they guard clients, this guards the upstream). May wait in its queue.
    pub async fn admit(&mut self, priority: Priority) -> Result<(), ShedReason> {
        let Some(limit) = self.kept.as_ref().and_then(|k| k.adaptive.clone()) else { return Ok(()) };
        match limit.acquire(priority).await {
            Ok(permit) => {
                self.permit = Some(Box::new(permit));
                Ok(())
            }
            Err(reason) => {
                self.shed = Some(reason);
                Err(reason)
            }
        }
    }

    /// Why the adaptive limit refused this request, if it did.
    pub fn shed(&self) -> Option<ShedReason> {
        self.shed
    }

    /// Picks the first server; a request that gets none is answered by [`unavailable`].
    pub fn first(&mut self) -> Result<(), Unavailable> {
        let Some(kept) = &self.kept else { return Err(Unavailable::Down) };
        self.slot = Some(kept.pool.pick(&[])?);
        Ok(())
    }

    fn pool(&self) -> Option<&Arc<Pool>> {
        self.kept.as_ref().map(|k| &k.pool)
    }

    pub fn tries(&self) -> usize {
        self.tried.len()
    }

    /// The servers this request was sent to, in order.
    pub fn tried(&self) -> &[SocketAddr] {
        &self.tried
    }

    /// The servers tried, like nginx's `$upstream_addr` (`"10.0.0.1:80, 10.0.0.2:80"`), or `-`.
    pub fn addrs(&self) -> String {
        if self.tried.is_empty() {
            return "-".to_string();
        }
        self.tried.iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(", ")
    }

    /// `keepalive = 0` on an HTTP/1.1 upstream: the request asks the server to close. (A zero
    /// idle timeout alone does not stop reuse: Pingora's pool checks it with a coarse timer, and
    /// a request that comes within a few milliseconds takes the connection.)
    pub fn close_after(&self) -> bool {
        self.pool().is_some_and(|p| p.with_spec(|s| !s.keepalive && s.protocol == crate::upstream::Protocol::H1))
    }

    /// The request is over: give the places back.
    pub fn release(&mut self) {
        self.slot = None;
        self.permit = None;
    }

    /// The peer of the next attempt: the server's TLS settings, protocol and timeouts.
    pub fn peer(&mut self) -> Result<Box<HttpPeer>> {
        let Some(slot) = &self.slot else {
            return Error::e_explain(ErrorType::InternalError, "no upstream server for this request");
        };
        self.tried.push(slot.addr());
        self.first_at.get_or_insert_with(Instant::now);
        // Built with the pool's membership (TLS material loaded at config compile): a clone.
        Ok(Box::new(slot.peer().clone()))
    }

    /// Whether policy allows another attempt; if so the next server is picked (and its place
    /// taken) now, so that a retry never ends in "no server" when the last answer was usable.
    fn next_server(&mut self, spec: &UpstreamSpec) -> bool {
        let limit = spec.retry.tries.unwrap_or(MAX_TRIES).min(MAX_TRIES) as usize;
        if self.tried.len() >= limit {
            return false;
        }
        if let (Some(timeout), Some(first)) = (spec.retry.timeout, self.first_at) {
            if first.elapsed() >= timeout {
                return false;
            }
        }
        // A retry keeps the request's adaptive place, but is not made while others are refused
        // or waiting for one: retries must not pile onto an overloaded upstream.
        if self.permit.as_ref().is_some_and(|p| !p.allows_retry()) {
            return false;
        }
        let Some(pool) = self.pool() else { return false };
        match pool.pick(&self.tried) {
            Ok(next) => {
                self.slot = Some(next);
                if let Some(permit) = &mut self.permit {
                    permit.retried();
                }
                true
            }
            Err(_) => false,
        }
    }

    /// The request was fully sent to the upstream (`request_body_filter` at its end of stream,
    /// which Pingora also calls for a request without a body and for each retry): the adaptive
    /// limit's latency sample starts here, so a client's slow upload is not the upstream's
    /// latency.
    pub fn sent(&mut self) {
        if let Some(permit) = &mut self.permit {
            permit.sent();
        }
    }

    /// The upstream's answer has ended (its body's end of stream was read): it is no longer
    /// working on this request, so the adaptive place is given back now, not when a slow client
    /// has finished reading. (The `max_conns` slot and any `limit_conn` lease stay until the
    /// request ends: they count other things.) How early this moment comes is the response
    /// buffering's business.
    pub fn upstream_finished(&mut self) {
        self.permit = None;
    }

    /// The upstream's response head arrived: the adaptive limit's latency sample.
    pub fn answered(&mut self) {
        if let Some(permit) = &mut self.permit {
            permit.answered();
        }
    }

    /// The current attempt failed: count it against the server and give its place back.
    fn fail(&mut self) -> Option<Arc<UpstreamSpec>> {
        let pool = self.pool()?.clone();
        let slot = self.slot.take()?;
        pool.record_failure(slot.addr());
        drop(slot);
        Some(pool.spec())
    }

    fn retry_counted(&self, reason: &str) {
        if let Some(pool) = self.pool() {
            METRICS.upstream_retries.with_label_values(&[&pool.name, reason]).inc();
        }
    }

    /// `fail_to_connect`: nothing was sent, so any method may go to the next server (nginx).
    pub fn connect_failed(&mut self, mut e: Box<Error>) -> Box<Error> {
        if let (Some(pool), Some(slot)) = (self.pool(), &self.slot) {
            METRICS.upstream_connect_errors.with_label_values(&[&pool.name, &slot.addr().to_string()]).inc();
            if is_tls_failure(&e) {
                // A configuration problem an operator must see (wrong CA, name, client cert):
                // the client only gets a 502.
                let peer = slot.peer();
                tracing::warn!(upstream = %pool.name, server = %slot.addr(), sni = %peer.sni,
                    reason = tls_reason(&e), error = %e, "upstream TLS handshake failed");
            }
        }
        let timeout = matches!(e.etype(), ErrorType::ConnectTimedout);
        let reason = if timeout { "timeout" } else { "error" };
        let Some(spec) = self.fail() else { return e };
        let allowed = if timeout { spec.retry.on_timeout } else { spec.retry.on_error };
        let retry = allowed && self.next_server(&spec);
        if retry {
            self.retry_counted(reason);
        }
        e.set_retry(retry);
        e
    }

    /// `error_while_proxy`: the request may have reached the server.
    pub fn proxy_failed(&mut self, session: &Session, mut e: Box<Error>, client_reused: bool) -> Box<Error> {
        if std::mem::take(&mut self.status_retry) {
            return e;
        }
        let idempotent = session.req_header().method.is_idempotent();
        let replayable = !session.as_ref().retry_buffer_truncated() && session.response_written().is_none();
        if *e.esource() != ErrorSource::Upstream {
            // The client went away or sent garbage: not the server's fault, nothing to retry.
            e.set_retry(false);
            return e;
        }
        // A kept-alive connection the server had closed: the same server may get it again.
        if client_reused && matches!(e.retry, RetryType::ReusedOnly) {
            let retry = idempotent && replayable && self.slot.is_some();
            if retry {
                self.tried.pop();
                self.retry_counted("stale_connection");
            }
            e.set_retry(retry);
            return e;
        }
        let timeout = matches!(e.etype(), ErrorType::ReadTimedout | ErrorType::WriteTimedout);
        if let (true, Some(permit)) = (timeout, &mut self.permit) {
            permit.timed_out();
        }
        let reason = if timeout { "timeout" } else { "error" };
        let Some(spec) = self.fail() else { return e };
        let allowed = if timeout { spec.retry.on_timeout } else { spec.retry.on_error };
        let method_ok = idempotent || spec.retry.non_idempotent;
        let retry = allowed && method_ok && replayable && self.next_server(&spec);
        if retry {
            self.retry_counted(reason);
        }
        e.set_retry(retry);
        e
    }

    /// `upstream_response_filter`: a status listed in `next_upstream` sends the request to the
    /// next server when one is available; otherwise this response goes to the client (nginx).
    pub fn response_status(&mut self, session: &Session, status: u16) -> Result<()> {
        self.answered();
        // Every response passes here: the usual one, whose status is not listed, costs a look.
        let listed = |s: &UpstreamSpec| s.retry.on_status.contains(&status);
        if !self.pool().is_some_and(|p| p.with_spec(listed)) {
            return Ok(());
        }
        let reason = format!("http_{status}");
        let Some(spec) = self.fail() else { return Ok(()) };
        let method_ok = session.req_header().method.is_idempotent() || spec.retry.non_idempotent;
        let replayable = !session.as_ref().retry_buffer_truncated() && session.response_written().is_none();
        if !(method_ok && replayable && self.next_server(&spec)) {
            return Ok(());
        }
        self.retry_counted(&reason);
        self.status_retry = true;
        let mut e = Error::explain(ErrorType::HTTPStatus(status), "upstream status listed in next_upstream");
        e.as_up();
        e.set_retry(true);
        Err(e)
    }
}

/// The TLS handshake with the server failed (certificate not verified, name mismatch, client
/// certificate refused, no common protocol).
fn is_tls_failure(e: &Error) -> bool {
    matches!(e.etype(), ErrorType::TLSHandshakeFailure | ErrorType::InvalidCert | ErrorType::HandshakeError)
}

/// The gist of a handshake error, e.g. `invalid peer certificate: UnknownIssuer` or `received
/// fatal alert: HandshakeFailure`, out of Pingora's nested contexts; else the whole error.
fn tls_reason(e: &Error) -> String {
    let text = e.to_string();
    ["invalid peer certificate", "received fatal alert", "peer is incompatible", "peer misbehaved"]
        .iter()
        .find_map(|needle| text.find(needle))
        .map(|start| {
            let rest = &text[start..];
            let end = [", SNI:", " cause:", " context:"].iter().filter_map(|m| rest.find(m)).min();
            rest[..end.unwrap_or(rest.len())].trim().to_string()
        })
        .unwrap_or(text)
}

/// No server for the request: 503 when they are all at `max_conns` (as before), 502 when none is up.
pub async fn unavailable(session: &mut Session, why: Unavailable, upstream: &str, route: &str) -> Result<bool> {
    match why {
        Unavailable::Busy => {
            METRICS.upstream_unavailable.with_label_values(&[upstream, "busy"]).inc();
            let answer = Answer::new(503, Refusal::UpstreamBusy { route }).with_header("Retry-After", "1");
            respond::answer(session, &answer).await
        }
        Unavailable::Down => {
            METRICS.upstream_unavailable.with_label_values(&[upstream, "down"]).inc();
            respond::answer(session, &Answer::new(502, Refusal::NoHealthyUpstream { upstream, route })).await
        }
    }
}

/// The upstream's adaptive limit refused the request: the route's overload status
/// (`limit_conn_status`, 503 by default) with `Retry-After`, or gRPC's answer on a gRPC route.
pub async fn shed(
    session: &mut Session,
    reason: ShedReason,
    upstream: &str,
    route: &crate::config::Route,
) -> Result<bool> {
    let refusal = Refusal::UpstreamOverloaded { upstream, route: &route.name, reason: reason.as_str() };
    let answer = Answer::new(route.conn_status, refusal).with_header("Retry-After", "1").for_grpc(route.grpc_status);
    respond::answer(session, &answer).await
}

/// `fail_to_proxy`: 504 when the last attempt timed out, 502 for other upstream failures, each
/// with a JSON body naming the upstream; client-side errors as Pingora does them.
pub async fn fail_to_proxy(session: &mut Session, e: &Error, attempts: &Attempts, route: &str) -> FailToProxy {
    let upstream = attempts.pool().map_or("-", |p| p.name.as_str());
    let (code, error) = match (e.etype(), e.esource()) {
        _ if respond::is_close_444(e) => (0, ""),
        (ErrorType::HTTPStatus(code), _) => (*code, "upstream_error"),
        (ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout, ErrorSource::Upstream) => {
            (504, "upstream_timeout")
        }
        (_, ErrorSource::Upstream) if is_tls_failure(e) => (502, "upstream_tls_error"),
        (_, ErrorSource::Upstream) => (502, "upstream_error"),
        (ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed, ErrorSource::Downstream) => {
            (0, "")
        }
        (_, ErrorSource::Downstream) => (400, "bad_request"),
        _ => (500, "internal_error"),
    };
    if code > 0 && session.response_written().is_none() {
        let refusal = Refusal::UpstreamFailed { error, upstream, route, tries: attempts.tries() };
        if let Err(write_error) = respond::answer(session, &Answer::new(code, refusal)).await {
            tracing::debug!(error = %write_error, "cannot send the error response");
        }
    }
    FailToProxy { error_code: code, can_reuse_downstream: false }
}
