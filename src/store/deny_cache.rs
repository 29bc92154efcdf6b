//! The deny cache: when the shared store rejects a key with a retry time, this instance rejects the
//! same request locally until then, without asking the store. Exact for `limit_req`: a rejection
//! changes no state, and other instances can only push the time later, never earlier. Bounded:
//! an LRU with a size cap.
//!
//! Entries are keyed by everything the retry time depends on — zone, client key, burst and cost —
//! since routes may share a zone's state with different bursts.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DenyKey {
    pub zone: Box<str>,
    pub key: Box<[u8]>,
    pub burst: u64,
    pub cost: u64,
}

struct Inner {
    /// key → (denied until µs, recency stamp)
    entries: HashMap<DenyKey, (u64, u64)>,
    /// recency stamp → key, oldest first
    by_recency: BTreeMap<u64, DenyKey>,
    next_stamp: u64,
}

pub struct DenyCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

impl DenyCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner { entries: HashMap::new(), by_recency: BTreeMap::new(), next_stamp: 0 }),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Until when (µs) the request is known to be rejected, if it is at `now_us`.
    pub fn denied_until(&self, key: &DenyKey, now_us: u64) -> Option<u64> {
        if !self.is_enabled() {
            return None;
        }
        let mut inner = self.lock();
        let until = inner.entries.get(key)?.0;
        if until > now_us {
            return Some(until);
        }
        inner.remove(key);
        None
    }

    pub fn insert(&self, key: DenyKey, until_us: u64) {
        if !self.is_enabled() {
            return;
        }
        let mut inner = self.lock();
        inner.remove(&key);
        while inner.entries.len() >= self.capacity {
            let Some((_, oldest)) = inner.by_recency.pop_first() else {
                break;
            };
            inner.entries.remove(&oldest);
        }
        let stamp = inner.next_stamp;
        inner.next_stamp += 1;
        inner.by_recency.insert(stamp, key.clone());
        inner.entries.insert(key, (until_us, stamp));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    fn remove(&mut self, key: &DenyKey) {
        if let Some((_, stamp)) = self.entries.remove(key) {
            self.by_recency.remove(&stamp);
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
        let c = DenyCache::new(2);
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
