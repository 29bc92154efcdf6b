//! The operator's side of the in-process stores: rate-limit state (`MemoryStore`) and lease counts
//! (`MemoryConnStore`) are kept apart, and the admin asks one object for both, as it asks the
//! guarded Redis store.

use std::sync::Arc;

use async_trait::async_trait;

use super::{MemoryConnStore, MemoryStore};
use crate::limit::State;
use crate::store::{StoreAdmin, StoreError};

/// The process's memory stores, for the admin API: state and resets from `limits`, leases held from
/// `conns`. Made from the same `Arc`s the engine decides on.
pub struct MemoryAdmin {
    pub limits: Arc<MemoryStore>,
    pub conns: Arc<MemoryConnStore>,
}

#[async_trait]
impl StoreAdmin for MemoryAdmin {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn inspect(&self, zone: &str, key: &[u8]) -> Result<Option<State>, StoreError> {
        self.limits.inspect(zone, key).await
    }

    async fn held(&self, zone: &str, key: &[u8]) -> Result<u32, StoreError> {
        self.conns.held(zone, key).await
    }

    async fn reset(&self, zone: &str, key: &[u8]) -> Result<(), StoreError> {
        self.limits.reset(zone, key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, DelayPolicy, LimitReq, ManualClock, Rate};
    use crate::store::{decided_at_once, KeyedConn, KeyedZone};

    #[test]
    fn answers_for_both_stores_it_was_made_from() {
        let limits = Arc::new(MemoryStore::new(Arc::new(ManualClock::new(1_700_000_000_000_000))));
        let conns = Arc::new(MemoryConnStore::default());
        let admin = MemoryAdmin { limits: limits.clone(), conns: conns.clone() };
        let limit = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("1r/s").expect("rate"),
            burst: 0,
            delay: DelayPolicy::NoDelay,
        };
        assert!(limits.decide_now(&[KeyedZone::new("z", b"k".as_slice(), limit, 1)]).admitted);
        assert!(conns.acquire_now(&[KeyedConn::new("c", b"k".as_slice(), 2)]).admitted);
        assert!(decided_at_once(admin.inspect("z", b"k")).expect("memory").is_some());
        assert_eq!(decided_at_once(admin.held("c", b"k")).expect("memory"), 1);
        decided_at_once(admin.reset("z", b"k")).expect("memory");
        assert_eq!(limits.state("z", b"k"), None, "the engine's store forgot the key");
        assert!(limits.decide_now(&[KeyedZone::new("z", b"k".as_slice(), limit, 1)]).admitted);
    }
}
