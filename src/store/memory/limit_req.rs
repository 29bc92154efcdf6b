//! `limit_req` in process: each zone's state in a sharded map, decided by the limit model itself
//! under the shards' locks.
//!
//! **Bounded.** A zone holds at most `max_keys` keys (`[[limit_req_zone]] max_keys`, default
//! [`DEFAULT_MAX_KEYS`]); when it is full, expired state goes first, then the live state closest to
//! expiry among the least recently used, never the state of a key that is being rejected
//! (`bounded.rs` says why this cannot be exploited the way nginx's LRU eviction can). When nothing
//! can be evicted, the request is rejected for that zone with a one-second retry (nginx answers its
//! limit status when it cannot allocate a state), and `weir_memory_zone_full_total` counts it.
//! Keys are kept as 64-bit hashes under a per-process random seed: every entry has the same size,
//! so `max_keys` bounds memory (~150 bytes per key; a sliding log adds 8 bytes per entry).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use async_trait::async_trait;
use smallvec::SmallVec;

use super::{ZoneLimits, ZoneMetrics, DEFAULT_MAX_KEYS};
use crate::limit::{charge_all, decide_all, Clock, State, SystemClock, Verdict, ZoneInput};
use crate::store::bounded::{Bounded, Expiring};
use crate::store::{refused_unread, KeyedZone, LimitStore, StoreAdmin, StoreError};

/// Per-request scratch lists, one item per zone of the request: on the stack for the usual few.
type PerZone<T> = SmallVec<[T; 4]>;

/// Keys per shard a zone aims at; a zone has between 1 and [`MAX_SHARDS`] shards.
const KEYS_PER_SHARD: usize = 1024;
const MAX_SHARDS: usize = 64;
/// The retry time of a request refused because its zone is full.
const FULL_RETRY_US: u64 = 1_000_000;

struct Entry {
    state: State,
    expires_us: u64,
    /// Set when the key is rejected: until its retry time it is never evicted.
    protected_until_us: u64,
}

impl Expiring for Entry {
    fn expires_us(&self) -> u64 {
        self.expires_us
    }
    fn protected_until_us(&self) -> u64 {
        self.protected_until_us
    }
}

/// One zone: its shards and its metrics.
struct ZoneTable {
    shards: Box<[Mutex<Bounded<u64, Entry>>]>,
    /// The capacity the shards were last given.
    cap: std::sync::atomic::AtomicUsize,
    metrics: ZoneMetrics,
}

impl ZoneTable {
    fn new(zone: &str, cap: usize) -> Self {
        let shards = (cap / KEYS_PER_SHARD).clamp(1, MAX_SHARDS);
        let per_shard = cap.div_ceil(shards);
        let metrics = ZoneMetrics::new(zone);
        metrics.capacity.set(i64::try_from(per_shard * shards).unwrap_or(i64::MAX));
        Self { shards: (0..shards).map(|_| Mutex::new(Bounded::new(per_shard))).collect(), cap: cap.into(), metrics }
    }

    /// Applies a changed `max_keys` (a reload).
    fn resize(&self, cap: usize) {
        use std::sync::atomic::Ordering;
        // A read on every decision; a write only when the config changed.
        if self.cap.load(Ordering::Relaxed) == cap || self.cap.swap(cap, Ordering::Relaxed) == cap {
            return;
        }
        let per_shard = cap.div_ceil(self.shards.len());
        for shard in self.shards.iter() {
            lock(shard).set_cap(per_shard);
        }
        self.metrics.capacity.set(i64::try_from(per_shard * self.shards.len()).unwrap_or(i64::MAX));
    }

    fn shard_of(&self, hash: u64) -> usize {
        // The high bits: the maps inside hash the low ones again.
        ((hash >> 32) as usize) % self.shards.len()
    }
}

pub struct MemoryStore {
    zones: RwLock<HashMap<Box<str>, Arc<ZoneTable>>>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    limits: ZoneLimits,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

impl MemoryStore {
    /// Every zone holds up to [`DEFAULT_MAX_KEYS`] keys (see [`MemoryStore::with_zone_limits`]).
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            zones: RwLock::new(HashMap::new()),
            hasher: RandomState::new(),
            clock,
            limits: Arc::new(|_| DEFAULT_MAX_KEYS),
        }
    }

    /// Takes each zone's capacity from `limits` (the running config's `max_keys`).
    pub fn with_zone_limits(mut self, limits: ZoneLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The zone's table, made on first use; its capacity follows the config.
    fn table(&self, zone: &str) -> Arc<ZoneTable> {
        let cap = (self.limits)(zone).max(1);
        let found = self.zones.read().unwrap_or_else(|p| p.into_inner()).get(zone).cloned();
        let table = match found {
            Some(table) => table,
            None => {
                let mut zones = self.zones.write().unwrap_or_else(|p| p.into_inner());
                zones.entry(Box::from(zone)).or_insert_with(|| Arc::new(ZoneTable::new(zone, cap))).clone()
            }
        };
        table.resize(cap);
        table
    }

    fn existing_table(&self, zone: &str) -> Option<Arc<ZoneTable>> {
        self.zones.read().unwrap_or_else(|p| p.into_inner()).get(zone).cloned()
    }

    /// Decides synchronously; `decide` is this behind the store trait.
    pub fn decide_now(&self, zones: &[KeyedZone<'_>]) -> Verdict {
        self.decide_with(zones, decide_all)
    }

    /// Charges after the response, synchronously (`LimitStore::charge`): never refused, each zone
    /// capped at its ceiling (`limit::charge_all`), under the same locks as a decision.
    pub fn charge_now(&self, zones: &[KeyedZone<'_>]) -> Verdict {
        self.decide_with(zones, charge_all)
    }

    /// A decision (`decide_all`) or a charge (`charge_all`) of every zone, under their locks, and
    /// its write.
    fn decide_with(&self, zones: &[KeyedZone<'_>], decide: impl Fn(&[ZoneInput<'_>], u64) -> Verdict) -> Verdict {
        let tables: PerZone<Arc<ZoneTable>> = zones.iter().map(|c| self.table(c.zone)).collect();
        let hashes: PerZone<u64> = zones.iter().map(|c| self.hasher.hash_one(c.key.as_slice())).collect();
        // (table, shard) of each check; locked once each, in one global order, so concurrent
        // requests never deadlock.
        let slots: PerZone<(usize, usize)> =
            tables.iter().zip(&hashes).map(|(t, &h)| (Arc::as_ptr(t) as usize, t.shard_of(h))).collect();
        let mut order: PerZone<(usize, usize, usize)> =
            slots.iter().enumerate().map(|(i, &(table, shard))| (table, shard, i)).collect();
        order.sort_unstable();
        order.dedup_by_key(|(table, shard, _)| (*table, *shard));
        let mut guards: PerZone<MutexGuard<'_, Bounded<u64, Entry>>> =
            order.iter().map(|&(_, shard, i)| lock(&tables[i].shards[shard])).collect();
        // The time is read under the locks: of two requests on one key, the one decided second
        // sees the later time, so the order of `decided_us` is the order of the decisions.
        let now_us = self.clock.now_us();
        // Per check, the index of its guard.
        let at: PerZone<usize> = slots
            .iter()
            .map(|slot| order.binary_search_by_key(slot, |&(table, shard, _)| (table, shard)).unwrap_or(0))
            .collect();
        let lens_before: PerZone<usize> = guards.iter().map(|g| g.len()).collect();

        let mut inputs: PerZone<ZoneInput<'_>> = SmallVec::with_capacity(zones.len());
        for ((check, &g), hash) in zones.iter().zip(&at).zip(&hashes) {
            let state = guards[g].get_mut(hash, now_us).map(|e| e.state.clone());
            inputs.push(ZoneInput { limit: &check.limit, state, cost: check.cost });
        }
        let mut verdict = decide(&inputs, now_us);
        if verdict.admitted {
            // Room for every new key first, so that a full zone refuses the request before any
            // zone is charged (all or nothing).
            let mut full = None;
            for (n, (input, &g)) in inputs.iter().zip(&at).enumerate() {
                if input.state.is_none() && guards[g].make_room(now_us).is_err() {
                    full = Some(n);
                    break;
                }
            }
            match full {
                Some(n) => {
                    tables[n].metrics.full.inc();
                    // That zone rejects with a short retry; nothing was written.
                    verdict = refused_unread(zones, |i| (i == n).then_some(FULL_RETRY_US), now_us);
                }
                None => {
                    for ((zone, &g), &hash) in verdict.zones.iter().zip(&at).zip(&hashes) {
                        let entry =
                            Entry { state: zone.next.clone(), expires_us: zone.expires_us, protected_until_us: 0 };
                        guards[g].put(hash, entry);
                    }
                }
            }
        } else {
            // A rejected key keeps its state until its retry time, whatever floods the zone.
            for ((zone, &g), hash) in verdict.zones.iter().zip(&at).zip(&hashes) {
                if let (false, Some(retry)) = (zone.admitted, zone.retry_after_us) {
                    if let Some(entry) = guards[g].get_mut(hash, now_us) {
                        entry.protected_until_us = entry.protected_until_us.max(now_us.saturating_add(retry));
                    }
                }
            }
        }
        for ((guard, before), &(_, _, i)) in guards.iter_mut().zip(lens_before).zip(&order) {
            let metrics = &tables[i].metrics;
            let dropped = guard.take_stats();
            metrics.expired.inc_by(dropped.expired);
            metrics.evicted.inc_by(dropped.evicted);
            metrics.keys.add(guard.len() as i64 - before as i64);
        }
        verdict
    }

    /// What `decide_now` would say, writing nothing (`LimitStore::peek`). Each key is read under
    /// its own lock; a peek is a check, not a charge, so it needs no atomicity across zones.
    pub fn peek_now(&self, zones: &[KeyedZone<'_>]) -> Verdict {
        let now_us = self.clock.now_us();
        let states: PerZone<Option<State>> = zones.iter().map(|c| self.state(c.zone, &c.key)).collect();
        let inputs: PerZone<ZoneInput<'_>> =
            zones.iter().zip(states).map(|(c, state)| ZoneInput { limit: &c.limit, state, cost: c.cost }).collect();
        decide_all(&inputs, now_us)
    }

    /// The live state of one key, for tests and the admin API.
    pub fn state(&self, zone: &str, key: &[u8]) -> Option<State> {
        let now_us = self.clock.now_us();
        let table = self.existing_table(zone)?;
        let hash = self.hasher.hash_one(key);
        let shard = lock(&table.shards[table.shard_of(hash)]);
        shard.peek(&hash, now_us).map(|e| e.state.clone())
    }

    /// Forgets one key's state (admin reset).
    pub fn forget(&self, zone: &str, key: &[u8]) {
        let Some(table) = self.existing_table(zone) else { return };
        let hash = self.hasher.hash_one(key);
        if lock(&table.shards[table.shard_of(hash)]).remove(&hash) {
            table.metrics.keys.add(-1);
        }
    }

    /// Number of keys held, expired or not (memory accounting).
    pub fn len(&self) -> usize {
        let zones = self.zones.read().unwrap_or_else(|p| p.into_inner());
        zones.values().map(|t| t.shards.iter().map(|s| lock(s).len()).sum::<usize>()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A poisoned shard only means another request panicked mid-update of plain numbers: keep serving.
fn lock<T>(shard: &Mutex<T>) -> MutexGuard<'_, T> {
    shard.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait]
impl LimitStore for MemoryStore {
    async fn decide(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        Ok(self.decide_now(zones))
    }

    fn in_process(&self) -> Option<&MemoryStore> {
        Some(self)
    }

    async fn peek(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        Ok(self.peek_now(zones))
    }

    async fn charge(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        Ok(self.charge_now(zones))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

/// No fleet and nothing to ping: the trait's defaults answer those.
#[async_trait]
impl StoreAdmin for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn inspect(&self, zone: &str, key: &[u8]) -> Result<Option<State>, StoreError> {
        Ok(self.state(zone, key))
    }

    async fn reset(&self, zone: &str, key: &[u8]) -> Result<(), StoreError> {
        self.forget(zone, key);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, DelayPolicy, LimitReq, ManualClock, Rate};

    const T0: u64 = 1_700_000_000_000_000;

    fn check<'a>(zone: &'a str, key: &'a [u8], burst: u64) -> KeyedZone<'a> {
        let limit = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("1r/s").unwrap(),
            burst,
            delay: DelayPolicy::NoDelay,
        };
        KeyedZone::new(zone, key, limit, 1)
    }

    #[test]
    fn peek_says_what_decide_would_and_writes_nothing() {
        let store = MemoryStore::new(Arc::new(ManualClock::new(T0)));
        for _ in 0..5 {
            assert!(store.peek_now(&[check("a", b"k", 0)]).admitted, "a peek never charges");
        }
        assert!(store.state("a", b"k").is_none(), "nothing written");
        assert!(store.decide_now(&[check("a", b"k", 0)]).admitted);
        let before = store.state("a", b"k");
        let peeked = store.peek_now(&[check("a", b"k", 0)]);
        assert!(!peeked.admitted, "full: the peek refuses like a decision would");
        assert_eq!(peeked.retry_after_us, store.decide_now(&[check("a", b"k", 0)]).retry_after_us);
        assert_eq!(store.state("a", b"k"), before);
    }

    #[test]
    fn keys_and_zones_are_independent() {
        let store = MemoryStore::new(Arc::new(ManualClock::new(T0)));
        assert!(store.decide_now(&[check("a", b"k1", 0)]).admitted);
        assert!(!store.decide_now(&[check("a", b"k1", 0)]).admitted);
        assert!(store.decide_now(&[check("a", b"k2", 0)]).admitted);
        assert!(store.decide_now(&[check("b", b"k1", 0)]).admitted);
    }

    #[test]
    fn rejection_in_one_zone_leaves_the_other_uncharged() {
        let store = MemoryStore::new(Arc::new(ManualClock::new(T0)));
        assert!(store.decide_now(&[check("tight", b"k", 0)]).admitted);
        let v = store.decide_now(&[check("loose", b"k", 10), check("tight", b"k", 0)]);
        assert!(!v.admitted);
        assert_eq!(store.state("loose", b"k"), None);
    }

    fn capped(clock: Arc<ManualClock>, max_keys: usize) -> MemoryStore {
        MemoryStore::new(clock).with_zone_limits(Arc::new(move |_| max_keys))
    }

    #[test]
    fn drained_state_is_absent_and_dropped_to_make_room() {
        let clock = Arc::new(ManualClock::new(T0));
        let store = capped(clock.clone(), 100);
        for i in 0..100u32 {
            assert!(store.decide_now(&[check("z", &i.to_be_bytes(), 0)]).admitted);
        }
        assert_eq!(store.len(), 100);
        clock.advance_us(1_000_001);
        assert_eq!(store.state("z", &0u32.to_be_bytes()), None);
        for i in 100..200u32 {
            assert!(store.decide_now(&[check("z", &i.to_be_bytes(), 0)]).admitted);
        }
        assert_eq!(store.len(), 100, "expired keys made room; the cap holds");
    }

    #[test]
    fn a_flood_of_new_keys_never_frees_a_limited_key() {
        let clock = Arc::new(ManualClock::new(T0));
        let store = capped(clock.clone(), 64);
        // The victim uses its burst and is rejected: far from drained, and protected.
        for _ in 0..6 {
            store.decide_now(&[check("z", b"victim", 5)]);
        }
        assert!(!store.decide_now(&[check("z", b"victim", 5)]).admitted);
        for i in 0..10_000u32 {
            clock.advance_us(10);
            assert!(store.decide_now(&[check("z", &i.to_be_bytes(), 5)]).admitted, "new keys find room");
        }
        assert!(store.len() <= 64);
        assert!(!store.decide_now(&[check("z", b"victim", 5)]).admitted, "still limited");
        let level = match store.state("z", b"victim") {
            Some(State::Bucket(b)) => b.level,
            other => panic!("victim's state lost: {other:?}"),
        };
        assert!(level > 5.0, "{level}");
    }

    #[test]
    fn a_zone_full_of_rejected_keys_refuses_new_ones_without_charging_anything() {
        let clock = Arc::new(ManualClock::new(T0));
        let store = capped(clock.clone(), 2);
        for key in [b"a", b"b"] {
            assert!(store.decide_now(&[check("z", key, 1)]).admitted);
            assert!(store.decide_now(&[check("z", key, 1)]).admitted);
            assert!(!store.decide_now(&[check("z", key, 1)]).admitted, "protected for 1 s, drained in 2 s");
        }
        let v = store.decide_now(&[check("other", b"c", 0), check("z", b"c", 0)]);
        assert!(!v.admitted);
        assert_eq!(v.retry_after_us, Some(FULL_RETRY_US));
        assert!(v.zones[0].admitted && !v.zones[1].admitted);
        assert_eq!(store.state("other", b"c"), None, "the other zone was not charged");
        clock.advance_us(999_999);
        assert!(!store.decide_now(&[check("z", b"c", 0)]).admitted);
        // Once the rejected keys' retry time has come, the live one closest to expiry may go.
        clock.advance_us(1);
        assert!(store.decide_now(&[check("z", b"c", 0)]).admitted);
        assert_eq!(store.len(), 2);
    }
}
