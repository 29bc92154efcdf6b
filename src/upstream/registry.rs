//! The pools of every upstream by name, outside the config snapshots so that a reload keeps
//! their state, and the background task that runs active health checks and DNS re-resolution.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::{resolve, Pool, Upstream, UpstreamSpec};

/// How often the background task looks at the config, the checks due and the health gauges.
const TICK: Duration = Duration::from_millis(50);

pub static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::default);

#[derive(Default)]
pub struct Registry {
    pools: Mutex<HashMap<String, Arc<Pool>>>,
    watching: OnceLock<()>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Pool>>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool named like `spec`, created on first use; a spec from a newer config snapshot
    /// (higher `seq`) updates it.
    pub fn attach(&self, spec: &Arc<UpstreamSpec>, seq: u64) -> Arc<Pool> {
        let mut pools = self.lock();
        match pools.get(&spec.name) {
            Some(pool) => {
                pool.configure(spec, seq);
                pool.clone()
            }
            None => {
                let pool = Arc::new(Pool::new(spec, seq));
                pools.insert(spec.name.clone(), pool.clone());
                pool
            }
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<Pool>> {
        self.lock().get(name).cloned()
    }

    fn all(&self) -> Vec<Arc<Pool>> {
        self.lock().values().cloned().collect()
    }

    /// Follows the live config: `snapshot` gives the current one (a new `Arc` when it changes),
    /// `upstreams` its upstreams. They get pools at once (health checks start without waiting
    /// for traffic), pools of removed upstreams are dropped. Starts, once per process, a thread
    /// with its own small runtime for the checks and DNS lookups.
    pub fn watch<S: Send + Sync + 'static>(
        &'static self,
        snapshot: impl Fn() -> Arc<S> + Send + 'static,
        upstreams: fn(&S) -> &[Upstream],
    ) {
        if self.watching.set(()).is_err() {
            return;
        }
        let spawned = std::thread::Builder::new().name("weir-upstreams".into()).spawn(move || {
            match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt.block_on(self.run(snapshot, upstreams)),
                Err(e) => tracing::error!(error = %e, "cannot start the upstream health checker"),
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the upstream health checker");
        }
    }

    async fn run<S>(&self, snapshot: impl Fn() -> Arc<S>, upstreams: fn(&S) -> &[Upstream]) {
        let mut seen: Option<Arc<S>> = None;
        let mut due_check: HashMap<String, Instant> = HashMap::new();
        let mut due_resolve: HashMap<String, Instant> = HashMap::new();
        let mut running: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
        let mut resolving: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
        loop {
            let current = snapshot();
            if !seen.as_ref().is_some_and(|s| Arc::ptr_eq(s, &current)) {
                for upstream in upstreams(&current) {
                    upstream.pool();
                }
                seen = Some(current);
            }
            if let Some(current) = &seen {
                // Also drops a pool an old snapshot's late first request brought back.
                let live = upstreams(current);
                self.lock().retain(|name, _| live.iter().any(|u| &u.name == name));
            }
            let now = Instant::now();
            for pool in self.all() {
                let spec = pool.spec();
                if let Some(check) = &spec.health_check {
                    let idle = running.get(&spec.name).is_none_or(|task| task.is_finished());
                    if idle && due_check.get(&spec.name).is_none_or(|t| *t <= now) {
                        due_check.insert(spec.name.clone(), now + check.interval);
                        let pool = pool.clone();
                        running.insert(spec.name.clone(), tokio::spawn(async move { pool.check_health().await }));
                    }
                }
                if spec.servers.iter().any(|s| s.is_name) {
                    let idle = resolving.get(&spec.name).is_none_or(|task| task.is_finished());
                    let due = due_resolve.entry(spec.name.clone()).or_insert(now + spec.resolve_interval);
                    // One lookup round at a time per upstream, even when a resolver is slow.
                    if idle && *due <= now {
                        *due = now + spec.resolve_interval;
                        resolving.insert(spec.name.clone(), tokio::spawn(resolve::refresh(pool.clone())));
                    }
                }
                pool.export_health();
            }
            tokio::time::sleep(TICK).await;
        }
    }
}
