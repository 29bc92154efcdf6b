//! Issue 40, item 1: no Nagle stalls anywhere. Every socket Weir accepts (proxy, admin, rate
//! limit service cleartext and TLS) and every one it opens (Redis, upstreams) runs with
//! `TCP_NODELAY`: read on the real process's sockets, duplicated with `pidfd_getfd(2)`.
//! A socket left to Nagle's algorithm against delayed ACKs stalls a small write ~40 ms, which
//! Envoy's 20 ms rate limit timeout turns into a request that was never limited.

use crate::support;

use std::net::{SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::time::Duration;

use support::certs::{install, Ca};
use support::http;
use support::poll::wait_until;
use support::redis_server::RedisServer;
use support::upstream::Upstream;
use support::weir::{free_port, Weir};

/// Each TCP connection of `pid`: its local and peer addresses and whether TCP_NODELAY is set.
fn connections(pid: u32) -> Vec<(SocketAddr, SocketAddr, bool)> {
    // SAFETY: raw syscalls with valid arguments; every descriptor obtained is owned below.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0) };
    assert!(pidfd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
    let mut found = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("/proc fd").flatten() {
        let is_socket = std::fs::read_link(entry.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        let Some(target) = entry.file_name().to_str().and_then(|n| n.parse::<libc::c_long>().ok()) else { continue };
        if !is_socket {
            continue;
        }
        // SAFETY: as above; the duplicate is owned by `stream` and closed when it drops.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, target, 0) };
        if fd < 0 {
            continue;
        }
        let stream = unsafe { TcpStream::from_raw_fd(fd as i32) };
        if let (Ok(local), Ok(peer), Ok(nodelay)) = (stream.local_addr(), stream.peer_addr(), stream.nodelay()) {
            found.push((local, peer, nodelay));
        }
    }
    // SAFETY: closing the pidfd opened above.
    unsafe { libc::close(pidfd as i32) };
    found
}

/// Which of Weir's connections a kind is: accepted on a listener, or opened to a server's port.
enum Side {
    AcceptedOn(SocketAddr),
    OpenedTo(u16),
}

impl Side {
    fn owns(&self, (local, peer, _): &(SocketAddr, SocketAddr, bool)) -> bool {
        match self {
            Side::AcceptedOn(addr) => local == addr,
            Side::OpenedTo(port) => peer.port() == *port,
        }
    }
}

#[test]
fn every_socket_weir_accepts_or_opens_has_tcp_nodelay() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = install(dir.path(), "rls", &ca.leaf(&["localhost"], "localhost", 30));
    let rls: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let rls_tls: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let config = format!(
        r#"[server]
listen = ["$LISTEN"]
admin = "$LISTEN2"

[[server.tls]]
cert = "{cert}"
key = "{key}"

[store]
kind = "redis"
url = "{redis}"

[[upstream]]
name = "app"
servers = ["{up}"]

[[limit_req_zone]]
name = "z"
key = "ip"
rate = "100r/s"

[[limit_req_zone]]
name = "d"
rate = "100r/s"

[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
limit_req = [ {{ zone = "z", burst = 100, nodelay = true }} ]

[rls]
listen = ["{rls}"]
listen_tls = ["{rls_tls}"]

[[rls.domain]]
name = "d"

[[rls.domain.descriptor]]
key = "a"
zone = "d"
"#,
        cert = cert.display(),
        key = key.display(),
        redis = redis.url(),
        up = up.addr(),
    );
    let w = Weir::start(&config);
    let (proxy, admin) = (w.addrs[0], w.addrs[1]);
    // A proxied request: Weir decides on Redis and keeps its upstream connection in its pool.
    assert_eq!(http::get(proxy, "/").status, 200);
    // Client connections to every listener, held open (the RLS ones before any handshake or preface).
    let clients: Vec<TcpStream> =
        [proxy, admin, rls, rls_tls].iter().map(|a| TcpStream::connect(a).expect("connect")).collect();
    let pid = w.pid().expect("pid");
    let redis_port: u16 =
        redis.url().trim_end_matches('/').rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    let kinds = [
        ("proxy", Side::AcceptedOn(proxy)),
        ("admin", Side::AcceptedOn(admin)),
        ("rls", Side::AcceptedOn(rls)),
        ("rls_tls", Side::AcceptedOn(rls_tls)),
        ("redis", Side::OpenedTo(redis_port)),
        ("upstream", Side::OpenedTo(up.addr().port())),
    ];
    // Wait until Weir has accepted all of them (the RLS accept loop runs on its own task).
    let seen_all = || {
        let conns = connections(pid);
        kinds.iter().all(|(_, side)| conns.iter().any(|c| side.owns(c)))
    };
    let conns = connections(pid);
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(20), seen_all).is_some(),
        "every kind of socket is open in weir: {conns:?}"
    );
    let conns = connections(pid);
    for (kind, side) in &kinds {
        let of_kind: Vec<_> = conns.iter().filter(|c| side.owns(c)).collect();
        assert!(!of_kind.is_empty(), "{kind}: no socket");
        for c in of_kind {
            assert!(c.2, "{kind}: {} -> {} runs without TCP_NODELAY", c.0, c.1);
        }
    }
    drop(clients);
}
