//! Slow readers against response buffering (issue 46): a client that asks for a large body and
//! reads nothing must not hold the upstream's workers, must cost a bounded, stated amount of
//! memory, and must give it back when it leaves; when the buffers' budget is spent Weir streams
//! as before and no byte is lost. Real binary, real sockets, an upstream with a fixed number of
//! blocking workers (the shape of a gunicorn or Puma app).

use crate::support;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::admin;
use support::config::{with_app, MEMORY_STORE, NO_ACCESS_LOG};
use support::metrics::{scrape, scrape_until};
use support::poll::wait_until;
use support::weir::Weir;

/// The pattern every large body repeats: its period is a prime number of bytes, so a lost,
/// repeated or reordered chunk of any power-of-two size shifts what follows and shows.
const PERIOD: usize = 1_048_573;

fn pattern() -> &'static [u8] {
    static PATTERN: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    PATTERN.get_or_init(|| {
        (0..PERIOD as u64).map(|i| ((i.wrapping_mul(0x9E37_79B9) >> 11) as u8) ^ (i >> 13) as u8).collect()
    })
}

/// The bytes of a large body from `offset` on, at most `max` of them (to the pattern's end).
fn body_at(offset: u64, max: usize) -> &'static [u8] {
    let start = (offset % PERIOD as u64) as usize;
    &pattern()[start..PERIOD.min(start + max)]
}

/// An HTTP/1.1 app with `workers` blocking threads, each serving one request at a time and
/// closing the connection after it (gunicorn's sync workers). `GET /big` answers `big` bytes of the pattern;
/// anything else a short "ok".
struct WorkerApp {
    addr: SocketAddr,
    /// Large bodies written whole to the socket (the worker is free of them).
    big_done: Arc<AtomicUsize>,
}

impl WorkerApp {
    fn start(workers: usize, big: u64) -> WorkerApp {
        let listener = Arc::new(TcpListener::bind("127.0.0.1:0").expect("bind app"));
        let addr = listener.local_addr().expect("app addr");
        let big_done = Arc::new(AtomicUsize::new(0));
        for _ in 0..workers {
            let (listener, big_done) = (listener.clone(), big_done.clone());
            thread::spawn(move || loop {
                let Ok((conn, _)) = listener.accept() else { return };
                let _ = serve(conn, big, &big_done);
            });
        }
        WorkerApp { addr, big_done }
    }

    fn big_done(&self) -> usize {
        self.big_done.load(Ordering::SeqCst)
    }
}

fn serve(mut conn: TcpStream, big: u64, big_done: &AtomicUsize) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    if head.starts_with(b"GET /big ") {
        conn.write_all(format!("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: {big}\r\n\r\n").as_bytes())?;
        let mut at = 0u64;
        while at < big {
            let chunk = body_at(at, (big - at).min(64 * 1024) as usize);
            conn.write_all(chunk)?;
            at += chunk.len() as u64;
        }
        big_done.fetch_add(1, Ordering::SeqCst);
    } else {
        conn.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")?;
    }
    Ok(())
}

fn config(app: SocketAddr, buffering: &str) -> String {
    with_app(
        &format!("{}\nsend_timeout = \"120s\"\n\n[server.response_buffering]\n{buffering}", admin::LISTEN),
        &format!("{MEMORY_STORE}\n\n{NO_ACCESS_LOG}"),
        app,
        "[[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"",
    )
}

/// A client that asks for `/big` and reads nothing, its receive buffer shrunk to a few KiB
/// (what an attacker does to hold the most with the least).
fn slow_reader(addr: SocketAddr) -> TcpStream {
    let mut s = connect_with_small_window(addr).expect("connect slow reader");
    s.write_all(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n").expect("send slow request");
    s
}

/// A loopback IPv4 connection whose receive buffer is 4 KiB from the SYN on (set after the
/// handshake, it would shrink below the window already offered and the sender would retransmit).
fn connect_with_small_window(addr: SocketAddr) -> io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(v4) = addr else { return Err(io::Error::other("IPv4 only")) };
    // SAFETY: plain socket calls on a descriptor this function owns; the sockaddr_in and the
    // c_int option are valid for the sizes passed.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let size: libc::c_int = 4096;
        let opt = &size as *const libc::c_int as *const libc::c_void;
        if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, opt, std::mem::size_of::<libc::c_int>() as u32) != 0
        {
            return Err(io::Error::last_os_error());
        }
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_port = v4.port().to_be();
        sa.sin_addr = libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::connect(fd, &sa as *const libc::sockaddr_in as *const libc::sockaddr, len) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stream)
    }
}

/// `GET /small` on a fresh connection: true when a 200 came within `timeout`.
fn honest(addr: SocketAddr, timeout: Duration) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, timeout) else { return false };
    let _ = s.set_read_timeout(Some(timeout));
    if s.write_all(b"GET /small HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    answer.starts_with(b"HTTP/1.1 200") && answer.ends_with(b"ok")
}

/// Reads one `/big` answer off `s` to its end and checks every byte against the pattern.
fn read_big_and_check(s: &mut TcpStream, big: u64) -> Result<(), String> {
    s.set_read_timeout(Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            other => return Err(format!("head cut short: {other:?} after {:?}", String::from_utf8_lossy(&head))),
        }
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    if !head.starts_with("http/1.1 200") || !head.contains(&format!("content-length: {big}\r\n")) {
        return Err(format!("unexpected head {head:?}"));
    }
    let mut buf = vec![0u8; 256 * 1024];
    let mut at = 0u64;
    while at < big {
        let n = s.read(&mut buf).map_err(|e| format!("read at {at} of {big}: {e}"))?;
        if n == 0 {
            return Err(format!("body cut at {at} of {big} bytes"));
        }
        let mut checked = 0;
        while checked < n {
            let want = body_at(at, n - checked);
            if buf[checked..checked + want.len()] != *want {
                return Err(format!("the body differs within bytes {at}..{}", at + want.len() as u64));
            }
            checked += want.len();
            at += want.len() as u64;
        }
    }
    Ok(())
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The attack: 6 slow readers of a 64 MiB body in front of a 4-worker app. With
/// buffering the workers write every body to Weir and are free: ≥ 18 of 20 honest requests
/// beside them are answered (without it: 0 of 20).
#[test]
fn slow_readers_do_not_hold_the_upstreams_workers() {
    const BIG: u64 = 64 << 20;
    let app = WorkerApp::start(4, BIG);
    let w = Weir::start(&config(app.addr, "temp_files = \"1g\""));
    let readers: Vec<TcpStream> = (0..6).map(|_| slow_reader(w.addr)).collect();
    // Every one of the 6 bodies leaves the app although nobody reads it (each in a temp file).
    let freed = wait_until(Duration::from_secs(60), Duration::from_millis(50), || app.big_done() == 6);
    assert!(freed.is_some(), "the app's workers finished {} of 6 large bodies", app.big_done());
    let started = Instant::now();
    let answered: usize = (0..20)
        .map(|_| thread::spawn(move || honest(w.addr, Duration::from_secs(20))))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| usize::from(h.join().expect("honest client")))
        .sum();
    assert!(answered >= 18, "{answered} of 20 honest requests answered beside 6 slow readers");
    assert!(started.elapsed() < Duration::from_secs(20), "honest requests took {:?}", started.elapsed());
    drop(readers);
}

/// A slow reader who does read in the end gets every byte, in order, from memory and temp file.
#[test]
fn a_reader_who_comes_back_gets_every_byte_after_the_upstream_is_done() {
    const BIG: u64 = 24 << 20;
    let app = WorkerApp::start(2, BIG);
    let w = Weir::start(&config(app.addr, "memory_per_connection = \"64k\""));
    let mut readers: Vec<TcpStream> = (0..3).map(|_| slow_reader(w.addr)).collect();
    assert!(
        wait_until(Duration::from_secs(60), Duration::from_millis(50), || app.big_done() == 3).is_some(),
        "the app finished {} of 3 bodies before anyone read",
        app.big_done()
    );
    for (i, r) in readers.iter_mut().enumerate() {
        read_big_and_check(r, BIG).unwrap_or_else(|e| panic!("reader {i}: {e}"));
    }
}

/// The budget spent: memory for one connection's share in all and no temp files. Four clients
/// that pause and then read get every byte (they are streamed with back-pressure, as without
/// buffering) — buffering only ever stops helping.
#[test]
fn a_spent_budget_streams_with_back_pressure_and_loses_nothing() {
    const BIG: u64 = 8 << 20;
    let app = WorkerApp::start(4, BIG);
    let w =
        Weir::start(&config(app.addr, "memory = \"64k\"\nmemory_per_connection = \"64k\"\nmax_temp_file_size = \"0\""));
    let mut readers: Vec<TcpStream> = (0..4).map(|_| slow_reader(w.addr)).collect();
    // The clients pause before reading, so all four answers are in flight at once.
    thread::sleep(Duration::from_millis(300));
    let checks: Vec<_> =
        readers.drain(..).map(|mut r| thread::spawn(move || read_big_and_check(&mut r, BIG))).collect();
    for (i, c) in checks.into_iter().enumerate() {
        c.join().expect("reader thread").unwrap_or_else(|e| panic!("reader {i}: {e}"));
    }
    assert_eq!(app.big_done(), 4);
}

/// Memory per slow reader: 200 readers of a 4 MiB body each, none reading. With buffering each
/// holds its memory share and Pingora's per-connection buffers (the rest of the body is in its
/// temp file, the upstream connection closed); without buffering each held Pingora's in-flight
/// body chunks as well (~850 KiB measured). Once they leave the memory is returned. The allocator
/// is told to return freed pages at once (`MIMALLOC_PURGE_DELAY=0`, see docs/security.md) so
/// that RSS shows what is held, not what mimalloc keeps for later.
#[test]
fn memory_per_slow_reader_is_bounded_and_returned() {
    const BIG: u64 = 4 << 20;
    const READERS: usize = 200;
    let app = WorkerApp::start(READERS + 8, BIG);
    let w = Weir::start_with_env(
        &config(app.addr, "memory_per_connection = \"64k\"\nmemory = \"64m\""),
        &[("MIMALLOC_PURGE_DELAY", "0")],
    );
    let pid = w.pid().expect("pid");
    for _ in 0..20 {
        assert!(honest(w.addr, Duration::from_secs(5)), "warm-up request");
    }
    let before = rss_kib(pid);
    let readers: Vec<TcpStream> = (0..READERS).map(|_| slow_reader(w.addr)).collect();
    assert!(
        wait_until(Duration::from_secs(90), Duration::from_millis(50), || app.big_done() == READERS).is_some(),
        "the app finished {} of {READERS} bodies",
        app.big_done()
    );
    let held = settled_rss(pid);
    let per_reader = held.saturating_sub(before) / READERS as u64;
    eprintln!("RSS before {before} KiB, holding {READERS} slow readers {held} KiB: {per_reader} KiB each");
    // A 64 KiB share + ~180 KiB of Pingora's per-connection state (measured 360 KiB in all);
    // unbuffered it was ~850.
    assert!(per_reader <= 500, "{per_reader} KiB per slow reader");
    // What the budgets hold is on /metrics: at most each reader's 64 KiB in memory, and the rest
    // of the bodies the kernel did not take in temp files.
    let buffered = scrape(admin::addr(&w));
    let (memory, temp) = (
        buffered.must("weir_response_buffer_bytes", &[("medium", "memory")]),
        buffered.must("weir_response_buffer_bytes", &[("medium", "temp_file")]),
    );
    eprintln!("buffered for {READERS} slow readers: {memory} bytes in memory, {temp} in temp files");
    assert!(memory > 0.0 && memory <= (READERS as f64) * 65_536.0, "memory held {memory}");
    assert!(temp > 0.0 && temp <= (READERS as u64 * BIG) as f64, "temp files held {temp}");
    drop(readers);
    assert!(
        wait_until(Duration::from_secs(30), Duration::from_millis(100), || open_descriptors(pid) < 40).is_some(),
        "the readers' connections and temp files are closed: {} descriptors open",
        open_descriptors(pid)
    );
    let drained = scrape_until(admin::addr(&w), Duration::from_secs(30), Duration::from_millis(100), |s| {
        s.value_or_zero("weir_response_buffer_bytes", &[("medium", "memory")]) == 0.0
            && s.value_or_zero("weir_response_buffer_bytes", &[("medium", "temp_file")]) == 0.0
    });
    assert!(
        drained.is_ok(),
        "the budgets give everything back when the readers leave: {:?}",
        drained.err().map(|s| s.filtered())
    );
    let after = settled_rss(pid);
    eprintln!("RSS after they left: {after} KiB");
    // What the allocator kept is used again: a second wave costs (almost) nothing more.
    let again: Vec<TcpStream> = (0..READERS).map(|_| slow_reader(w.addr)).collect();
    assert!(
        wait_until(Duration::from_secs(90), Duration::from_millis(50), || app.big_done() == 2 * READERS).is_some(),
        "the app finished {} of the second {READERS} bodies",
        app.big_done() - READERS
    );
    let second = settled_rss(pid);
    eprintln!("RSS holding a second wave of {READERS}: {second} KiB");
    assert!(
        second <= held + (held - before) / 4,
        "a second wave of slow readers grew RSS from {held} to {second} KiB: memory is not reused"
    );
    drop(again);
    assert!(honest(w.addr, Duration::from_secs(5)));
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(usize::MAX, |d| d.count())
}

/// The lowest RSS over the next 5 s: freed pages go back over a second or two.
fn settled_rss(pid: u32) -> u64 {
    (0..10)
        .map(|_| {
            thread::sleep(Duration::from_millis(500));
            rss_kib(pid)
        })
        .min()
        .unwrap_or(u64::MAX)
}
