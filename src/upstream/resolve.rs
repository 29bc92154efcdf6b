//! Host names in `servers` are resolved when the config is compiled and again every
//! `resolve_interval`, off the request path. A name that stops resolving keeps its last good
//! addresses; the failure is logged and counted.
//!
//! With `resolver = "IP:port"` (nginx's `resolver`) the names go to that one DNS server through
//! `hickory-resolver`: an A then an AAAA query over UDP (TCP only when a reply is truncated), no
//! EDNS, no retries, 1 s per query, no system config (`resolv.conf`, `/etc/hosts`, search
//! domains). Nothing is cached from one resolution to the next and records' TTLs are not used:
//! names are resolved again every `resolve_interval`.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError, NoRecords};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::{Name, RData, RecordType};
use hickory_resolver::Resolver;

use super::Pool;
use crate::metrics::METRICS;

/// How long a `resolver` gets to answer one query.
const RESOLVER_TIMEOUT: Duration = Duration::from_secs(1);

/// Resolves `target` (`host:port`) with the system resolver, or by asking the DNS server
/// `resolver`: its addresses, deduplicated in answer order. Blocks the calling thread (config
/// compilation); the lookups through `resolver` run on the DNS thread's runtime, so this may be
/// called from inside a Tokio runtime too (the admin API's reload).
pub fn resolve_now(target: &str, resolver: Option<SocketAddr>) -> io::Result<Vec<SocketAddr>> {
    use std::net::ToSocketAddrs;
    let found: Vec<SocketAddr> = match resolver {
        None => target.to_socket_addrs()?.collect(),
        Some(server) => {
            let (host, port) = split(target)?;
            let host = host.to_string();
            on_dns_thread(async move { lookup(&host, server).await })?
                .into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect()
        }
    };
    Ok(dedup(found))
}

/// [`resolve_now`] for a task on a runtime: the system resolver on a blocking thread, a
/// `resolver` asked from this task.
async fn resolve(target: String, resolver: Option<SocketAddr>) -> io::Result<Vec<SocketAddr>> {
    match resolver {
        None => tokio::task::spawn_blocking(move || resolve_now(&target, None)).await.map_err(io::Error::other)?,
        Some(server) => {
            let (host, port) = split(&target)?;
            let found = lookup(host, server).await?;
            Ok(dedup(found.into_iter().map(|ip| SocketAddr::new(ip, port)).collect()))
        }
    }
}

fn split(target: &str) -> io::Result<(&str, u16)> {
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, "expected host:port");
    let (host, port) = target.rsplit_once(':').ok_or_else(bad)?;
    Ok((host, port.parse().map_err(|_| bad())?))
}

fn dedup(found: Vec<SocketAddr>) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for addr in found {
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    out
}

/// Runs `lookup` on a small current-thread runtime of its own thread (started once), waiting for
/// the answer: callers of [`resolve_now`] may be on a runtime already, where `block_on` panics.
fn on_dns_thread<F>(lookup: F) -> io::Result<Vec<IpAddr>>
where
    F: std::future::Future<Output = io::Result<Vec<IpAddr>>> + Send + 'static,
{
    static DNS: OnceLock<Result<tokio::runtime::Handle, String>> = OnceLock::new();
    let handle = DNS
        .get_or_init(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
            let handle = rt.handle().clone();
            std::thread::Builder::new()
                .name("weir-dns".into())
                .spawn(move || rt.block_on(std::future::pending::<()>()))
                .map_err(|e| e.to_string())?;
            Ok(handle)
        })
        .as_ref()
        .map_err(|e| io::Error::other(format!("cannot start the DNS thread: {e}")))?;
    let (tx, rx) = mpsc::sync_channel(1);
    handle.spawn(async move {
        let _ = tx.send(lookup.await);
    });
    rx.recv().map_err(|_| io::Error::other("the DNS thread dropped the lookup"))?
}

/// The addresses of `host` (A, then AAAA records) asked of `server`; an empty list when the name
/// exists without addresses. NXDOMAIN for A is final (`NotFound`); otherwise one of the two
/// answering is enough (some servers refuse AAAA queries).
async fn lookup(host: &str, server: SocketAddr) -> io::Result<Vec<IpAddr>> {
    let mut name = Name::from_ascii(host)
        .ok()
        .filter(|n| !n.is_root())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{host:?} is not a DNS name")))?;
    // Exactly this name: no search domains.
    name.set_fqdn(true);

    let mut ns = NameServerConfig::udp_and_tcp(server.ip());
    for connection in &mut ns.connections {
        connection.port = server.port();
    }
    let mut opts = ResolverOpts::default();
    opts.timeout = RESOLVER_TIMEOUT;
    opts.attempts = 0; // no retries: the next round is resolve_interval away
    opts.edns0 = false; // plain 512-byte queries as before; a truncated reply is asked again over TCP
    opts.use_hosts_file = ResolveHosts::Never;
    opts.cache_size = 0;
    opts.positive_max_ttl = Some(Duration::ZERO);
    opts.negative_max_ttl = Some(Duration::ZERO);
    // A resolver per lookup: its connections live on the calling runtime and nothing it might
    // cache outlives this resolution.
    let resolver =
        Resolver::builder_with_config(ResolverConfig::from_name_servers(vec![ns]), TokioRuntimeProvider::default())
            .with_options(opts)
            .build()
            .map_err(io::Error::other)?;

    let query = |record_type: RecordType| {
        let (resolver, name) = (&resolver, name.clone());
        async move {
            let answer = tokio::time::timeout(RESOLVER_TIMEOUT, resolver.lookup(name, record_type))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "DNS query timed out"))?;
            match answer {
                Ok(found) => Ok(found
                    .answers()
                    .iter()
                    .filter_map(|record| match &record.data {
                        RData::A(a) if record_type == RecordType::A => Some(IpAddr::V4(a.0)),
                        RData::AAAA(aaaa) if record_type == RecordType::AAAA => Some(IpAddr::V6(aaaa.0)),
                        _ => None, // CNAME and others
                    })
                    .collect()),
                Err(NetError::Dns(DnsError::NoRecordsFound(NoRecords { response_code, .. }))) => match response_code {
                    ResponseCode::NXDomain => Err(io::Error::new(io::ErrorKind::NotFound, "no such name (NXDOMAIN)")),
                    ResponseCode::NoError => Ok(Vec::new()),
                    code => Err(io::Error::other(format!("DNS reply: {code}"))),
                },
                Err(e) => Err(io::Error::other(e)),
            }
        }
    };
    let v4 = query(RecordType::A).await;
    if matches!(&v4, Err(e) if e.kind() == io::ErrorKind::NotFound) {
        return v4;
    }
    match (v4, query(RecordType::AAAA).await) {
        (Ok(mut a), Ok(aaaa)) => {
            a.extend(aaaa);
            Ok(a)
        }
        (Ok(a), Err(_)) | (Err(_), Ok(a)) => Ok(a),
        (Err(e), Err(_)) => Err(e),
    }
}

/// Resolves every name of `pool` again and applies the answers that succeeded.
pub(super) async fn refresh(pool: Arc<Pool>) {
    let resolver = pool.spec().resolver;
    for target in pool.names() {
        match resolve(target.clone(), resolver).await {
            Ok(addrs) if !addrs.is_empty() => pool.set_resolved(&target, addrs),
            Ok(_) => failed(&pool, &target, "no addresses"),
            Err(e) => failed(&pool, &target, &e.to_string()),
        }
    }
}

fn failed(pool: &Pool, target: &str, error: &str) {
    tracing::warn!(upstream = %pool.name, server = target, error,
        "cannot resolve upstream server; keeping its last good addresses");
    METRICS.upstream_resolve_failures.with_label_values(&[&pool.name, target]).inc();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A DNS server on loopback that answers every query with NXDOMAIN, or never answers.
    fn server(answer: bool) -> SocketAddr {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                if answer && n >= 12 {
                    let mut r = buf[..n].to_vec();
                    r[2] |= 0x80;
                    r[3] = 0x83;
                    let _ = socket.send_to(&r, from);
                }
            }
        });
        addr
    }

    #[test]
    fn nxdomain_is_not_found_and_the_addresses_are_deduplicated() {
        let err = resolve_now("gone.weir.test:80", Some(server(true))).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        let (a, b) = (SocketAddr::from(([10, 0, 0, 1], 80)), SocketAddr::from(([10, 0, 0, 2], 80)));
        assert_eq!(dedup(vec![b, a, b, a]), vec![b, a], "answer order kept");
        assert_eq!(split("app:x").unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    /// The admin API's reload compiles the config on a runtime thread: no nested `block_on`.
    #[tokio::test]
    async fn a_silent_resolver_times_out_after_a_second_per_query_even_inside_a_runtime() {
        let started = Instant::now();
        let err = resolve_now("app.weir.test:80", Some(server(false))).unwrap_err();
        let took = started.elapsed();
        assert!(took >= RESOLVER_TIMEOUT && took < 3 * RESOLVER_TIMEOUT, "{took:?}: {err}");
    }
}
