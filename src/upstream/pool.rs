//! The live state of one upstream: its servers (addresses with weights, as resolved last), the
//! Pingora load balancer that picks among them (weighted round robin, active health), and per
//! address the requests in flight (`max_conns`) and the passive failures (`max_fails` /
//! `fail_timeout`). A reload hands the pool a new spec; the per-address state stays.

use std::cell::{Cell, OnceCell};
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::lb::discovery::ServiceDiscovery;
use pingora::lb::selection::RoundRobin;
use pingora::lb::{Backend, Backends, LoadBalancer};
use pingora::upstreams::peer::HttpPeer;

use super::server_state::{lock, now_ms, ServerState, States};
use super::{health, tls, ServerSpec, UpstreamSpec};
use crate::metrics::METRICS;

/// A member's address for Pingora (its balancer and health checks): the socket path of a
/// `unix:` server, else the address.
fn backend_addr(server: &ServerSpec, addr: SocketAddr) -> pingora::protocols::l4::socket::SocketAddr {
    #[cfg(unix)]
    if let Some(path) = &server.unix {
        if let Ok(u) = std::os::unix::net::SocketAddr::from_pathname(path) {
            return pingora::protocols::l4::socket::SocketAddr::Unix(u);
        }
    }
    let _ = server;
    pingora::protocols::l4::socket::SocketAddr::Inet(addr)
}

/// The current membership, handed to Pingora's `Backends` as its service discovery.
#[derive(Default)]
struct Members(ArcSwap<BTreeSet<Backend>>);

#[async_trait]
impl ServiceDiscovery for Members {
    async fn discover(&self) -> pingora::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        Ok((BTreeSet::clone(&self.0.load()), HashMap::new()))
    }
}

/// A place on one server, given back when dropped (at the end of the attempt or the request,
/// however it ends).
pub struct ServerSlot {
    state: Arc<ServerState>,
    peer: Arc<HttpPeer>,
}

impl ServerSlot {
    pub fn addr(&self) -> SocketAddr {
        self.state.addr
    }

    /// The server's peer (TLS, protocol, timeouts), built with the membership: clone it.
    pub fn peer(&self) -> &HttpPeer {
        &self.peer
    }
}

impl std::fmt::Debug for ServerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServerSlot({})", self.state.addr)
    }
}

impl Drop for ServerSlot {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.state.in_flight_gauge.dec();
    }
}

/// Why no server could be picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// Every server that is up has `max_conns` requests in flight.
    Busy,
    /// No server is up (or every one was tried already by this request).
    Down,
}

pub type Pick = Result<ServerSlot, Unavailable>;

/// One address of the current membership.
struct Member {
    backend: Backend,
    /// Index into `spec.servers` of the entry it came from.
    entry: usize,
    state: Arc<ServerState>,
    /// What each request to it clones (see `tls::peer_template`).
    peer: Arc<HttpPeer>,
}

/// Everything that changes together on a reload or a DNS change.
struct Shape {
    spec: Arc<UpstreamSpec>,
    lb: Arc<LoadBalancer<RoundRobin>>,
    members: Vec<Member>,
    by_addr: HashMap<SocketAddr, usize>,
}

/// One upstream's state, found by name in the registry and shared by every config snapshot.
pub struct Pool {
    pub name: String,
    shape: ArcSwap<Shape>,
    discovery: Arc<Members>,
    /// Per address, kept while the address is a member.
    states: States,
    /// Per entry of `servers` (by target text): the last good addresses.
    resolved: Mutex<HashMap<String, Vec<SocketAddr>>>,
    /// Serialises changes of the shape (reload vs DNS).
    change: Mutex<()>,
}

/// A server as `GET /upstreams` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerStatus {
    pub server: String,
    pub address: String,
    pub weight: usize,
    /// Up for active checks (always true without `health_check`).
    pub healthy: bool,
    /// Kept out by passive health (`max_fails`) for this many more milliseconds.
    pub passive_down_ms: u64,
    pub in_flight: usize,
    pub max_conns: Option<usize>,
}

impl Pool {
    pub(super) fn new(spec: &Arc<UpstreamSpec>) -> Self {
        let discovery = Arc::new(Members::default());
        let states = States::default();
        let lb = new_lb(spec, &discovery, &states);
        let pool = Self {
            name: spec.name.clone(),
            shape: ArcSwap::from_pointee(Shape {
                spec: spec.clone(),
                lb,
                members: Vec::new(),
                by_addr: HashMap::new(),
            }),
            discovery,
            states,
            resolved: Mutex::new(HashMap::new()),
            change: Mutex::new(()),
        };
        pool.reshape(spec.clone(), false);
        pool
    }

    pub fn spec(&self) -> Arc<UpstreamSpec> {
        self.shape.load().spec.clone()
    }

    /// `f` of the current spec, without taking a count on it (the request path's reads).
    pub fn with_spec<T>(&self, f: impl FnOnce(&UpstreamSpec) -> T) -> T {
        f(&self.shape.load().spec)
    }

    pub(super) fn lb(&self) -> Arc<LoadBalancer<RoundRobin>> {
        self.shape.load().lb.clone()
    }

    /// Applies the spec of a newer config snapshot (the registry applies them in order).
    pub(super) fn configure(&self, spec: &Arc<UpstreamSpec>) {
        let current = self.spec();
        if *current == **spec {
            return;
        }
        // The check connects like requests do: new TLS settings or protocol, new check; over TLS
        // a server entry's host is also the name it is checked as.
        let new_check = current.health_check != spec.health_check
            || current.tls != spec.tls
            || current.protocol != spec.protocol
            || (spec.tls.is_some() && current.servers != spec.servers);
        // Fresh compile results replace older DNS answers.
        lock(&self.resolved).clear();
        self.reshape(spec.clone(), new_check);
    }

    /// Records the addresses a name resolves to now; rebuilds the membership when they changed.
    pub(super) fn set_resolved(&self, target: &str, addrs: Vec<SocketAddr>) {
        {
            let mut resolved = lock(&self.resolved);
            let spec = self.spec();
            let compiled = spec.servers.iter().find(|s| s.target == target).map(|s| &s.addrs);
            let previous = resolved.get(target).or(compiled);
            if previous == Some(&addrs) {
                return;
            }
            tracing::info!(upstream = %self.name, server = target, addresses = ?addrs, "upstream server resolves to new addresses");
            resolved.insert(target.to_string(), addrs);
        }
        self.reshape(self.spec(), false);
    }

    fn addrs_of(&self, server: &ServerSpec) -> Vec<SocketAddr> {
        lock(&self.resolved).get(&server.target).cloned().unwrap_or_else(|| server.addrs.clone())
    }

    /// Rebuilds the membership from `spec` and the latest DNS answers. The load balancer is kept
    /// (and with it active health and the round-robin position) unless the health check changed.
    fn reshape(&self, spec: Arc<UpstreamSpec>, new_check: bool) {
        let _serial = lock(&self.change);
        let old = self.shape.load_full();
        let lb = if new_check { new_lb(&spec, &self.discovery, &self.states) } else { old.lb.clone() };
        let mut states = lock(&self.states);
        let mut members = Vec::new();
        let mut by_addr = HashMap::new();
        for (entry, server) in spec.servers.iter().enumerate() {
            for addr in self.addrs_of(server) {
                if by_addr.contains_key(&addr) {
                    continue;
                }
                let state = states.entry(addr).or_insert_with(|| Arc::new(ServerState::new(&self.name, addr))).clone();
                let peer = Arc::new(tls::peer_template(&spec, server, addr));
                let mut ext = pingora::lb::Extensions::new();
                // An HTTPS health check verifies the server as its requests do.
                ext.insert(health::CheckSni(peer.sni.clone()));
                let backend = Backend { addr: backend_addr(server, addr), weight: server.weight, ext };
                by_addr.insert(addr, members.len());
                members.push(Member { backend, entry, state, peer });
            }
        }
        // Addresses that left: forget their state once nothing is in flight there.
        states.retain(|addr, state| {
            let keep = by_addr.contains_key(addr) || state.in_flight() > 0;
            if !keep {
                METRICS.forget_upstream_server(&self.name, &addr.to_string());
            }
            keep
        });
        drop(states);
        self.discovery.0.store(Arc::new(members.iter().map(|m| m.backend.clone()).collect()));
        // Static membership: the update completes without waiting.
        poll_once(lb.update());
        self.shape.store(Arc::new(Shape { spec, lb, members, by_addr }));
    }

    /// Picks a server for a request: weighted round robin among servers that are up (active and
    /// passive health), have room (`max_conns`) and were not tried by this request yet.
    pub fn pick(&self, tried: &[SocketAddr]) -> Pick {
        self.pick_with_clock(tried, now_ms)
    }

    /// [`Pool::pick`] at `now` ([`now_ms`]'s clock): the tests drive passive health's time.
    #[cfg(test)]
    fn pick_at(&self, tried: &[SocketAddr], now: u64) -> Pick {
        self.pick_with_clock(tried, || now)
    }

    fn pick_with_clock(&self, tried: &[SocketAddr], clock: impl Fn() -> u64) -> Pick {
        let shape = self.shape.load();
        // Read only with several servers: the clock is the costly part of a single server's pick.
        let now = OnceCell::new();
        // nginx: with a single server, max_fails / fail_timeout are ignored.
        let single = shape.members.len() == 1;
        let busy = Cell::new(false);
        let taken: Cell<Option<usize>> = Cell::new(None);
        let accept_member = |i: usize, healthy: bool| {
            let member = &shape.members[i];
            if !healthy || tried.contains(&member.state.addr) {
                return false;
            }
            if !single && member.state.passive_down(*now.get_or_init(&clock)) {
                return false;
            }
            if !member.state.take(shape.spec.servers[member.entry].max_conns) {
                busy.set(true);
                return false;
            }
            taken.set(Some(i));
            true
        };
        let accept = |backend: &Backend, healthy: bool| {
            super::member_key(&backend.addr)
                .and_then(|a| shape.by_addr.get(&a))
                .is_some_and(|&i| accept_member(i, healthy))
        };
        if single {
            // The sidecar's usual upstream: no round to rob (the balancer's selection allocates
            // and hashes; ~2,000 instructions a request), and without an active check nothing to
            // look up (the readiness map hashes the backend: ~650 instructions).
            let only = &shape.members[0];
            let healthy = shape.spec.health_check.is_none() || shape.lb.backends().ready(&only.backend);
            accept_member(0, healthy);
        } else {
            // Round robin may revisit servers under concurrency: bound it, then scan in order.
            let n = shape.members.len();
            if shape.lb.select_with(b"", 2 * n + 4, accept).is_none() {
                let backends = shape.lb.backends();
                let _ = shape.members.iter().find(|m| accept(&m.backend, backends.ready(&m.backend)));
            }
        }
        if let Some(i) = taken.get() {
            let member = &shape.members[i];
            return Ok(ServerSlot { state: member.state.clone(), peer: member.peer.clone() });
        }
        // Like nginx ("no live upstreams"): servers out for max_fails stay out for fail_timeout,
        // even when that leaves none.
        if busy.get() {
            return Err(Unavailable::Busy);
        }
        Err(Unavailable::Down)
    }

    /// A request to `addr` failed in a way `proxy_next_upstream` counts (nginx `max_fails`).
    pub fn record_failure(&self, addr: SocketAddr) {
        self.record_failure_at(addr, now_ms())
    }

    /// [`Pool::record_failure`] at `now` ([`now_ms`]'s clock).
    fn record_failure_at(&self, addr: SocketAddr, now: u64) {
        let shape = self.shape.load();
        let Some(&i) = shape.by_addr.get(&addr) else { return };
        let member = &shape.members[i];
        let server = &shape.spec.servers[member.entry];
        METRICS.upstream_passive_failures.with_label_values(&[&self.name, &addr.to_string()]).inc();
        if server.max_fails == 0 || shape.members.len() == 1 {
            return;
        }
        let window = server.fail_timeout.as_millis() as u64;
        let mut fails = member.state.lock_fails();
        if now.saturating_sub(fails.1) > window {
            *fails = (0, now);
        }
        fails.0 += 1;
        if fails.0 >= server.max_fails {
            *fails = (0, now);
            member.state.down_until.store(now + window, Ordering::Release);
            METRICS.upstream_server_up.with_label_values(&[&self.name, &addr.to_string()]).set(0);
            tracing::warn!(upstream = %self.name, server = %addr, fail_timeout = ?server.fail_timeout,
                "upstream server failed max_fails times: skipped for fail_timeout");
        }
    }

    /// Each current server with its health and load.
    pub fn status(&self) -> Vec<ServerStatus> {
        let shape = self.shape.load();
        let now = now_ms();
        let backends = shape.lb.backends();
        shape
            .members
            .iter()
            .map(|m| {
                let server = &shape.spec.servers[m.entry];
                ServerStatus {
                    server: server.target.clone(),
                    address: super::show_addr(m.state.addr),
                    weight: server.weight,
                    healthy: backends.ready(&m.backend),
                    passive_down_ms: m.state.down_until.load(Ordering::Acquire).saturating_sub(now),
                    in_flight: m.state.in_flight(),
                    max_conns: server.max_conns,
                }
            })
            .collect()
    }

    /// Publishes each server's health to the `weir_upstream_server_up` gauge.
    pub(super) fn export_health(&self) {
        for s in self.status() {
            let up = s.healthy && s.passive_down_ms == 0;
            METRICS.upstream_server_up.with_label_values(&[&self.name, &s.address]).set(i64::from(up));
        }
    }

    /// Targets whose host is a name, to resolve again.
    pub(super) fn names(&self) -> Vec<String> {
        self.spec().servers.iter().filter(|s| s.is_name).map(|s| s.target.clone()).collect()
    }

    /// Runs one pass of the active health check, if the upstream has one.
    pub(super) async fn check_health(&self) {
        let lb = self.lb();
        lb.backends().run_health_check(true).await;
    }
}

fn new_lb(spec: &UpstreamSpec, discovery: &Arc<Members>, states: &States) -> Arc<LoadBalancer<RoundRobin>> {
    let mut lb = LoadBalancer::from_backends(Backends::new(Box::new(SharedMembers(discovery.clone()))));
    if let Some(check) = &spec.health_check {
        lb.set_health_check(health::build(spec, check, states.clone()));
    }
    Arc::new(lb)
}

/// `Box<dyn ServiceDiscovery>` over the pool's shared membership.
struct SharedMembers(Arc<Members>);

#[async_trait]
impl ServiceDiscovery for SharedMembers {
    async fn discover(&self) -> pingora::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        self.0.discover().await
    }
}

/// Polls a future that never waits (static discovery) to completion, once.
fn poll_once<F: std::future::Future>(future: F) {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    if future.as_mut().poll(&mut cx).is_pending() {
        tracing::error!("upstream membership update did not complete at once");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::{CheckKind, HealthCheckSpec, RetryPolicy, Timeouts};
    use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering as AtomicOrdering};
    use std::time::Duration;

    fn spec(servers: &[(&str, usize)], max_conns: Option<usize>) -> Arc<UpstreamSpec> {
        Arc::new(UpstreamSpec {
            name: "app".into(),
            servers: servers
                .iter()
                .map(|(a, w)| ServerSpec {
                    target: a.to_string(),
                    is_name: false,
                    weight: *w,
                    max_fails: 1,
                    fail_timeout: Duration::from_secs(10),
                    max_conns,
                    addrs: vec![a.parse().unwrap()],
                    unix: None,
                })
                .collect(),
            timeouts: Timeouts {
                connect: Duration::from_secs(1),
                read: Duration::from_secs(1),
                send: Duration::from_secs(1),
                idle: Duration::from_secs(1),
            },
            keepalive: true,
            health_check: None,
            retry: RetryPolicy {
                tries: None,
                timeout: None,
                on_error: true,
                on_timeout: true,
                on_status: vec![],
                non_idempotent: false,
            },
            resolve_interval: Duration::from_secs(30),
            resolver: None,
            tls: None,
            protocol: Default::default(),
            adaptive: None,
        })
    }

    fn addr(p: Pick) -> Option<SocketAddr> {
        p.ok().map(|s| s.addr())
    }

    const A: &str = "127.0.0.1:1";
    const B: &str = "127.0.0.1:2";

    #[test]
    fn weighted_round_robin() {
        let pool = Pool::new(&spec(&[(A, 3), (B, 1)], None));
        let mut counts = HashMap::new();
        for _ in 0..400 {
            *counts.entry(addr(pool.pick(&[])).unwrap()).or_insert(0) += 1;
        }
        assert_eq!(counts[&A.parse().unwrap()], 300, "{counts:?}");
        assert_eq!(counts[&B.parse().unwrap()], 100, "{counts:?}");
    }

    #[test]
    fn max_conns_skips_full_servers_and_frees_slots_on_drop() {
        let pool = Pool::new(&spec(&[(A, 1), (B, 1)], Some(1)));
        let first = pool.pick(&[]).unwrap();
        let second = pool.pick(&[]).unwrap();
        assert_ne!(first.addr(), second.addr());
        assert_eq!(pool.pick(&[]).unwrap_err(), Unavailable::Busy);
        drop(first);
        assert!(pool.pick(&[]).is_ok());
    }

    #[test]
    fn in_flight_survives_a_new_spec() {
        let pool = Pool::new(&spec(&[(A, 1)], Some(2)));
        let _held = [pool.pick(&[]).unwrap(), pool.pick(&[]).unwrap()];
        // A reload with other settings, same server: the places taken still count.
        pool.configure(&spec(&[(A, 2)], Some(2)));
        assert_eq!(pool.pick(&[]).unwrap_err(), Unavailable::Busy);
    }

    #[test]
    fn passive_failures_skip_a_server_until_fail_timeout() {
        let pool = Pool::new(&spec(&[(A, 1), (B, 1)], None));
        let a: SocketAddr = A.parse().unwrap();
        let b: SocketAddr = B.parse().unwrap();
        pool.record_failure(a);
        for _ in 0..10 {
            assert_eq!(addr(pool.pick(&[])), Some(b));
        }
        assert_eq!(addr(pool.pick(&[b])), None, "a is out, b already tried");
        pool.record_failure(b);
        assert_eq!(pool.pick(&[]).unwrap_err(), Unavailable::Down, "nginx: no live upstreams");

        // A single server is never taken out by passive health (nginx).
        let single = Pool::new(&spec(&[(A, 1)], None));
        single.record_failure(a);
        assert_eq!(addr(single.pick(&[])), Some(a));
    }

    /// `spec` with every server's `max_fails` and `fail_timeout` set.
    fn with_passive(spec: Arc<UpstreamSpec>, max_fails: u32, fail_timeout: Duration) -> Arc<UpstreamSpec> {
        let mut spec = (*spec).clone();
        for server in &mut spec.servers {
            server.max_fails = max_fails;
            server.fail_timeout = fail_timeout;
        }
        Arc::new(spec)
    }

    /// The servers `picks` picks at `now` (each pick's place given back at once).
    fn picked_at(pool: &Pool, now: u64, picks: usize) -> BTreeSet<SocketAddr> {
        (0..picks).filter_map(|_| addr(pool.pick_at(&[], now))).collect()
    }

    #[test]
    fn passive_health_counts_max_fails_within_fail_timeout_and_lets_the_server_back_exactly_after_it() {
        // On a manual clock (ms): nginx's max_fails = 2 within fail_timeout = 10 s.
        let pool = Pool::new(&with_passive(spec(&[(A, 1), (B, 1)], None), 2, Duration::from_secs(10)));
        let a: SocketAddr = A.parse().unwrap();
        let b: SocketAddr = B.parse().unwrap();
        let both = BTreeSet::from([a, b]);
        let t0 = 5_000_000;
        pool.record_failure_at(a, t0);
        assert_eq!(picked_at(&pool, t0, 4), both, "one failure of two: a is still in");
        // The second failure comes after the window of the first: they do not add up.
        pool.record_failure_at(a, t0 + 10_001);
        assert_eq!(picked_at(&pool, t0 + 10_001, 4), both, "failures further apart than fail_timeout");
        // Two within the window: out for fail_timeout from the second, to the millisecond.
        let second = t0 + 10_002;
        pool.record_failure_at(a, second);
        assert_eq!(picked_at(&pool, second, 4), BTreeSet::from([b]), "max_fails reached: a is out");
        assert_eq!(picked_at(&pool, second + 9_999, 4), BTreeSet::from([b]), "still out 1 ms before fail_timeout");
        assert_eq!(picked_at(&pool, second + 10_000, 4), both, "back once fail_timeout has passed");
        // And its count starts again: one more failure does not take it out.
        pool.record_failure_at(a, second + 10_000);
        assert_eq!(picked_at(&pool, second + 10_001, 4), both);
    }

    #[test]
    fn max_fails_zero_never_takes_a_server_out() {
        let pool = Pool::new(&with_passive(spec(&[(A, 1), (B, 1)], None), 0, Duration::from_secs(10)));
        let a: SocketAddr = A.parse().unwrap();
        for i in 0..100 {
            pool.record_failure_at(a, 1_000 + i);
        }
        assert!(picked_at(&pool, 1_100, 4).contains(&a));
    }

    /// An HTTP server for health checks answering each request with the status in `status`
    /// (connection closed after each), counting what it answered.
    async fn check_target(status: Arc<AtomicU16>, answered: Arc<AtomicUsize>) -> SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (status, answered) = (status.clone(), answered.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let code = status.load(AtomicOrdering::SeqCst);
                    // Counted before the answer, so the check that reads it has been counted.
                    answered.fetch_add(1, AtomicOrdering::SeqCst);
                    let reply = format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                    let _ = conn.write_all(reply.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        addr
    }

    fn checked(servers: &[(&str, usize)], rise: usize, fall: usize) -> Arc<UpstreamSpec> {
        let mut spec = (*with_passive(spec(servers, None), 1, Duration::from_secs(3600))).clone();
        spec.health_check = Some(HealthCheckSpec {
            kind: CheckKind::Http { path: "/health".into(), host: "localhost".into(), statuses: vec![(200, 299)] },
            interval: Duration::from_secs(3600),
            timeout: Duration::from_secs(5),
            rise,
            fall,
            port: None,
        });
        Arc::new(spec)
    }

    fn healthy(pool: &Pool, server: SocketAddr) -> bool {
        let status = pool.status();
        let s = status.iter().find(|s| s.address == server.to_string()).expect("a member");
        s.healthy
    }

    /// Active checks count passes and failures, not time: each pass of `check_health` is one
    /// check (the interval between passes is the registry's), so no clock is needed at all.
    #[tokio::test]
    async fn active_checks_take_a_server_out_after_fall_failures_and_back_after_rise_passes() {
        let status = Arc::new(AtomicU16::new(200));
        let answered = Arc::new(AtomicUsize::new(0));
        let target = check_target(status.clone(), answered.clone()).await;
        let pool = Pool::new(&checked(&[(&target.to_string(), 1)], 2, 3));
        let check = |n: usize| {
            let pool = &pool;
            async move {
                for _ in 0..n {
                    pool.check_health().await;
                }
            }
        };
        check(1).await;
        assert_eq!(answered.load(AtomicOrdering::SeqCst), 1, "one check per pass");
        assert!(healthy(&pool, target));

        status.store(503, AtomicOrdering::SeqCst);
        check(2).await;
        assert!(healthy(&pool, target), "2 failures of fall = 3: still up");
        assert!(pool.pick(&[]).is_ok());
        check(1).await;
        assert!(!healthy(&pool, target), "the 3rd consecutive failure takes it out");
        assert_eq!(pool.pick(&[]).unwrap_err(), Unavailable::Down, "an unhealthy only server is not picked");

        // Passes must be consecutive: pass, fail, pass is not rise = 2.
        status.store(200, AtomicOrdering::SeqCst);
        check(1).await;
        status.store(500, AtomicOrdering::SeqCst);
        check(1).await;
        status.store(200, AtomicOrdering::SeqCst);
        check(1).await;
        assert!(!healthy(&pool, target), "interrupted passes do not count");
        check(1).await;
        assert!(healthy(&pool, target), "2 consecutive passes of rise = 2 bring it back");
        assert!(pool.pick(&[]).is_ok());
        assert_eq!(answered.load(AtomicOrdering::SeqCst), 8, "every pass checked the server once");
    }

    /// A server passive health took out (for an hour) is back as soon as the active check sees
    /// it come back: positive evidence beats the failures counted before.
    #[tokio::test]
    async fn an_active_check_bringing_a_server_back_forgets_its_passive_failures() {
        let status = Arc::new(AtomicU16::new(200));
        let answered = Arc::new(AtomicUsize::new(0));
        let target = check_target(status.clone(), answered.clone()).await;
        let other: SocketAddr = B.parse().unwrap();
        let pool = Pool::new(&checked(&[(&target.to_string(), 1), (B, 1)], 1, 1));
        pool.record_failure(target);
        assert_eq!(picked_at(&pool, now_ms(), 4), BTreeSet::from([other]), "max_fails = 1: out for an hour");

        status.store(500, AtomicOrdering::SeqCst);
        pool.check_health().await;
        assert!(!healthy(&pool, target));
        status.store(200, AtomicOrdering::SeqCst);
        pool.check_health().await;
        assert!(healthy(&pool, target));
        // B (nothing listens there) failed its checks meanwhile: only the target can be picked.
        assert!(!healthy(&pool, other));
        assert_eq!(picked_at(&pool, now_ms(), 4), BTreeSet::from([target]), "back without waiting an hour");
    }

    #[test]
    fn tried_servers_are_skipped() {
        let pool = Pool::new(&spec(&[(A, 1), (B, 1)], None));
        let a: SocketAddr = A.parse().unwrap();
        let b: SocketAddr = B.parse().unwrap();
        for _ in 0..5 {
            assert_eq!(addr(pool.pick(&[a])), Some(b));
        }
        assert_eq!(pool.pick(&[a, b]).unwrap_err(), Unavailable::Down);
    }
}
