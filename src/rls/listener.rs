//! The rate limit service's listeners: gRPC over HTTP/2 (tonic), cleartext on `rls.listen` and
//! TLS on `rls.listen_tls` with the proxy's certificates (and their reloads). A Pingora background
//! service, so it runs beside the proxy — or alone — and stops with the process.
//!
//! Every resource a client controls is capped: message size, header list size, streams per
//! connection, time per call, and TLS handshakes.

use std::net::TcpListener as StdListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};

use super::proto::RateLimitServiceServer;
use super::service::RlsService;

/// A request is a few descriptors; Envoy's are well under 1 KiB.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// HPACK-decoded size of one call's metadata.
pub const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// Concurrent calls on one HTTP/2 connection (Envoy multiplexes its calls on a few).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// A call that takes longer is answered DEADLINE_EXCEEDED (the store has its own, shorter timeout).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct RlsListener {
    service: Arc<RlsService>,
    /// Bound at start-up (so a busy address fails the start), served once the service starts.
    listeners: Mutex<Vec<(StdListener, Option<TlsAcceptor>)>>,
}

impl RlsListener {
    /// Binds every address now; `tls` serves `listen_tls`.
    pub fn bind(
        service: RlsService,
        listen: &[std::net::SocketAddr],
        listen_tls: &[std::net::SocketAddr],
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Result<Self, String> {
        let mut listeners = Vec::new();
        let tls_acceptor = tls.map(TlsAcceptor::from);
        for (field, addr, acceptor) in listen
            .iter()
            .map(|a| ("rls.listen", a, None))
            .chain(listen_tls.iter().map(|a| ("rls.listen_tls", a, tls_acceptor.clone())))
        {
            if field == "rls.listen_tls" && acceptor.is_none() {
                return Err("rls.listen_tls: no TLS configuration".into());
            }
            let listener = StdListener::bind(addr).map_err(|e| format!("{field}: cannot listen on {addr}: {e}"))?;
            listener.set_nonblocking(true).map_err(|e| format!("{field}: {addr}: {e}"))?;
            listeners.push((listener, acceptor));
        }
        Ok(Self { service: Arc::new(service), listeners: Mutex::new(listeners) })
    }
}

#[async_trait]
impl BackgroundService for RlsListener {
    async fn start(&self, shutdown: ShutdownWatch) {
        let listeners = std::mem::take(&mut *self.listeners.lock().unwrap_or_else(|p| p.into_inner()));
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
            let router = tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .timeout(CALL_TIMEOUT)
                .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
                .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
                .http2_keepalive_interval(Some(Duration::from_secs(30)))
                .http2_keepalive_timeout(Some(Duration::from_secs(10)))
                .add_service(grpc);
            let mut stop = shutdown.clone();
            let signal = async move {
                let _ = stop.changed().await;
            };
            match acceptor {
                None => {
                    servers.spawn(async move {
                        let result =
                            router.serve_with_incoming_shutdown(TcpListenerStream::new(listener), signal).await;
                        (addr, result)
                    });
                }
                Some(acceptor) => {
                    let incoming = tls_incoming(listener, acceptor);
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

/// TLS connections of one listener: each handshake in its own task (a slow client cannot stall
/// the accept loop), bounded in time.
fn tls_incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
) -> ReceiverStream<std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "rls: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        crate::metrics::METRICS.tls_handshakes.with_label_values(&["ok"]).inc();
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(_)) => crate::metrics::METRICS.tls_handshakes.with_label_values(&["failed"]).inc(),
                    Err(_) => crate::metrics::METRICS.tls_handshakes.with_label_values(&["timeout"]).inc(),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
