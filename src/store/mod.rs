//! Where limit state lives. Every store answers the same question — "may this request pass, and
//! after how long?" — for all `limit_req` zones of a request at once, all-or-nothing.

mod breaker;
mod conn;
mod deny_cache;
mod guarded;
mod memory;
mod redis;
mod redis_conn;
mod redis_conn_kind;
mod redis_rollback;
mod redis_slots;
mod redis_url;

use std::time::Duration;

use async_trait::async_trait;

use crate::limit::{LimitReq, State, Verdict};

pub use self::conn::{ConnCheck, ConnStore, ConnVerdict, LeaseKey, MemoryConnStore};
pub use self::guarded::GuardedStore;
pub use self::memory::MemoryStore;
pub use self::redis::{redis_key, RedisClock, RedisStore, RedisStoreConfig, RedisTls};
pub use self::redis_slots::key_slot;
pub use self::redis_url::{parse_redis_url, RedisTopology};

/// One zone of one request, as the store sees it.
#[derive(Debug, Clone, Copy)]
pub struct ZoneCheck<'a> {
    /// The zone's stable name: state is keyed by it, so reloads that change a rate keep counters.
    pub zone: &'a str,
    /// The client key (already bounded in length by `keys`). Never empty: empty keys are not limited.
    pub key: &'a [u8],
    pub limit: LimitReq,
    pub cost: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the limit store did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    #[error("unexpected reply from the limit script: {0}")]
    Reply(String),
    #[error("the limit store is unreachable (circuit open; probing in the background)")]
    CircuitOpen,
}

#[async_trait]
pub trait LimitStore: Send + Sync {
    /// Decides every zone of one request atomically: charges all of them or none.
    async fn decide(&self, checks: &[ZoneCheck<'_>]) -> Result<Verdict, StoreError>;

    /// "memory" or "redis", for logs and metrics.
    fn kind(&self) -> &'static str;

    /// The stored state of one key (for the admin API); `None` when absent, i.e. fully drained.
    async fn inspect(&self, zone: &str, key: &[u8]) -> Result<Option<State>, StoreError>;

    /// Whether the store answers now (for readiness).
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
