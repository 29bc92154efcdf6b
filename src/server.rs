//! Assembles the Pingora server: one proxy service on the configured listeners, sharing one store.

use std::sync::Arc;

use arc_swap::ArcSwap;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;

use crate::config::{Runtime, StoreSettings};
use crate::limit::SystemClock;
use crate::proxy::WeirProxy;
use crate::store::{LimitStore, MemoryStore, RedisStore};

/// Seconds between SIGTERM and exit: listeners close at once, in-flight requests get this long.
const GRACE_SECONDS: u64 = 1;

pub fn build_store(settings: &StoreSettings) -> Result<Arc<dyn LimitStore>, String> {
    Ok(match settings {
        StoreSettings::Memory => Arc::new(MemoryStore::default()),
        StoreSettings::Redis(cfg) => Arc::new(
            RedisStore::new(cfg.clone(), Arc::new(SystemClock))
                .map_err(|e| format!("store: {e}"))?,
        ),
    })
}

/// Runs the proxy until a signal stops the process. Never returns on success.
pub fn run(runtime: Runtime) -> Result<(), String> {
    let store = build_store(&runtime.store)?;
    let listen = runtime.server.listen.clone();

    let mut conf = ServerConf::default();
    conf.threads = runtime.server.threads;
    conf.grace_period_seconds = Some(GRACE_SECONDS);
    conf.graceful_shutdown_timeout_seconds = Some(GRACE_SECONDS);
    // Pingora's defaults are fixed names in /tmp: give each process its own.
    let tmp = std::env::temp_dir();
    let pid = std::process::id();
    conf.pid_file = tmp.join(format!("weir-{pid}.pid")).display().to_string();
    conf.upgrade_sock = tmp
        .join(format!("weir-{pid}-upgrade.sock"))
        .display()
        .to_string();

    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let proxy = WeirProxy::new(Arc::new(ArcSwap::from_pointee(runtime)), store);
    let mut service = pingora::proxy::http_proxy_service(&server.configuration, proxy);
    for addr in &listen {
        service.add_tcp(&addr.to_string());
    }
    server.add_service(service);
    tracing::info!(listen = ?listen, "weir started");
    server.run_forever()
}
