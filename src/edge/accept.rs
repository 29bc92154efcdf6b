//! The accept loop of a listener Weir serves itself (the rate limit service's gRPC), under the
//! same discipline as the proxy's edge: a connection cap (its share of the descriptor budget,
//! `budget.rs`), `TCP_NODELAY`, a deadline for the TLS handshake and the HTTP/2 preface, an idle
//! timeout, and accept errors backed off so that a descriptor shortage never spins a core.
//!
//! Admitted connections come out of a channel, ready for an HTTP/2 server (tonic's
//! `serve_with_incoming`), each an [`Admitted`] stream that holds its place under the cap for as
//! long as it lives.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tokio_stream::wrappers::ReceiverStream;

use super::caps::{ConnPermit, ConnectionCaps};
use crate::metrics::METRICS;

/// The first bytes of every HTTP/2 connection (RFC 9113 §3.4).
pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The first wait after a failed accept; doubled while accept keeps failing.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What one listener's connections are held to.
#[derive(Debug, Clone, Copy)]
pub struct Discipline {
    /// Connections open at once; more are closed at once.
    pub max_connections: usize,
    /// From accept to the last byte of the HTTP/2 preface (TLS handshake included).
    pub preface_timeout: Duration,
    /// A connection from which nothing was read for this long is closed.
    pub idle_timeout: Duration,
    /// `weir_connections_refused_total{cap}` for a connection over `max_connections`.
    pub cap_label: &'static str,
}

/// Accepts on `listener` until the receiver is dropped: each connection that finds a place under
/// the cap gets `TCP_NODELAY`, then `handshake` (TLS, or none) and the preface within
/// `preface_timeout`, each in its own task so that a slow client holds up no other.
pub fn admitted<S, H, F>(
    listener: TcpListener,
    caps: Arc<ConnectionCaps>,
    discipline: impl Fn() -> Discipline + Send + 'static,
    handshake: H,
) -> ReceiverStream<io::Result<Admitted<S>>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(TcpStream) -> F + Send + 'static,
    F: Future<Output = io::Result<S>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(conn) => {
                        backoff = FIRST_BACKOFF;
                        conn
                    }
                    Err(e) => {
                        // EMFILE, ENFILE, ENOBUFS: accept fails at once until something closes.
                        METRICS.accept_errors.inc();
                        tracing::warn!(error = %e, wait = ?backoff, "accept failed; backing off");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                },
                _ = tx.closed() => return,
            };
            let d = discipline();
            let permit = match caps.admit(Some(peer.ip()), d.max_connections, None) {
                Ok(permit) => permit,
                Err(_) => {
                    METRICS.connections_refused.with_label_values(&[d.cap_label]).inc();
                    drop(tcp);
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (tx, shake) = (tx.clone(), handshake(tcp));
            tokio::spawn(async move {
                let opened = async {
                    let mut stream = shake.await?;
                    let mut preface = [0u8; 24];
                    stream.read_exact(&mut preface).await?;
                    if &preface != H2_PREFACE {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, "not HTTP/2 (gRPC needs it)"));
                    }
                    Ok(stream)
                };
                match tokio::time::timeout(d.preface_timeout, opened).await {
                    Ok(Ok(stream)) => {
                        let conn = Admitted::new(stream, permit, peer, d.idle_timeout);
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "connection closed before HTTP/2 began"),
                    Err(_) => {
                        METRICS.connections_cut.with_label_values(&["header_timeout"]).inc();
                        tracing::debug!(%peer, "no HTTP/2 preface within the deadline: closed");
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// An admitted connection: its place under the cap is given back when it is dropped, its preface
/// (already read and checked) is replayed to the server first, and a read that waits longer than
/// the idle timeout fails, which closes the connection.
pub struct Admitted<S> {
    inner: S,
    _permit: ConnPermit,
    peer: SocketAddr,
    preface_left: usize,
    idle: Duration,
    last_read: Instant,
    idle_timer: Pin<Box<Sleep>>,
}

impl<S> Admitted<S> {
    fn new(inner: S, permit: ConnPermit, peer: SocketAddr, idle: Duration) -> Self {
        let now = Instant::now();
        Self {
            inner,
            _permit: permit,
            peer,
            preface_left: H2_PREFACE.len(),
            idle,
            last_read: now,
            idle_timer: Box::pin(tokio::time::sleep_until(now + idle)),
        }
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Ready with an error once nothing was read for the idle timeout; the timer is moved only
    /// when it fires early (reads just note their time).
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            ready!(self.idle_timer.as_mut().poll(cx));
            let due = self.last_read + self.idle;
            if Instant::now() >= due {
                METRICS.connections_cut.with_label_values(&["keepalive_timeout"]).inc();
                return Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, "idle connection closed"));
            }
            self.idle_timer.as_mut().reset(due);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Admitted<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.preface_left > 0 {
            let start = H2_PREFACE.len() - this.preface_left;
            let n = this.preface_left.min(buf.remaining());
            buf.put_slice(&H2_PREFACE[start..start + n]);
            this.preface_left -= n;
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.last_read = Instant::now();
                }
                Poll::Ready(result)
            }
            Poll::Pending => match this.poll_idle(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Admitted<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = TcpStream::connect(addr).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        (client, server)
    }

    #[tokio::test(start_paused = true)]
    async fn the_preface_is_replayed_and_an_idle_connection_times_out_exactly_after_the_idle_time() {
        let (mut client, server) = pair().await;
        let caps = Arc::new(ConnectionCaps::default());
        let permit = caps.admit(None, 1, None).expect("a place");
        let peer = client.local_addr().expect("addr");
        let mut conn = Admitted::new(server, permit, peer, Duration::from_secs(60));
        assert_eq!(caps.open(), 1);
        let mut first = [0u8; 24];
        conn.read_exact(&mut first).await.expect("the preface");
        assert_eq!(&first, H2_PREFACE);
        tokio::time::advance(Duration::from_secs(59)).await;
        client.write_all(b"x").await.expect("write");
        let mut byte = [0u8; 1];
        conn.read_exact(&mut byte).await.expect("a read 59 s in");
        // The idle clock restarted at that read: 59 s more are not enough, 60 are.
        let started = Instant::now();
        let err = conn.read(&mut byte).await.expect_err("idle");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_secs(60), "{:?}", started.elapsed());
        drop(conn);
        assert_eq!(caps.open(), 0, "the place is given back");
    }
}
