//! Assembles the Pingora server from the config read at start: the proxy service on the `listen`
//! and `listen_tls` addresses (through the edge: connection caps, TLS handshakes), the rate
//! limit service (`[rls]`) and the admin listener when configured, all sharing the stores and
//! upstream pools built once (`lasting`) and the file descriptors split between them (`Budget`).
//! Reloads (SIGHUP, file changes) are armed here; at exit the leases still held are given back.

use std::sync::Arc;

use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;

use crate::edge::budget::Budget;
use crate::edge::{Capped, EdgeApp, TlsListeners};
use crate::process::admin::AdminApp;
use crate::process::lasting::Lasting;
use crate::process::reload::Reloader;
use crate::proxy::WeirProxy;
use crate::tls;

/// Seconds between SIGTERM and exit: listeners close at once, in-flight requests get this long.
const GRACE_SECONDS: u64 = 1;
/// The longest the exit waits for the store to take back the leases still held then.
const LEASE_RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs the proxy until a signal stops the process. Never returns on success.
pub fn run(reloader: Arc<Reloader>) -> Result<(), String> {
    let runtime = reloader.runtime().load_full();
    // The stores (and the Redis connection), upstream pools and certificates are made once and
    // outlive every reload.
    let lasting = Lasting::build(&reloader)?;
    lasting.start(&reloader.runtime())?;
    let listen = runtime.server.listen.clone();
    let listen_tls = runtime.server.listen_tls.clone();
    for warning in &runtime.warnings {
        tracing::warn!("{warning}");
    }
    reloader.reload_on_sighup()?;
    reloader.watch()?;

    // Pingora's pid file and upgrade socket default to fixed names in /tmp: give each process its own.
    let tmp = std::env::temp_dir();
    let pid = std::process::id();
    let conf = ServerConf {
        threads: runtime.server.threads,
        work_stealing: runtime.server.work_stealing,
        grace_period_seconds: Some(GRACE_SECONDS),
        graceful_shutdown_timeout_seconds: Some(GRACE_SECONDS),
        pid_file: tmp.join(format!("weir-{pid}.pid")).display().to_string(),
        upgrade_sock: tmp.join(format!("weir-{pid}-upgrade.sock")).display().to_string(),
        ..ServerConf::default()
    };

    // Pingora retries a busy address every second forever; a service manager would see a live
    // process that serves nothing. Fail at once instead, naming the address.
    for (field, addr) in listen
        .iter()
        .map(|a| ("server.listen", a))
        .chain(listen_tls.iter().map(|a| ("server.listen_tls", a)))
        .chain(runtime.server.admin.iter().map(|a| ("server.admin", a)))
    {
        if let Err(e) = std::net::TcpListener::bind(addr) {
            return Err(format!("{field}: cannot listen on {addr}: {e}"));
        }
    }
    let fd_limit = raise_fd_limit();
    // One descriptor budget for every listener: each its own cap, all below the limit together.
    let budget = Budget::split(fd_limit, runtime.rls.is_some());

    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    // One certificate resolver (and watcher) for every TLS listener, the proxy's and the RLS's.
    let rls = runtime.rls.as_ref();
    let resolver = lasting.certs.clone();
    let mut admin_app = AdminApp::new(reloader.clone(), &lasting);
    if let Some(rls) = rls {
        let tls = match (&resolver, rls.listen_tls.is_empty()) {
            // gRPC needs HTTP/2: ALPN offers h2 on these listeners whatever server.http2 says.
            (Some(resolver), false) => {
                Some(Arc::new(tls::server_config(resolver.clone(), runtime.server.min_tls, true)?))
            }
            _ => None,
        };
        let service = crate::rls::service::RlsService::new(reloader.runtime(), lasting.rls_limits);
        // RLQS ledgers: in the shared store (every instance on it makes one division), or here.
        let ledger = match runtime.store {
            crate::config::StoreSettings::Redis(..) => crate::rls::quota::Ledger::Shared(lasting.admin.clone()),
            crate::config::StoreSettings::Memory => crate::rls::quota::Ledger::Local(Arc::new(
                crate::rls::quota::MemoryLedger::new(Arc::new(crate::limit::SystemClock)),
            )),
        };
        let quota = crate::rls::quota::QuotaService::new(reloader.runtime(), ledger, lasting.instance.clone());
        admin_app = admin_app.with_quota(quota.live());
        let listener = crate::rls::listener::RlsListener::bind(service, quota, reloader.runtime(), budget.rls, tls)?;
        let mut background = pingora::services::background::background_service("weir rls", listener);
        background.threads = Some(runtime.server.threads);
        server.add_service(background);
        tracing::info!(listen = ?rls.listen, listen_tls = ?rls.listen_tls, "rate limit service (gRPC) started");
    }
    // Without HTTP listeners the process is the rate limit service alone.
    // Kept for the exit: the proxy takes the stores.
    let leases = lasting.conns.keeper.clone();
    let budget_leases = lasting.budget_leases.clone();
    if !listen.is_empty() || !listen_tls.is_empty() {
        let proxy = WeirProxy::new(reloader.runtime(), lasting.limits, lasting.conns, lasting.upstreams.clone());
        let mut proxy = pingora::proxy::http_proxy(&server.configuration, proxy);
        proxy.server_options = Some(http_options(&runtime.server));
        // The edge serves h2 connections with these options read per connection (edge/streams.rs);
        // the proxy's own copy matches them for any h2 connection that would not pass there.
        proxy.h2_options = Some(crate::edge::h2_options(&runtime.server.clients));
        let mut edge = EdgeApp::new(proxy, reloader.runtime(), budget.proxy);
        if let (false, Some(resolver)) = (listen_tls.is_empty(), &resolver) {
            let config = tls::server_config(resolver.clone(), runtime.server.min_tls, runtime.server.http2)?;
            edge = edge.with_tls(TlsListeners::new(listen_tls.clone(), config));
        }
        let mut service = pingora::services::listening::Service::new("weir proxy".to_string(), edge);
        // TLS listeners are plain TCP to Pingora: the edge does their handshake (see edge/tls.rs).
        for addr in listen.iter().chain(&listen_tls) {
            service.add_tcp(&addr.to_string());
        }
        server.add_service(service);
    }
    if let Some(admin) = runtime.server.admin {
        let mut admin_service = pingora::services::listening::Service::new(
            "weir admin".to_string(),
            Capped::new(admin_app, budget.admin, "admin_max_connections"),
        );
        admin_service.threads = Some(1);
        admin_service.add_tcp(&admin.to_string());
        server.add_service(admin_service);
    }
    tracing::info!(listen = ?listen, listen_tls = ?listen_tls, "weir started");
    server.run(pingora::server::RunArgs::default());
    // Stopped (SIGTERM, SIGINT, an upgrade): the leases of requests cut at the end of the grace
    // period are given back (else a restarted instance finds their keys full for lease_ttl), and
    // buffered access lines are written before the exit, which runs no destructor.
    if let Some(budget) = &budget_leases {
        let keys = budget.release_at_exit(LEASE_RELEASE_TIMEOUT);
        if keys > 0 {
            tracing::info!(keys, "unused lease tokens given back at exit");
        }
    }
    let released = leases.release_at_exit(LEASE_RELEASE_TIMEOUT);
    if released > 0 {
        tracing::info!(leases = released, "leases given back at exit");
    }
    crate::logging::buffer::flush_all();
    std::process::exit(0)
}

/// Pingora's per-connection HTTP options: h2c on the cleartext listeners when enabled, and idle
/// HTTP/2 connections closed after `keepalive_timeout` like idle HTTP/1.1 ones. Read at start-up.
fn http_options(server: &crate::config::ServerSettings) -> pingora::apps::HttpServerOptions {
    let mut options = pingora::apps::HttpServerOptions::default();
    options.h2c = server.h2c;
    options.h2_idle_timeout = Some(server.clients.keepalive_timeout);
    options
}

/// Raises the soft file-descriptor limit to the hard one (nginx's `worker_rlimit_nofile`) and
/// returns it: client connections are capped below it, so the process never runs out.
fn raise_fd_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the file-descriptor limit; assuming 1024");
            1024
        }
    }
}
