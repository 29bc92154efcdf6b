//! The one owner of what outlives a reload. Made once at start from the first config, it follows
//! every reload through the reloader's hooks and is handed, piece by piece, to the front doors and
//! the engine: nothing of it is global, and nothing of it hangs off a config snapshot.

use std::future::Future;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::metrics_observer::MetricsObserver;
use crate::config::{Runtime, StoreSettings};
use crate::engine::{ConnStores, Observer, Stores};
use crate::limit::SystemClock;
use crate::process::reload::Reloader;
use crate::store::{
    ConnStore, GuardedStore, LeaseLedger, LeasedStore, LimitStore, MemoryAdmin, MemoryConnStore, MemoryStore,
    RedisStore, StoreAdmin, ZoneLimits,
};
use crate::tls::{CertResolver, CertWatcher};
use crate::top::Tracker;
use crate::upstream;

/// How often an open circuit breaker pings the store to see whether it is back.
const PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

pub struct Lasting {
    /// The stores of rate limits: the configured one (on Redis one connection, one circuit
    /// breaker and the deny cache, shared by every front door) and the proxy's in-process one
    /// for the `local` failure policy.
    pub limits: Stores,
    /// The stores of concurrency leases, likewise.
    pub conns: ConnStores,
    /// The primary stores' operator side, made from the same `Arc`s (on Redis the guarded store
    /// itself; in memory `MemoryAdmin` over both): the admin API, `/readyz` and the fleet sync hold
    /// this, never the engine's traits.
    pub admin: Arc<dyn StoreAdmin>,
    /// The rate limit service's stores: the same configured store, its own `local` one.
    pub rls_limits: Stores,
    /// Every upstream's pool and adaptive limit, by name.
    pub upstreams: Arc<upstream::Registry>,
    /// This process's top-keys tables: the engine records into them (through its observer),
    /// the admin API and the fleet sync read them.
    pub top: Arc<Tracker>,
    /// This instance's name in the fleet (top keys, resets).
    pub instance: String,
    /// The certificates of every TLS listener, proxy's and rate limit service's; `None` without.
    pub certs: Option<Arc<CertResolver>>,
    /// On Redis, the leasing layer in front of the store (docs/leases.md): its keeper runs on a
    /// thread of its own, a reload and the exit give its unused tokens back.
    pub budget_leases: Option<LeasedStore>,
}

impl Lasting {
    /// Builds everything from the first config and hooks it to `reloader`'s reloads. Starts no
    /// task: [`Lasting::start`] does, once the process is ready to serve.
    pub fn build(reloader: &Reloader) -> Result<Lasting, String> {
        let runtime = reloader.runtime();
        let first = runtime.load_full();
        // Each zone's capacity follows the running config (`max_keys`), reloads included.
        let live = runtime.clone();
        let zone_limits: ZoneLimits = Arc::new(move |zone| live.load().zone_max_keys(zone));
        let (limits, conns, admin, budget_leases) = primary_stores(&first.store, &zone_limits)?;
        if let Some(leased) = &budget_leases {
            let leased = leased.clone();
            reloader.on_apply(move |_| leased.reloaded());
        }
        let kind = limits.kind();
        let top = Arc::new(Tracker::default());
        // The engine reports to the metrics, then to the live view's tables; made once, for the
        // process's life (the engine holds it by plain reference).
        let observer: &'static dyn Observer = Box::leak(Box::new((MetricsObserver::new(kind), top.clone())));
        let local = || MemoryStore::default().with_zone_limits(zone_limits.clone());

        let upstreams = Arc::new(upstream::Registry::new(&first.upstreams));
        let before = upstreams.clone();
        reloader.on_prepare(move |next| before.prepare(&next.upstreams));
        let after = upstreams.clone();
        reloader.on_apply(move |next| after.retain(&next.upstreams));

        let needs_tls =
            !first.server.listen_tls.is_empty() || first.rls.as_ref().is_some_and(|r| !r.listen_tls.is_empty());
        let certs = if needs_tls {
            let resolver = Arc::new(CertResolver::new(first.tls_certs.clone()));
            let watcher = CertWatcher::start(resolver.clone())?;
            reloader.on_apply(move |next| watcher.apply_config(next.tls_certs.clone()));
            Some(resolver)
        } else {
            None
        };

        Ok(Lasting {
            limits: Stores::new(limits.clone(), local()).observed_by(observer),
            rls_limits: Stores::new(limits, local()).observed_by(observer),
            conns: ConnStores::new(
                conns,
                kind,
                Arc::new(MemoryConnStore::default().with_zone_limits(zone_limits.clone())),
                observer,
            ),
            admin,
            upstreams,
            top,
            instance: crate::top::fleet::instance_id(),
            certs,
            budget_leases,
        })
    }

    /// Starts the tasks that keep the lasting state, each on a thread of its own with a small
    /// runtime, apart from the request path: the upstreams' health checks and DNS, and on a shared
    /// store the lease keeper and the fleet's top keys and resets (the memory store's leases never
    /// expire and it has no fleet).
    pub fn start(&self, runtime: &Arc<ArcSwap<Runtime>>) -> Result<(), String> {
        if self.conns.primary.renew_every().is_some() {
            let keeper = self.conns.keeper.clone();
            on_own_thread("weir-leases", async move { keeper.run().await })?;
        }
        if let Some(leased) = self.budget_leases.clone() {
            on_own_thread("weir-budget-leases", async move { leased.run().await })?;
        }
        let upstreams = self.upstreams.clone();
        on_own_thread("weir-upstreams", async move { upstreams.run_checks().await })?;
        if matches!(runtime.load().store, StoreSettings::Redis(..)) {
            let fleet = {
                // A reset, by any instance, voids this instance's leases of the key.
                let leases = self.budget_leases.clone();
                let on_reset: crate::top::fleet::OnReset = Box::new(move |zone, key| {
                    if let Some(leases) = &leases {
                        leases.void(zone, key);
                    }
                });
                crate::top::fleet::run(
                    self.admin.clone(),
                    runtime.clone(),
                    self.instance.clone(),
                    self.top.clone(),
                    on_reset,
                )
            };
            on_own_thread("weir-fleet", fleet)?;
        }
        Ok(())
    }
}

/// Runs `task` on a new thread named `name`, on a current-thread runtime of its own.
fn on_own_thread(name: &str, task: impl Future<Output = ()> + Send + 'static) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime of {name}: {e}"))?;
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || runtime.block_on(task))
        .map_err(|e| format!("cannot start the thread {name}: {e}"))?;
    Ok(())
}

type PrimaryStores = (Arc<dyn LimitStore>, Arc<dyn ConnStore>, Arc<dyn StoreAdmin>, Option<LeasedStore>);

/// The configured store, for rates and for concurrency leases, and its operator side.
fn primary_stores(settings: &StoreSettings, zone_limits: &ZoneLimits) -> Result<PrimaryStores, String> {
    Ok(match settings {
        StoreSettings::Memory => {
            let limits = Arc::new(MemoryStore::default().with_zone_limits(zone_limits.clone()));
            let conns = Arc::new(MemoryConnStore::default().with_zone_limits(zone_limits.clone()));
            // Leasing on the memory store is pointless (one process, decisions already in
            // memory): its zones decide exactly, `weir check` says so.
            (limits.clone(), conns.clone(), Arc::new(MemoryAdmin { limits, conns }), None)
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
                .with_conn(redis.clone()),
            );
            // Leased zones are answered in front of the guard; their asks go to Redis itself.
            let ledger: Arc<dyn LeaseLedger> = redis;
            // The keeper's give-backs on a connection of their own, made on the keeper's thread
            // (the exit's come after the proxy's runtime, and its connection, are gone).
            let returns: Arc<dyn LeaseLedger> = Arc::new(
                RedisStore::new(cfg.clone(), Arc::new(SystemClock))
                    .map_err(|e| format!("store: {e}"))?
                    .with_coalescing(false),
            );
            let leased = LeasedStore::new(guarded.clone(), ledger, returns, Arc::new(SystemClock));
            (Arc::new(leased.clone()), guarded.clone(), guarded, Some(leased))
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::process::reload::ReloadOutcome;

    fn config(upstreams: &[&str]) -> String {
        let mut text = String::from("[server]\nlisten = [\"127.0.0.1:8080\"]\n");
        for (i, name) in upstreams.iter().enumerate() {
            text += &format!("[[upstream]]\nname = \"{name}\"\nservers = [\"127.0.0.1:{}\"]\n", 9000 + i);
        }
        text + &format!("[[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"{}\"\n", upstreams[0])
    }

    /// A reload's new upstream has its state before any request can see the snapshot naming it,
    /// and the state of an upstream it drops goes once the snapshot is out.
    #[test]
    fn upstream_state_is_ready_before_a_snapshot_is_published() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weir.toml");
        let first = config(&["api"]);
        std::fs::write(&path, &first).unwrap();
        let reloader = Arc::new(Reloader::new(&path, crate::config::from_text(&first, "weir.toml").unwrap(), &first));
        let lasting = Lasting::build(&reloader).unwrap();

        let next = crate::config::from_text(&config(&["web", "api"]), "weir.toml").unwrap();
        let web = &next.upstreams[0];
        // Kept state is one object; a detached one (not kept) is made afresh at each look.
        let kept =
            |registry: &upstream::Registry, u: &upstream::Upstream| Arc::ptr_eq(&registry.of(u), &registry.of(u));
        assert!(!kept(&lasting.upstreams, web));

        let checked = Arc::new(AtomicBool::new(false));
        let (registry, live, seen) = (lasting.upstreams.clone(), reloader.runtime(), checked.clone());
        reloader.on_prepare(move |next| {
            if seen.swap(true, Ordering::SeqCst) {
                return; // the first reload only
            }
            let web = next.upstreams.iter().find(|u| u.name == "web").unwrap();
            assert_eq!(live.load().upstreams.len(), 1, "not yet published");
            assert!(kept(&registry, web), "prepared before it is published");
        });
        std::fs::write(&path, config(&["web", "api"])).unwrap();
        assert!(matches!(reloader.reload("test"), ReloadOutcome::Applied { .. }));
        assert!(checked.load(Ordering::SeqCst));
        assert!(kept(&lasting.upstreams, web));

        let api = &next.upstreams[1];
        std::fs::write(&path, config(&["web"])).unwrap();
        assert!(matches!(reloader.reload("test"), ReloadOutcome::Applied { .. }));
        assert!(!kept(&lasting.upstreams, api), "dropped once published");
    }
}
