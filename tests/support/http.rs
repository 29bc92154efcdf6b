//! A tiny HTTP/1.1 client over `std::net::TcpStream`, for tests.
//!
//! It sends whatever bytes it is told to (raw header names and values, invalid UTF-8, huge
//! values, malformed request lines) and reads one response: status line, headers
//! (case-insensitive lookup) and body (Content-Length, chunked, or until EOF). Every socket
//! operation has a timeout, so a test never hangs on a misbehaving server.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Timeout applied to connect, every read and every write unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);

/// Largest response head (status line + headers) this client accepts.
const MAX_HEAD: usize = 1 << 20;

/// One HTTP response as read off the wire.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    /// Header names lower-cased, values as raw bytes (trimmed), in wire order.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Response {
    /// First value of header `name` (case-insensitive), lossily decoded.
    pub fn header(&self, name: &str) -> Option<String> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    /// Every value of header `name` (case-insensitive), lossily decoded, in wire order.
    pub fn header_all(&self, name: &str) -> Vec<String> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().filter(|(n, _)| *n == name).map(|(_, v)| String::from_utf8_lossy(v).into_owned()).collect()
    }

    pub fn has_header(&self, name: &str) -> bool {
        self.header(name).is_some()
    }

    /// The body, lossily decoded.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics (with the response) when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.summary()))
    }

    /// A one-line summary for assertion messages.
    pub fn summary(&self) -> String {
        let mut s = format!("{} {}", self.status, self.reason);
        for (n, v) in &self.headers {
            let v = String::from_utf8_lossy(v);
            let v: String = v.chars().take(120).collect();
            s.push_str(&format!(" | {n}: {v}"));
        }
        let body: String = self.text().chars().take(200).collect();
        s.push_str(&format!(" | body: {body:?}"));
        s
    }
}

/// The [`Response::summary`] of each response, in order (print with `{:#?}`).
pub fn summaries(rs: &[Response]) -> Vec<String> {
    rs.iter().map(Response::summary).collect()
}

/// The status of each response, in order.
pub fn statuses(rs: &[Response]) -> Vec<u16> {
    rs.iter().map(|r| r.status).collect()
}

/// A request to send. Header names and values are raw bytes: nothing is validated.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub target: String,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub body: Vec<u8>,
    /// Add `Host: localhost` when no Host header was given.
    pub auto_host: bool,
}

impl Request {
    pub fn new(method: &str, target: &str) -> Request {
        Request {
            method: method.to_string(),
            target: target.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
            auto_host: true,
        }
    }

    pub fn get(target: &str) -> Request {
        Request::new("GET", target)
    }

    /// Add a header (text).
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.as_bytes().to_vec(), value.as_bytes().to_vec()));
        self
    }

    /// Add a header with arbitrary bytes as name and value.
    pub fn raw_header(mut self, name: &[u8], value: &[u8]) -> Request {
        self.headers.push((name.to_vec(), value.to_vec()));
        self
    }

    pub fn body(mut self, body: &[u8]) -> Request {
        self.body = body.to_vec();
        self
    }

    pub fn no_host(mut self) -> Request {
        self.auto_host = false;
        self
    }

    pub fn is_head(&self) -> bool {
        self.method.eq_ignore_ascii_case("HEAD")
    }

    /// The request as it goes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.body.len());
        out.extend_from_slice(format!("{} {} HTTP/1.1\r\n", self.method, self.target).as_bytes());
        let has = |name: &str| self.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()));
        if self.auto_host && !has("host") {
            out.extend_from_slice(b"Host: localhost\r\n");
        }
        for (n, v) in &self.headers {
            out.extend_from_slice(n);
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
        if !self.body.is_empty() && !has("content-length") && !has("transfer-encoding") {
            out.extend_from_slice(format!("Content-Length: {}\r\n", self.body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        out
    }
}

/// One client connection; several requests may be sent on it (keep-alive).
pub struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub fn connect(addr: SocketAddr) -> io::Result<Conn> {
        Conn::connect_timeout(addr, DEFAULT_TIMEOUT)
    }

    pub fn connect_timeout(addr: SocketAddr, timeout: Duration) -> io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(Conn { reader: BufReader::new(stream) })
    }

    pub fn stream(&self) -> &TcpStream {
        self.reader.get_ref()
    }

    /// Send `req` and read its response.
    pub fn send(&mut self, req: &Request) -> io::Result<Response> {
        self.send_raw(&req.to_bytes())?;
        self.read_response(req.is_head())?
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed before any response byte"))
    }

    /// Write raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        let s = self.reader.get_mut();
        s.write_all(bytes)?;
        s.flush()
    }

    /// Reads until the peer closes the connection (what it sent meanwhile is dropped).
    pub fn read_to_close(&mut self) -> io::Result<()> {
        self.reader.read_to_end(&mut Vec::new()).map(drop)
    }

    /// Read one response. `Ok(None)` when the peer closed (or reset) the connection before
    /// sending a single byte.
    pub fn read_response(&mut self, head_request: bool) -> io::Result<Option<Response>> {
        let mut line = Vec::new();
        let n = match read_line(&mut self.reader, &mut line, MAX_HEAD) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(None),
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(None);
        }
        let status_line = String::from_utf8_lossy(trim_crlf(&line)).into_owned();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or("");
        if !version.starts_with("HTTP/1.") {
            return Err(bad(format!("bad status line: {status_line:?}")));
        }
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(format!("bad status code in {status_line:?}")))?;
        let reason = parts.next().unwrap_or("").to_string();

        let mut headers = Vec::new();
        let mut head_len = line.len();
        loop {
            line.clear();
            let n = read_line(&mut self.reader, &mut line, MAX_HEAD)?;
            if n == 0 {
                return Err(bad("EOF inside response head".into()));
            }
            head_len += n;
            if head_len > MAX_HEAD {
                return Err(bad("response head too large".into()));
            }
            let l = trim_crlf(&line);
            if l.is_empty() {
                break;
            }
            let colon = l
                .iter()
                .position(|&b| b == b':')
                .ok_or_else(|| bad(format!("header line without colon: {:?}", lossy(l))))?;
            let name = String::from_utf8_lossy(&l[..colon]).trim().to_ascii_lowercase();
            let value = trim_ows(&l[colon + 1..]).to_vec();
            headers.push((name, value));
        }
        let mut resp = Response { status, reason, headers, body: Vec::new() };
        if (100..200).contains(&status) {
            // Interim response: read the final one.
            return self.read_response(head_request);
        }
        if head_request || status == 204 || status == 304 {
            return Ok(Some(resp));
        }
        let chunked =
            resp.header("transfer-encoding").map(|v| v.to_ascii_lowercase().contains("chunked")).unwrap_or(false);
        if chunked {
            resp.body = read_chunked(&mut self.reader)?;
        } else if let Some(cl) = resp.header("content-length") {
            let len: usize = cl.trim().parse().map_err(|_| bad(format!("bad content-length {cl:?}")))?;
            let mut body = vec![0u8; len];
            self.reader.read_exact(&mut body)?;
            resp.body = body;
        } else {
            let mut body = Vec::new();
            self.reader.read_to_end(&mut body)?;
            resp.body = body;
        }
        Ok(Some(resp))
    }
}

/// A keep-alive connection to one address, opened when needed: after an I/O error or a
/// `Connection: close` response, the next request opens a new one.
pub struct KeepAlive {
    addr: SocketAddr,
    timeout: Duration,
    conn: Option<Conn>,
}

impl KeepAlive {
    /// Nothing is opened yet; connections use `timeout` (see [`Conn::connect_timeout`]).
    pub fn new(addr: SocketAddr, timeout: Duration) -> KeepAlive {
        KeepAlive { addr, timeout, conn: None }
    }

    /// Send `req` and read its response, on the open connection or a new one.
    pub fn send(&mut self, req: &Request) -> io::Result<Response> {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => Conn::connect_timeout(self.addr, self.timeout)?,
        };
        let r = conn.send(req)?;
        if !r.header("connection").is_some_and(|c| c.eq_ignore_ascii_case("close")) {
            self.conn = Some(conn);
        }
        Ok(r)
    }
}

/// Send one request on a fresh connection.
pub fn send(addr: SocketAddr, req: &Request) -> io::Result<Response> {
    Conn::connect(addr)?.send(req)
}

/// Send one request on a fresh connection; panic (with context) on any I/O error.
pub fn must_send(addr: SocketAddr, req: &Request) -> Response {
    match send(addr, req) {
        Ok(r) => r,
        Err(e) => panic!("request {} {} to {addr} failed: {e}", req.method, req.target),
    }
}

/// `GET path` on a fresh connection.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    must_send(addr, &Request::get(path))
}

/// `GET path` with extra text headers on a fresh connection.
pub fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut req = Request::get(path);
    for (n, v) in headers {
        req = req.header(n, v);
    }
    must_send(addr, &req)
}

/// `GET path` with extra text headers on a connection of its own that asks to be closed, read to
/// its end. Weir closes a connection only after the request's `logging` phase (metrics, access log
/// line) has run, so when this returns that phase is over: a positive signal, no waiting.
pub fn get_logged(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut req = Request::get(path).header("Connection", "close");
    for (n, v) in headers {
        req = req.header(n, v);
    }
    let mut conn = Conn::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let r = conn.send(&req).unwrap_or_else(|e| panic!("GET {path} to {addr} failed: {e}"));
    let mut rest = Vec::new();
    if let Err(e) = conn.reader.read_to_end(&mut rest) {
        panic!("GET {path} to {addr}: the connection was not closed after the response ({e}): {}", r.summary());
    }
    r
}

/// Write raw bytes on a fresh connection and read one response if the server sends one.
/// `Ok(None)`: the server closed the connection without answering.
pub fn send_raw(addr: SocketAddr, bytes: &[u8]) -> io::Result<Option<Response>> {
    let mut c = Conn::connect(addr)?;
    c.send_raw(bytes)?;
    c.read_response(false)
}

fn read_line<R: BufRead>(r: &mut R, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    let n = Read::take(&mut *r, max as u64 + 1).read_until(b'\n', buf)?;
    if n > max {
        return Err(bad("line too long".into()));
    }
    Ok(n)
}

fn read_chunked<R: BufRead>(r: &mut R) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        if read_line(r, &mut line, 4096)? == 0 {
            return Err(bad("EOF in chunk size".into()));
        }
        let l = lossy(trim_crlf(&line));
        let size_str = l.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_str, 16).map_err(|_| bad(format!("bad chunk size {l:?}")))?;
        if size == 0 {
            // Trailers until an empty line.
            loop {
                line.clear();
                if read_line(r, &mut line, MAX_HEAD)? == 0 || trim_crlf(&line).is_empty() {
                    return Ok(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])?;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)?;
        if &crlf != b"\r\n" {
            return Err(bad("chunk not followed by CRLF".into()));
        }
    }
}

fn trim_crlf(l: &[u8]) -> &[u8] {
    let l = l.strip_suffix(b"\n").unwrap_or(l);
    l.strip_suffix(b"\r").unwrap_or(l)
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}
