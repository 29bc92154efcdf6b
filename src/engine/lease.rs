//! A held concurrency lease, released when its request ends — in the ticket's `finish` normally,
//! and by `Drop` on any path that skips it, so a slot is never leaked by an early return, a client
//! abort or a panic.
//!
//! Leases on a store where they expire (Redis: `lease_ttl`) are kept alive by the process's one
//! [`LeaseKeeper`], which renews every held lease together and gives back those dropped without
//! a release. The engine starts no task: the process runs [`LeaseKeeper::run`], which makes its
//! store calls concurrently within that one task.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use futures_util::stream::{self, StreamExt};
use tokio::sync::Notify;
use tracing::debug;

use super::observe::Observer;
use crate::store::{ready_now, ConnStore, LeaseKey};

/// Unique per process start, so lease ids of different instances never collide.
static INSTANCE: LazyLock<String> = LazyLock::new(|| {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}", std::process::id(), nanos)
});
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A fresh lease id: `<instance>:<counter>`.
pub fn new_lease_id() -> String {
    format!("{}:{}", *INSTANCE, NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Store calls in flight at once while renewing or giving back (one Redis pipeline's worth).
const IN_FLIGHT: usize = 64;

/// What the keeper asks of the store for a lease.
#[derive(Clone, Copy)]
enum Call {
    Renew,
    Release,
}

impl Call {
    fn as_str(self) -> &'static str {
        match self {
            Call::Renew => "renew",
            Call::Release => "release",
        }
    }
}

/// One lease as the keeper knows it.
#[derive(Clone)]
struct Kept {
    keys: Vec<LeaseKey>,
    id: String,
}

/// The leases held on one store whose leases expire: renewed every `renew_every` while held,
/// given back when their `Lease` was dropped unreleased.
pub struct LeaseKeeper {
    store: Arc<dyn ConnStore>,
    held: Mutex<HashMap<u64, Kept>>,
    /// Dropped without a release: given back by the next turn of [`LeaseKeeper::run`].
    orphans: Mutex<Vec<Kept>>,
    orphaned: Notify,
    next: AtomicU64,
    /// Whether [`LeaseKeeper::run`] is running (only then can it give leases back at exit).
    running: AtomicBool,
    /// Asked by [`LeaseKeeper::release_at_exit`]: give every lease back, then stop.
    stopping: Notify,
    /// Set once that is done, for the thread waiting in `release_at_exit`.
    stopped: (Mutex<bool>, Condvar),
}

impl LeaseKeeper {
    pub fn new(store: Arc<dyn ConnStore>) -> Arc<Self> {
        Arc::new(LeaseKeeper {
            store,
            held: Mutex::default(),
            orphans: Mutex::default(),
            orphaned: Notify::new(),
            next: AtomicU64::new(0),
            running: AtomicBool::new(false),
            stopping: Notify::new(),
            stopped: (Mutex::new(false), Condvar::new()),
        })
    }

    /// At a graceful shutdown, once the front doors have stopped: gives back every lease still
    /// held or dropped unreleased (a request cut at the end of the grace period), waiting at
    /// most `timeout`. Else each would keep its key full for `lease_ttl` after a restart.
    /// Returns how many were given back (0 when the keeper is not running: on a store whose
    /// leases never expire, the process's end frees them).
    pub fn release_at_exit(&self, timeout: std::time::Duration) -> usize {
        if !self.running.load(Ordering::Acquire) {
            return 0;
        }
        let count = lock(&self.held).len() + lock(&self.orphans).len();
        self.stopping.notify_one();
        let (done, signal) = &self.stopped;
        let guard = lock(done);
        let (guard, waited) =
            signal.wait_timeout_while(guard, timeout, |done| !*done).unwrap_or_else(|p| p.into_inner());
        if waited.timed_out() && !*guard {
            tracing::warn!(leases = count, ?timeout, "leases not all given back at exit; the rest expire by lease_ttl");
        }
        count
    }

    /// Leases kept alive now (tests).
    pub fn held(&self) -> usize {
        lock(&self.held).len()
    }

    /// Renews the held leases every `renew_every` and gives back orphans as they come; for the
    /// process's life. A store whose leases never expire needs only the second.
    pub async fn run(&self) {
        self.running.store(true, Ordering::Release);
        let every = self.store.renew_every();
        let mut due = every.map(|every| tokio::time::Instant::now() + every);
        loop {
            let renewal = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = renewal => {
                    self.renew_all().await;
                    due = every.map(|every| tokio::time::Instant::now() + every);
                }
                () = self.orphaned.notified() => self.release_orphans().await,
                () = self.stopping.notified() => {
                    let held: Vec<Kept> = lock(&self.held).drain().map(|(_, kept)| kept).collect();
                    self.call_each(held, Call::Release).await;
                    self.release_orphans().await;
                    let (done, signal) = &self.stopped;
                    *lock(done) = true;
                    signal.notify_all();
                    return;
                }
            }
        }
    }

    async fn renew_all(&self) {
        let leases: Vec<Kept> = lock(&self.held).values().cloned().collect();
        self.call_each(leases, Call::Renew).await;
    }

    async fn release_orphans(&self) {
        let orphans = std::mem::take(&mut *lock(&self.orphans));
        self.call_each(orphans, Call::Release).await;
    }

    /// `call` on each lease, [`IN_FLIGHT`] at a time, within this task. A release that fails is
    /// tried once more at once: the connection may have been made on a runtime that has since
    /// stopped (the proxy's, at a shutdown), and the first call's error is what makes it
    /// reconnect here. Then a failure is only logged: a renewal is tried again next round, a
    /// lease not given back expires by its TTL.
    async fn call_each(&self, leases: Vec<Kept>, call: Call) {
        let calls = leases.into_iter().map(|kept| {
            let store = self.store.clone();
            async move {
                let result = match call {
                    Call::Renew => store.renew(&kept.keys, &kept.id).await,
                    Call::Release => match store.release(&kept.keys, &kept.id).await {
                        Ok(()) => Ok(()),
                        Err(_) => store.release(&kept.keys, &kept.id).await,
                    },
                };
                if let Err(e) = result {
                    debug!(lease = %kept.id, error = %e, call = call.as_str(), "lease call failed");
                }
            }
        });
        let mut running = stream::iter(calls).buffer_unordered(IN_FLIGHT);
        while running.next().await.is_some() {}
    }

    fn keep(&self, keys: &[LeaseKey], id: &str) -> u64 {
        let serial = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.held).insert(serial, Kept { keys: keys.to_vec(), id: id.to_string() });
        serial
    }

    fn forget(&self, serial: u64) {
        lock(&self.held).remove(&serial);
    }

    fn orphan(&self, kept: Kept) {
        lock(&self.orphans).push(kept);
        self.orphaned.notify_one();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub struct Lease {
    store: Arc<dyn ConnStore>,
    keys: Vec<LeaseKey>,
    id: String,
    observer: &'static dyn Observer,
    /// Where the lease is kept alive (`None` on a store where leases never expire) and its
    /// number there.
    keeper: Option<(Arc<LeaseKeeper>, u64)>,
    released: bool,
}

impl Lease {
    /// Starts holding a lease `store` has granted; `keeper` keeps it alive when `store` is its
    /// store and its leases expire.
    pub fn hold(
        store: Arc<dyn ConnStore>,
        keys: Vec<LeaseKey>,
        id: String,
        observer: &'static dyn Observer,
        keeper: &Arc<LeaseKeeper>,
    ) -> Lease {
        observer.lease(true);
        let kept = Arc::ptr_eq(&store, &keeper.store) && store.renew_every().is_some();
        let keeper = kept.then(|| (keeper.clone(), keeper.keep(&keys, &id)));
        Lease { store, keys, id, observer, keeper, released: false }
    }

    pub async fn release(mut self) {
        self.stop();
        if let Err(e) = self.store.release(&self.keys, &self.id).await {
            debug!(lease = %self.id, error = %e, "lease release failed; it expires by itself");
        }
    }

    fn stop(&mut self) {
        if let Some((keeper, serial)) = self.keeper.take() {
            keeper.forget(serial);
        }
        if !self.released {
            self.released = true;
            self.observer.lease(false);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let keeper = self.keeper.clone();
        self.stop();
        let (keys, id) = (std::mem::take(&mut self.keys), std::mem::take(&mut self.id));
        match keeper {
            // Given back by the keeper's task, which the process runs.
            Some((keeper, _)) => keeper.orphan(Kept { keys, id }),
            // An in-process store answers at once.
            None => {
                if ready_now(self.store.release(&keys, &id)).is_none() {
                    debug!(lease = %id, "lease release did not finish at once; it expires by itself");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;
    use crate::engine::Unobserved;
    use crate::store::{ConnVerdict, KeyedConn, MemoryConnStore, StoreAdmin, StoreError};

    const EVERY: Duration = Duration::from_secs(10);

    /// The memory store, with leases that expire unless renewed every [`EVERY`] (as on Redis),
    /// counting the renewals of each lease.
    #[derive(Default)]
    struct Expiring {
        counts: MemoryConnStore,
        renewals: Mutex<HashMap<String, u32>>,
    }

    impl Expiring {
        fn renewals(&self, id: &str) -> u32 {
            lock(&self.renewals).get(id).copied().unwrap_or(0)
        }

        async fn held(&self) -> u32 {
            self.counts.held("conn", b"a").await.unwrap()
        }
    }

    #[async_trait]
    impl ConnStore for Expiring {
        async fn acquire(&self, zones: &[KeyedConn<'_>], lease: &str) -> Result<ConnVerdict, StoreError> {
            self.counts.acquire(zones, lease).await
        }
        async fn renew(&self, _keys: &[LeaseKey], lease: &str) -> Result<(), StoreError> {
            *lock(&self.renewals).entry(lease.to_string()).or_default() += 1;
            Ok(())
        }
        async fn release(&self, keys: &[LeaseKey], lease: &str) -> Result<(), StoreError> {
            self.counts.release(keys, lease).await
        }
        fn renew_every(&self) -> Option<Duration> {
            Some(EVERY)
        }
    }

    /// One keeper renews every held lease on the store's schedule, stops at a release, and gives
    /// back a lease dropped unreleased; on tokio's paused clock.
    #[tokio::test(start_paused = true)]
    async fn one_keeper_renews_held_leases_and_gives_back_dropped_ones() {
        let expiring = Arc::new(Expiring::default());
        let store: Arc<dyn ConnStore> = expiring.clone();
        let keeper = LeaseKeeper::new(store.clone());
        let running = tokio::spawn({
            let keeper = keeper.clone();
            async move { keeper.run().await }
        });
        let zone = [KeyedConn::new("conn", "a", 5)];
        let keys = vec![LeaseKey { zone: "conn".into(), key: b"a".to_vec() }];
        let mut leases = Vec::new();
        for id in ["1", "2"] {
            assert!(store.acquire(&zone, id).await.unwrap().admitted);
            leases.push(Lease::hold(store.clone(), keys.clone(), id.into(), &Unobserved, &keeper));
        }
        assert_eq!(keeper.held(), 2);

        tokio::time::sleep(EVERY * 3 + Duration::from_millis(1)).await;
        assert_eq!((expiring.renewals("1"), expiring.renewals("2")), (3, 3));

        let second = leases.pop().unwrap();
        leases.pop().unwrap().release().await;
        tokio::time::sleep(EVERY).await;
        assert_eq!((expiring.renewals("1"), expiring.renewals("2")), (3, 4), "a released lease is not renewed");
        assert_eq!(expiring.held().await, 1);

        drop(second);
        assert_eq!(keeper.held(), 0);
        // The keeper's task gives it back at its next turn; no time needs to pass.
        for _ in 0..100 {
            if expiring.held().await == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(expiring.held().await, 0);
        running.abort();
    }

    /// At exit the keeper gives back every lease still held and every one dropped unreleased,
    /// then stops; `release_at_exit` waits for that.
    #[test]
    fn at_exit_every_lease_is_given_back() {
        let expiring = Arc::new(Expiring::default());
        let store: Arc<dyn ConnStore> = expiring.clone();
        let keeper = LeaseKeeper::new(store.clone());
        assert_eq!(keeper.release_at_exit(Duration::from_secs(1)), 0, "no keeper running: nothing to wait for");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let zone = [KeyedConn::new("conn", "a", 5)];
        let keys = vec![LeaseKey { zone: "conn".into(), key: b"a".to_vec() }];
        let mut leases = Vec::new();
        for id in ["1", "2", "3"] {
            assert!(rt.block_on(store.acquire(&zone, id)).unwrap().admitted);
            leases.push(Lease::hold(store.clone(), keys.clone(), id.into(), &Unobserved, &keeper));
        }
        drop(leases.pop());
        let running = std::thread::spawn({
            let keeper = keeper.clone();
            move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(keeper.run());
            }
        });
        while !keeper.running.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        keeper.release_at_exit(Duration::from_secs(10));
        assert_eq!(rt.block_on(expiring.held()), 0, "held and dropped leases given back");
        running.join().expect("the keeper stops after giving them back");
    }

    /// On a store where leases never expire nothing is kept, and a dropped lease goes back at
    /// once, without any task.
    #[tokio::test]
    async fn in_process_leases_need_no_keeper() {
        let memory = Arc::new(MemoryConnStore::default());
        let store: Arc<dyn ConnStore> = memory.clone();
        let keeper = LeaseKeeper::new(store.clone());
        let zone = [KeyedConn::new("conn", "a", 5)];
        assert!(store.acquire(&zone, "1").await.unwrap().admitted);
        let keys = vec![LeaseKey { zone: "conn".into(), key: b"a".to_vec() }];
        let lease = Lease::hold(store.clone(), keys, "1".into(), &Unobserved, &keeper);
        assert_eq!(keeper.held(), 0);
        drop(lease);
        assert_eq!(memory.held("conn", b"a").await.unwrap(), 0);
    }
}
