//! The client edge: what every connection passes before HTTP is parsed. Connections beyond the
//! caps are answered with a short 503 and closed at once (never left to hang in the kernel's
//! queue), and admitted ones are wrapped in a [`GuardedStream`] that enforces the head and
//! keep-alive deadlines. The proxy itself runs unchanged inside.

mod caps;
mod stream;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use tokio::io::AsyncWriteExt;

pub use caps::{ConnPermit, ConnectionCaps, Refusal};
pub use stream::{GuardedStream, StreamLimits};

use crate::config::Runtime;
use crate::metrics::METRICS;
use crate::proxy::{bodies, WeirProxy};

/// File descriptors kept for everything but client connections: the admin listener and its
/// clients, Redis, the config watcher, logs, Pingora's own.
const FD_RESERVE: usize = 128;
/// How long a refused connection may take to receive its 503.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_millis(500);

pub struct EdgeApp {
    proxy: Arc<HttpProxy<WeirProxy>>,
    runtime: Arc<ArcSwap<Runtime>>,
    caps: Arc<ConnectionCaps>,
    /// The instance cap when the config sets none, from the file-descriptor limit.
    default_max_connections: usize,
}

impl EdgeApp {
    pub fn new(proxy: HttpProxy<WeirProxy>, runtime: Arc<ArcSwap<Runtime>>, fd_limit: u64) -> Self {
        Self {
            proxy: Arc::new(proxy),
            runtime,
            caps: Arc::new(ConnectionCaps::default()),
            default_max_connections: default_max_connections(fd_limit),
        }
    }
}

/// Each proxied request holds two descriptors (client and upstream), and a reserve stays free so
/// the admin endpoints and Redis keep working when clients take everything else.
pub fn default_max_connections(fd_limit: u64) -> usize {
    let fds = usize::try_from(fd_limit).unwrap_or(usize::MAX);
    (fds.saturating_sub(FD_RESERVE) / 2).max(16)
}

#[async_trait]
impl ServerApp for EdgeApp {
    async fn process_new(self: &Arc<Self>, mut stream: Stream, shutdown: &ShutdownWatch) -> Option<Stream> {
        let runtime = self.runtime.load();
        let clients = &runtime.server.clients;
        let peer = peer_ip(&stream);
        // Trusted proxies carry many clients on their connections: only the instance cap counts them.
        let trusted = match (peer, runtime.real_ip.as_ref()) {
            (Some(ip), Some(real_ip)) => real_ip.is_trusted(&ip),
            _ => false,
        };
        let per_ip = if trusted { None } else { clients.max_connections_per_ip };
        let max_total = clients.max_connections.unwrap_or(self.default_max_connections);
        let permit = match self.caps.admit(peer, max_total, per_ip) {
            Ok(permit) => permit,
            Err(refusal) => {
                METRICS.connections_refused.with_label_values(&[refusal.label()]).inc();
                refuse(&mut stream, refusal).await;
                return None;
            }
        };
        let limits = StreamLimits {
            header_timeout: clients.header_timeout,
            keepalive_timeout: clients.keepalive_timeout,
            max_header_size: clients.max_header_size,
        };
        drop(runtime);
        let guarded: Stream = Box::new(GuardedStream::new(stream, limits, permit));
        // HTTP/1 keep-alive loops inside the proxy, so this returns when the connection is done.
        self.proxy.process_new(guarded, shutdown).await
    }

    async fn cleanup(&self) {
        self.proxy.cleanup().await
    }
}

fn peer_ip(stream: &Stream) -> Option<IpAddr> {
    let digest = stream.get_socket_digest()?;
    digest.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip())
}

/// A short HTTP/1.1 503 with `Connection: close`, best effort: the client may be gone already.
async fn refuse(stream: &mut Stream, refusal: Refusal) {
    let body = bodies::too_many_connections(refusal.label());
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
