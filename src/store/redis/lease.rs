//! Leases of a leased zone's budget in Redis (docs/leases.md): `lua/limit_req/lease.lua`'s grant
//! and give-back, part of the one joined script, called by its SHA-1 like every decision. A lease
//! is taken rarely (once per lease, not per request), so it goes through redis-rs's shared
//! connection rather than the decision lane.

use ::redis::Value;

use super::limit_req::{zone_args, LIMIT_REQ};
use super::RedisStore;
use crate::limit::lease::Grant;
use crate::store::{KeyedZone, StoreError};

/// What a lease call asks: who holds it (`"i"` and digits), and for a grant how much.
#[derive(Debug, Clone, Copy)]
pub struct LeaseAsk {
    /// The least tokens to grant (the cost of the request that asked).
    pub min: u64,
    pub want: u64,
    pub lifetime_us: u64,
}

/// The holders' hash of a state key: the same hash slot (the tag is the state key's).
pub(super) fn holders_key(state_key: &[u8]) -> Vec<u8> {
    let mut key = state_key.to_vec();
    key.extend_from_slice(b":lease");
    key
}

/// One live holder of a leased key's budget, as Redis keeps it (`GET /limits`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LeaseHolder {
    /// The holder's id (`LeasedStore::holder` of some instance).
    pub holder: String,
    /// How long its latest lease lasts, on the store's clock.
    pub ends_in_ms: f64,
}

impl RedisStore {
    /// The key's live holders (ends after now), from its holders' hash: read only, one
    /// round trip. The tokens each holds are the instance's to tell: Redis keeps only the ends.
    pub async fn lease_holders(&self, zone: &str, key: &[u8]) -> Result<Vec<LeaseHolder>, StoreError> {
        let hkey = holders_key(&self.key_for(zone, key));
        let local_now = self.now_arg(|c| c.now_us());
        let ((secs, micros), all): ((u64, u64), Vec<(String, u64)>) = self
            .bounded(async {
                let mut conn = self.connection().await?;
                Ok(::redis::pipe().cmd("TIME").cmd("HGETALL").arg(&hkey).query_async(&mut conn).await?)
            })
            .await?;
        let now = local_now.unwrap_or(secs * 1_000_000 + micros);
        let mut live: Vec<LeaseHolder> = all
            .into_iter()
            .filter(|(_, ends)| *ends > now)
            .map(|(holder, ends)| LeaseHolder { holder, ends_in_ms: (ends - now) as f64 / 1e3 })
            .collect();
        live.sort_by(|a, b| a.holder.cmp(&b.holder));
        Ok(live)
    }

    /// Asks `lua/limit_req/lease.lua` for a lease of `zone`'s key for `holder`.
    pub async fn lease_grant(&self, zone: &KeyedZone<'_>, holder: &str, ask: LeaseAsk) -> Result<Grant, StoreError> {
        let key = self.key_for(zone.zone, &zone.key);
        let mut call = LIMIT_REQ.call();
        call.key(&key).key(holders_key(&key)).arg("lease").arg("grant").arg(holder);
        match self.now_arg(|c| c.now_us()) {
            Some(now) => call.arg(now),
            None => call.arg(""),
        };
        let mut args = zone_args(zone);
        args[5] = ask.min as i64;
        for value in args {
            call.arg(value);
        }
        call.arg(ask.want).arg(ask.lifetime_us);
        let reply: Vec<Value> = self
            .bounded(async {
                let mut conn = self.connection().await?;
                Ok(call.invoke(&mut conn).await?)
            })
            .await?;
        parse_grant(&reply)
    }

    /// Several keys' leases for `holder` in one round trip (`lua/limit_req/lease.lua`'s
    /// `grants`): each granted as `lease_grant` would, in order, at one now. On a Cluster the
    /// keys go in one call per hash slot, on one connection.
    pub async fn lease_grants(
        &self,
        asks: &[(KeyedZone<'_>, LeaseAsk)],
        holder: &str,
    ) -> Result<Vec<Grant>, StoreError> {
        let keys: Vec<Vec<u8>> = asks.iter().map(|(zone, _)| self.key_for(zone.zone, &zone.key)).collect();
        let groups =
            if self.is_cluster() { super::slots::group_by_slot(&keys) } else { vec![(0..asks.len()).collect()] };
        let now = self.now_arg(|c| c.now_us());
        let calls: Vec<super::connection::ScriptCall> = groups
            .iter()
            .map(|group| {
                let mut call = LIMIT_REQ.call();
                call.arg("lease").arg("grants").arg(holder);
                match now {
                    Some(now) => call.arg(now),
                    None => call.arg(""),
                };
                call.arg(group.len());
                for &i in group {
                    let (zone, ask) = &asks[i];
                    call.key(&keys[i]).key(holders_key(&keys[i]));
                    let mut args = zone_args(zone);
                    args[5] = ask.min as i64;
                    for value in args {
                        call.arg(value);
                    }
                    call.arg(ask.want).arg(ask.lifetime_us);
                }
                call
            })
            .collect();
        let replies: Vec<Vec<Vec<Value>>> = self
            .bounded(async {
                let mut conn = self.connection().await?;
                let mut replies = Vec::with_capacity(calls.len());
                for call in &calls {
                    replies.push(call.invoke(&mut conn).await?);
                }
                Ok(replies)
            })
            .await?;
        let mut grants: Vec<Option<Grant>> = vec![None; asks.len()];
        for (group, reply) in groups.iter().zip(&replies) {
            if reply.len() != group.len() {
                return Err(StoreError::Reply(format!(
                    "lease grants: {} replies to {} grants",
                    reply.len(),
                    group.len()
                )));
            }
            for (&i, one) in group.iter().zip(reply) {
                grants[i] = Some(parse_grant(one)?);
            }
        }
        grants
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| StoreError::Reply("lease grants: a grant went unanswered".into()))
    }

    /// Gives `unused` tokens of `holder`'s lease back to `zone`'s key (a lease ended early).
    pub async fn lease_give_back(
        &self,
        zone: &KeyedZone<'_>,
        holder: &str,
        unused: u64,
        window_start_us: Option<u64>,
    ) -> Result<(), StoreError> {
        let key = self.key_for(zone.zone, &zone.key);
        let mut call = LIMIT_REQ.call();
        call.key(&key).key(holders_key(&key)).arg("lease").arg("give").arg(holder);
        match self.now_arg(|c| c.now_us()) {
            Some(now) => call.arg(now),
            None => call.arg(""),
        };
        let mut args = zone_args(zone);
        args[5] = unused as i64;
        for value in args {
            call.arg(value);
        }
        match window_start_us {
            Some(start) => call.arg(start),
            None => call.arg(""),
        };
        let _: Value = self
            .bounded(async {
                let mut conn = self.connection().await?;
                Ok(call.invoke(&mut conn).await?)
            })
            .await?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl crate::store::LeaseLedger for RedisStore {
    async fn grant(&self, zone: &KeyedZone<'_>, holder: &str, ask: LeaseAsk) -> Result<Grant, StoreError> {
        self.lease_grant(zone, holder, ask).await
    }

    async fn grants(&self, asks: &[(KeyedZone<'_>, LeaseAsk)], holder: &str) -> Result<Vec<Grant>, StoreError> {
        self.lease_grants(asks, holder).await
    }

    fn batches(&self) -> bool {
        true
    }

    async fn give_back(
        &self,
        zone: &KeyedZone<'_>,
        holder: &str,
        unused: u64,
        window_start_us: Option<u64>,
    ) -> Result<(), StoreError> {
        self.lease_give_back(zone, holder, unused, window_start_us).await
    }
}

/// `{tokens, retry_us, window_start_us, window_left_us, now_us}` (-1: none).
fn parse_grant(reply: &[Value]) -> Result<Grant, StoreError> {
    let int = |i: usize| match reply.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(StoreError::Reply(format!("lease grant: value {} is {other:?}, not an integer", i + 1))),
    };
    let optional = |n: i64| u64::try_from(n).ok();
    let tokens = u64::try_from(int(0)?).map_err(|_| StoreError::Reply("lease grant: negative tokens".into()))?;
    Ok(Grant {
        tokens,
        retry_after_us: optional(int(1)?),
        window_start_us: optional(int(2)?),
        window_left_us: optional(int(3)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_reply_becomes_a_grant() {
        let g = parse_grant(&[Value::Int(7), Value::Int(-1), Value::Int(-1), Value::Int(-1), Value::Int(5)]).unwrap();
        assert_eq!((g.tokens, g.retry_after_us, g.window_start_us), (7, None, None));
        let r = parse_grant(&[Value::Int(0), Value::Int(100), Value::Int(60), Value::Int(40), Value::Int(5)]).unwrap();
        assert_eq!((r.tokens, r.retry_after_us, r.window_left_us), (0, Some(100), Some(40)));
        assert!(parse_grant(&[Value::Int(1)]).is_err());
    }

    #[test]
    fn the_holders_share_the_state_keys_slot() {
        let key = crate::store::redis_key("weir:", "api", b"k1");
        assert_eq!(super::super::key_slot(&key), super::super::key_slot(&holders_key(&key)));
    }
}
