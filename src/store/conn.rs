//! Concurrency caps (nginx `limit_conn`): at most N requests in flight per key. A request takes
//! one lease in every conn zone of its route, all or none, and gives it back when it ends.
//! In Redis a lease expires unless renewed, so a crashed proxy's slots come back by themselves.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use super::StoreError;

/// One conn zone of one request.
#[derive(Debug, Clone, Copy)]
pub struct ConnCheck<'a> {
    pub zone: &'a str,
    pub key: &'a [u8],
    pub max: u32,
}

/// Where a held lease lives, to renew and release it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseKey {
    pub zone: String,
    pub key: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnVerdict {
    pub admitted: bool,
    /// Index of the first zone at its max, when rejected.
    pub rejected: Option<usize>,
    /// Leases each zone held before this request.
    pub held: Vec<u32>,
}

#[async_trait]
pub trait ConnStore: Send + Sync {
    /// Takes `lease` in every zone if each holds fewer than its max; otherwise takes nothing.
    async fn acquire(&self, checks: &[ConnCheck<'_>], lease: &str) -> Result<ConnVerdict, StoreError>;
    /// Extends a held lease (only where it still exists).
    async fn renew(&self, keys: &[LeaseKey], lease: &str) -> Result<(), StoreError>;
    async fn release(&self, keys: &[LeaseKey], lease: &str) -> Result<(), StoreError>;
    /// How often a held lease must be renewed; `None` when leases never expire (in-process).
    fn renew_every(&self) -> Option<Duration>;
    /// Leases held for one key (admin API, tests).
    async fn held(&self, zone: &str, key: &[u8]) -> Result<u32, StoreError>;
}

/// In-process counters: exact for one instance; a lease is a count released by its request.
#[derive(Default)]
pub struct MemoryConnStore {
    counts: Mutex<HashMap<(String, Vec<u8>), u32>>,
}

impl MemoryConnStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, Vec<u8>), u32>> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn acquire_now(&self, checks: &[ConnCheck<'_>]) -> ConnVerdict {
        let mut counts = self.lock();
        let held: Vec<u32> =
            checks.iter().map(|c| counts.get(&(c.zone.to_string(), c.key.to_vec())).copied().unwrap_or(0)).collect();
        let rejected = checks.iter().zip(&held).position(|(c, &h)| h >= c.max);
        if rejected.is_none() {
            for c in checks {
                *counts.entry((c.zone.to_string(), c.key.to_vec())).or_insert(0) += 1;
            }
        }
        ConnVerdict { admitted: rejected.is_none(), rejected, held }
    }

    pub fn release_now(&self, keys: &[LeaseKey]) {
        let mut counts = self.lock();
        for k in keys {
            let id = (k.zone.clone(), k.key.clone());
            if let Some(count) = counts.get_mut(&id) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    counts.remove(&id);
                }
            }
        }
    }
}

#[async_trait]
impl ConnStore for MemoryConnStore {
    async fn acquire(&self, checks: &[ConnCheck<'_>], _lease: &str) -> Result<ConnVerdict, StoreError> {
        Ok(self.acquire_now(checks))
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

    async fn held(&self, zone: &str, key: &[u8]) -> Result<u32, StoreError> {
        Ok(self.lock().get(&(zone.to_string(), key.to_vec())).copied().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_or_none_and_release() {
        let store = MemoryConnStore::default();
        let a = ConnCheck { zone: "a", key: b"k", max: 2 };
        let b = ConnCheck { zone: "b", key: b"k", max: 1 };
        let first = store.acquire_now(&[a, b]);
        assert!(first.admitted);
        let second = store.acquire_now(&[a, b]);
        assert_eq!(second, ConnVerdict { admitted: false, rejected: Some(1), held: vec![1, 1] });
        // The rejection took nothing in zone a.
        assert!(store.acquire_now(&[a]).admitted);
        assert!(!store.acquire_now(&[a]).admitted);
        let keys =
            [LeaseKey { zone: "a".into(), key: b"k".to_vec() }, LeaseKey { zone: "b".into(), key: b"k".to_vec() }];
        store.release_now(&keys);
        assert!(store.acquire_now(&[b]).admitted);
        store.release_now(&keys[..1]);
        store.release_now(&keys);
        store.release_now(&keys);
        assert!(store.lock().is_empty(), "counts return to zero and are removed");
    }
}
