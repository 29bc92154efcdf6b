//! The exact bytes of the headers Weir writes (issue 40: the header writing was made cheaper and
//! must stay byte-identical): the `RateLimit-Policy` / `RateLimit` fields of a passed request and
//! of a rejection with its `Retry-After`, in their case and order, and the forwarded headers the
//! upstream receives. Both heads are read off real sockets: a raw client, a raw upstream.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::time::Duration;

use support::config::memory_with_app;
use support::tcp_server::TcpServer;
use support::weir::Weir;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Reads one head, through its blank line, as text (the bodies here are 2 bytes or JSON).
fn read_head(reader: &mut impl BufRead) -> Option<String> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        head.push_str(&line);
        if line == "\r\n" {
            return Some(head);
        }
    }
}

/// An upstream that reports every request head it reads and answers `200 ok`, keeping the
/// connection open.
fn raw_upstream() -> (TcpServer, Receiver<String>) {
    let (tx, rx) = channel::<String>();
    let tx = Mutex::new(tx);
    let server = TcpServer::start("raw-upstream", move |conn: TcpStream, _stop: &AtomicBool| {
        let heads: Sender<String> = tx.lock().expect("upstream channel").clone();
        let mut writer = conn.try_clone().expect("clone the upstream connection");
        let mut reader = BufReader::new(conn);
        while let Some(head) = read_head(&mut reader) {
            if heads.send(head).is_err() || writer.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").is_err()
            {
                return;
            }
        }
    });
    (server, rx)
}

/// Sends `GET target` with an X-Forwarded-For and returns the response head (its body read), its
/// `Date` value (checked for its shape) replaced by `<date>`.
fn get(conn: &mut BufReader<TcpStream>, target: &str) -> String {
    let request = format!("GET {target} HTTP/1.1\r\nHost: weir.test\r\nX-Forwarded-For: 198.51.100.7\r\n\r\n");
    conn.get_mut().write_all(request.as_bytes()).expect("send the request");
    let head = read_head(conn).expect("a response head");
    let length = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_owned))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no Content-Length in {head:?}"));
    let mut body = vec![0; length];
    conn.read_exact(&mut body).expect("read the body");
    head.split_inclusive("\r\n")
        .map(|line| match line.strip_prefix("Date: ") {
            Some(date) => {
                assert!(date.ends_with(" GMT\r\n") && date.len() == 31, "Date: {date:?}");
                "Date: <date>\r\n"
            }
            None => line,
        })
        .collect()
}

fn connect(addr: SocketAddr) -> BufReader<TcpStream> {
    let conn = TcpStream::connect(addr).expect("connect to weir");
    conn.set_read_timeout(Some(TIMEOUT)).expect("read timeout");
    BufReader::new(conn)
}

fn config(up: SocketAddr) -> String {
    memory_with_app(
        up,
        r#"[real_ip]
trusted = ["127.0.0.1/32"]
header = "X-Forwarded-For"

[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "10r/s"

[[limit_req_zone]]
name = "per_ip_min"
key = "ip"
rate = "60r/m"

[[limit_req_zone]]
name = "slow"
key = "ip"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 20, nodelay = true }, { zone = "per_ip_min", burst = 5, nodelay = true } ]

[[route]]
name = "slow"
path_prefix = "/slow/"
upstream = "app"
limit_req = [ { zone = "slow", burst = 0, nodelay = true } ]

[[route]]
name = "open"
path_prefix = "/"
upstream = "app"
"#,
    )
}

#[test]
fn rate_limit_fields_and_forwarded_headers_are_byte_exact() {
    let (up, upstream_heads) = raw_upstream();
    let w = Weir::start(&config(up.addr()));
    let mut conn = connect(w.addr);

    let passed = get(&mut conn, "/api/x");
    assert_eq!(
        passed,
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\
         RateLimit-Policy: \"per_ip\";q=21;w=3, \"per_ip_min\";q=6;w=6\r\n\
         RateLimit: \"per_ip\";r=20;t=1, \"per_ip_min\";r=5;t=1\r\nDate: <date>\r\nConnection: keep-alive\r\n\r\n"
    );
    let forwarded = upstream_heads.recv_timeout(TIMEOUT).expect("the upstream saw the request");
    assert_eq!(
        forwarded,
        "GET /api/x HTTP/1.1\r\nHost: weir.test\r\nx-forwarded-for: 198.51.100.7, 127.0.0.1\r\n\
         x-real-ip: 198.51.100.7\r\n\r\n"
    );

    // A route without limits: the forwarded headers only.
    let open = get(&mut conn, "/open");
    assert_eq!(open, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nDate: <date>\r\nConnection: keep-alive\r\n\r\n");
    let forwarded = upstream_heads.recv_timeout(TIMEOUT).expect("the upstream saw the request");
    assert_eq!(
        forwarded,
        "GET /open HTTP/1.1\r\nHost: weir.test\r\nx-forwarded-for: 198.51.100.7, 127.0.0.1\r\n\
         x-real-ip: 198.51.100.7\r\n\r\n"
    );

    // A rejection: Weir's own response, with Retry-After.
    assert!(get(&mut conn, "/slow/a").starts_with("HTTP/1.1 200 OK\r\n"));
    let rejected = get(&mut conn, "/slow/a");
    assert_eq!(
        rejected,
        "HTTP/1.1 429 Too Many Requests\r\nRateLimit-Policy: \"slow\";q=1;w=60\r\nRateLimit: \"slow\";r=0;t=60\r\n\
         Retry-After: 60\r\nContent-Type: application/json\r\nContent-Length: 71\r\nDate: <date>\r\n\
         Connection: keep-alive\r\n\r\n"
    );
}
