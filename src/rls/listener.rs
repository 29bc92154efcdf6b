//! The rate limit service's listeners: gRPC over HTTP/2 (tonic), cleartext on `rls.listen` and
//! TLS on `rls.listen_tls` with the proxy's certificates (and their reloads). A Pingora background
//! service, so it runs beside the proxy — or alone — and stops with the process.
//!
//! Every resource a client controls is capped (docs/edge-bounds.md): connections (the service's
//! share of the descriptor budget), the time to the HTTP/2 preface (TLS handshake included) and
//! idle time (`[server]` `header_timeout` and `keepalive_timeout`, as for the proxy's
//! clients), calls per connection and in flight in all, message and header sizes, time per call.
//! Accepted sockets run with `TCP_NODELAY` (edge/accept.rs); the responses that finish in one
//! turn of the runtime leave in one write (`coalesce`).

use std::convert::Infallible;
use std::future::Future;
use std::net::TcpListener as StdListener;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_stream::StreamExt;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::server::NamedService;
use tonic::transport::server::Connected;

use super::coalesce::CoalescedWrites;
use super::proto::quota::RateLimitQuotaServiceServer;
use super::proto::RateLimitServiceServer;
use super::quota::QuotaService;
use super::service::RlsService;
use crate::config::Runtime;
use crate::edge::accept::{self, Admitted, Discipline};
use crate::edge::ConnectionCaps;
use crate::metrics::METRICS;

/// A request is a few descriptors; Envoy's are well under 1 KiB.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// HPACK-decoded size of one call's metadata.
pub const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// Concurrent calls on one HTTP/2 connection (Envoy multiplexes its calls on a few); more are
/// refused by HTTP/2 itself (`REFUSED_STREAM`).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 100;
/// Calls in flight over all connections; more are answered UNAVAILABLE at once. A call whose
/// message never comes holds ~14 KiB until `CALL_TIMEOUT`: 1024 of them are ~14 MiB.
pub const MAX_CALLS_IN_FLIGHT: usize = 1024;
/// A call that takes longer is answered DEADLINE_EXCEEDED (the store has its own, shorter timeout).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

pub struct RlsListener {
    service: Arc<RlsService>,
    /// RLQS (`StreamRateLimitQuotas`) on the same listeners, connections and budgets.
    quota: Arc<QuotaService>,
    runtime: Arc<ArcSwap<Runtime>>,
    /// The service's share of the descriptor budget (`edge::budget`).
    max_connections: usize,
    /// Bound at start-up (so a busy address fails the start), served once the service starts.
    listeners: Mutex<Vec<(StdListener, Option<TlsAcceptor>)>>,
}

impl RlsListener {
    /// Binds every address now; `tls` serves `listen_tls`.
    pub fn bind(
        service: RlsService,
        quota: QuotaService,
        runtime: Arc<ArcSwap<Runtime>>,
        max_connections: usize,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Result<Self, String> {
        let rt = runtime.load();
        let Some(rls) = rt.rls.as_ref() else { return Err("rls: not configured".into()) };
        let mut listeners = Vec::new();
        let tls_acceptor = tls.map(TlsAcceptor::from);
        for (field, addr, acceptor) in rls
            .listen
            .iter()
            .map(|a| ("rls.listen", a, None))
            .chain(rls.listen_tls.iter().map(|a| ("rls.listen_tls", a, tls_acceptor.clone())))
        {
            if field == "rls.listen_tls" && acceptor.is_none() {
                return Err("rls.listen_tls: no TLS configuration".into());
            }
            let listener = StdListener::bind(addr).map_err(|e| format!("{field}: cannot listen on {addr}: {e}"))?;
            listener.set_nonblocking(true).map_err(|e| format!("{field}: {addr}: {e}"))?;
            listeners.push((listener, acceptor));
        }
        drop(rt);
        Ok(Self {
            service: Arc::new(service),
            quota: Arc::new(quota),
            runtime,
            max_connections,
            listeners: Mutex::new(listeners),
        })
    }

    /// What the service's connections are held to, read per connection (reloads apply to new ones).
    fn discipline(&self) -> impl Fn() -> Discipline + Send + 'static {
        let (runtime, max_connections) = (self.runtime.clone(), self.max_connections);
        move || {
            let clients = &runtime.load().server.clients;
            Discipline {
                max_connections,
                preface_timeout: clients.header_timeout,
                idle_timeout: clients.keepalive_timeout,
                cap_label: "rls_max_connections",
            }
        }
    }
}

#[async_trait]
impl BackgroundService for RlsListener {
    async fn start(&self, shutdown: ShutdownWatch) {
        let listeners = std::mem::take(&mut *self.listeners.lock().unwrap_or_else(|p| p.into_inner()));
        // One cap over every address of the service, and one bound on its calls in flight.
        let caps = Arc::new(ConnectionCaps::default());
        let calls = Arc::new(Semaphore::new(MAX_CALLS_IN_FLIGHT));
        let mut servers = tokio::task::JoinSet::new();
        for (std_listener, acceptor) in listeners {
            let listener = match TcpListener::from_std(std_listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(error = %e, "rls: cannot serve a listener");
                    continue;
                }
            };
            let addr = listener.local_addr().ok();
            let grpc = RateLimitServiceServer::from_arc(self.service.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            // A stream's messages are bounded like a call's; its time is not (CALL_TIMEOUT bounds the
            // call until its answer stream starts), its count is (`rls.max_quota_streams`).
            let quota = RateLimitQuotaServiceServer::from_arc(self.quota.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            let router = tonic::transport::Server::builder()
                .timeout(CALL_TIMEOUT)
                .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
                .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
                .http2_keepalive_interval(Some(Duration::from_secs(30)))
                .http2_keepalive_timeout(Some(Duration::from_secs(10)))
                .add_service(CallBudget { inner: grpc, calls: calls.clone() })
                .add_service(CallBudget { inner: quota, calls: calls.clone() });
            let mut stop = shutdown.clone();
            let signal = async move {
                let _ = stop.changed().await;
            };
            let discipline = self.discipline();
            match acceptor {
                None => {
                    let incoming = accept::admitted(listener, caps.clone(), discipline, |tcp| async { Ok(tcp) })
                        .map(|conn| conn.map(CoalescedWrites::new));
                    servers.spawn(async move { (addr, router.serve_with_incoming_shutdown(incoming, signal).await) });
                }
                Some(acceptor) => {
                    let handshake = move |tcp| {
                        let acceptor = acceptor.clone();
                        async move {
                            let result = acceptor.accept(tcp).await;
                            let label = if result.is_ok() { "ok" } else { "failed" };
                            METRICS.tls_handshakes.with_label_values(&[label]).inc();
                            result
                        }
                    };
                    let incoming = accept::admitted(listener, caps.clone(), discipline, handshake)
                        .map(|conn| conn.map(CoalescedWrites::new));
                    servers.spawn(async move { (addr, router.serve_with_incoming_shutdown(incoming, signal).await) });
                }
            }
        }
        while let Some(done) = servers.join_next().await {
            if let Ok((addr, Err(e))) = done {
                tracing::error!(?addr, error = %e, "rls listener stopped");
            }
        }
    }
}

impl<S> Connected for Admitted<S> {
    type ConnectInfo = std::net::SocketAddr;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.peer()
    }
}

/// The service behind a bound on the calls in flight over all connections: a call over it is
/// answered UNAVAILABLE at once (Envoy applies its `failure_mode_deny`), before its message is
/// read, so calls that never send one cannot pile up.
#[derive(Clone)]
struct CallBudget<S> {
    inner: S,
    calls: Arc<Semaphore>,
}

impl<S: NamedService> NamedService for CallBudget<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for CallBudget<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let Ok(permit) = self.calls.clone().try_acquire_owned() else {
            METRICS.rls_calls_shed.inc();
            let status = tonic::Status::unavailable("weir: too many rate limit calls in flight, retry");
            return Box::pin(std::future::ready(Ok(status.into_http())));
        };
        let call = self.inner.call(req);
        Box::pin(async move {
            let answer = call.await;
            drop(permit);
            answer
        })
    }
}
