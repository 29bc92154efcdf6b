//! Puts the shared store behind a circuit breaker and a deny cache, so a flood from one client
//! costs Redis about one call per retry period, and a dead Redis costs nothing at all.
//!
//! While the circuit is open, `decide` fails at once with [`StoreError::CircuitOpen`] and the
//! caller applies the route's failure policy; a background task pings the store and closes the
//! circuit as soon as it answers.

mod breaker;
mod deny_cache;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tracing::{info, warn};

use self::breaker::{Breaker, Transition};
use self::deny_cache::{DenyCache, DenyKey};
use crate::limit::{Clock, State, Verdict};
use crate::metrics::METRICS;
use crate::store::{
    refused_unread, ConnStore, ConnVerdict, FleetSync, KeyedConn, KeyedZone, LeaseKey, LimitStore, StoreAdmin,
    StoreError, StoreHealth,
};

pub struct GuardedStore {
    inner: Arc<dyn LimitStore>,
    /// The same store's operator side: the breaker's probe pings it, the admin's calls pass to it.
    admin: Arc<dyn StoreAdmin>,
    /// The same store's concurrency leases, behind the same breaker.
    conn: Option<Arc<dyn ConnStore>>,
    breaker: Arc<Breaker>,
    deny_cache: DenyCache,
    clock: Arc<dyn Clock>,
    probe_interval: Duration,
    /// The error of the latest failed call, for the log and `/readyz`.
    last_error: Arc<Mutex<Option<String>>>,
}

impl GuardedStore {
    pub fn new<S: LimitStore + StoreAdmin + 'static>(
        store: Arc<S>,
        clock: Arc<dyn Clock>,
        breaker_failures: u32,
        deny_cache_size: usize,
        probe_interval: Duration,
    ) -> Self {
        Self {
            inner: store.clone(),
            admin: store,
            conn: None,
            breaker: Arc::new(Breaker::new(breaker_failures)),
            deny_cache: DenyCache::new(deny_cache_size),
            clock,
            probe_interval,
            last_error: Arc::default(),
        }
    }

    /// Also guards `conn`, the concurrency side of the same store.
    pub fn with_conn(mut self, conn: Arc<dyn ConnStore>) -> Self {
        self.conn = Some(conn);
        self
    }

    fn conn(&self) -> Result<&Arc<dyn ConnStore>, StoreError> {
        self.conn.as_ref().ok_or_else(|| StoreError::Reply("this store keeps no concurrency leases".into()))
    }

    /// Fails at once while the circuit is open: the store is not called. Plain functions around
    /// the call (not an `async` wrapper), so the guard's futures hold nothing more than the call's.
    fn closed(&self) -> Result<(), StoreError> {
        if self.breaker.is_open() {
            return Err(StoreError::CircuitOpen);
        }
        Ok(())
    }

    /// Counts the outcome of a call for the breaker, starting the probe when it opens; hands it on.
    fn observed<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        match &result {
            Ok(_) => self.breaker.record_success(),
            Err(e) => {
                *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                if self.breaker.record_failure() == Transition::Opened {
                    self.start_probe();
                }
            }
        }
        result
    }

    pub fn circuit_open(&self) -> bool {
        self.breaker.is_open()
    }

    /// Probes the store until it answers *and accepts writes* (a Redis that answers PING but
    /// refuses writes with `OOM` or `BUSY` cannot decide: closing on a PING made the circuit flap),
    /// then closes the circuit. Runs on the caller's runtime (the proxy's), like the store's own
    /// connection.
    fn start_probe(&self) {
        let (inner, breaker, interval) = (self.admin.clone(), self.breaker.clone(), self.probe_interval);
        let last_error = self.last_error.clone();
        METRICS.store_circuit_open.set(1);
        METRICS.store_circuit_opens.inc();
        let error = last_error.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default();
        warn!(store = inner.kind(), error = %error, "limit store failing: circuit open, the failure policy applies until a probe succeeds");
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                match inner.ping().await {
                    Ok(()) => {
                        breaker.close();
                        METRICS.store_circuit_open.set(0);
                        info!(store = inner.kind(), "limit store answers again: circuit closed");
                        return;
                    }
                    Err(e) => *last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string()),
                }
            }
        });
    }

    fn deny_key(check: &KeyedZone<'_>) -> DenyKey {
        DenyKey {
            zone: check.zone.into(),
            key: check.key.as_slice().into(),
            burst: check.limit.burst,
            cost: check.cost,
        }
    }
}

#[async_trait]
impl LimitStore for GuardedStore {
    async fn decide(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        // A known rejection holds whatever Redis's health: ask the deny cache before the breaker.
        let now_us = self.clock.now_us();
        // Checked before any key is built: each is two allocations per zone.
        if self.deny_cache.holds_any() {
            let denied: Vec<Option<u64>> =
                zones.iter().map(|c| self.deny_cache.denied_until(&Self::deny_key(c), now_us)).collect();
            if denied.iter().any(Option::is_some) {
                METRICS.deny_cache_hits.inc();
                // The cached zones reject until their time.
                let retry = |n: usize| denied[n].map(|until| until.saturating_sub(now_us));
                return Ok(refused_unread(zones, retry, now_us));
            }
        }
        self.closed()?;
        // The result is bound before `observed` is called: as its argument, the call's `self` would
        // be held across the await, a word more in every decision's future.
        let result = self.inner.decide(zones).await;
        let verdict = self.observed(result)?;
        if !verdict.admitted {
            for (check, zone) in zones.iter().zip(&verdict.zones) {
                if let (false, Some(retry)) = (zone.admitted, zone.retry_after_us) {
                    // `now_us` was read before the store's own clock: the entry expires slightly
                    // early, never late.
                    self.deny_cache.insert(Self::deny_key(check), now_us + retry, now_us);
                }
            }
        }
        Ok(verdict)
    }

    /// Through the breaker, not the deny cache: a check writes nothing to remember.
    async fn peek(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        self.closed()?;
        let result = self.inner.peek(zones).await;
        self.observed(result)
    }

    /// Through the breaker, not the deny cache: a charge is never refused.
    async fn charge(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        self.closed()?;
        let result = self.inner.charge(zones).await;
        self.observed(result)
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
}

/// The operator's calls pass to the store as they are, not through the breaker (an inspection or a
/// reset is worth trying while the probe waits; each is bounded by the store's timeout), except the
/// fleet sync, which fails with `CircuitOpen` while it is open; the guard adds its own state: a
/// reset reaches the deny cache, and an open circuit makes the store unready.
#[async_trait]
impl StoreAdmin for GuardedStore {
    fn kind(&self) -> &'static str {
        self.admin.kind()
    }

    async fn inspect(&self, zone: &str, key: &[u8]) -> Result<Option<State>, StoreError> {
        self.admin.inspect(zone, key).await
    }

    async fn held(&self, zone: &str, key: &[u8]) -> Result<u32, StoreError> {
        self.admin.held(zone, key).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.admin.ping().await
    }

    async fn zone_keys(&self, budget: u64) -> Result<crate::store::ZoneKeys, StoreError> {
        self.admin.zone_keys(budget).await
    }

    async fn lease_holders(
        &self,
        zone: &str,
        key: &[u8],
    ) -> Result<Option<Vec<crate::store::LeaseHolder>>, StoreError> {
        self.admin.lease_holders(zone, key).await
    }

    /// Resets the key in the store, then here: this instance's deny cache lets it through at once;
    /// the others' forget it when they read the reset (`sync_fleet`).
    async fn reset(&self, zone: &str, key: &[u8]) -> Result<(), StoreError> {
        let result = self.admin.reset(zone, key).await;
        self.deny_cache.forget(zone, key);
        result
    }

    /// Behind the breaker like a decision: an open circuit answers at once.
    async fn quota_ledger(
        &self,
        zone: &str,
        key: &[u8],
        op: &str,
        args: &[String],
    ) -> Result<Option<Vec<String>>, StoreError> {
        self.closed()?;
        self.admin.quota_ledger(zone, key, op, args).await
    }

    /// The fleet's resets reach this instance's deny cache here.
    async fn sync_fleet(
        &self,
        instance: &str,
        view: Option<Vec<u8>>,
        forget: &[String],
    ) -> Result<Option<FleetSync>, StoreError> {
        self.closed()?;
        let sync = self.admin.sync_fleet(instance, view, forget).await?;
        for (zone, key) in sync.iter().flat_map(|s| s.resets.iter()) {
            self.deny_cache.forget(zone, key);
        }
        Ok(sync)
    }

    /// Not ready while the circuit is open (every decision goes to the failure policy), with the
    /// error that opened it or the probe's latest.
    async fn health(&self) -> StoreHealth {
        let mut health = self.admin.health().await;
        if self.breaker.is_open() {
            let error = self.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default();
            health.ready = false;
            health.reason = Some(format!("circuit open: the failure policy answers every request ({error})"));
        }
        health
    }
}

#[async_trait]
impl ConnStore for GuardedStore {
    async fn acquire(&self, zones: &[KeyedConn<'_>], lease: &str) -> Result<ConnVerdict, StoreError> {
        self.closed()?;
        let result = self.conn()?.acquire(zones, lease).await;
        self.observed(result)
    }

    // Renewals and releases are attempted even while the circuit is open: a lease given back late
    // only holds a slot until its TTL, but one never given back would hold it that long for sure.
    async fn renew(&self, keys: &[LeaseKey], lease: &str) -> Result<(), StoreError> {
        self.conn()?.renew(keys, lease).await
    }

    async fn release(&self, keys: &[LeaseKey], lease: &str) -> Result<(), StoreError> {
        self.conn()?.release(keys, lease).await
    }

    fn renew_every(&self) -> Option<Duration> {
        self.conn.as_ref().and_then(|c| c.renew_every())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, DelayPolicy, LimitReq, ManualClock, Rate};
    use crate::store::MemoryStore;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const T0: u64 = 1_700_000_000_000_000;

    /// A store that counts calls and can be made to fail.
    struct Counting {
        inner: MemoryStore,
        calls: AtomicUsize,
        pings: AtomicUsize,
        failing: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl LimitStore for Counting {
        async fn decide(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.failing.load(Ordering::SeqCst) {
                return Err(StoreError::Reply("down".into()));
            }
            self.inner.decide(zones).await
        }
        fn kind(&self) -> &'static str {
            "counting"
        }
    }

    /// The admin's calls go to the memory store, which keeps the state; the probe sees `failing`.
    #[async_trait]
    impl StoreAdmin for Counting {
        fn kind(&self) -> &'static str {
            "counting"
        }
        async fn inspect(&self, zone: &str, key: &[u8]) -> Result<Option<State>, StoreError> {
            self.inner.inspect(zone, key).await
        }
        async fn reset(&self, zone: &str, key: &[u8]) -> Result<(), StoreError> {
            self.inner.reset(zone, key).await
        }
        async fn ping(&self) -> Result<(), StoreError> {
            self.pings.fetch_add(1, Ordering::SeqCst);
            if self.failing.load(Ordering::SeqCst) {
                Err(StoreError::Reply("down".into()))
            } else {
                Ok(())
            }
        }
    }

    fn setup(deny_cache: usize) -> (Arc<ManualClock>, Arc<Counting>, GuardedStore) {
        let clock = Arc::new(ManualClock::new(T0));
        let counting = Arc::new(Counting {
            inner: MemoryStore::new(clock.clone()),
            calls: AtomicUsize::new(0),
            pings: AtomicUsize::new(0),
            failing: false.into(),
        });
        let guarded = GuardedStore::new(counting.clone(), clock.clone(), 3, deny_cache, Duration::from_millis(10));
        (clock, counting, guarded)
    }

    fn check(key: &[u8]) -> KeyedZone<'_> {
        let limit = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("1r/s").unwrap(),
            burst: 0,
            delay: DelayPolicy::NoDelay,
        };
        KeyedZone::new("z", key, limit, 1)
    }

    #[tokio::test]
    async fn a_flood_reaches_the_store_once_per_retry_period_with_the_same_decisions() {
        let (clock, counting, guarded) = setup(100);
        let (reference_clock, _, reference) = setup(0);
        let mut admitted = (0, 0);
        for _ in 0..1000 {
            let a = guarded.decide(&[check(b"k")]).await.unwrap();
            let b = reference.decide(&[check(b"k")]).await.unwrap();
            assert_eq!(a.admitted, b.admitted);
            admitted.0 += a.admitted as u32;
            admitted.1 += b.admitted as u32;
            clock.advance_us(2_000); // 1000 requests over 2 s
            reference_clock.advance_us(2_000);
        }
        assert_eq!(admitted.0, admitted.1);
        // One admitted + one rejected call per 1 s retry period, not 1000 calls.
        assert!(counting.calls.load(Ordering::SeqCst) <= 6, "{}", counting.calls.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_cached_rejection_holds_while_the_circuit_is_open() {
        let (_, counting, guarded) = setup(100);
        assert!(guarded.decide(&[check(b"k")]).await.unwrap().admitted);
        assert!(!guarded.decide(&[check(b"k")]).await.unwrap().admitted);
        counting.failing.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            assert!(guarded.decide(&[check(b"other")]).await.is_err());
        }
        assert!(guarded.circuit_open());
        let v = guarded.decide(&[check(b"k")]).await.unwrap();
        assert!(!v.admitted, "the deny cache still rejects k");
        assert!(matches!(guarded.decide(&[check(b"new")]).await, Err(StoreError::CircuitOpen)));
    }

    /// Lets the probe task run up to its next wait (the clock is paused: nothing else moves it).
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    /// On tokio's paused clock: the probe pings once per interval while the store is down, and
    /// closes the circuit at the first interval after it is back, not before.
    #[tokio::test(start_paused = true)]
    async fn circuit_opens_fails_fast_and_closes_at_the_first_probe_after_the_store_is_back() {
        let (clock, counting, _) = setup(0);
        let probe = Duration::from_secs(1);
        let guarded = GuardedStore::new(counting.clone(), clock, 3, 0, probe);
        counting.failing.store(true, Ordering::SeqCst);
        for _ in 0..2 {
            assert!(guarded.decide(&[check(b"k")]).await.is_err());
        }
        assert!(!guarded.circuit_open(), "2 failures of 3: still closed");
        assert!(guarded.decide(&[check(b"k")]).await.is_err());
        assert!(guarded.circuit_open(), "the 3rd consecutive failure opens it");
        settle().await;
        let calls = counting.calls.load(Ordering::SeqCst);
        assert!(matches!(guarded.decide(&[check(b"k")]).await, Err(StoreError::CircuitOpen)));
        assert_eq!(counting.calls.load(Ordering::SeqCst), calls, "an open circuit does not call the store");

        // Down for 5.5 probe intervals: 5 pings, all failed, the circuit open throughout.
        for _ in 0..11 {
            tokio::time::advance(probe / 2).await;
            settle().await;
            assert!(guarded.circuit_open());
        }
        assert_eq!(counting.pings.load(Ordering::SeqCst), 5, "one ping per probe interval");

        // Back half way to the next probe: still open until that probe, to the millisecond.
        counting.failing.store(false, Ordering::SeqCst);
        tokio::time::advance(probe / 2 - Duration::from_millis(1)).await;
        settle().await;
        assert!(guarded.circuit_open(), "no probe yet");
        assert!(matches!(guarded.decide(&[check(b"k")]).await, Err(StoreError::CircuitOpen)));
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        assert!(!guarded.circuit_open(), "the 6th probe found the store back");
        assert_eq!(counting.pings.load(Ordering::SeqCst), 6);
        assert!(guarded.decide(&[check(b"k")]).await.unwrap().admitted);
        // Closed, the probe is gone: time passing pings nothing more.
        tokio::time::advance(probe * 3).await;
        settle().await;
        assert_eq!(counting.pings.load(Ordering::SeqCst), 6);
    }

    #[tokio::test]
    async fn a_reset_through_the_guard_reaches_the_store_and_the_deny_cache() {
        let (_, counting, guarded) = setup(100);
        assert!(guarded.decide(&[check(b"k")]).await.unwrap().admitted);
        assert!(!guarded.decide(&[check(b"k")]).await.unwrap().admitted, "now in the deny cache");
        assert!(guarded.inspect("z", b"k").await.unwrap().is_some());
        guarded.reset("z", b"k").await.unwrap();
        assert_eq!(guarded.inspect("z", b"k").await.unwrap(), None, "forgotten in the store");
        let calls = counting.calls.load(Ordering::SeqCst);
        assert!(guarded.decide(&[check(b"k")]).await.unwrap().admitted, "and in the deny cache");
        assert_eq!(counting.calls.load(Ordering::SeqCst), calls + 1, "decided by the store, not the cache");
    }

    #[tokio::test]
    async fn an_open_circuit_fails_the_fleet_sync_and_makes_the_store_unready() {
        let (_, counting, guarded) = setup(0);
        assert!(guarded.health().await.ready);
        assert!(matches!(guarded.sync_fleet("me", None, &[]).await, Ok(None)), "memory: no fleet");
        counting.failing.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            assert!(guarded.decide(&[check(b"k")]).await.is_err());
        }
        assert!(guarded.circuit_open());
        assert!(matches!(guarded.sync_fleet("me", None, &[]).await, Err(StoreError::CircuitOpen)));
        let health = guarded.health().await;
        assert!(!health.ready);
        let reason = health.reason.unwrap_or_default();
        assert!(reason.starts_with("circuit open") && reason.contains("down"), "{reason}");
        // An inspection still asks the store: it may answer before the probe does.
        assert_eq!(guarded.inspect("z", b"k").await.unwrap(), None);
    }
}
