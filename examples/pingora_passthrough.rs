//! The smallest Pingora 0.9.1 reverse proxy: the benchmark's "plain Pingora" row (bench/README.md),
//! which separates Pingora's own per-request cost from Weir's.
//!
//! ```text
//! cargo build --release --example pingora_passthrough
//! target/release/examples/pingora_passthrough LISTEN UPSTREAM [THREADS [forwarded]]
//! target/release/examples/pingora_passthrough 127.0.0.1:8080 127.0.0.1:9000 1
//! ```
//!
//! `ProxyHttp` with only `upstream_peer`, the timeouts and no downstream modules (as Weir: Pingora's
//! default adds a disabled response compression): every request goes to the one upstream, over a
//! kept-alive connection from Pingora's pool, with Weir's default timeouts (nginx's too:
//! connect 5 s, upstream read and send 60 s, pool idle 60 s, client body and send 60 s; Pingora
//! arms a timer for each, ~2,500 instructions a request). No other filter, no logging, no config
//! file; the same `pingora` crate and features as Weir (Cargo.toml), `threads` worker threads
//! (default 1), Pingora's default runtime settings otherwise (the grace period on SIGTERM aside:
//! 1 s, as Weir's), and Weir's allocator (mimalloc, unless both are built with
//! `--no-default-features`), so that the row compares like with like.
//!
//! `forwarded` (the bench's row 2b): also tells the upstream the client, as Weir does by default
//! and as any proxy in front of an application must: `X-Forwarded-For` set to the TCP peer and
//! `X-Real-IP` to the same address, written with Pingora's `insert_header` on the request it
//! forwards. Row 2 − row 2b is then Weir's own cost for the same bytes on the wire.

use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use pingora::http::RequestHeader;
use pingora::prelude::{HttpPeer, ProxyHttp, Result, Session};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Weir's default for the upstream's read/send/idle and the client's body/send timeouts.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

struct Passthrough {
    upstream: SocketAddr,
    forwarded: bool,
}

#[async_trait]
impl ProxyHttp for Passthrough {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    /// As Weir: no downstream modules (Pingora's default adds a disabled response compression).
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut Self::CTX) -> Result<bool> {
        session.set_read_timeout(Some(IO_TIMEOUT));
        session.set_write_timeout(Some(IO_TIMEOUT));
        Ok(false)
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut Self::CTX) -> Result<Box<HttpPeer>> {
        let mut peer = HttpPeer::new(self.upstream, false, String::new());
        peer.options.connection_timeout = Some(Duration::from_secs(5));
        peer.options.read_timeout = Some(IO_TIMEOUT);
        peer.options.write_timeout = Some(IO_TIMEOUT);
        peer.options.idle_timeout = Some(IO_TIMEOUT);
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        _ctx: &mut Self::CTX,
    ) -> Result<()> {
        if self.forwarded {
            if let Some(peer) = session.client_addr().and_then(|a| a.as_inet()).map(|a| ip_text(a.ip())) {
                upstream_request.insert_header("x-forwarded-for", peer.as_str())?;
                upstream_request.insert_header("x-real-ip", peer)?;
            }
        }
        Ok(())
    }
}

/// An address's text without `Display`'s formatter (~1,300 instructions for an IPv4 address), so
/// that the row is a lower bound of the forwarding's cost.
fn ip_text(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let mut out = String::with_capacity(15);
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                out.push_str(itoa::Buffer::new().format(octet));
            }
            out
        }
        v6 => v6.to_string(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let forwarded = match args.get(4).map(String::as_str) {
        None => false,
        Some("forwarded") => true,
        Some(other) => {
            eprintln!("the fourth argument may only be `forwarded`, got {other:?}");
            std::process::exit(2)
        }
    };
    if args.len() < 3 || args.len() > 5 {
        eprintln!("usage: {} LISTEN UPSTREAM [THREADS [forwarded]]   (e.g. 127.0.0.1:8080 127.0.0.1:9000 1)", args[0]);
        std::process::exit(2);
    }
    let upstream: SocketAddr = args[2].parse().unwrap_or_else(|e| {
        eprintln!("UPSTREAM {}: {e}", args[2]);
        std::process::exit(2)
    });
    let threads: usize = args.get(3).map_or(Ok(1), |t| t.parse()).unwrap_or_else(|e| {
        eprintln!("THREADS: {e}");
        std::process::exit(2)
    });
    // Pingora's pid file and upgrade socket default to fixed names in /tmp: one per process. Like
    // Weir, a 1 s grace period on SIGTERM (Pingora's default is 5 s).
    let tmp = std::env::temp_dir();
    let pid = std::process::id();
    let conf = ServerConf {
        threads,
        grace_period_seconds: Some(1),
        graceful_shutdown_timeout_seconds: Some(1),
        pid_file: tmp.join(format!("pingora-passthrough-{pid}.pid")).display().to_string(),
        upgrade_sock: tmp.join(format!("pingora-passthrough-{pid}-upgrade.sock")).display().to_string(),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut proxy = pingora::proxy::http_proxy_service(&server.configuration, Passthrough { upstream, forwarded });
    proxy.add_tcp(&args[1]);
    server.add_service(proxy);
    server.run_forever()
}
