//! Host names in `servers` are resolved when the config is compiled and again every
//! `resolve_interval`, off the request path. A name that stops resolving keeps its last good
//! addresses; the failure is logged and counted.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::Pool;
use crate::metrics::METRICS;

/// How long a `resolver` gets to answer one query.
const RESOLVER_TIMEOUT: Duration = Duration::from_secs(1);

/// Resolves `target` (`host:port`) with the system resolver, or by asking the DNS server
/// `resolver`: its addresses, deduplicated in answer order.
pub fn resolve_now(target: &str, resolver: Option<SocketAddr>) -> std::io::Result<Vec<SocketAddr>> {
    use std::net::ToSocketAddrs;
    let found: Vec<SocketAddr> = match resolver {
        None => target.to_socket_addrs()?.collect(),
        Some(server) => {
            let bad = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "expected host:port");
            let (host, port) = target.rsplit_once(':').ok_or_else(bad)?;
            let port: u16 = port.parse().map_err(|_| bad())?;
            super::dns::lookup(host, server, RESOLVER_TIMEOUT)?
                .into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect()
        }
    };
    let mut out: Vec<SocketAddr> = Vec::new();
    for addr in found {
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    Ok(out)
}

/// Resolves every name of `pool` again and applies the answers that succeeded.
pub(super) async fn refresh(pool: Arc<Pool>) {
    let resolver = pool.spec().resolver;
    for target in pool.names() {
        let lookup = target.clone();
        let answer = tokio::task::spawn_blocking(move || resolve_now(&lookup, resolver)).await;
        match answer {
            Ok(Ok(addrs)) if !addrs.is_empty() => pool.set_resolved(&target, addrs),
            Ok(Ok(_)) => failed(&pool, &target, "no addresses"),
            Ok(Err(e)) => failed(&pool, &target, &e.to_string()),
            Err(e) => failed(&pool, &target, &e.to_string()),
        }
    }
}

fn failed(pool: &Pool, target: &str, error: &str) {
    tracing::warn!(upstream = %pool.name, server = target, error,
        "cannot resolve upstream server; keeping its last good addresses");
    METRICS.upstream_resolve_failures.with_label_values(&[&pool.name, target]).inc();
}
