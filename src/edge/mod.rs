//! The client edge: what every connection passes before HTTP is parsed. Connections beyond the
//! caps are answered with a short 503 and closed at once (never left to hang in the kernel's
//! queue), and admitted ones are wrapped in a [`GuardedStream`] that enforces the head and
//! keep-alive deadlines. The proxy itself runs unchanged inside.

pub mod accept;
pub mod budget;
mod capped;
mod caps;
mod stream;
mod streams;
mod tls;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::{Stream, ALPN};
use pingora::server::ShutdownWatch;
use tokio::io::AsyncWriteExt;

pub use capped::Capped;
pub use caps::{CapFull, ConnPermit, ConnectionCaps};
pub use stream::{GuardedStream, StreamLimits};
pub use streams::{awaiting_body, body_progress, h2_options};
pub use tls::TlsListeners;

use crate::buffering::{Budgets, WriteBehind};
use crate::config::Runtime;
use crate::metrics::METRICS;
use streams::StreamGate;

/// How long a refused connection may take to receive its 503.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_millis(500);
use accept::H2_PREFACE;

/// Wraps the HTTP app it serves (the proxy): generic, so the edge knows nothing of the proxy.
pub struct EdgeApp<A> {
    proxy: Arc<A>,
    runtime: Arc<ArcSwap<Runtime>>,
    caps: Arc<ConnectionCaps>,
    /// The instance cap when the config sets none: the proxy's share of the descriptor budget.
    default_max_connections: usize,
    /// The `listen_tls` addresses and their acceptor.
    tls: Option<TlsListeners>,
    /// Cleartext HTTP/2 with prior knowledge is enabled (`server.h2c`).
    h2c: bool,
    /// Every connection's response buffers together (`server.response_buffering`).
    buffers: Arc<Budgets>,
}

impl<A: HttpServerApp> EdgeApp<A> {
    pub fn new(proxy: A, runtime: Arc<ArcSwap<Runtime>>, default_max_connections: usize) -> Self {
        let h2c = proxy.server_options().is_some_and(|o| o.h2c);
        let buffers = Arc::new(Budgets::metered(&runtime.load().server.clients.response_buffering));
        Self {
            proxy: Arc::new(proxy),
            runtime,
            caps: Arc::new(ConnectionCaps::default()),
            default_max_connections,
            tls: None,
            h2c,
            buffers,
        }
    }

    /// Connections accepted on these addresses start with a TLS handshake.
    pub fn with_tls(mut self, tls: TlsListeners) -> Self {
        self.tls = Some(tls);
        self
    }
}

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> ServerApp for EdgeApp<A> {
    async fn process_new(self: &Arc<Self>, mut stream: Stream, shutdown: &ShutdownWatch) -> Option<Stream> {
        let runtime = self.runtime.load();
        let clients = &runtime.server.clients;
        let peer = peer_ip(&stream);
        let tls = self.tls.as_ref().filter(|t| local_addr(&stream).is_some_and(|a| t.serves(a)));
        // Trusted proxies carry many clients on their connections: only the instance cap counts them.
        let trusted = crate::keys::peer_is_trusted(peer, runtime.real_ip.as_ref());
        let per_ip = if trusted { None } else { clients.max_connections_per_ip };
        let max_total = clients.max_connections.unwrap_or(self.default_max_connections);
        let permit = match self.caps.admit(peer, max_total, per_ip) {
            Ok(permit) => permit,
            Err(refusal) => {
                METRICS.connections_refused.with_label_values(&[refusal.label()]).inc();
                if tls.is_some() {
                    // Before the handshake there is no way to say why: just close.
                    pingora::protocols::Shutdown::shutdown(&mut *stream).await;
                } else {
                    refuse(&mut stream, refusal).await;
                }
                return None;
            }
        };
        let limits = StreamLimits {
            header_timeout: clients.header_timeout,
            keepalive_timeout: clients.keepalive_timeout,
            max_header_size: clients.max_header_size,
        };
        let clients = clients.clone();
        drop(runtime);
        let (stream, multiplexed) = match tls {
            Some(tls) => match tls.handshake(stream, limits.header_timeout).await {
                Ok(stream) => {
                    METRICS.tls_handshakes.with_label_values(&["ok"]).inc();
                    let h2 = matches!(stream.selected_alpn_proto(), Some(ALPN::H2));
                    (stream, h2)
                }
                Err(e) => {
                    let label = match e {
                        tls::HandshakeError::TimedOut => "timeout",
                        tls::HandshakeError::Failed(_) => "failed",
                    };
                    METRICS.tls_handshakes.with_label_values(&[label]).inc();
                    tracing::debug!(peer = ?peer, error = ?e, "TLS handshake failed");
                    return None;
                }
            },
            None if self.h2c => {
                let mut preface = [0u8; H2_PREFACE.len()];
                // Pingora peeks for the preface too, without a deadline: bound the wait here.
                match tokio::time::timeout(limits.header_timeout, stream.try_peek(&mut preface)).await {
                    Ok(Ok(_)) => {
                        let h2 = &preface == H2_PREFACE;
                        (stream, h2)
                    }
                    Ok(Err(_)) => return None,
                    Err(_) => {
                        METRICS.connections_cut.with_label_values(&["header_timeout"]).inc();
                        return None;
                    }
                }
            }
            None => (stream, false),
        };
        let buffering = &clients.response_buffering;
        let stream: Stream = if buffering.enabled && !multiplexed {
            // HTTP/1: the response is taken ahead of a slow client (HTTP/2: see buffering/mod.rs).
            self.buffers.apply(buffering);
            Box::new(WriteBehind::new(stream, buffering.clone(), self.buffers.clone(), clients.send_timeout))
        } else {
            stream
        };
        let guarded: Stream = Box::new(GuardedStream::new(stream, limits, permit, multiplexed));
        if multiplexed {
            // Each stream takes a place under the caps and has a body deadline (see streams.rs).
            let gate = StreamGate::new(self.proxy.clone(), self.caps.clone(), peer, (max_total, per_ip), clients);
            return Arc::new(gate).process_new(guarded, shutdown).await;
        }
        // HTTP/1 keep-alive loops inside the proxy, so this returns when the connection is done.
        self.proxy.process_new(guarded, shutdown).await
    }

    async fn cleanup(&self) {
        self.proxy.cleanup().await
    }
}

fn local_addr(stream: &Stream) -> Option<std::net::SocketAddr> {
    let digest = stream.get_socket_digest()?;
    digest.local_addr().and_then(|a| a.as_inet()).copied()
}

/// The peer's address, an IPv4-mapped IPv6 one (a dual-stack listener's view of an IPv4 client)
/// as the IPv4 address it is, so caps and trusted-proxy ranges see one client one way.
fn peer_ip(stream: &Stream) -> Option<IpAddr> {
    let digest = stream.get_socket_digest()?;
    digest.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip().to_canonical())
}

/// The body of a connection refused at accept (`max_connections` / `max_connections_per_ip`).
fn too_many_connections(cap: &'static str) -> String {
    // One family with every body Weir writes (`engine/refusal.rs`).
    crate::engine::Refusal::TooManyConnections { cap }.body()
}

/// A short HTTP/1.1 503 with `Connection: close`, best effort: the client may be gone already.
async fn refuse(stream: &mut Stream, refusal: CapFull) {
    let body = too_many_connections(refusal.label());
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.flush().await
    };
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, write).await;
    pingora::protocols::Shutdown::shutdown(&mut **stream).await;
}
