//! Hostile clients, second round (issue 22) at the edge: HTTP/2 stream floods held to the
//! advertised stream cap and to the connection caps, HTTP/2 request bodies and responses bounded
//! per stream by `body_timeout` and `send_timeout`, IPv4-mapped peers counted as IPv4 by the
//! per-address cap, and upper bounds on the client limits in config. Real weir processes, a raw
//! HTTP/2 client (tests/support/h2.rs) and real upstream sockets.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::admin;
use support::config::{line_of, with_app};
use support::h2::{self, Frame, H2Conn};
use support::http::{Conn, Request};
use support::metrics::scrape;
use support::poll::wait_until;
use support::tcp_server::TcpServer;
use support::upstream::Upstream;
use support::weir::{check_config, Weir};

const MEMORY: &str = "[store]\nkind = \"memory\"";

/// An upstream that reads what it is sent and never answers, holding each connection until the
/// test ends: every request forwarded to it stays in flight. Counts its connections.
struct Holding {
    server: TcpServer,
    accepted: Arc<AtomicUsize>,
}

impl Holding {
    fn start() -> Holding {
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let server = TcpServer::start("holding", move |mut conn: TcpStream, stop: &AtomicBool| {
            count.fetch_add(1, Ordering::SeqCst);
            let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
            let mut buf = [0u8; 4096];
            while !stop.load(Ordering::SeqCst) {
                match conn.read(&mut buf) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(_) => return,
                }
            }
        });
        Holding { server, accepted }
    }

    fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// h2c on `$LISTEN`, the admin listener, `server_extra`; `/slow` goes to `slow`, the rest to `fast`.
fn h2c_config(fast: SocketAddr, slow: SocketAddr, server_extra: &str) -> String {
    with_app(
        &format!("h2c = true\n{}\n{server_extra}", admin::LISTEN),
        MEMORY,
        fast,
        &format!(
            "[[upstream]]\nname = \"slow\"\nservers = [\"{slow}\"]\nread_timeout = \"60s\"\n\n\
             [[route]]\nname = \"slow\"\npath_prefix = \"/slow\"\nupstream = \"slow\"\n\n\
             [[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n"
        ),
    )
}

/// The RST_STREAM frames among `frames`, as (stream, error code).
fn resets(frames: &[Frame]) -> Vec<(u32, u32)> {
    frames.iter().filter(|f| f.kind == h2::RST_STREAM).map(|f| (f.stream, f.error_code().unwrap_or(u32::MAX))).collect()
}

#[test]
fn the_advertised_stream_cap_is_pingoras_default_or_h2_max_streams_and_is_enforced() {
    let fast = Upstream::start();
    let slow = Holding::start();

    // No setting: Pingora's default (100), advertised in the server's first SETTINGS.
    let w = Weir::start(&h2c_config(fast.addr(), slow.addr(), ""));
    let c = H2Conn::connect(w.addr, &[]).expect("h2c connection");
    assert_eq!(c.server_settings.setting(h2::SETTINGS_MAX_CONCURRENT_STREAMS), Some(100), "{:?}", c.server_settings);
    drop((c, w));

    let w = Weir::start(&h2c_config(fast.addr(), slow.addr(), "h2_max_streams = 5"));
    let mut c = H2Conn::connect(w.addr, &[]).expect("h2c connection");
    assert_eq!(c.server_settings.setting(h2::SETTINGS_MAX_CONCURRENT_STREAMS), Some(5));
    // Eight streams at once, each held by the upstream: the last three are over the cap.
    for i in 0..8 {
        c.request(1 + 2 * i, "GET", "/slow", &[], true).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(20), || slow.accepted() == 5).is_some(),
        "the five streams within the cap reach the upstream: {}",
        slow.accepted()
    );
    let frames = c.frames_until_ping_ack(Duration::from_secs(10)).expect("frames until the PING ack");
    assert_eq!(resets(&frames), [(11, h2::REFUSED_STREAM), (13, h2::REFUSED_STREAM), (15, h2::REFUSED_STREAM)]);
    assert_eq!(slow.accepted(), 5);
}

/// `conns` h2c connections (all connected before any stream is sent, each holding a place), then
/// `streams` GET /slow on each, with a thread per connection counting `REFUSED_STREAM` resets.
struct Flood {
    conns: Vec<H2Conn>,
    readers: Vec<thread::JoinHandle<()>>,
    refused: Arc<AtomicUsize>,
}

impl Flood {
    fn start(addr: SocketAddr, conns: usize, streams: u32) -> Flood {
        let mut conns: Vec<H2Conn> = (0..conns).map(|_| H2Conn::connect(addr, &[]).expect("h2c connection")).collect();
        let refused = Arc::new(AtomicUsize::new(0));
        let mut readers = Vec::new();
        for c in &mut conns {
            assert_eq!(c.server_settings.setting(h2::SETTINGS_MAX_CONCURRENT_STREAMS), Some(streams));
            for i in 0..streams {
                c.request(1 + 2 * i, "GET", "/slow", &[], true).unwrap();
            }
            let mut reader = c.try_clone().unwrap();
            let refused = refused.clone();
            readers.push(thread::spawn(move || {
                // Until the connection ends (the test shuts it down when done).
                while let Ok(f) = h2::read_frame(&mut reader, Duration::from_secs(60)) {
                    if f.kind == h2::RST_STREAM && f.error_code() == Some(h2::REFUSED_STREAM) {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        Flood { conns, readers, refused }
    }

    fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        // Shut the sockets down (the readers' clones too), then wait for the readers.
        for c in &self.conns {
            let _ = c.try_clone().and_then(|s| s.shutdown(std::net::Shutdown::Both));
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

#[test]
fn an_h2_stream_flood_is_held_to_the_connection_caps_and_others_are_still_served() {
    let fast = Upstream::start();
    let slow = Holding::start();
    // 256 descriptors: at most (256 - 128) / 2 = 64 places in all; this client gets 40 of them.
    // The stream cap is raised so that only the connection caps stand in the flood's way.
    let config = h2c_config(
        fast.addr(),
        slow.addr(),
        "h2_max_streams = 200\nmax_connections_per_ip = 40\nheader_timeout = \"30s\"",
    );
    let w = Weir::start_with_nofile(&config, 256);
    let admin = admin::addr(&w);

    // Three connections of 200 streams each from 127.0.0.1: 600 requests for a slow upstream.
    // Without the caps each would hold an upstream socket: far past the 256 descriptors.
    let flood = Flood::start(w.addr, 3, 200);
    // 40 places for 127.0.0.1: the three connections, each with its first stream, and 37 more
    // streams. Every other stream is refused.
    let expected_refused = 600 - 40;
    assert!(
        wait_until(Duration::from_secs(20), Duration::from_millis(20), || flood.refused() >= expected_refused)
            .is_some(),
        "streams over the caps are refused: {} of {expected_refused}",
        flood.refused()
    );
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(20), || slow.accepted() == 40).is_some(),
        "40 streams reach the upstream: {}",
        slow.accepted()
    );
    // During the flood: the admin listener answers, so does an HTTP/1 client from another
    // address, and the flooding address gets a quick 503 rather than a hang.
    let health = support::http::get(admin, "/healthz");
    assert_eq!(health.status, 200, "{}", health.summary());
    let other = http1_get_from("127.0.0.2", w.addr, "/fast");
    assert!(other.starts_with("HTTP/1.1 200"), "another client is served: {other}");
    let same = support::http::get(w.addr, "/fast");
    assert_eq!(same.status, 503, "{}", same.summary());
    assert_eq!(same.json()["cap"], "max_connections_per_ip");
    let m = scrape(admin);
    assert!(m.value_or_zero("weir_connections_refused_total", &[("cap", "max_connections_per_ip")]) >= 561.0);
    assert_eq!(flood.refused(), expected_refused, "no stream within the caps was refused");
    assert_eq!(slow.accepted(), 40);
    assert!(!w.stderr().contains("Too many open files"), "{}", w.stderr());

    // The flood's places come back when its connections close.
    drop(flood);
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            support::http::send(w.addr, &Request::get("/fast")).is_ok_and(|r| r.status == 200)
        })
        .is_some(),
        "the flooding address is served again once its streams are gone"
    );
}

#[test]
fn without_a_per_address_cap_the_instance_cap_holds_an_h2_flood_and_the_admin_listener_answers() {
    let fast = Upstream::start();
    let slow = Holding::start();
    // 256 descriptors: (256 - 128) / 2 = 64 places in all, and no per-address cap (as behind a
    // load balancer): the instance cap alone stands in the way.
    let config = h2c_config(fast.addr(), slow.addr(), "h2_max_streams = 200\nheader_timeout = \"30s\"");
    let w = Weir::start_with_nofile(&config, 256);
    let admin = admin::addr(&w);
    let flood = Flood::start(w.addr, 2, 200);
    // 64 places: the two connections, their first streams, and 62 more streams; 336 refused.
    assert!(
        wait_until(Duration::from_secs(20), Duration::from_millis(20), || flood.refused() >= 336).is_some(),
        "streams over the instance cap are refused: {} of 336",
        flood.refused()
    );
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(20), || slow.accepted() == 64).is_some(),
        "64 streams reach the upstream: {}",
        slow.accepted()
    );
    let health = support::http::get(admin, "/healthz");
    assert_eq!(health.status, 200, "{}", health.summary());
    // Another client is answered at once, with the instance cap's 503.
    let other = http1_get_from("127.0.0.2", w.addr, "/fast");
    assert!(other.starts_with("HTTP/1.1 503"), "{other}");
    assert!(other.contains("\"max_connections\""), "{other}");
    let m = scrape(admin);
    assert_eq!(m.value_or_zero("weir_connections_refused_total", &[("cap", "max_connections")]), 337.0);
    assert_eq!(slow.accepted(), 64);
    assert_eq!(flood.refused(), 336);
    assert!(!w.stderr().contains("Too many open files"), "{}", w.stderr());
}

/// `GET path` over HTTP/1.1 from the local address `from` (any 127.0.0.0/8 address is loopback
/// on Linux), returning the raw response.
fn http1_get_from(from: &str, to: SocketAddr, path: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap_or_else(|e| panic!("bind {from}: {e}"));
        socket.connect(to).await.unwrap_or_else(|e| panic!("connect {to} from {from}: {e}"))
    });
    let mut s = stream.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads frames until `stream` is reset (or the connection ends); how long after `since`.
fn time_until_reset(c: &mut H2Conn, stream: u32, since: Instant, limit: Duration) -> Duration {
    loop {
        match c.read_frame(limit.saturating_sub(since.elapsed())) {
            Ok(f) if f.kind == h2::RST_STREAM && f.stream == stream => return since.elapsed(),
            Ok(f) if f.kind == h2::GOAWAY => return since.elapsed(),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return since.elapsed(),
            Err(e) => panic!("stream {stream} still open after {:?}: {e}", since.elapsed()),
        }
    }
}

#[test]
fn an_h2_request_body_that_stops_arriving_is_cut_at_body_timeout() {
    let fast = Upstream::start();
    let slow = Holding::start();
    let w = Weir::start(&h2c_config(fast.addr(), slow.addr(), "body_timeout = \"2s\""));
    let admin = admin::addr(&w);
    let mut c = H2Conn::connect(w.addr, &[]).expect("h2c connection");

    // A head announcing 10 bytes of body, and then nothing.
    let sent = Instant::now();
    c.request(1, "POST", "/slow/upload", &[("content-length", "10")], false).unwrap();
    let cut_after = time_until_reset(&mut c, 1, sent, Duration::from_secs(15));
    assert!(cut_after >= Duration::from_secs(2), "cut before body_timeout: {cut_after:?}");

    // The deadline is between two pieces of body: a slow but steady body is not cut. Time must
    // pass: pieces 1 s apart (half the timeout), 3 s in all, longer than one body_timeout.
    c.request(3, "POST", "/slow/upload", &[("content-length", "10")], false).unwrap();
    for _ in 0..3 {
        thread::sleep(Duration::from_millis(1000));
        c.data(3, b"x", false).unwrap();
    }
    let last_piece = Instant::now();
    let cut_after = time_until_reset(&mut c, 3, last_piece, Duration::from_secs(15));
    assert!(cut_after >= Duration::from_secs(2), "cut before body_timeout after the last piece: {cut_after:?}");
    let cut = scrape(admin).value_or_zero("weir_connections_cut_total", &[("cause", "body_timeout")]);
    assert_eq!(cut, 2.0);
    // Both reached the upstream (the body deadline runs while it is forwarded), and the
    // connection itself is still usable.
    assert_eq!(slow.accepted(), 2);
    let frames = c.frames_until_ping_ack(Duration::from_secs(5)).expect("the connection outlives its streams");
    assert!(resets(&frames).is_empty(), "{frames:?}");
}

#[test]
fn an_h2_response_the_client_does_not_take_is_cut_at_send_timeout() {
    // An upstream that answers at once with 1 MB; the client opens no flow-control window.
    let big = TcpServer::start("big", |mut conn: TcpStream, _stop: &AtomicBool| {
        let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).is_ok_and(|n| n == 1) {
            head.push(byte[0]);
        }
        let body = vec![b'x'; 1_000_000];
        let _ = conn.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
        let _ = conn.write_all(&body);
    });
    let w = Weir::start(&with_app(
        &format!("h2c = true\nsend_timeout = \"2s\"\n{}", admin::LISTEN),
        MEMORY,
        big.addr(),
        "[[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n",
    ));
    let mut c = H2Conn::connect(w.addr, &[(h2::SETTINGS_INITIAL_WINDOW_SIZE, 0)]).expect("h2c connection");
    let sent = Instant::now();
    c.request(1, "GET", "/big", &[], true).unwrap();
    let cut_after = time_until_reset(&mut c, 1, sent, Duration::from_secs(15));
    assert!(cut_after >= Duration::from_secs(2), "cut before send_timeout: {cut_after:?}");
}

#[test]
fn the_per_address_cap_counts_ipv4_mapped_peers_as_ipv4() {
    // A dual-stack listener needs IPv6: say so plainly where there is none.
    if let Err(e) = TcpListener::bind("[::1]:0") {
        panic!("this test needs an IPv6 loopback (::1) for a dual-stack listener: {e}");
    }
    let up = Upstream::start();
    let dual = TcpListener::bind("[::]:0").expect("bind [::]:0").local_addr().unwrap().port();
    let config = with_app(
        &format!("max_connections_per_ip = 2\n{}", admin::LISTEN),
        MEMORY,
        up.addr(),
        "[[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n",
    )
    .replace("listen = [\"$LISTEN\"]", &format!("listen = [\"$LISTEN\", \"[::]:{dual}\"]"));
    let w = Weir::start(&config);
    let admin = admin::addr(&w);
    // An IPv4 client reaches the dual-stack listener as ::ffff:127.0.0.1.
    let via_dual: SocketAddr = format!("127.0.0.1:{dual}").parse().unwrap();
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || TcpStream::connect(via_dual).is_ok())
            .is_some(),
        "weir listens on [::]:{dual}"
    );
    // Hold one keep-alive connection through each listener, each shown admitted by a 200. (A
    // readiness probe still being closed may hold a place a moment: retry until it is gone.)
    let held: Vec<Conn> = [w.addr, via_dual]
        .into_iter()
        .map(|addr| {
            let mut held = None;
            wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
                let Ok(mut c) = Conn::connect(addr) else { return false };
                let admitted = c.send(&Request::get("/")).is_ok_and(|r| r.status == 200);
                if admitted {
                    held = Some(c);
                }
                admitted
            });
            held.unwrap_or_else(|| panic!("a connection through {addr} is admitted"))
        })
        .collect();
    for addr in [via_dual, w.addr] {
        let r = support::http::get(addr, "/");
        assert_eq!(r.status, 503, "a third connection from 127.0.0.1 through {addr}: {}", r.summary());
        assert_eq!(r.json()["cap"], "max_connections_per_ip");
    }
    assert!(scrape(admin).value_or_zero("weir_connections_refused_total", &[("cap", "max_connections_per_ip")]) >= 2.0);
    // A real IPv6 client is another address, with places of its own.
    let v6: SocketAddr = format!("[::1]:{dual}").parse().unwrap();
    assert_eq!(support::http::get(v6, "/").status, 200);
    drop(held);
}

#[test]
fn client_limits_beyond_their_upper_bounds_are_refused_by_weir_check() {
    let cases = [
        ("max_header_size = 100000000000", "server.max_header_size: must be 1024..=1048576, got 100000000000"),
        (
            "header_timeout = \"1000000000000h\"",
            "server.header_timeout: \"1000000000000h\" is too long: the most is 1h",
        ),
        ("body_timeout = \"2h\"", "server.body_timeout: \"2h\" is too long: the most is 1h"),
        ("send_timeout = \"3601s\"", "server.send_timeout: \"3601s\" is too long"),
        ("keepalive_timeout = \"61m\"", "server.keepalive_timeout: \"61m\" is too long"),
        ("max_connections = 100000000", "server.max_connections: must be 1..=10000000, got 100000000"),
        ("max_connections_per_ip = 0", "server.max_connections_per_ip: must be 1..=10000000, got 0"),
        ("h2_max_streams = 1001", "server.h2_max_streams: must be 1..=1000, got 1001"),
        ("h2_max_streams = 0", "server.h2_max_streams: must be 1..=1000, got 0"),
    ];
    let check =
        |config: &str| check_config("weir.toml", &config.replace("$LISTEN", "127.0.0.1:8080"), Duration::from_secs(15));
    for (line, message) in cases {
        let config = with_app(line, MEMORY, "127.0.0.1:9".parse().unwrap(), "");
        let out = check(&config);
        assert_eq!(out.code, Some(1), "{line}: {}", out.describe());
        let want = format!("weir.toml:{}: {message}", line_of(&config, line));
        assert!(out.stderr.contains(&want), "{line}: expected {want:?} in:\n{}", out.describe());
    }
    let store = "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\ntimeout = \"10m\"";
    let out = check(&with_app("", store, "127.0.0.1:9".parse().unwrap(), ""));
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stderr.contains("store.timeout: expected a positive duration up to \"60s\""), "{}", out.describe());
    // The largest values are accepted.
    let top = "max_header_size = 1048576\nheader_timeout = \"1h\"\nbody_timeout = \"3600s\"\nh2_max_streams = 1000";
    let out = check(&with_app(top, MEMORY, "127.0.0.1:9".parse().unwrap(), ""));
    assert_eq!(out.code, Some(0), "{}", out.describe());
}
