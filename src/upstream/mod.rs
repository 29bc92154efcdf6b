//! Upstreams: what `[[upstream]]` compiles to ([`UpstreamSpec`], immutable, part of the config
//! snapshot) and the state that must outlive a reload ([`Pool`]: round-robin position, requests in
//! flight, active and passive health, last good DNS answers), kept by name in a [`Registry`] the process owns.
//!
//! - `pool`: server selection (Pingora's weighted round robin), `max_conns`, passive failures.
//! - `health`: active TCP / HTTP checks (Pingora's `TcpHealthCheck` / `HttpHealthCheck`).
//! - `resolve`: re-resolution of host names every `resolve_interval`.
//! - `registry`: the pools and adaptive limits by upstream name, and the task that runs checks and DNS.
//! - `tls`: HTTPS (CA, SNI, client certificates) and HTTP/2 to the servers: the peer templates.

mod health;
mod pool;
mod registry;
mod resolve;
mod server_state;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use pool::{Pick, Pool, ServerSlot, ServerStatus, Unavailable};
pub use registry::{Kept, Registry};
pub use resolve::resolve_now;
pub use tls::{Protocol, UpstreamTls};

/// One `[[upstream]]` as compiled: pure data, compared on reload to decide what to rebuild.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamSpec {
    pub name: String,
    pub servers: Vec<ServerSpec>,
    pub timeouts: Timeouts,
    /// Idle connections kept for reuse: `false` when `keepalive = 0`.
    pub keepalive: bool,
    pub health_check: Option<HealthCheckSpec>,
    pub retry: RetryPolicy,
    /// How often host names in `servers` are resolved again.
    pub resolve_interval: Duration,
    /// The DNS server to ask (nginx `resolver`); the system resolver when `None`.
    pub resolver: Option<SocketAddr>,
    /// `tls = true`: HTTPS to every server, with these settings.
    pub tls: Option<UpstreamTls>,
    pub protocol: Protocol,
    /// `adaptive`: a concurrency limit learned from latency (src/adaptive/).
    pub adaptive: Option<crate::adaptive::AdaptiveSpec>,
}

/// One entry of `servers`: `"host:port weight=3 max_fails=2 fail_timeout=5s max_conns=10"`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSpec {
    /// `host:port` as written.
    pub target: String,
    /// True when the host is a name (re-resolved), false for an IP literal.
    pub is_name: bool,
    pub weight: usize,
    /// Failures within `fail_timeout` that make the server unavailable for `fail_timeout`
    /// (nginx); 0 turns passive health off for this server.
    pub max_fails: u32,
    pub fail_timeout: Duration,
    /// Requests in flight to this server from this instance.
    pub max_conns: Option<usize>,
    /// Addresses the name resolved to when the config was compiled (a unix socket server:
    /// its [`unix_identity`]).
    pub addrs: Vec<SocketAddr>,
    /// `unix:/path/to.sock`: the socket's absolute path (Pingora connects with `new_uds`).
    pub unix: Option<String>,
}

/// The per-address state (in flight, passive failures, the membership) is keyed by an IP
/// address; a unix socket server gets a stable stand-in one from its path, in the IPv6 discard
/// prefix `100::/64` (RFC 6666: never routed), so the same path keeps its state across reloads.
pub fn unix_identity(path: &str) -> SocketAddr {
    // FNV-1a: stable across processes and builds, unlike a randomly keyed hasher.
    let hash = path.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let ip = std::net::Ipv6Addr::from((0x0100u128 << 112) | u128::from(hash));
    let addr = SocketAddr::new(ip.into(), 0);
    lock_unix_names().insert(addr, path.to_string());
    addr
}

fn lock_unix_names() -> std::sync::MutexGuard<'static, std::collections::HashMap<SocketAddr, String>> {
    static NAMES: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<SocketAddr, String>>> =
        std::sync::LazyLock::new(Default::default);
    NAMES.lock().unwrap_or_else(|p| p.into_inner())
}

/// An address as logs, metrics and `GET /upstreams` show it: `unix:/path` for a socket.
pub fn show_addr(addr: SocketAddr) -> String {
    match lock_unix_names().get(&addr) {
        Some(path) => format!("unix:{path}"),
        None => addr.to_string(),
    }
}

/// The key of a Pingora backend's address in the pool's per-address state.
pub(crate) fn member_key(addr: &pingora::protocols::l4::socket::SocketAddr) -> Option<SocketAddr> {
    match addr {
        pingora::protocols::l4::socket::SocketAddr::Inet(a) => Some(*a),
        #[cfg(unix)]
        pingora::protocols::l4::socket::SocketAddr::Unix(u) => {
            u.as_pathname().and_then(|p| p.to_str()).map(unix_identity)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub read: Duration,
    pub send: Duration,
    pub idle: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckKind {
    Tcp,
    Http {
        path: String,
        host: String,
        /// Inclusive ranges of statuses that count as healthy.
        statuses: Vec<(u16, u16)>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheckSpec {
    pub kind: CheckKind,
    pub interval: Duration,
    pub timeout: Duration,
    /// Consecutive passes that make a down server up again.
    pub rise: usize,
    /// Consecutive failures that make an up server down.
    pub fall: usize,
    /// Check this port instead of the server's.
    pub port: Option<u16>,
}

/// `proxy_next_upstream` and friends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// At most this many servers per request, the first included; `None`: each server once.
    pub tries: Option<u32>,
    /// No new try once this long has passed since the first; `None`: no limit.
    pub timeout: Option<Duration>,
    pub on_error: bool,
    pub on_timeout: bool,
    /// Response statuses that make Weir try the next server (`http_502`, …).
    pub on_status: Vec<u16>,
    /// Retry POST, PATCH, … too once the request was sent (nginx `non_idempotent`).
    pub non_idempotent: bool,
}

impl RetryPolicy {
    pub fn off(&self) -> bool {
        !self.on_error && !self.on_timeout && self.on_status.is_empty()
    }
}

/// Largest `tries`: Pingora makes at most 16 attempts per request.
pub const MAX_TRIES: u32 = 16;

/// A compiled upstream in the config snapshot: settings only. What outlives a reload (its
/// [`Pool`], its adaptive limit) is kept by name in the process's [`Registry`].
pub struct Upstream {
    pub spec: Arc<UpstreamSpec>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.spec.fmt(f)
    }
}

impl std::ops::Deref for Upstream {
    type Target = UpstreamSpec;

    fn deref(&self) -> &UpstreamSpec {
        &self.spec
    }
}

impl Upstream {
    pub fn new(spec: UpstreamSpec) -> Self {
        Self { spec: Arc::new(spec) }
    }
}
