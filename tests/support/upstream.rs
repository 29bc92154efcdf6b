//! A real HTTP/1.1 upstream for tests, on a free loopback port, with std threads.
//!
//! Answers every request `200 OK` with the request path as body (`text/plain`, Content-Length,
//! header `X-Upstream: <name>`), supports keep-alive, counts requests, records what it saw
//! (arrival instant, method, path, headers) and can sleep before answering.
//!
//! For concurrency and failover tests it also:
//! - measures its concurrency: requests in flight (from the end of the request head to just before
//!   the response is written: weir cannot finish, and release, a request earlier) and the largest
//!   count seen, so a cap that lets one request too many through shows as a number;
//! - holds a request whose path has the segments `sleep/<ms>` that long (ended early when the
//!   upstream is killed or dropped), and one whose path starts with `/hang` until then, unanswered;
//! - answers a path with the segments `bytes/<n>` with a body of `n` bytes (downloads);
//! - answers `/health` with a settable status when [`Upstream::set_health`] was called (not
//!   counted, not recorded), and every other request with a forced status if one is set;
//! - adds headers set with [`Upstream::set_response_header`] to its responses;
//! - can be killed (listener and every open connection closed, as if the process died) and
//!   started again on the same address, or started on a listener of the caller's.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::poll::{poll, wait_until};
use super::tcp_server::TcpServer;

/// How long a kept-alive connection may stay idle before the upstream closes it.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest request head accepted (weir's tests send ~60 KiB header values).
const MAX_HEAD: usize = 4 << 20;

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When the request head was fully read.
    pub at: Instant,
    pub method: String,
    pub path: String,
    /// Header names lower-cased, values raw.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<String> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }
}

#[derive(Default)]
struct Inner {
    name: String,
    hits: AtomicUsize,
    seen: Mutex<Vec<Seen>>,
    sleep_ms: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// Status of `/health`; 0: `/health` is an ordinary request.
    health: AtomicU16,
    /// When non-zero, every other request gets this status.
    forced: AtomicU16,
    /// Every connection accepted, to close them all on [`Upstream::kill`].
    conns: Mutex<Vec<TcpStream>>,
    /// A login endpoint: when set, requests whose `X-Password` differs are answered 401.
    password: Mutex<Option<String>>,
    /// Extra headers of every response other than `/health` (e.g. a cost the upstream reports).
    headers: Mutex<Vec<(String, String)>>,
}

/// A running upstream; stops accepting when dropped.
pub struct Upstream {
    server: TcpServer,
    addr: SocketAddr,
    inner: Arc<Inner>,
}

/// Counts one request in flight while it lives.
struct InFlight<'a>(&'a Inner);

impl<'a> InFlight<'a> {
    fn enter(inner: &'a Inner) -> InFlight<'a> {
        let now = inner.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        inner.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(inner)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Upstream {
    pub fn start() -> Upstream {
        Upstream::start_named("up")
    }

    /// Start an upstream whose responses carry `X-Upstream: name`.
    pub fn start_named(name: &str) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind upstream {name}: {e}"));
        Upstream::start_on(name, listener)
    }

    /// [`Upstream::start_named`] on a listener of the caller's (e.g. on 127.0.0.2).
    pub fn start_on(name: &str, listener: TcpListener) -> Upstream {
        let inner = Arc::new(Inner { name: name.to_string(), ..Inner::default() });
        let served = inner.clone();
        let server = TcpServer::start_on(&format!("upstream-{name}"), listener, move |conn, stop| {
            if let Ok(clone) = conn.try_clone() {
                served.conns.lock().unwrap().push(clone);
            }
            let _ = serve(conn, &served, stop);
        });
        let addr = server.addr();
        Upstream { server, addr, inner }
    }

    /// [`Upstream::start_named`] on `addr` again (after [`Upstream::kill`]), retried for 5 s
    /// while the port is busy.
    pub fn restart_at(name: &str, addr: SocketAddr) -> Upstream {
        let listener =
            poll(Duration::from_secs(5), Duration::from_millis(20), || TcpListener::bind(addr), Result::is_ok)
                .unwrap_or_else(|e| panic!("cannot bind {addr} again: {e:?}"))
                .unwrap_or_else(|e| panic!("cannot bind {addr} again: {e}"));
        Upstream::start_on(name, listener)
    }

    /// Closes the listener and every open connection, as if the process died: held requests end
    /// unanswered, new connections are refused. Returns once the port is free.
    pub fn kill(&mut self) {
        self.server.shutdown();
        for c in self.inner.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `127.0.0.1:PORT`, for configs.
    pub fn addr_str(&self) -> String {
        self.addr().to_string()
    }

    /// Sleep this long before answering each request (0 = none).
    pub fn set_sleep(&self, d: Duration) {
        self.inner.sleep_ms.store(d.as_millis() as usize, Ordering::SeqCst);
    }

    /// Act as a login endpoint: 401 for a request whose `X-Password` is not `password`, 200
    /// otherwise (off by default: every request gets 200).
    pub fn set_password(&self, password: &str) {
        *self.inner.password.lock().unwrap() = Some(password.to_string());
    }

    /// Requests received so far.
    pub fn hits(&self) -> usize {
        self.inner.hits.load(Ordering::SeqCst)
    }

    /// Requests received so far whose path starts with `prefix`.
    pub fn hits_with_prefix(&self, prefix: &str) -> usize {
        self.seen().iter().filter(|s| s.path.starts_with(prefix)).count()
    }

    /// Everything received so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.inner.seen.lock().unwrap().clone()
    }

    /// Forget the counters and the log.
    pub fn reset(&self) {
        let mut seen = self.inner.seen.lock().unwrap();
        seen.clear();
        self.inner.hits.store(0, Ordering::SeqCst);
    }

    /// Wait (bounded) until at least `n` requests were received.
    pub fn wait_hits(&self, n: usize, timeout: Duration) -> bool {
        wait_until(timeout, Duration::from_millis(10), || self.hits() >= n).is_some()
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::SeqCst)
    }

    /// The most requests in flight at once since the start (or [`Upstream::reset_max`]).
    pub fn max_in_flight(&self) -> usize {
        self.inner.max_in_flight.load(Ordering::SeqCst)
    }

    /// Starts a new measurement of the largest concurrency (from what is in flight now).
    pub fn reset_max(&self) {
        self.inner.max_in_flight.store(self.in_flight(), Ordering::SeqCst);
    }

    /// Wait (bounded) until exactly `n` requests are in flight.
    pub fn wait_in_flight(&self, n: usize, timeout: Duration) -> bool {
        wait_until(timeout, Duration::from_millis(10), || self.in_flight() == n).is_some()
    }

    /// Answer `/health` with `status` from now on (not counted as a hit, not recorded).
    pub fn set_health(&self, status: u16) {
        self.inner.health.store(status, Ordering::SeqCst);
    }

    /// Add `name: value` to every later response (other than `/health`); `None` removes it.
    pub fn set_response_header(&self, name: &str, value: Option<&str>) {
        let mut headers = self.inner.headers.lock().unwrap();
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        if let Some(value) = value {
            headers.push((name.to_string(), value.to_string()));
        }
    }

    /// Answer every other request with `status` (0: back to 200).
    pub fn force_status(&self, status: u16) {
        self.inner.forced.store(status, Ordering::SeqCst);
    }
}

/// `/…/sleep/<ms>/…` → ms (0 without such segments).
fn sleep_of(path: &str) -> u64 {
    let segments: Vec<&str> = path.split('/').collect();
    segments.windows(2).find(|w| w[0] == "sleep").and_then(|w| w[1].parse().ok()).unwrap_or(0)
}

/// Sleeps `ms`, ending early once `stop` is set.
fn hold(ms: u64, stop: &AtomicBool) {
    let until = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < until && !stop.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(5).min(until.saturating_duration_since(Instant::now())));
    }
}

fn serve(stream: TcpStream, inner: &Inner, stop: &AtomicBool) -> io::Result<()> {
    stream.set_read_timeout(Some(IDLE_TIMEOUT))?;
    stream.set_write_timeout(Some(Duration::from_secs(15)))?;
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        // Request line (skip stray empty lines between requests, RFC 9112 2.2).
        let mut line = Vec::new();
        loop {
            line.clear();
            if read_line(&mut reader, &mut line)? == 0 {
                return Ok(());
            }
            if !trim_crlf(&line).is_empty() {
                break;
            }
        }
        let request_line = String::from_utf8_lossy(trim_crlf(&line)).into_owned();
        let mut parts = request_line.split(' ');
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let version = parts.next().unwrap_or("HTTP/1.1").to_string();

        let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
        let mut head_len = line.len();
        loop {
            line.clear();
            let n = read_line(&mut reader, &mut line)?;
            if n == 0 {
                return Ok(());
            }
            head_len += n;
            if head_len > MAX_HEAD {
                writer.write_all(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )?;
                return Ok(());
            }
            let l = trim_crlf(&line);
            if l.is_empty() {
                break;
            }
            if let Some(c) = l.iter().position(|&b| b == b':') {
                let name = String::from_utf8_lossy(&l[..c]).trim().to_ascii_lowercase();
                let mut v = &l[c + 1..];
                while let [b' ' | b'\t', rest @ ..] = v {
                    v = rest;
                }
                while let [rest @ .., b' ' | b'\t'] = v {
                    v = rest;
                }
                headers.push((name, v.to_vec()));
            }
        }
        let at = Instant::now();
        if stop.load(Ordering::SeqCst) {
            // Killed while this request came in: it dies unanswered.
            return Ok(());
        }
        let health = inner.health.load(Ordering::SeqCst);
        let is_health = health != 0 && path == "/health";
        let get = |n: &str| {
            headers.iter().find(|(k, _)| k == n).map(|(_, v)| String::from_utf8_lossy(v).to_ascii_lowercase())
        };
        let wrong_password = match inner.password.lock().unwrap().as_deref() {
            Some(want) => {
                headers.iter().find(|(k, _)| k == "x-password").map(|(_, v)| v.as_slice()) != Some(want.as_bytes())
            }
            None => false,
        };
        let chunked = get("transfer-encoding").map(|v| v.contains("chunked")).unwrap_or(false);
        let content_length: usize = get("content-length").and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        let close = get("connection").map(|v| v.contains("close")).unwrap_or(false) || version == "HTTP/1.0";

        let in_flight = if is_health {
            None
        } else {
            let mut seen = inner.seen.lock().unwrap();
            seen.push(Seen { at, method: method.clone(), path: path.clone(), headers });
            inner.hits.fetch_add(1, Ordering::SeqCst);
            Some(InFlight::enter(inner))
        };

        // Drain the body.
        if chunked {
            drain_chunked(&mut reader)?;
        } else if content_length > 0 {
            io::copy(&mut (&mut reader).take(content_length as u64), &mut io::sink())?;
        }

        let sleep = inner.sleep_ms.load(Ordering::SeqCst);
        if sleep > 0 {
            thread::sleep(Duration::from_millis(sleep as u64));
        }
        if in_flight.is_some() && path.starts_with("/hang") {
            while !stop.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(10));
            }
            return Ok(());
        }
        hold(sleep_of(&path), stop);
        // Out of flight before the first response byte.
        drop(in_flight);

        let status = match (is_health, inner.forced.load(Ordering::SeqCst)) {
            (true, _) => health,
            (false, _) if wrong_password => 401,
            (false, 0) => 200,
            (false, forced) => forced,
        };
        let body = if method.eq_ignore_ascii_case("HEAD") {
            Vec::new()
        } else if let Some(n) = bytes_of(&path) {
            vec![b'x'; n]
        } else {
            path.as_bytes().to_vec()
        };
        let mut resp = format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nX-Upstream: {}\r\n",
            match status {
                200 => "OK",
                401 => "Unauthorized",
                _ => "X",
            },
            if method.eq_ignore_ascii_case("HEAD") { path.len() } else { body.len() },
            inner.name
        );
        if close {
            resp.push_str("Connection: close\r\n");
        }
        if !is_health {
            for (name, value) in inner.headers.lock().unwrap().iter() {
                resp.push_str(&format!("{name}: {value}\r\n"));
            }
        }
        resp.push_str("\r\n");
        let mut out = resp.into_bytes();
        out.extend_from_slice(&body);
        writer.write_all(&out)?;
        writer.flush()?;
        if close {
            return Ok(());
        }
    }
}

fn read_line<R: BufRead>(r: &mut R, buf: &mut Vec<u8>) -> io::Result<usize> {
    Read::take(&mut *r, MAX_HEAD as u64).read_until(b'\n', buf)
}

fn drain_chunked<R: BufRead>(r: &mut R) -> io::Result<()> {
    let mut line = Vec::new();
    loop {
        line.clear();
        if read_line(r, &mut line)? == 0 {
            return Ok(());
        }
        let l = String::from_utf8_lossy(trim_crlf(&line)).into_owned();
        let size = usize::from_str_radix(l.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
        if size == 0 {
            loop {
                line.clear();
                if read_line(r, &mut line)? == 0 || trim_crlf(&line).is_empty() {
                    return Ok(());
                }
            }
        }
        io::copy(&mut Read::take(&mut *r, size as u64 + 2), &mut io::sink())?;
    }
}

fn trim_crlf(l: &[u8]) -> &[u8] {
    let l = l.strip_suffix(b"\n").unwrap_or(l);
    l.strip_suffix(b"\r").unwrap_or(l)
}

/// The body size a path asks for with the segments `bytes/<n>`.
fn bytes_of(path: &str) -> Option<usize> {
    let mut segments = path.split('/');
    segments.find(|s| *s == "bytes")?;
    segments.next()?.parse().ok()
}

/// An upstream on a unix socket (`unix:/path` servers): answers every request `200 OK` with
/// `X-Upstream: unix` and the request path as body, keeps connections alive, counts requests.
/// The socket file is removed on drop.
pub struct UnixUpstream {
    pub path: std::path::PathBuf,
    hits: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl UnixUpstream {
    pub fn start(path: &std::path::Path) -> UnixUpstream {
        let listener = std::os::unix::net::UnixListener::bind(path)
            .unwrap_or_else(|e| panic!("bind unix upstream {}: {e}", path.display()));
        listener.set_nonblocking(true).unwrap();
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (hits.clone(), stop.clone());
        thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (h, s) = (h.clone(), s.clone());
                        thread::spawn(move || {
                            let _ = conn.set_nonblocking(false);
                            let _ = serve_unix(conn, &h, &s);
                        });
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
                    Err(_) => return,
                }
            }
        });
        UnixUpstream { path: path.to_path_buf(), hits, stop }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for UnixUpstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve_unix(
    stream: std::os::unix::net::UnixStream,
    hits: &std::sync::atomic::AtomicUsize,
    stop: &AtomicBool,
) -> io::Result<()> {
    stream.set_read_timeout(Some(IDLE_TIMEOUT))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    while !stop.load(Ordering::SeqCst) {
        let mut line = Vec::new();
        if read_line(&mut reader, &mut line)? == 0 {
            return Ok(());
        }
        let request_line = String::from_utf8_lossy(trim_crlf(&line)).into_owned();
        if request_line.is_empty() {
            continue;
        }
        let path = request_line.split(' ').nth(1).unwrap_or("/").to_string();
        let mut content_length = 0usize;
        loop {
            let mut h = Vec::new();
            if read_line(&mut reader, &mut h)? == 0 {
                return Ok(());
            }
            let h = trim_crlf(&h);
            if h.is_empty() {
                break;
            }
            let text = String::from_utf8_lossy(h).to_ascii_lowercase();
            if let Some(v) = text.strip_prefix("content-length:") {
                content_length = v.trim().parse().unwrap_or(0);
            }
        }
        io::copy(&mut (&mut reader).take(content_length as u64), &mut io::sink())?;
        hits.fetch_add(1, Ordering::SeqCst);
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Upstream: unix\r\nContent-Length: {}\r\n\r\n",
            path.len()
        );
        writer.write_all(head.as_bytes())?;
        writer.write_all(path.as_bytes())?;
    }
    Ok(())
}
