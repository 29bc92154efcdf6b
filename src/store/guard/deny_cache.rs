//! The deny cache: when the shared store rejects a key with a retry time, this instance rejects the
//! same request locally until then, without asking the store. Exact for `limit_req`: a rejection
//! changes no state, and other instances can only push the time later, never earlier. Bounded:
//! sharded [`Bounded`] maps (the `lru` crate) with a size cap; when full, an expired entry goes
//! first, else the one that expires first among the least recently used (it saves the fewest
//! store calls).
//!
//! Entries are keyed by everything the retry time depends on — zone, client key, burst and cost —
//! since routes may share a zone's state with different bursts.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::store::bounded::{Bounded, Expiring};

/// Independent maps; the configured size is spread over them.
const SHARDS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DenyKey {
    pub zone: Box<str>,
    pub key: Box<[u8]>,
    pub burst: u64,
    pub cost: u64,
}

/// Denied until this time (µs).
#[derive(Debug, Clone, Copy)]
struct Until(u64);

impl Expiring for Until {
    fn expires_us(&self) -> u64 {
        self.0
    }
}

pub struct DenyCache {
    shards: Vec<Mutex<Bounded<DenyKey, Until>>>,
    /// Entries in all shards. While zero — nobody is being rejected, the common case — a lookup
    /// takes no lock at all.
    len: AtomicUsize,
}

impl DenyCache {
    /// `capacity` 0 turns the cache off.
    pub fn new(capacity: usize) -> Self {
        let shards = if capacity == 0 { 0 } else { SHARDS };
        let shard_capacity = capacity.div_ceil(SHARDS);
        Self {
            shards: (0..shards).map(|_| Mutex::new(Bounded::new(shard_capacity))).collect(),
            len: AtomicUsize::new(0),
        }
    }

    pub fn is_enabled(&self) -> bool {
        !self.shards.is_empty()
    }

    /// Whether any key is held (expired ones included): while not, a caller need not build the
    /// keys to look up — nobody is being rejected, the common case.
    pub fn holds_any(&self) -> bool {
        self.is_enabled() && self.len.load(Ordering::Relaxed) > 0
    }

    /// Until when (µs) the request is known to be rejected, if it is at `now_us`.
    pub fn denied_until(&self, key: &DenyKey, now_us: u64) -> Option<u64> {
        if !self.holds_any() {
            return None;
        }
        let mut shard = self.shard(key);
        let before = shard.len();
        // Any entry, live or not: an expired one is removed here, so that the lock-free fast
        // path above comes back as soon as every rejection has run out.
        let until = match shard.get_mut(key, 0).map(|u| u.0) {
            Some(until) if until > now_us => Some(until),
            Some(_) => {
                shard.remove(key);
                None
            }
            None => None,
        };
        self.account(before, shard.len());
        until
    }

    pub fn insert(&self, key: DenyKey, until_us: u64, now_us: u64) {
        if !self.is_enabled() {
            return;
        }
        let mut shard = self.shard(&key);
        let before = shard.len();
        // Never full: nothing in the deny cache is protected.
        if shard.contains(&key) || shard.make_room(now_us).is_ok() {
            shard.put(key, Until(until_us));
        }
        shard.take_stats();
        self.account(before, shard.len());
    }

    /// Forgets every entry of one client key in a zone, whatever its burst and cost (a reset).
    pub fn forget(&self, zone: &str, key: &[u8]) {
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let before = shard.len();
            shard.remove_where(|k| &*k.zone == zone && &*k.key == key);
            self.account(before, shard.len());
        }
    }

    /// Keeps `len` in step with a shard's change; called under the shard's lock, so it never
    /// stays below the true count.
    fn account(&self, before: usize, after: usize) {
        if after > before {
            self.len.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.len.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    fn shard(&self, key: &DenyKey) -> MutexGuard<'_, Bounded<DenyKey, Until>> {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        let shard = &self.shards[(h.finish() as usize) % self.shards.len()];
        shard.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> DenyKey {
        DenyKey { zone: "z".into(), key: k.as_bytes().into(), burst: 0, cost: 1 }
    }

    #[test]
    fn denies_until_the_retry_time_then_forgets() {
        let c = DenyCache::new(10);
        c.insert(key("a"), 1_000, 0);
        assert_eq!(c.denied_until(&key("a"), 999), Some(1_000));
        assert_eq!(c.denied_until(&key("a"), 1_000), None);
        assert_eq!(c.len(), 0);
        let other_burst = DenyKey { burst: 5, ..key("a") };
        c.insert(key("a"), 2_000, 0);
        assert_eq!(c.denied_until(&other_burst, 0), None);
    }

    #[test]
    fn at_capacity_evicts_the_entry_that_expires_first() {
        // One shard makes the order observable.
        let c = DenyCache { shards: vec![Mutex::new(Bounded::new(2))], len: AtomicUsize::new(0) };
        c.insert(key("a"), 10, 0);
        c.insert(key("b"), 30, 0);
        c.insert(key("a"), 20, 0); // refreshes a
        c.insert(key("c"), 40, 0); // evicts a, the first to expire
        assert_eq!(c.len(), 2);
        assert_eq!(c.denied_until(&key("a"), 0), None);
        assert_eq!(c.denied_until(&key("b"), 0), Some(30));
        assert_eq!(c.denied_until(&key("c"), 0), Some(40));
        c.insert(key("d"), 50, 35); // b has expired: it goes
        assert_eq!(c.denied_until(&key("c"), 35), Some(40));
        assert_eq!(c.denied_until(&key("d"), 35), Some(50));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn forgets_a_key_under_every_burst_and_cost() {
        let c = DenyCache::new(100);
        c.insert(key("a"), 1_000, 0);
        c.insert(DenyKey { burst: 5, cost: 3, ..key("a") }, 1_000, 0);
        c.insert(key("b"), 1_000, 0);
        c.forget("z", b"a");
        assert_eq!(c.len(), 1);
        assert_eq!(c.denied_until(&key("a"), 0), None);
        assert_eq!(c.denied_until(&key("b"), 0), Some(1_000));
    }

    #[test]
    fn disabled_cache_stores_nothing() {
        let c = DenyCache::new(0);
        c.insert(key("a"), 10, 0);
        assert_eq!(c.denied_until(&key("a"), 0), None);
    }
}
