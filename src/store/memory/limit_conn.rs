//! The in-process twin of the concurrency store: exact for one instance, a lease is a count that
//! its request gives back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::{ZoneLimits, ZoneMetrics, DEFAULT_MAX_KEYS};
use crate::store::{ConnStore, ConnVerdict, KeyedConn, LeaseKey, StoreAdmin, StoreError};

/// In-process counters: exact for one instance; a lease is a count released by its request.
///
/// Bounded like the memory store's zones: a zone holds counts for at most `max_keys` keys. Every
/// count is a request in flight, so none can be evicted: a new key in a full zone is rejected by
/// that zone (nginx's `limit_conn` answers its status when it cannot allocate a node), counted in
/// `weir_memory_zone_full_total`.
pub struct MemoryConnStore {
    inner: Mutex<Counts>,
    limits: ZoneLimits,
}

#[derive(Default)]
struct Counts {
    counts: HashMap<(String, Vec<u8>), u32>,
    /// Per zone: keys held, the capacity last applied, and the zone's metrics.
    zones: HashMap<String, (usize, usize, ZoneMetrics)>,
}

impl Default for MemoryConnStore {
    fn default() -> Self {
        Self { inner: Mutex::new(Counts::default()), limits: Arc::new(|_| DEFAULT_MAX_KEYS) }
    }
}

impl Counts {
    fn zone(&mut self, zone: &str) -> &mut (usize, usize, ZoneMetrics) {
        if !self.zones.contains_key(zone) {
            self.zones.insert(zone.to_string(), (0, 0, ZoneMetrics::new(zone)));
        }
        // Just inserted if it was missing.
        self.zones.get_mut(zone).expect("zone entry")
    }
}

impl MemoryConnStore {
    /// Takes each zone's capacity from `limits` (the running config's `max_keys`).
    pub fn with_zone_limits(mut self, limits: ZoneLimits) -> Self {
        self.limits = limits;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn acquire_now(&self, conns: &[KeyedConn<'_>]) -> ConnVerdict {
        let caps: Vec<usize> = conns.iter().map(|c| (self.limits)(c.zone).max(1)).collect();
        let mut inner = self.lock();
        let held: Vec<u32> = conns
            .iter()
            .map(|c| inner.counts.get(&(c.zone.to_string(), c.key.to_vec())).copied().unwrap_or(0))
            .collect();
        let mut rejected = conns.iter().zip(&held).position(|(c, &h)| h >= c.max);
        if rejected.is_none() {
            // A new key needs room in its zone; counts of requests in flight are never evicted.
            for (i, (c, (&h, &cap))) in conns.iter().zip(held.iter().zip(&caps)).enumerate() {
                let (keys, applied, metrics) = inner.zone(c.zone);
                if *applied != cap {
                    *applied = cap;
                    metrics.capacity.set(i64::try_from(cap).unwrap_or(i64::MAX));
                }
                if h == 0 && *keys >= cap {
                    metrics.full.inc();
                    rejected = Some(i);
                    break;
                }
            }
        }
        if rejected.is_none() {
            for c in conns {
                let count = inner.counts.entry((c.zone.to_string(), c.key.to_vec())).or_insert(0);
                *count += 1;
                if *count == 1 {
                    let (keys, _, metrics) = inner.zone(c.zone);
                    *keys += 1;
                    metrics.keys.inc();
                }
            }
        }
        ConnVerdict { admitted: rejected.is_none(), rejected, held }
    }

    pub fn release_now(&self, keys: &[LeaseKey]) {
        let mut inner = self.lock();
        for k in keys {
            let id = (k.zone.clone(), k.key.clone());
            if let Some(count) = inner.counts.get_mut(&id) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    inner.counts.remove(&id);
                    let (held, _, metrics) = inner.zone(&k.zone);
                    *held = held.saturating_sub(1);
                    metrics.keys.dec();
                }
            }
        }
    }
}

#[async_trait]
impl ConnStore for MemoryConnStore {
    async fn acquire(&self, conns: &[KeyedConn<'_>], _lease: &str) -> Result<ConnVerdict, StoreError> {
        Ok(self.acquire_now(conns))
    }

    async fn renew(&self, _keys: &[LeaseKey], _lease: &str) -> Result<(), StoreError> {
        Ok(())
    }

    async fn release(&self, keys: &[LeaseKey], _lease: &str) -> Result<(), StoreError> {
        self.release_now(keys);
        Ok(())
    }

    fn renew_every(&self) -> Option<Duration> {
        None
    }
}

/// Counts leases only: the rate-limit side's calls are `MemoryStore`'s.
#[async_trait]
impl StoreAdmin for MemoryConnStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn held(&self, zone: &str, key: &[u8]) -> Result<u32, StoreError> {
        Ok(self.lock().counts.get(&(zone.to_string(), key.to_vec())).copied().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_or_none_and_release() {
        let store = MemoryConnStore::default();
        let a = KeyedConn::new("a", b"k", 2);
        let b = KeyedConn::new("b", b"k", 1);
        let both = [a.clone(), b.clone()];
        let first = store.acquire_now(&both);
        assert!(first.admitted);
        let second = store.acquire_now(&both);
        assert_eq!(second, ConnVerdict { admitted: false, rejected: Some(1), held: vec![1, 1] });
        // The rejection took nothing in zone a.
        assert!(store.acquire_now(std::slice::from_ref(&a)).admitted);
        assert!(!store.acquire_now(std::slice::from_ref(&a)).admitted);
        let keys =
            [LeaseKey { zone: "a".into(), key: b"k".to_vec() }, LeaseKey { zone: "b".into(), key: b"k".to_vec() }];
        store.release_now(&keys);
        assert!(store.acquire_now(std::slice::from_ref(&b)).admitted);
        store.release_now(&keys[..1]);
        store.release_now(&keys);
        store.release_now(&keys);
        assert!(store.lock().counts.is_empty(), "counts return to zero and are removed");
    }

    #[test]
    fn a_full_zone_refuses_new_keys_and_takes_nothing() {
        let store = MemoryConnStore::default().with_zone_limits(Arc::new(|zone| if zone == "small" { 2 } else { 100 }));
        let check = |zone, key| KeyedConn::new(zone, key, 5);
        assert!(store.acquire_now(&[check("small", b"a")]).admitted);
        assert!(store.acquire_now(&[check("small", b"b")]).admitted);
        assert!(store.acquire_now(&[check("small", b"a")]).admitted, "a held key has room");
        let v = store.acquire_now(&[check("big", b"c"), check("small", b"c")]);
        assert_eq!(v, ConnVerdict { admitted: false, rejected: Some(1), held: vec![0, 0] });
        assert_eq!(store.lock().counts.get(&("big".to_string(), b"c".to_vec())), None, "all or none");
        store.release_now(&[LeaseKey { zone: "small".into(), key: b"b".to_vec() }]);
        assert!(store.acquire_now(&[check("small", b"c")]).admitted, "a released key frees its room");
    }
}
