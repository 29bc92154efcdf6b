//! A small HTTP/2 client on raw frames (RFC 9113), for tests that must do what a well-behaved
//! client library would not: open more streams than the server allows, send a request head and
//! never its body, keep a zero flow-control window. Cleartext with prior knowledge (h2c).
//!
//! Header blocks are HPACK literals without indexing or Huffman coding (valid HPACK that any
//! server decodes); responses are read as frames, and only their type, flags, stream and
//! payload are looked at.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const PING: u8 = 6;
pub const GOAWAY: u8 = 7;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;

pub const REFUSED_STREAM: u32 = 0x7;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[derive(Debug, Clone)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The error code of a RST_STREAM (or the GOAWAY's).
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.kind {
            RST_STREAM => 0,
            GOAWAY => 4,
            _ => return None,
        };
        let b = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A SETTINGS parameter's value.
    pub fn setting(&self, id: u16) -> Option<u32> {
        if self.kind != SETTINGS {
            return None;
        }
        self.payload
            .chunks_exact(6)
            .find(|c| u16::from_be_bytes([c[0], c[1]]) == id)
            .map(|c| u32::from_be_bytes([c[2], c[3], c[4], c[5]]))
    }
}

pub struct H2Conn {
    stream: TcpStream,
    /// The server's first SETTINGS frame.
    pub server_settings: Frame,
}

impl H2Conn {
    /// Connects, sends the preface and `settings` (id, value), and reads the server's SETTINGS
    /// (acknowledging it).
    pub fn connect(addr: SocketAddr, settings: &[(u16, u32)]) -> io::Result<H2Conn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        let mut conn =
            H2Conn { stream, server_settings: Frame { kind: SETTINGS, flags: 0, stream: 0, payload: Vec::new() } };
        conn.stream.write_all(PREFACE)?;
        let payload: Vec<u8> =
            settings.iter().flat_map(|(id, v)| [id.to_be_bytes().as_slice(), &v.to_be_bytes()].concat()).collect();
        conn.write_frame(SETTINGS, 0, 0, &payload)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let f = conn.read_frame(deadline.saturating_duration_since(Instant::now()))?;
            if f.kind == SETTINGS && f.flags & ACK == 0 {
                conn.write_frame(SETTINGS, ACK, 0, &[])?;
                conn.server_settings = f;
                return Ok(conn);
            }
        }
    }

    pub fn try_clone(&self) -> io::Result<TcpStream> {
        self.stream.try_clone()
    }

    pub fn write_frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> io::Result<()> {
        let len = payload.len() as u32;
        let mut head = [0u8; 9];
        head[..3].copy_from_slice(&len.to_be_bytes()[1..]);
        head[3] = kind;
        head[4] = flags;
        head[5..].copy_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
        self.stream.write_all(&[head.as_slice(), payload].concat())
    }

    /// A request head on `stream` (odd, increasing): `method` `path` with `headers`; `end`: no body.
    pub fn request(
        &mut self,
        stream: u32,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        end: bool,
    ) -> io::Result<()> {
        let mut block = Vec::new();
        for (name, value) in [(":method", method), (":scheme", "http"), (":authority", "weir.test"), (":path", path)]
            .into_iter()
            .chain(headers.iter().copied())
        {
            literal(&mut block, name, value);
        }
        let flags = END_HEADERS | if end { END_STREAM } else { 0 };
        self.write_frame(HEADERS, flags, stream, &block)
    }

    pub fn data(&mut self, stream: u32, bytes: &[u8], end: bool) -> io::Result<()> {
        self.write_frame(DATA, if end { END_STREAM } else { 0 }, stream, bytes)
    }

    /// Sends a PING and reads frames until its ACK, returning those read before it: the server
    /// writes in order, so they are everything it had sent until then.
    pub fn frames_until_ping_ack(&mut self, timeout: Duration) -> io::Result<Vec<Frame>> {
        let token = *b"weirtest";
        self.write_frame(PING, 0, 0, &token)?;
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let f = self.read_frame(deadline.saturating_duration_since(Instant::now()))?;
            if f.kind == PING && f.flags & ACK != 0 && f.payload == token {
                return Ok(seen);
            }
            seen.push(f);
        }
    }

    /// The next frame, within `timeout`. `UnexpectedEof` when the server closed the connection.
    pub fn read_frame(&mut self, timeout: Duration) -> io::Result<Frame> {
        read_frame(&mut self.stream, timeout)
    }
}

/// One frame from `stream`, within `timeout` (`TimedOut` past it).
pub fn read_frame(stream: &mut TcpStream, timeout: Duration) -> io::Result<Frame> {
    let deadline = Instant::now() + timeout;
    let mut head = [0u8; 9];
    read_exact_by(stream, &mut head, deadline)?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    read_exact_by(stream, &mut payload, deadline)?;
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Ok(Frame { kind: head[3], flags: head[4], stream: id, payload })
}

fn read_exact_by(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no frame in time"));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[at..]) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed")),
            Ok(n) => at += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no frame in time"))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// An HPACK literal header field without indexing, new name, no Huffman coding (RFC 7541 §6.2.2).
fn literal(block: &mut Vec<u8>, name: &str, value: &str) {
    block.push(0x00);
    string(block, name.as_bytes());
    string(block, value.as_bytes());
}

fn string(block: &mut Vec<u8>, s: &[u8]) {
    // A 7-bit prefix integer (RFC 7541 §5.1), H = 0.
    let mut n = s.len();
    if n < 127 {
        block.push(n as u8);
    } else {
        block.push(127);
        n -= 127;
        while n >= 128 {
            block.push((n % 128) as u8 | 0x80);
            n /= 128;
        }
        block.push(n as u8);
    }
    block.extend_from_slice(s);
}
