//! What Weir keeps of every upstream across reloads, by name: its [`Pool`] and its adaptive
//! limit. The process owns one [`Registry`] (`process::lasting::Lasting`) and brings it up to
//! date before each config snapshot is published; requests find their upstream's state here,
//! never inside the snapshot. Also the background task that runs active health checks and DNS
//! re-resolution.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use super::server_state::lock;
use super::{resolve, Pool, Upstream};
use crate::adaptive::AdaptiveLimit;
use schedule::{Schedule, Watched};

mod schedule;

/// How often the background task looks at the checks due and the health gauges.
const TICK: Duration = Duration::from_millis(50);

/// One upstream's state that outlives a reload.
pub struct Kept {
    pub pool: Arc<Pool>,
    /// `None` when the upstream has no adaptive limit.
    pub adaptive: Option<Arc<AdaptiveLimit>>,
}

impl Kept {
    fn new(upstream: &Upstream) -> Self {
        Kept {
            pool: Arc::new(Pool::new(&upstream.spec)),
            adaptive: upstream.adaptive.map(|spec| Arc::new(AdaptiveLimit::new(&upstream.name, spec))),
        }
    }

    /// The same state under `upstream`'s newer settings: what was learned is kept.
    fn reconfigured(&self, upstream: &Upstream) -> Self {
        self.pool.configure(&upstream.spec);
        let adaptive = match (upstream.adaptive, &self.adaptive) {
            (Some(spec), Some(limit)) => {
                limit.reconfigure(spec);
                Some(limit.clone())
            }
            (Some(spec), None) => Some(Arc::new(AdaptiveLimit::new(&upstream.name, spec))),
            (None, _) => None,
        };
        Kept { pool: self.pool.clone(), adaptive }
    }
}

#[derive(Default)]
pub struct Registry {
    /// Read by every request without a lock; replaced whole by [`Registry::prepare`].
    kept: ArcSwap<HashMap<String, Arc<Kept>>>,
    /// Serialises the writers (reloads, on one thread anyway, and the first start).
    change: Mutex<()>,
}

impl Registry {
    /// A registry holding the state of `upstreams` (the first config's).
    pub fn new(upstreams: &[Upstream]) -> Self {
        let registry = Registry::default();
        registry.prepare(upstreams);
        registry
    }

    /// Before a snapshot naming `upstreams` is published: new upstreams get their state, the
    /// others their new settings. Requests still on the old snapshot keep finding theirs.
    pub fn prepare(&self, upstreams: &[Upstream]) {
        let _writer = lock(&self.change);
        let mut next = HashMap::clone(&self.kept.load());
        for upstream in upstreams {
            let kept = match next.get(&upstream.name) {
                Some(kept) => kept.reconfigured(upstream),
                None => Kept::new(upstream),
            };
            next.insert(upstream.name.clone(), Arc::new(kept));
        }
        self.kept.store(Arc::new(next));
    }

    /// After the snapshot naming `upstreams` is published: the state of upstreams it no longer
    /// names is dropped (requests in flight hold their own reference until they end).
    pub fn retain(&self, upstreams: &[Upstream]) {
        let _writer = lock(&self.change);
        let mut next = HashMap::clone(&self.kept.load());
        next.retain(|name, _| upstreams.iter().any(|u| &u.name == name));
        self.kept.store(Arc::new(next));
    }

    /// The state of `upstream`. A request that began on a snapshot older than the reload that
    /// removed its upstream gets a fresh state of its own, kept nowhere.
    pub fn of(&self, upstream: &Upstream) -> Arc<Kept> {
        match self.kept.load().get(&upstream.name) {
            Some(kept) => kept.clone(),
            None => Arc::new(Kept::new(upstream)),
        }
    }

    fn pools(&self) -> Vec<Arc<Pool>> {
        self.kept.load().values().map(|k| k.pool.clone()).collect()
    }

    /// Runs the active health checks and the DNS lookups of every kept upstream (checks start
    /// without waiting for traffic), for the process's life (the process runs it). When is
    /// [`Schedule`]'s to decide; this starts the tasks and tells it which still run.
    pub async fn run_checks(&self) {
        let mut schedule = Schedule::default();
        let mut checks: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
        let mut lookups: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
        let running = |tasks: &HashMap<String, tokio::task::JoinHandle<()>>, name: &String| {
            tasks.get(name).is_some_and(|task| !task.is_finished())
        };
        loop {
            // A finished task is no longer running: dropped, so removed upstreams leave nothing.
            checks.retain(|_, task| !task.is_finished());
            lookups.retain(|_, task| !task.is_finished());
            let pools = self.pools();
            let watched: Vec<Watched> = pools
                .iter()
                .map(|pool| {
                    let spec = pool.spec();
                    Watched {
                        check_every: spec.health_check.as_ref().map(|check| check.interval),
                        lookup_every: spec.servers.iter().any(|s| s.is_name).then_some(spec.resolve_interval),
                        checking: running(&checks, &spec.name),
                        looking_up: running(&lookups, &spec.name),
                        name: spec.name.clone(),
                    }
                })
                .collect();
            let starts = schedule.due(Instant::now(), &watched);
            for ((pool, upstream), start) in pools.iter().zip(&watched).zip(starts) {
                if start.check {
                    let pool = pool.clone();
                    checks.insert(upstream.name.clone(), tokio::spawn(async move { pool.check_health().await }));
                }
                if start.lookup {
                    lookups.insert(upstream.name.clone(), tokio::spawn(resolve::refresh(pool.clone())));
                }
                pool.export_health();
            }
            tokio::time::sleep(TICK).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{from_text, Runtime};

    fn config(upstreams: &str) -> Runtime {
        let text = format!(
            "[server]\nlisten = [\"127.0.0.1:8080\"]\n{upstreams}\n[[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"api\"\n"
        );
        from_text(&text, "test.toml").unwrap()
    }

    const API: &str = "[[upstream]]\nname = \"api\"\nservers = [\"127.0.0.1:1\"]\nmax_conns = 1\n";
    const API_ADAPTIVE: &str =
        "[[upstream]]\nname = \"api\"\nservers = [\"127.0.0.1:1\"]\nmax_conns = 1\nadaptive = {}\n";
    const OTHER: &str = "[[upstream]]\nname = \"other\"\nservers = [\"127.0.0.1:2\"]\n";

    /// A reload keeps what the upstream learned and holds; only what it no longer names goes.
    #[test]
    fn reloads_keep_state_by_name_and_drop_removed_upstreams() {
        let first = config(API_ADAPTIVE);
        let registry = Registry::new(&first.upstreams);
        let kept = registry.of(&first.upstreams[0]);
        let _held = kept.pool.pick(&[]).unwrap();
        assert!(kept.adaptive.is_some());

        // Same upstream, new settings: the place taken still counts, the limit is the same one.
        let second = config(&format!("{API_ADAPTIVE}{OTHER}"));
        registry.prepare(&second.upstreams);
        registry.retain(&second.upstreams);
        let again = registry.of(&second.upstreams[0]);
        assert!(Arc::ptr_eq(&kept.pool, &again.pool));
        assert!(Arc::ptr_eq(kept.adaptive.as_ref().unwrap(), again.adaptive.as_ref().unwrap()));
        assert_eq!(again.pool.pick(&[]).unwrap_err(), super::super::Unavailable::Busy);

        // The adaptive limit turned off: the pool stays, the limit goes.
        let third = config(&format!("{API}{OTHER}"));
        registry.prepare(&third.upstreams);
        assert!(registry.of(&third.upstreams[0]).adaptive.is_none());

        // "other" removed: its state is dropped once the snapshot is out; a request still on the
        // old snapshot gets a fresh state kept nowhere.
        let other = registry.of(&third.upstreams[1]);
        let fourth = config(API);
        registry.prepare(&fourth.upstreams);
        assert!(Arc::ptr_eq(&registry.of(&third.upstreams[1]).pool, &other.pool), "kept until published");
        registry.retain(&fourth.upstreams);
        let late = registry.of(&third.upstreams[1]);
        assert!(!Arc::ptr_eq(&late.pool, &other.pool));
        assert_eq!(registry.pools().len(), 1);
    }
}
