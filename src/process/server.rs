//! Assembles the Pingora server: one proxy service on the configured listeners, sharing one store.

use std::sync::Arc;

use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;

use crate::config::Runtime;
use crate::config::StoreSettings;
use crate::edge::budget::Budget;
use crate::edge::{Capped, EdgeApp, TlsListeners};
use crate::engine::ConnStores;
use crate::engine::Observer;
use crate::engine::Stores;
use crate::limit::SystemClock;
use crate::metrics::MetricsObserver;
use crate::process::admin::AdminApp;
use crate::process::reload::Reloader;
use crate::proxy::WeirProxy;
use crate::store::{
    ConnStore, GuardedStore, LimitStore, MemoryAdmin, MemoryConnStore, MemoryStore, RedisStore, StoreAdmin, ZoneLimits,
};
use crate::tls::{self, CertResolver, CertWatcher};
use crate::top::Tracker;
use arc_swap::ArcSwap;

/// Seconds between SIGTERM and exit: listeners close at once, in-flight requests get this long.
const GRACE_SECONDS: u64 = 1;
/// How often an open circuit breaker pings the store to see whether it is back.
const PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// What outlives every reload, made once at start and handed to the proxy, the admin API and
/// the engine: the stores of rate limits and concurrency leases (on Redis both share one
/// connection, one circuit breaker and the deny cache), with the in-process stores of the `local`
/// failure policy. Upstream pools live in `upstream::REGISTRY`, whose health and DNS task
/// `run` starts; certificates in the `CertWatcher` that reload feeds.
pub struct Lasting {
    pub limits: Stores,
    pub conns: ConnStores,
    /// The primary stores' operator side, made from the same `Arc`s (on Redis the guarded store
    /// itself; in memory `MemoryAdmin` over both): the admin API, `/readyz` and the fleet sync hold
    /// this, never the engine's traits.
    pub admin: Arc<dyn StoreAdmin>,
    /// This process's top-keys tables: the engine records into them (through `limits`), the admin
    /// API and the fleet sync read them.
    pub top: Arc<Tracker>,
}

impl Lasting {
    pub fn build(runtime: &Arc<ArcSwap<Runtime>>) -> Result<Lasting, String> {
        // Each zone's capacity follows the running config (`max_keys`), reloads included.
        let live = runtime.clone();
        let zone_limits: ZoneLimits = Arc::new(move |zone| live.load().zone_max_keys(zone));
        let (limits, conns, admin) = primary_stores(runtime, &zone_limits)?;
        let kind = limits.kind();
        let top = Arc::new(Tracker::default());
        // The engine reports to the metrics, then to the live view's tables; made once, for the
        // process's life (the engine holds it by plain reference).
        let observer: &'static dyn Observer = Box::leak(Box::new((MetricsObserver::new(kind), top.clone())));
        Ok(Lasting {
            limits: Stores::new(limits, MemoryStore::default().with_zone_limits(zone_limits.clone()))
                .observed_by(observer),
            conns: ConnStores {
                primary: conns,
                kind,
                local: Arc::new(MemoryConnStore::default().with_zone_limits(zone_limits)),
                observer,
            },
            admin,
            top,
        })
    }
}

type PrimaryStores = (Arc<dyn LimitStore>, Arc<dyn ConnStore>, Arc<dyn StoreAdmin>);

/// The configured store, for rates and for concurrency leases, and its operator side.
fn primary_stores(runtime: &Arc<ArcSwap<Runtime>>, zone_limits: &ZoneLimits) -> Result<PrimaryStores, String> {
    let settings = &runtime.load().store;
    Ok(match settings {
        StoreSettings::Memory => {
            let limits = Arc::new(MemoryStore::default().with_zone_limits(zone_limits.clone()));
            let conns = Arc::new(MemoryConnStore::default().with_zone_limits(zone_limits.clone()));
            (limits.clone(), conns.clone(), Arc::new(MemoryAdmin { limits, conns }))
        }
        StoreSettings::Redis(cfg, resilience) => {
            let redis = Arc::new(
                RedisStore::new(cfg.clone(), Arc::new(SystemClock))
                    .map_err(|e| format!("store: {e}"))?
                    .with_lease_ttl(resilience.lease_ttl)
                    .with_coalescing(resilience.coalesce),
            );
            redis.watch_eviction_policy()?;
            let guarded = Arc::new(
                GuardedStore::new(
                    redis.clone(),
                    Arc::new(SystemClock),
                    resilience.breaker_failures,
                    resilience.deny_cache_size,
                    PROBE_INTERVAL,
                )
                .with_conn(redis),
            );
            (guarded.clone(), guarded.clone(), guarded)
        }
    })
}

/// Runs the proxy until a signal stops the process. Never returns on success.
pub fn run(reloader: Arc<Reloader>) -> Result<(), String> {
    let runtime = reloader.runtime().load_full();
    // The stores (and the Redis connection) are made once and outlive every reload.
    let lasting = Lasting::build(&reloader.runtime())?;
    let live = reloader.runtime();
    crate::upstream::REGISTRY.watch(move || live.load_full(), |rt: &crate::config::Runtime| &rt.upstreams);
    // Fleet-wide top keys and resets (a no-op on the memory store, which has no fleet).
    let instance = crate::top::fleet::instance_id();
    if matches!(runtime.store, StoreSettings::Redis(..)) {
        crate::top::fleet::start(lasting.admin.clone(), reloader.runtime(), instance.clone(), lasting.top.clone())?;
    }
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
    let admin_store = lasting.admin.clone();
    let admin_top = lasting.top.clone();
    // One certificate resolver (and watcher) for every TLS listener, the proxy's and the RLS's.
    let rls = runtime.rls.as_ref();
    let needs_tls = !listen_tls.is_empty() || rls.is_some_and(|r| !r.listen_tls.is_empty());
    let resolver = if needs_tls {
        let resolver = Arc::new(CertResolver::new(runtime.tls_certs.clone()));
        let watcher = CertWatcher::start(resolver.clone())?;
        reloader.on_apply(move |next| watcher.apply_config(next.tls_certs.clone()));
        Some(resolver)
    } else {
        None
    };
    if let Some(rls) = rls {
        let tls = match (&resolver, rls.listen_tls.is_empty()) {
            // gRPC needs HTTP/2: ALPN offers h2 on these listeners whatever server.http2 says.
            (Some(resolver), false) => {
                Some(Arc::new(tls::server_config(resolver.clone(), runtime.server.min_tls, true)?))
            }
            _ => None,
        };
        let stores = rls_stores(&reloader, &lasting.limits);
        let service = crate::rls::service::RlsService::new(reloader.runtime(), stores);
        let listener = crate::rls::listener::RlsListener::bind(service, reloader.runtime(), budget.rls, tls)?;
        let mut background = pingora::services::background::background_service("weir rls", listener);
        background.threads = Some(runtime.server.threads);
        server.add_service(background);
        tracing::info!(listen = ?rls.listen, listen_tls = ?rls.listen_tls, "rate limit service (gRPC) started");
    }
    // Without HTTP listeners the process is the rate limit service alone.
    if !listen.is_empty() || !listen_tls.is_empty() {
        let proxy = WeirProxy::new(reloader.runtime(), lasting.limits, lasting.conns);
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
            Capped::new(
                AdminApp::new(reloader.clone(), admin_store, instance, admin_top),
                budget.admin,
                "admin_max_connections",
            ),
        );
        admin_service.threads = Some(1);
        admin_service.add_tcp(&admin.to_string());
        server.add_service(admin_service);
    }
    tracing::info!(listen = ?listen, listen_tls = ?listen_tls, "weir started");
    server.run(pingora::server::RunArgs::default());
    // Stopped (SIGTERM, SIGINT, an upgrade): buffered access lines are written before the exit,
    // which runs no destructor.
    crate::logging::buffer::flush_all();
    std::process::exit(0)
}

/// The rate limit service's stores: the process's store (one Redis connection, breaker and deny
/// cache for both front doors) and its own in-process one for the `local` failure policy. Its
/// decisions go to the same top-keys tables as the proxy's.
fn rls_stores(reloader: &Reloader, limits: &Stores) -> Stores {
    let live = reloader.runtime();
    let zone_limits: ZoneLimits = Arc::new(move |zone| live.load().zone_max_keys(zone));
    Stores::new(limits.primary.clone(), MemoryStore::default().with_zone_limits(zone_limits))
        .observed_by(limits.observer)
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
