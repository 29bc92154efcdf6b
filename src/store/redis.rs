//! The Redis store. PLACEHOLDER: being written (lua/limit_req.lua + EVALSHA client).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{LimitStore, StoreError, ZoneCheck};
use crate::limit::{Clock, Verdict};

/// Whose clock decides: Redis `TIME` (one clock for the fleet) or the proxy's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisClock {
    Redis,
    Local,
}

#[derive(Debug, Clone)]
pub struct RedisStoreConfig {
    pub url: String,
    pub timeout: Duration,
    pub clock: RedisClock,
    pub key_prefix: String,
}

pub struct RedisStore {
    config: RedisStoreConfig,
    #[allow(dead_code)]
    clock: Arc<dyn Clock>,
}

impl RedisStore {
    /// Parses the URL; does no I/O (the connection is made lazily on the proxy's runtime).
    pub fn new(config: RedisStoreConfig, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        ::redis::Client::open(config.url.as_str())?;
        Ok(Self { config, clock })
    }
}

/// `<prefix><zone>:{<key>}`: the client key is the hash tag, so one client's zones share a slot.
pub fn redis_key(prefix: &str, zone: &str, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + zone.len() + key.len() + 3);
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(zone.as_bytes());
    out.extend_from_slice(b":{");
    out.extend_from_slice(key);
    out.push(b'}');
    out
}

#[async_trait]
impl LimitStore for RedisStore {
    async fn decide(&self, _checks: &[ZoneCheck<'_>]) -> Result<Verdict, StoreError> {
        Err(StoreError::Reply(format!(
            "redis store at {} not implemented yet",
            self.config.url
        )))
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}
