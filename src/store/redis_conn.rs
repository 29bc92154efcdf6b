//! Fleet-wide concurrency leases in Redis through `lua/limit_conn.lua`, on the same connection as
//! the rate limits. Keys are `<prefix>conn:<zone>:{<client key>}` (zone names cannot contain `:`,
//! so they never meet a `limit_req` key).

use std::time::Duration;

use ::redis::Value;
use async_trait::async_trait;

use super::redis::{redis_key, RedisClock, RedisStore};
use super::{ConnCheck, ConnStore, ConnVerdict, LeaseKey, StoreError};

impl RedisStore {
    /// The Redis key of one conn zone's lease set for one client key.
    pub fn conn_key(&self, zone: &str, key: &[u8]) -> Vec<u8> {
        redis_key(&format!("{}conn:", self.config().key_prefix), zone, key)
    }

    /// One call of the conn script; `maxes` only for "acquire".
    async fn conn_call(&self, mode: &str, keys: &[Vec<u8>], lease: &str, maxes: &[u32]) -> Result<Value, StoreError> {
        let mut call = self.conn_script.prepare_invoke();
        for key in keys {
            call.key(key);
        }
        call.arg(mode);
        match self.config().clock {
            RedisClock::Local => call.arg(self.clock().now_us() / 1000),
            RedisClock::Redis => call.arg(""),
        };
        call.arg(self.lease_ttl.as_millis() as u64).arg(lease);
        for max in maxes {
            call.arg(*max);
        }
        self.bounded(async {
            let mut conn = self.connection().await?;
            Ok(call.invoke_async(&mut conn).await?)
        })
        .await
    }

    fn lease_keys(&self, keys: &[LeaseKey]) -> Vec<Vec<u8>> {
        keys.iter().map(|k| self.conn_key(&k.zone, &k.key)).collect()
    }
}

#[async_trait]
impl ConnStore for RedisStore {
    async fn acquire(&self, checks: &[ConnCheck<'_>], lease: &str) -> Result<ConnVerdict, StoreError> {
        let keys: Vec<Vec<u8>> = checks.iter().map(|c| self.conn_key(c.zone, c.key)).collect();
        let maxes: Vec<u32> = checks.iter().map(|c| c.max).collect();
        let reply = self.conn_call("acquire", &keys, lease, &maxes).await?;
        let numbers: Vec<i64> =
            ::redis::from_redis_value(reply).map_err(|e| StoreError::Reply(format!("limit_conn acquire: {e}")))?;
        if numbers.len() != 2 + checks.len() {
            return Err(StoreError::Reply(format!(
                "limit_conn acquire: expected {} values, got {}",
                2 + checks.len(),
                numbers.len()
            )));
        }
        let admitted = numbers[0] == 1;
        let rejected = (!admitted && numbers[1] >= 1).then(|| numbers[1] as usize - 1);
        let held = numbers[2..].iter().map(|&n| n.clamp(0, u32::MAX as i64) as u32).collect();
        Ok(ConnVerdict { admitted, rejected, held })
    }

    async fn renew(&self, keys: &[LeaseKey], lease: &str) -> Result<(), StoreError> {
        self.conn_call("renew", &self.lease_keys(keys), lease, &[]).await.map(drop)
    }

    async fn release(&self, keys: &[LeaseKey], lease: &str) -> Result<(), StoreError> {
        self.conn_call("release", &self.lease_keys(keys), lease, &[]).await.map(drop)
    }

    fn renew_every(&self) -> Option<Duration> {
        Some(self.lease_ttl / 3)
    }

    async fn held(&self, zone: &str, key: &[u8]) -> Result<u32, StoreError> {
        let redis_key = self.conn_key(zone, key);
        // Only unexpired leases count; for an inspection the local clock is close enough.
        let now_ms = self.clock().now_us() / 1000;
        self.bounded(async {
            let mut conn = self.connection().await?;
            let n: u32 = ::redis::cmd("ZCOUNT")
                .arg(&redis_key)
                .arg(format!("({now_ms}"))
                .arg("+inf")
                .query_async(&mut conn)
                .await?;
            Ok(n)
        })
        .await
    }
}
