//! A client connection whose writes never wait for the client while its buffer has room.
//!
//! `poll_write` sends straight to the socket when it can; when the socket is full the bytes go
//! to the connection's [`SpillQueue`] and the write returns at once. The queue is sent on
//! whatever polls the connection next: the next write, a flush, a read (Pingora reads the
//! client for its next request or to see it leave) and the shutdown, which waits until the
//! queue is sent. `poll_flush` does not wait for the client, for the same reason a TCP socket's
//! flush does not: the bytes are in the connection's hands.
//!
//! `send_timeout` bounds the client, as it does without buffering: when nothing of the queue
//! could be sent for that long, the connection fails. A connection dropped with bytes still
//! queued (Pingora gives up on a connection it will not reuse) is sent on by a task of its
//! own, holding whatever the caller asked it to keep (the connection's place under the caps).

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream, TimingDigest,
    UniqueID, UniqueIDType, ALPN,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{sleep_until, Instant, Sleep};

use super::{Budgets, ResponseBuffering, SpillQueue};

type Keep = Box<dyn Send + Sync>;

pub struct WriteBehind {
    /// `None` only once handed to the task that sends what a dropped connection left.
    core: Option<Core>,
    /// What a dropped connection's sending task holds until it is done.
    keep: Mutex<Vec<Keep>>,
}

/// The socket and its queue: what a dropped connection's sending task takes over.
struct Core {
    inner: Stream,
    queue: SpillQueue,
    send_timeout: Duration,
    /// When the client last took bytes (or had nothing waiting): `send_timeout` counts from here.
    last_progress: Instant,
    timer: Option<Pin<Box<Sleep>>>,
    /// The socket layer may hold written bytes (Pingora's stream buffers its writes): flush it.
    dirty: bool,
}

impl WriteBehind {
    pub fn new(inner: Stream, settings: Arc<ResponseBuffering>, budgets: Arc<Budgets>, send_timeout: Duration) -> Self {
        let core = Core {
            inner,
            queue: SpillQueue::new(settings, budgets),
            send_timeout,
            last_progress: Instant::now(),
            timer: None,
            dirty: false,
        };
        Self { core: Some(core), keep: Mutex::new(Vec::new()) }
    }

    /// Finds the buffering layer right under `stream`, if it has one.
    pub fn of(stream: &Stream) -> Option<&WriteBehind> {
        (**stream).as_any().downcast_ref::<WriteBehind>()
    }

    /// Bytes written by the proxy and not yet sent to the client.
    pub fn pending(&self) -> u64 {
        self.core.as_ref().map_or(0, |c| c.queue.pending())
    }

    /// Holds `what` until the last queued byte is sent, also past this stream's drop.
    pub fn keep_until_sent(&self, what: Keep) {
        self.keep.lock().unwrap_or_else(|p| p.into_inner()).push(what);
    }

    fn core(&mut self) -> &mut Core {
        self.core.as_mut().expect("the core is only taken by Drop")
    }

    fn inner(&self) -> Option<&Stream> {
        self.core.as_ref().map(|c| &c.inner)
    }
}

impl Core {
    /// Sends what is queued. `Ready(Ok)`: the queue is empty and the socket flushed.
    fn poll_send_queued(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let front = self.queue.front()?;
            if front.is_empty() {
                break;
            }
            match Pin::new(&mut self.inner).poll_write(cx, front) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    self.queue.consume(n);
                    self.last_progress = Instant::now();
                    self.dirty = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return self.wait_for_client(cx),
            }
        }
        if self.dirty {
            if Pin::new(&mut self.inner).poll_flush(cx)?.is_pending() {
                return self.wait_for_client(cx);
            }
            self.dirty = false;
            self.last_progress = Instant::now();
        }
        Poll::Ready(Ok(()))
    }

    /// The client took nothing: `Pending`, or the `send_timeout` error once it has been too long.
    fn wait_for_client(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let at = self.last_progress + self.send_timeout;
        let timer = self.timer.get_or_insert_with(|| Box::pin(sleep_until(at)));
        if timer.deadline() != at {
            timer.as_mut().reset(at);
        }
        match timer.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "client took no buffered response bytes within send_timeout",
            ))),
        }
    }
}

impl AsyncWrite for WriteBehind {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let core = self.core();
        let sent = core.poll_send_queued(cx)?;
        if sent.is_ready() {
            // Nothing queued: straight to the socket while it takes bytes.
            match Pin::new(&mut core.inner).poll_write(cx, buf) {
                Poll::Ready(Ok(n)) => {
                    core.last_progress = Instant::now();
                    core.dirty = true;
                    return Poll::Ready(Ok(n));
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                // The queue starts to fill now: the client's `send_timeout` counts from here.
                Poll::Pending => core.last_progress = Instant::now(),
            }
        }
        match core.queue.push(buf) {
            // Both bounds reached: wait for the client (the socket's waker is registered).
            0 => Poll::Pending,
            n => Poll::Ready(Ok(n)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let core = self.core();
        core.dirty = true;
        match core.poll_send_queued(cx) {
            Poll::Ready(result) => Poll::Ready(result),
            // The queue is ours to send: the writer need not wait for the client.
            Poll::Pending => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let core = self.core();
        core.dirty = true;
        ready!(core.poll_send_queued(cx))?;
        Pin::new(&mut core.inner).poll_shutdown(cx)
    }
}

impl AsyncRead for WriteBehind {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let core = self.core();
        // Whoever waits for the client's next bytes also sends it what is queued.
        if let Poll::Ready(Err(e)) = core.poll_send_queued(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut core.inner).poll_read(cx, buf)
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        let Some(mut core) = self.core.take() else { return };
        if core.queue.is_empty() && !core.dirty {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let keep = std::mem::take(&mut *self.keep.lock().unwrap_or_else(|p| p.into_inner()));
        runtime.spawn(async move {
            if poll_fn(|cx| core.poll_send_queued(cx)).await.is_ok() {
                core.inner.shutdown().await;
            }
            // The queue is sent (or the client failed): its budget and places go back.
            drop((core, keep));
        });
    }
}

#[async_trait]
impl Shutdown for WriteBehind {
    async fn shutdown(&mut self) {
        // The response must reach the client before the socket closes.
        let core = self.core();
        core.dirty = true;
        if poll_fn(|cx| core.poll_send_queued(cx)).await.is_ok() {
            core.inner.shutdown().await;
        }
    }
}

impl UniqueID for WriteBehind {
    fn id(&self) -> UniqueIDType {
        self.inner().map_or(Default::default(), |s| s.id())
    }
}

impl Ssl for WriteBehind {
    fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
        self.inner()?.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner()?.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner()?.selected_alpn_proto()
    }
}

impl GetTimingDigest for WriteBehind {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner().map_or_else(Vec::new, |s| s.get_timing_digest())
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner().map_or(Duration::ZERO, |s| s.get_read_pending_time())
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner().map_or(Duration::ZERO, |s| s.get_write_pending_time())
    }
}

impl GetProxyDigest for WriteBehind {
    fn get_proxy_digest(&self) -> Option<Arc<pingora::protocols::raw_connect::ProxyDigest>> {
        self.inner()?.get_proxy_digest()
    }
}

impl GetSocketDigest for WriteBehind {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner()?.get_socket_digest()
    }

    fn set_socket_digest(&mut self, socket_digest: SocketDigest) {
        if let Some(core) = self.core.as_mut() {
            core.inner.set_socket_digest(socket_digest)
        }
    }
}

#[async_trait]
impl Peek for WriteBehind {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.core().inner.try_peek(buf).await
    }
}

impl std::fmt::Debug for WriteBehind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteBehind")
            .field("inner", &self.inner())
            .field("pending", &self.pending())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpSocket, TcpStream};

    /// A loopback pair: the server's side under a `WriteBehind`, the client's with a 4 KiB
    /// receive buffer (so the kernel takes little of what is sent).
    async fn pair(
        settings: ResponseBuffering,
        budgets: Arc<Budgets>,
        send_timeout: Duration,
    ) -> (WriteBehind, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let socket = TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        let client = socket.connect(listener.local_addr().expect("addr")).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let stream: Stream = Box::new(pingora::protocols::l4::stream::Stream::from(server));
        (WriteBehind::new(stream, Arc::new(settings), budgets, send_timeout), client)
    }

    fn body(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[tokio::test]
    async fn writes_do_not_wait_for_a_client_that_reads_nothing_and_every_byte_arrives() {
        let dir = tempfile::tempdir().expect("temp dir");
        let settings = ResponseBuffering { temp_path: dir.path().to_path_buf(), ..ResponseBuffering::default() };
        let budgets = Arc::new(Budgets::new(&settings));
        let (mut server, mut client) = pair(settings, budgets.clone(), Duration::from_secs(30)).await;
        let data = body(8 << 20);
        // 8 MiB to a client that reads nothing: taken at once (memory, then the temp file).
        tokio::time::timeout(Duration::from_secs(20), async {
            server.write_all(&data).await.expect("write");
            server.flush().await.expect("flush");
        })
        .await
        .expect("the writes waited for the client");
        assert!(server.pending() > 0, "most of the body is still queued");
        assert!(budgets.disk.used() > 0, "past the memory share it went to the temp file");
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.expect("read");
            got
        });
        // The shutdown sends what is queued first.
        AsyncWriteExt::shutdown(&mut server).await.expect("shutdown after sending");
        let got = reading.await.expect("reader");
        assert!(got == data, "{} bytes received of {} sent, or out of order", got.len(), data.len());
        drop(server);
        assert_eq!((budgets.memory.used(), budgets.disk.used()), (0, 0));
    }

    #[tokio::test]
    async fn a_spent_budget_makes_writes_wait_for_the_client() {
        let settings = ResponseBuffering { memory: 0, temp_files: 0, ..ResponseBuffering::default() };
        let budgets = Arc::new(Budgets::new(&settings));
        let (mut server, mut client) = pair(settings, budgets, Duration::from_secs(30)).await;
        let data = body(4 << 20);
        let writing = tokio::spawn(async move {
            server.write_all(&data).await.expect("write");
            AsyncWriteExt::shutdown(&mut server).await.expect("shutdown");
        });
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.expect("read");
        writing.await.expect("writer");
        assert!(got == body(4 << 20), "streamed with back-pressure: {} bytes", got.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_takes_nothing_for_send_timeout_is_cut() {
        let dir = tempfile::tempdir().expect("temp dir");
        let settings = ResponseBuffering { temp_path: dir.path().to_path_buf(), ..ResponseBuffering::default() };
        let budgets = Arc::new(Budgets::new(&settings));
        let (mut server, _client) = pair(settings, budgets, Duration::from_secs(60)).await;
        // More than the kernel's socket buffers can take (tcp_wmem's maximum is 4 MiB).
        server.write_all(&body(16 << 20)).await.expect("taken into the buffer");
        let started = Instant::now();
        let err = AsyncWriteExt::shutdown(&mut server).await.expect_err("the client never reads");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_secs(59), "cut after {:?}", started.elapsed());
    }
}
