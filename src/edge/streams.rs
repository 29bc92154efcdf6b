//! HTTP/2 streams at the edge. One h2 connection carries many requests, and Pingora serves each
//! on a task of its own with no cap but the stream limit the connection advertises, and no body
//! deadline at all (its h2 session ignores the read timeout). Each h2 connection is therefore
//! served through a [`StreamGate`] of its own, which:
//!
//! - advertises `SETTINGS_MAX_CONCURRENT_STREAMS` = `h2_max_streams` (h2 itself answers streams
//!   beyond it with `REFUSED_STREAM`);
//! - counts streams against the connection caps: the connection's own place covers one stream in
//!   flight, each further one takes a place of its own under `max_connections` and
//!   `max_connections_per_ip`, as a connection would. A proxied stream holds an upstream socket
//!   as an HTTP/1 connection does, so this keeps descriptors within the same bound, and the
//!   admin listener keeps its reserve. A stream without a place is reset with `REFUSED_STREAM`
//!   (RFC 9113 §8.7: not processed, safe to retry);
//! - cuts a stream whose request body stops arriving for `body_timeout`, as HTTP/1's read
//!   timeout does. The proxy reports body progress through [`awaiting_body`] and
//!   [`body_progress`]; the deadline runs only between the start of the body's forwarding and
//!   its last byte, so a request delayed by `limit_req` is not cut for waiting.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, HttpServerOptions, ReusedHttpStream};
use pingora::protocols::http::v2::server::{default_h2_options, H2Options};
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::caps::{CapFull, ConnPermit, ConnectionCaps};
use crate::config::ClientLimits;
use crate::metrics::METRICS;

/// Pingora's h2 options with Weir's limits: the stream cap and the header-list cap (the h2
/// counterpart of `max_header_size`, on the HPACK-decoded size).
pub fn h2_options(clients: &ClientLimits) -> H2Options {
    let mut options = default_h2_options();
    options.max_concurrent_streams(clients.h2_max_streams);
    options.max_header_list_size(u32::try_from(clients.max_header_size).unwrap_or(u32::MAX));
    options
}

/// Where a connection's streams take their places: the caps and the limits that applied when
/// the connection was admitted.
pub struct StreamGate<A> {
    proxy: Arc<A>,
    caps: Arc<ConnectionCaps>,
    peer: Option<IpAddr>,
    max_total: usize,
    /// `None` for peers the per-address cap does not apply to (trusted proxies).
    per_ip: Option<usize>,
    clients: ClientLimits,
    /// The connection's own place is free for a stream.
    own_place_free: Arc<AtomicBool>,
}

/// A stream's place: the connection's own, or one taken from the caps.
enum Place {
    /// The connection's own place (its flag, set free again on drop).
    Own(Arc<AtomicBool>),
    Extra(#[allow(dead_code)] ConnPermit),
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Place::Own(free) = self {
            free.store(true, Ordering::Release);
        }
    }
}

impl<A: HttpServerApp + Send + Sync + 'static> StreamGate<A> {
    pub fn new(
        proxy: Arc<A>,
        caps: Arc<ConnectionCaps>,
        peer: Option<IpAddr>,
        (max_total, per_ip): (usize, Option<usize>),
        clients: ClientLimits,
    ) -> Self {
        Self { proxy, caps, peer, max_total, per_ip, clients, own_place_free: Arc::new(AtomicBool::new(true)) }
    }

    fn take_place(self: &Arc<Self>) -> Result<Place, CapFull> {
        if self.own_place_free.swap(false, Ordering::AcqRel) {
            return Ok(Place::Own(self.own_place_free.clone()));
        }
        self.caps.admit(self.peer, self.max_total, self.per_ip).map(Place::Extra)
    }
}

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> HttpServerApp for StreamGate<A> {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        if !session.is_http2() {
            return self.proxy.process_new_http(session, shutdown).await;
        }
        let _place = match self.take_place() {
            Ok(place) => place,
            Err(refusal) => {
                METRICS.connections_refused.with_label_values(&[refusal.label()]).inc();
                if let ServerSession::H2(stream) = &mut session {
                    stream.shutdown_with_reason(h2::Reason::REFUSED_STREAM);
                }
                return None;
            }
        };
        let watch = Arc::new(BodyWatch::new(self.clients.body_timeout));
        let serve = BODY_WATCH.scope(watch.clone(), self.proxy.process_new_http(session, shutdown));
        tokio::select! {
            served = serve => served,
            () = watch.expired() => {
                // Dropping the request resets its stream (h2 sends RST_STREAM) and closes its
                // upstream connection; concurrency leases are released by their `Drop`.
                METRICS.connections_cut.with_label_values(&["body_timeout"]).inc();
                tracing::debug!(peer = ?self.peer, "HTTP/2 request body not received within body_timeout");
                None
            }
        }
    }

    fn h2_options(&self) -> Option<H2Options> {
        Some(h2_options(&self.clients))
    }

    fn server_options(&self) -> Option<&HttpServerOptions> {
        self.proxy.server_options()
    }
}

tokio::task_local! {
    /// The body deadline of the h2 stream this task serves (absent on HTTP/1, whose body reads
    /// are bounded by the session's read timeout).
    static BODY_WATCH: Arc<BodyWatch>;
}

/// The request is about to be forwarded: from now its body must keep arriving (when it has one
/// still to come). Called by the proxy before it sends the request upstream.
pub fn awaiting_body(body_pending: bool) {
    let _ = BODY_WATCH.try_with(|w| if body_pending { w.arm() } else { w.disarm() });
}

/// A piece of the request body arrived (`end`: the last). Called by the proxy for each.
pub fn body_progress(end: bool) {
    let _ = BODY_WATCH.try_with(|w| if end { w.disarm() } else { w.touch() });
}

/// A deadline that runs while armed and moves forward with each piece of body.
struct BodyWatch {
    timeout: Duration,
    /// `Some(deadline)` while the body is awaited.
    deadline: Mutex<Option<Instant>>,
    armed: Notify,
}

impl BodyWatch {
    fn new(timeout: Duration) -> Self {
        Self { timeout, deadline: Mutex::new(None), armed: Notify::new() }
    }

    fn set(&self, deadline: Option<Instant>) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = deadline;
    }

    fn arm(&self) {
        self.set(Some(Instant::now() + self.timeout));
        self.armed.notify_one();
    }

    fn touch(&self) {
        let mut deadline = self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        if deadline.is_some() {
            *deadline = Some(Instant::now() + self.timeout);
        }
    }

    fn disarm(&self) {
        self.set(None);
    }

    /// Resolves once the body has been awaited for `timeout` without a piece arriving.
    async fn expired(&self) {
        loop {
            let deadline = *self.deadline.lock().unwrap_or_else(|p| p.into_inner());
            match deadline {
                None => self.armed.notified().await,
                Some(at) if Instant::now() >= at => return,
                // Progress moves the deadline without waking us: look again when this one passes.
                Some(at) => tokio::time::sleep_until(at).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_body_deadline_runs_only_while_armed_and_moves_with_progress() {
        let watch = Arc::new(BodyWatch::new(Duration::from_secs(5)));
        let start = Instant::now();
        let w = watch.clone();
        let expired = tokio::spawn(async move {
            w.expired().await;
            Instant::now()
        });
        // Not armed: nothing runs however long it waits (a delayed request).
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!expired.is_finished());
        watch.arm();
        tokio::time::sleep(Duration::from_secs(4)).await;
        watch.touch();
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(!expired.is_finished(), "progress moved the deadline");
        let at = expired.await.unwrap();
        assert_eq!(at - start, Duration::from_secs(60 + 4 + 5));

        let done = Arc::new(BodyWatch::new(Duration::from_secs(5)));
        done.arm();
        done.disarm();
        let d = done.clone();
        let never = tokio::spawn(async move { d.expired().await });
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!never.is_finished(), "a complete body has no deadline");
    }
}
