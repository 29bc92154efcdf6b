//! The TLS handshake of a `listen_tls` connection, done at the edge rather than in Pingora's
//! listener: the connection caps count a connection before its handshake (a refused one costs no
//! crypto), `header_timeout` bounds the handshake (Pingora's listener has no handshake deadline,
//! so a client that never sends its ClientHello would hold a socket forever), and the rustls
//! config is Weir's own (`min_tls`, ALPN, the SNI resolver), which Pingora's `TlsSettings`
//! cannot express. The result is Pingora's own `TlsStream`, so the proxy sees the same
//! digest, ALPN and SNI as with a Pingora TLS listener.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::listeners::tls::Acceptor;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream, TimingDigest,
    UniqueID, UniqueIDType,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The TLS listeners of the edge, and the acceptor they share.
pub struct TlsListeners {
    addrs: Vec<SocketAddr>,
    acceptor: Acceptor,
}

impl TlsListeners {
    pub fn new(addrs: Vec<SocketAddr>, config: rustls::ServerConfig) -> Self {
        Self { addrs, acceptor: Acceptor::from_server_config(Arc::new(config)) }
    }

    /// Whether a connection accepted on `local` came through a TLS listener (a listener on
    /// `0.0.0.0:8443` sees its connections' real local address).
    pub fn serves(&self, local: SocketAddr) -> bool {
        self.addrs.iter().any(|a| a.port() == local.port() && (a.ip() == local.ip() || a.ip().is_unspecified()))
    }

    /// The handshake, within `deadline`. `Err` names why it failed, for the debug log.
    pub async fn handshake(&self, stream: Stream, deadline: Duration) -> Result<Stream, HandshakeError> {
        match tokio::time::timeout(deadline, self.acceptor.tls_handshake(Transport(stream))).await {
            Ok(Ok(tls)) => Ok(Box::new(tls)),
            Ok(Err(e)) => Err(HandshakeError::Failed(e.to_string())),
            Err(_) => Err(HandshakeError::TimedOut),
        }
    }
}

#[derive(Debug)]
pub enum HandshakeError {
    TimedOut,
    Failed(String),
}

/// A boxed stream as a sized `IO`, which Pingora's `TlsStream<S>` needs.
#[derive(Debug)]
struct Transport(Stream);

impl AsyncRead for Transport {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Transport {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for Transport {
    async fn shutdown(&mut self) {
        self.0.shutdown().await
    }
}

impl UniqueID for Transport {
    fn id(&self) -> UniqueIDType {
        self.0.id()
    }
}

impl Ssl for Transport {}

impl GetTimingDigest for Transport {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.0.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.0.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.0.get_write_pending_time()
    }
}

impl GetProxyDigest for Transport {
    fn get_proxy_digest(&self) -> Option<Arc<pingora::protocols::raw_connect::ProxyDigest>> {
        self.0.get_proxy_digest()
    }
}

impl GetSocketDigest for Transport {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.0.get_socket_digest()
    }

    fn set_socket_digest(&mut self, socket_digest: SocketDigest) {
        self.0.set_socket_digest(socket_digest)
    }
}

#[async_trait]
impl Peek for Transport {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.0.try_peek(buf).await
    }
}
