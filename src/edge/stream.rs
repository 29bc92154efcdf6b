//! A client connection with deadlines Pingora does not have: the whole request head must arrive
//! within `header_timeout` (Pingora only bounds each read, so a header trickled a byte at a time
//! lives forever), it may not exceed `max_header_size`, and an idle keep-alive connection closes
//! after `keepalive_timeout`.
//!
//! The stream cannot see where a head ends, so the proxy tells it: `request_started` once the
//! head is parsed, `request_finished` when the response is done. Everything else is forwarded
//! to the socket untouched. On a TLS listener it wraps the decrypted stream (the handshake is
//! bounded by the edge). An HTTP/2 connection (`multiplexed`) carries many requests whose heads
//! the proxy cannot report here: only its preface is timed (see the field's doc).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream, TimingDigest,
    UniqueID, UniqueIDType, ALPN,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{sleep_until, Instant, Sleep};

use super::caps::ConnPermit;
use crate::buffering::WriteBehind;
use crate::metrics::METRICS;

/// Reading a request head: the header deadline runs and bytes are counted.
const HEAD: u8 = 0;
/// A request is being served: reads are body reads, bounded by Pingora's read timeout.
const BUSY: u8 = 1;
/// Between requests: the keep-alive deadline runs until the next request's first byte.
const IDLE: u8 = 2;

#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    pub header_timeout: Duration,
    pub keepalive_timeout: Duration,
    pub max_header_size: usize,
}

pub struct GuardedStream {
    inner: Stream,
    limits: StreamLimits,
    /// Set by the proxy (through `request_started` / `request_finished`), read here.
    phase: AtomicU8,
    /// The phase the deadline below was armed for.
    armed_for: u8,
    /// The phase's deadline, started at its first wait (a read that found nothing): a request
    /// whose head comes in one read never touches the timer.
    deadline: Option<Instant>,
    /// The timer behind `deadline`, reset rather than reallocated from one phase to the next.
    timer: Option<Pin<Box<Sleep>>>,
    head_bytes: usize,
    /// HTTP/2: many requests share the connection and the proxy cannot mark their heads here
    /// (an h2 session has no stream of its own). Only the connection preface is timed; request
    /// heads are bounded by h2's header-list limit, idleness by `h2_idle_timeout`.
    multiplexed: bool,
    /// The connection's place under the caps; handed to the buffering layer below at drop when
    /// it still has response bytes to send (the place is held until they are sent).
    permit: Option<ConnPermit>,
}

/// The HTTP/2 connection preface's length: once it is in, an h2 connection is past its head.
const H2_PREFACE_LEN: usize = 24;

impl GuardedStream {
    /// Wraps a new connection: its first request head must arrive within `header_timeout`.
    pub fn new(inner: Stream, limits: StreamLimits, permit: ConnPermit, multiplexed: bool) -> Self {
        METRICS.connections_open.inc();
        Self {
            inner,
            limits,
            phase: AtomicU8::new(HEAD),
            armed_for: HEAD,
            deadline: None,
            timer: None,
            head_bytes: 0,
            multiplexed,
            permit: Some(permit),
        }
    }

    /// The head of a request has been read: its body and response are not ours to time.
    pub fn request_started(&self) {
        self.phase.store(BUSY, Ordering::Release);
    }

    /// The response has been sent: the connection idles until the next request.
    pub fn request_finished(&self) {
        self.phase.store(IDLE, Ordering::Release);
    }

    /// Finds the guarded stream under a session's stream, if the connection came through the edge.
    pub fn of(stream: &Stream) -> Option<&GuardedStream> {
        (**stream).as_any().downcast_ref::<GuardedStream>()
    }

    fn cut(cause: &'static str, kind: io::ErrorKind, message: &'static str) -> Poll<io::Result<()>> {
        METRICS.connections_cut.with_label_values(&[cause]).inc();
        Poll::Ready(Err(io::Error::new(kind, message)))
    }
}

impl Drop for GuardedStream {
    fn drop(&mut self) {
        METRICS.connections_open.dec();
        if let (Some(below), Some(permit)) = (WriteBehind::of(&self.inner), self.permit.take()) {
            if below.pending() > 0 {
                below.keep_until_sent(Box::new(permit));
            }
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let phase = this.phase.load(Ordering::Acquire);
        if phase != this.armed_for {
            this.armed_for = phase;
            this.deadline = None;
        }
        if phase == HEAD && this.head_bytes > this.limits.max_header_size {
            // Only asked for when the head is still incomplete: Pingora reads again only then.
            return Self::cut("header_size", io::ErrorKind::InvalidData, "request head larger than max_header_size");
        }
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        match result {
            Poll::Ready(Ok(())) if read > 0 => match phase {
                // The next request's first byte: its head now has `header_timeout`.
                IDLE if this.phase.compare_exchange(IDLE, HEAD, Ordering::AcqRel, Ordering::Acquire).is_ok() => {
                    this.armed_for = HEAD;
                    this.deadline = None;
                    this.head_bytes = read;
                }
                HEAD => {
                    this.head_bytes += read;
                    if this.multiplexed && this.head_bytes >= H2_PREFACE_LEN {
                        this.phase.store(BUSY, Ordering::Release);
                        this.armed_for = BUSY;
                        this.deadline = None;
                    }
                }
                _ => {}
            },
            // Nothing to read: wait, but not past the phase's deadline. A client that trickles its
            // head still waits between its bytes, so it is cut at its first wait past the deadline.
            Poll::Pending => return this.wait(cx),
            _ => {}
        }
        result
    }
}

impl GuardedStream {
    /// The socket had nothing: `Pending` until the phase's deadline, then the cut.
    fn wait(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let timeout = match self.armed_for {
            // A response still being sent from the buffer below is no idle connection: the
            // buffer's own `send_timeout` bounds it, the keep-alive wait starts after it.
            IDLE if WriteBehind::of(&self.inner).is_some_and(|below| below.pending() > 0) => return Poll::Pending,
            HEAD => self.limits.header_timeout,
            IDLE => self.limits.keepalive_timeout,
            _ => return Poll::Pending,
        };
        let at = *self.deadline.get_or_insert_with(|| Instant::now() + timeout);
        let timer = self.timer.get_or_insert_with(|| Box::pin(sleep_until(at)));
        // A timer armed for an earlier deadline is kept: moving it costs a removal from and an
        // insertion into the timer wheel, on every request of a keep-alive connection. When it
        // fires before `at` it is moved then, at most once per `timeout`.
        if timer.deadline() > at {
            timer.as_mut().reset(at);
        }
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if timer.deadline() >= at {
                break;
            }
            // An earlier phase's deadline: wait on for this one.
            timer.as_mut().reset(at);
        }
        match self.armed_for {
            IDLE => Self::cut("keepalive_timeout", io::ErrorKind::TimedOut, "keep-alive connection idle too long"),
            _ => Self::cut("header_timeout", io::ErrorKind::TimedOut, "request head not received in time"),
        }
    }
}

impl AsyncWrite for GuardedStream {
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

#[async_trait]
impl Shutdown for GuardedStream {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for GuardedStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for GuardedStream {
    fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for GuardedStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for GuardedStream {
    fn get_proxy_digest(&self) -> Option<Arc<pingora::protocols::raw_connect::ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for GuardedStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, socket_digest: SocketDigest) {
        self.inner.set_socket_digest(socket_digest)
    }
}

#[async_trait]
impl Peek for GuardedStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

impl std::fmt::Debug for GuardedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedStream").field("inner", &self.inner).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge::caps::ConnectionCaps;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    const LIMITS: StreamLimits = StreamLimits {
        header_timeout: Duration::from_secs(10),
        keepalive_timeout: Duration::from_secs(30),
        max_header_size: 1024,
    };

    /// A loopback connection, the server's side guarded; `served`: its first request was served,
    /// so it idles (keep-alive) until the client's next byte.
    async fn guarded_pair(served: bool) -> (GuardedStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let permit = Arc::new(ConnectionCaps::default()).admit(None, 1, None).unwrap();
        let inner: Stream = Box::new(pingora::protocols::l4::stream::Stream::from(server));
        let guarded = GuardedStream::new(inner, LIMITS, permit, false);
        if served {
            guarded.request_finished();
        }
        (guarded, client)
    }

    /// Reads until the guard cuts the connection; each byte read is served as a whole request
    /// head unless `heads_complete` is false. Returns when, and why, it was cut.
    async fn read_until_cut(mut guarded: GuardedStream, heads_complete: bool) -> (Duration, io::Error) {
        let start = Instant::now();
        let mut buf = [0u8; 64];
        loop {
            match guarded.read(&mut buf).await {
                Ok(n) if n > 0 => {
                    if heads_complete {
                        guarded.request_started();
                        guarded.request_finished();
                    }
                }
                Ok(_) => panic!("the client closed first"),
                Err(e) => return (start.elapsed(), e),
            }
        }
    }

    /// A served connection idles; the client sends `byte` at `at` (a whole request head when
    /// `head_complete`). Returns when the guard cut it, and its message.
    async fn cut_after_a_byte_at(at: Duration, byte: &[u8], head_complete: bool) -> (Duration, String) {
        let (guarded, mut client) = guarded_pair(true).await;
        let cut = tokio::spawn(read_until_cut(guarded, head_complete));
        tokio::time::sleep(at).await;
        client.write_all(byte).await.unwrap();
        let (after, error) = cut.await.unwrap();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        (after, error.to_string())
    }

    #[tokio::test(start_paused = true)]
    async fn the_keepalive_deadline_counts_from_the_last_request_not_the_first() {
        // A request at 20 s moves the deadline from 30 s to 50 s, although the timer armed for
        // 30 s is kept (not moved on every request) and fires first.
        let cut = cut_after_a_byte_at(Duration::from_secs(20), b"x", true).await;
        assert_eq!(cut, (Duration::from_secs(50), "keep-alive connection idle too long".to_string()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_header_deadline_earlier_than_the_armed_timer_moves_it() {
        // The keep-alive timer waits for 30 s; a head begun at 5 s must be complete by 15 s.
        let cut = cut_after_a_byte_at(Duration::from_secs(5), b"G", false).await;
        assert_eq!(cut, (Duration::from_secs(15), "request head not received in time".to_string()));
    }
}
