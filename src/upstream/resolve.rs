//! Host names in `servers` are resolved when the config is compiled and again every
//! `resolve_interval`, off the request path. A name that stops resolving keeps its last good
//! addresses; the failure is logged and counted.

use std::net::SocketAddr;
use std::sync::Arc;

use super::Pool;
use crate::metrics::METRICS;

/// Resolves `target` (`host:port`): its addresses, deduplicated in resolver order.
pub fn resolve_now(target: &str) -> std::io::Result<Vec<SocketAddr>> {
    use std::net::ToSocketAddrs;
    let mut out: Vec<SocketAddr> = Vec::new();
    for addr in target.to_socket_addrs()? {
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    Ok(out)
}

/// Resolves every name of `pool` again and applies the answers that succeeded.
pub(super) async fn refresh(pool: Arc<Pool>) {
    for target in pool.names() {
        let lookup = target.clone();
        let answer = tokio::task::spawn_blocking(move || resolve_now(&lookup)).await;
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
