//! A real HTTP/1.1 upstream for tests, on a free loopback port, with std threads.
//!
//! Answers every request `200 OK` with the request path as body (`text/plain`, Content-Length,
//! header `X-Upstream: <name>`), supports keep-alive, counts requests, records what it saw
//! (arrival instant, method, path, headers) and can sleep before answering.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::poll::wait_until;
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

struct Inner {
    name: String,
    hits: AtomicUsize,
    seen: Mutex<Vec<Seen>>,
    sleep_ms: AtomicUsize,
    /// A login endpoint: when set, requests whose `X-Password` differs are answered 401.
    password: Mutex<Option<String>>,
}

/// A running upstream; stops accepting when dropped.
pub struct Upstream {
    server: TcpServer,
    inner: Arc<Inner>,
}

impl Upstream {
    pub fn start() -> Upstream {
        Upstream::start_named("up")
    }

    /// Start an upstream whose responses carry `X-Upstream: name`.
    pub fn start_named(name: &str) -> Upstream {
        let inner = Arc::new(Inner {
            name: name.to_string(),
            hits: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
            sleep_ms: AtomicUsize::new(0),
            password: Mutex::new(None),
        });
        let served = inner.clone();
        let server = TcpServer::start(&format!("upstream-{name}"), move |conn, stop| {
            let _ = serve(conn, &served, stop);
        });
        Upstream { server, inner }
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
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

        {
            let mut seen = inner.seen.lock().unwrap();
            seen.push(Seen { at, method: method.clone(), path: path.clone(), headers });
            inner.hits.fetch_add(1, Ordering::SeqCst);
        }

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

        let body = if method.eq_ignore_ascii_case("HEAD") { Vec::new() } else { path.as_bytes().to_vec() };
        let mut resp = format!(
            "HTTP/1.1 {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nX-Upstream: {}\r\n",
            if wrong_password { "401 Unauthorized" } else { "200 OK" },
            path.len(),
            inner.name
        );
        if close {
            resp.push_str("Connection: close\r\n");
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
