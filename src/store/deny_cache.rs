//! The deny cache: when the shared store rejects a key with a retry time, this instance rejects the
//! same request locally until then, without asking the store. Exact for `limit_req`: a rejection
//! changes no state, and other instances can only push the time later, never earlier. Bounded:
//! LRUs with a size cap, sharded so concurrent decisions rarely wait on one lock.
//!
//! Entries are keyed by everything the retry time depends on — zone, client key, burst and cost —
//! since routes may share a zone's state with different bursts.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Independent LRUs; the configured size is spread over them.
const SHARDS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DenyKey {
    pub zone: Box<str>,
    pub key: Box<[u8]>,
    pub burst: u64,
    pub cost: u64,
}

#[derive(Default)]
struct Inner {
    /// key → (denied until µs, recency stamp)
    entries: HashMap<DenyKey, (u64, u64)>,
    /// recency stamp → key, oldest first
    by_recency: BTreeMap<u64, DenyKey>,
    next_stamp: u64,
}

pub struct DenyCache {
    shard_capacity: usize,
    shards: Vec<Mutex<Inner>>,
    /// Entries in all shards. While zero — nobody is being rejected, the common case — a lookup
    /// takes no lock at all.
    len: AtomicUsize,
}

impl DenyCache {
    /// `capacity` 0 turns the cache off.
    pub fn new(capacity: usize) -> Self {
        let shards = if capacity == 0 { 0 } else { SHARDS };
        Self {
            shard_capacity: capacity.div_ceil(SHARDS),
            shards: (0..shards).map(|_| Mutex::new(Inner::default())).collect(),
            len: AtomicUsize::new(0),
        }
    }

    pub fn is_enabled(&self) -> bool {
        !self.shards.is_empty()
    }

    /// Until when (µs) the request is known to be rejected, if it is at `now_us`.
    pub fn denied_until(&self, key: &DenyKey, now_us: u64) -> Option<u64> {
        if !self.is_enabled() || self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut inner = self.shard(key);
        let until = inner.entries.get(key)?.0;
        if until > now_us {
            return Some(until);
        }
        if inner.remove(key) {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        None
    }

    pub fn insert(&self, key: DenyKey, until_us: u64) {
        if !self.is_enabled() {
            return;
        }
        let mut inner = self.shard(&key);
        let mut removed = usize::from(inner.remove(&key));
        while inner.entries.len() >= self.shard_capacity {
            match inner.by_recency.pop_first() {
                Some((_, oldest)) => {
                    inner.entries.remove(&oldest);
                    removed += 1;
                }
                None => break,
            }
        }
        let stamp = inner.next_stamp;
        inner.next_stamp += 1;
        inner.by_recency.insert(stamp, key.clone());
        inner.entries.insert(key, (until_us, stamp));
        // Adjusted under the shard's lock, so it never stays below the true count.
        self.len.fetch_add(1, Ordering::Relaxed);
        self.len.fetch_sub(removed, Ordering::Relaxed);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    fn shard(&self, key: &DenyKey) -> MutexGuard<'_, Inner> {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        let shard = &self.shards[(h.finish() as usize) % self.shards.len()];
        shard.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    /// Whether the key was there.
    fn remove(&mut self, key: &DenyKey) -> bool {
        match self.entries.remove(key) {
            Some((_, stamp)) => {
                self.by_recency.remove(&stamp);
                true
            }
            None => false,
        }
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
        c.insert(key("a"), 1_000);
        assert_eq!(c.denied_until(&key("a"), 999), Some(1_000));
        assert_eq!(c.denied_until(&key("a"), 1_000), None);
        assert_eq!(c.len(), 0);
        let other_burst = DenyKey { burst: 5, ..key("a") };
        c.insert(key("a"), 2_000);
        assert_eq!(c.denied_until(&other_burst, 0), None);
    }

    #[test]
    fn evicts_the_least_recently_inserted_at_capacity() {
        // One shard makes the LRU order observable.
        let c = DenyCache { shard_capacity: 2, shards: vec![Mutex::new(Inner::default())], len: AtomicUsize::new(0) };
        c.insert(key("a"), 10);
        c.insert(key("b"), 10);
        c.insert(key("a"), 20); // refreshes a
        c.insert(key("c"), 10); // evicts b
        assert_eq!(c.len(), 2);
        assert_eq!(c.denied_until(&key("b"), 0), None);
        assert_eq!(c.denied_until(&key("a"), 0), Some(20));
        assert_eq!(c.denied_until(&key("c"), 0), Some(10));
    }

    #[test]
    fn disabled_cache_stores_nothing() {
        let c = DenyCache::new(0);
        c.insert(key("a"), 10);
        assert_eq!(c.denied_until(&key("a"), 0), None);
    }
}
