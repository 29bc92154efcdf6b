//! Fleet-wide concurrency leases in Redis through `lua/limit_conn.lua`, on the same connection as
//! the rate limits. Keys are `<prefix>conn:<zone>:{<client key>}` (zone names cannot contain `:`,
//! so they never meet a `limit_req` key).
//!
//! On a Redis Cluster, conn zones with different client keys live in different hash slots and one
//! script call reaches one slot: a request's zones are acquired one slot per call, in order; if a
//! slot rejects, the leases taken in the earlier slots are released again (exact: a lease id is
//! unique to its request) and the remaining slots are only counted ("held" mode), so the verdict
//! equals one call's. Renewals and releases go one call per slot too.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::Value;
use async_trait::async_trait;

use super::connection::{LuaScript, ScriptCall};
use super::rollback::Rollback;
use super::slots::group_by_slot;
use super::{redis_key, RedisStore};
use crate::store::{ConnStore, ConnVerdict, KeyedConn, LeaseKey, StoreError};

/// `lua/limit_conn.lua`, called by its SHA-1 (`connection.rs`).
static LIMIT_CONN: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(include_str!("../../../lua/limit_conn.lua")));

impl RedisStore {
    /// The Redis key of one conn zone's lease set for one client key.
    pub fn conn_key(&self, zone: &str, key: &[u8]) -> Vec<u8> {
        redis_key(&format!("{}conn:", self.config().key_prefix), zone, key)
    }

    /// One call of the conn script over `keys`; `maxes` only for "acquire".
    fn conn_call<'k>(
        &self,
        mode: &str,
        keys: impl IntoIterator<Item = &'k Vec<u8>>,
        lease: &str,
        maxes: &[u32],
    ) -> ScriptCall {
        let mut call = LIMIT_CONN.call();
        for key in keys {
            call.key(key);
        }
        call.arg(mode);
        match self.now_arg(|c| c.now_us() / 1000) {
            Some(now_ms) => call.arg(now_ms),
            None => call.arg(""),
        };
        call.arg(self.lease_ttl.as_millis() as u64).arg(lease);
        for max in maxes {
            call.arg(*max);
        }
        call
    }

    /// `keys` grouped by hash slot: one group on a single server, or when all share a slot.
    fn slot_groups(&self, keys: &[Vec<u8>]) -> Vec<Vec<usize>> {
        if self.is_cluster() {
            group_by_slot(keys)
        } else {
            vec![(0..keys.len()).collect()]
        }
    }

    /// Sends `mode` ("renew" or "release") for every key, one call per slot.
    async fn per_slot(&self, mode: &str, keys: &[LeaseKey], lease: &str) -> Result<(), StoreError> {
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| self.conn_key(&k.zone, &k.key)).collect();
        let groups = self.slot_groups(&keys);
        self.bounded(async {
            let mut conn = self.connection().await?;
            for group in &groups {
                self.conn_call(mode, group.iter().map(|&i| &keys[i]), lease, &[]).invoke::<Value>(&mut conn).await?;
            }
            Ok(())
        })
        .await
    }

    /// Acquires slot by slot (module docs).
    async fn acquire_per_slot(
        &self,
        conns: &[KeyedConn<'_>],
        keys: &[Vec<u8>],
        groups: &[Vec<usize>],
        lease: &str,
    ) -> Result<ConnVerdict, StoreError> {
        let mut conn = self.connection().await?;
        let mut rollback = Rollback::new(conn.clone(), self.config().timeout);
        let mut held: Vec<Option<u32>> = vec![None; conns.len()];
        // The first rejecting zone as its slot's call reported it (in case the counts moved).
        let mut reported: Option<usize> = None;
        for group in groups {
            let group_keys = group.iter().map(|&i| &keys[i]);
            if reported.is_none() {
                let maxes: Vec<u32> = group.iter().map(|&i| conns[i].max).collect();
                let reply: Value = self.conn_call("acquire", group_keys, lease, &maxes).invoke(&mut conn).await?;
                let (admitted, rejected, counts) = parse_acquire(reply, group.len())?;
                for (&i, count) in group.iter().zip(counts) {
                    held[i] = Some(count);
                }
                if admitted {
                    rollback.push(self.conn_call("release", group.iter().map(|&i| &keys[i]), lease, &[]));
                } else {
                    reported = Some(rejected.and_then(|r| group.get(r)).copied().unwrap_or(group[0]));
                }
            } else {
                let reply: Value = self.conn_call("held", group_keys, lease, &[]).invoke(&mut conn).await?;
                let counts: Vec<i64> =
                    ::redis::from_redis_value(reply).map_err(|e| StoreError::Reply(format!("limit_conn held: {e}")))?;
                if counts.len() != group.len() {
                    return Err(StoreError::Reply(format!(
                        "limit_conn held: expected {} values, got {}",
                        group.len(),
                        counts.len()
                    )));
                }
                for (&i, count) in group.iter().zip(counts) {
                    held[i] = Some(clamp_count(count));
                }
            }
        }
        let held = held
            .into_iter()
            .map(|h| h.ok_or_else(|| StoreError::Reply("a conn zone of the request was in no slot group".into())))
            .collect::<Result<Vec<u32>, _>>()?;
        match reported {
            None => {
                rollback.disarm();
                Ok(ConnVerdict { admitted: true, rejected: None, held })
            }
            Some(reported) => {
                rollback.run().await;
                // As one call would report it: the first zone, in the request's order, at its max.
                let first = conns.iter().zip(&held).position(|(c, &h)| h >= c.max).unwrap_or(reported);
                Ok(ConnVerdict { admitted: false, rejected: Some(first), held })
            }
        }
    }

    /// Leases held for one key (`StoreAdmin::held`, in `mod.rs`).
    pub(super) async fn held_leases(&self, zone: &str, key: &[u8]) -> Result<u32, StoreError> {
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

/// An "acquire" reply of `zones` zones: admitted, the 0-based rejecting zone, the counts held.
fn parse_acquire(reply: Value, zones: usize) -> Result<(bool, Option<usize>, Vec<u32>), StoreError> {
    let numbers: Vec<i64> =
        ::redis::from_redis_value(reply).map_err(|e| StoreError::Reply(format!("limit_conn acquire: {e}")))?;
    if numbers.len() != 2 + zones {
        return Err(StoreError::Reply(format!(
            "limit_conn acquire: expected {} values, got {}",
            2 + zones,
            numbers.len()
        )));
    }
    let admitted = numbers[0] == 1;
    let rejected = (!admitted && numbers[1] >= 1).then(|| numbers[1] as usize - 1);
    Ok((admitted, rejected, numbers[2..].iter().map(|&n| clamp_count(n)).collect()))
}

fn clamp_count(n: i64) -> u32 {
    n.clamp(0, u32::MAX as i64) as u32
}

#[async_trait]
impl ConnStore for RedisStore {
    async fn acquire(&self, conns: &[KeyedConn<'_>], lease: &str) -> Result<ConnVerdict, StoreError> {
        let keys: Vec<Vec<u8>> = conns.iter().map(|c| self.conn_key(c.zone, &c.key)).collect();
        let groups = self.slot_groups(&keys);
        if groups.len() > 1 {
            return self.bounded(self.acquire_per_slot(conns, &keys, &groups, lease)).await;
        }
        let maxes: Vec<u32> = conns.iter().map(|c| c.max).collect();
        let call = self.conn_call("acquire", &keys, lease, &maxes);
        let reply: Value = self
            .bounded(async {
                let mut conn = self.connection().await?;
                Ok(call.invoke(&mut conn).await?)
            })
            .await?;
        let (admitted, rejected, held) = parse_acquire(reply, conns.len())?;
        Ok(ConnVerdict { admitted, rejected, held })
    }

    async fn renew(&self, keys: &[LeaseKey], lease: &str) -> Result<(), StoreError> {
        self.per_slot("renew", keys, lease).await
    }

    async fn release(&self, keys: &[LeaseKey], lease: &str) -> Result<(), StoreError> {
        self.per_slot("release", keys, lease).await
    }

    fn renew_every(&self) -> Option<Duration> {
        Some(self.lease_ttl / 3)
    }
}
