//! `limit_req` in Redis: every zone of a request decided by `lua/limit_req.lua`, the limit model
//! in Lua; its replies decoded into verdicts, its stored state read back for inspection.
//!
//! **One call per hash slot.** On one server (or a Sentinel master) all zones of a request are
//! decided by one script call. On a Redis Cluster a script may only touch keys of one slot, and a
//! request's keys share a slot only when they share a client key (`<prefix><zone>:{<client key>}`).
//! So zones are grouped by slot (one group, one call, in the common case) and the groups are
//! decided one call each, in order, all with the same `now` (the proxy's, or the first call's
//! Redis `TIME`, passed on). Each call charges its zones if they all admit and returns what the
//! keys held before (flag "u"). Once a group rejects, the later groups are only evaluated (flag
//! "n"), and the earlier groups' charges are taken back by `lua/restore.lua` (its header states
//! the race window). The verdict is combined exactly like `limit::decide_all`, so when nothing
//! else touches the keys meanwhile it equals what one call over all zones would give. (With
//! `clock = "redis"`, the later slots are thus decided on the first slot's node clock; cluster
//! nodes' clocks differ by little, and the script never runs a key's time backwards, so a skew can
//! only make a limit stricter.)

use std::sync::{Arc, LazyLock};

use ::redis::Value;

use super::connection::{LuaScript, ScriptCall};
use super::lane::{self, Call, LaneError};
use super::rollback::Rollback;
use super::script::LIMIT_REQ_SCRIPT;
use super::slot_owners::SlotOwners;
use super::slots::{self, group_by_slot};
use super::RedisStore;
use crate::limit::{
    decide_all, Algorithm, BucketState, DelayPolicy, SlidingState, State, TokenState, Verdict, WindowState, ZoneOutcome,
};
use crate::store::{KeyedZone, StoreError};

/// `lua/limit_req.lua` (joined from `lua/limit_req/`, `script.rs`) and `lua/restore.lua`, called
/// by their SHA-1 (`connection.rs`).
pub(super) static LIMIT_REQ: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(LIMIT_REQ_SCRIPT));
static RESTORE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(include_str!("../../../lua/restore.lua")));

/// Reply values before the zones, the values every zone's array starts with in the full reply, and
/// a zone's values in the compact one (see the header of `lua/limit_req.lua`).
const REPLY_HEAD: usize = 4;
const REPLY_ZONE_COMMON: usize = 8;
const REPLY_ZONE_COMPACT: usize = 5;
/// ... of a request's only zone (its admitted, delay and retry are the request's).
const REPLY_ONE_ZONE_COMPACT: usize = 2;

impl RedisStore {
    /// Decides every zone of one request atomically (`LimitStore::decide`): one call on one
    /// server or slot, else one call per slot with a rollback (module docs).
    pub(super) async fn decide_limit_req(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        if zones.is_empty() {
            // Nothing to limit: no round trip.
            return Ok(decide_all(&[], self.clock.now_us()));
        }
        let keys: Vec<Vec<u8>> = zones.iter().map(|c| self.key_for(c.zone, &c.key)).collect();
        // The paths other than a single server's lane are boxed: their futures (redis-rs's above
        // all) would otherwise make this one ~7 KB, allocated for every decision.
        let mut lane_reply = None;
        if self.is_cluster() {
            let groups = group_by_slot(&keys);
            if groups.len() > 1 {
                return Box::pin(self.bounded(self.decide_per_slot(zones, &keys, &groups))).await;
            }
            if let Some(owners) = &self.cluster_lanes {
                lane_reply = Box::pin(self.decide_on_master(owners, zones, &keys)).await?;
            }
        }
        let reply: Vec<Value> = match (lane_reply, &self.lanes) {
            (Some(reply), _) => reply,
            (None, Some(lanes)) => self.bounded(lanes.decide(self.lane_call(zones, &keys))).await?,
            (None, None) => {
                let all: Vec<usize> = (0..zones.len()).collect();
                let call = self.limit_call(zones, &keys, &all, self.now_arg(|c| c.now_us()), self.detail_flag());
                Box::pin(self.bounded(async {
                    let mut conn = self.connection().await?;
                    Ok(call.invoke(&mut conn).await?)
                }))
                .await?
            }
        };
        let algorithms: Vec<Algorithm> = zones.iter().map(|c| c.limit.algorithm).collect();
        parse_reply(&reply, &algorithms, self.full_outcomes)
    }

    /// `lua/limit_req.lua` with flag "n" (evaluate only): one call per hash slot, combined.
    pub(super) async fn peek_limit_req(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        self.call_per_slot(zones, "n").await
    }

    /// `lua/limit_req.lua` with flag "c" (charge after the response, never refused, capped at
    /// each zone's ceiling): one call per hash slot. A charge refuses nothing, so a request
    /// whose zones span slots needs no rollback.
    pub(super) async fn charge_limit_req(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        self.call_per_slot(zones, "c").await
    }

    /// The stored state of one key, as the script left it (for tests and the admin API), whatever
    /// algorithm wrote it. `None` when absent, i.e. expired.
    pub async fn raw_state(&self, zone: &str, key: &[u8]) -> Result<Option<State>, StoreError> {
        let redis_key = self.key_for(zone, key);
        let raw: Option<RawState> = self
            .bounded(async {
                let mut conn = self.connection().await?;
                let kind: String = ::redis::cmd("TYPE").arg(&redis_key).query_async(&mut conn).await?;
                Ok(match kind.as_str() {
                    "string" => {
                        let value: Option<Vec<u8>> = ::redis::cmd("GET").arg(&redis_key).query_async(&mut conn).await?;
                        value.map(RawState::Text)
                    }
                    "zset" => {
                        let entries: Vec<(Vec<u8>, Vec<u8>)> = ::redis::cmd("ZRANGE")
                            .arg(&redis_key)
                            .arg(0)
                            .arg(-1)
                            .arg("WITHSCORES")
                            .query_async(&mut conn)
                            .await?;
                        Some(RawState::Log(entries.into_iter().map(|(_, score)| score).collect()))
                    }
                    "none" => None,
                    other => return Err(StoreError::Reply(format!("state key of type {other}"))),
                })
            })
            .await?;
        match raw {
            None => Ok(None),
            Some(RawState::Text(text)) => {
                std::str::from_utf8(&text).ok().and_then(State::from_stored_text).map(Some).ok_or_else(|| {
                    StoreError::Reply(format!("state {:?} is in no known format", String::from_utf8_lossy(&text)))
                })
            }
            Some(RawState::Log(scores)) => {
                let entries = scores
                    .iter()
                    .map(|score| {
                        std::str::from_utf8(score).ok().and_then(State::log_entry_from_stored).ok_or_else(|| {
                            StoreError::Reply(format!("log entry {:?} is not µs", String::from_utf8_lossy(score)))
                        })
                    })
                    .collect::<Result<Vec<u64>, StoreError>>()?;
                Ok(Some(State::Log(entries)))
            }
        }
    }

    /// One call of `lua/limit_req.lua` for the zones `indices` of `zones` (whose keys are `keys`).
    fn limit_call(
        &self,
        zones: &[KeyedZone<'_>],
        keys: &[Vec<u8>],
        indices: &[usize],
        now_us: Option<u64>,
        flags: &str,
    ) -> ScriptCall {
        let mut call = LIMIT_REQ.call();
        for &i in indices {
            call.key(&keys[i]);
        }
        match now_us {
            Some(now) => call.arg(now),
            None => call.arg(""),
        };
        call.arg(flags);
        for &i in indices {
            for value in zone_args(&zones[i]) {
                call.arg(value);
            }
        }
        call
    }

    /// `limit_call` for the decision lane: the same keys and arguments, encoded at once.
    fn lane_call(&self, zones: &[KeyedZone<'_>], keys: &[Vec<u8>]) -> Call {
        let mut call = Call::new(keys.len(), zones.len());
        for key in keys {
            call.key(key);
        }
        match self.now_arg(|c| c.now_us()) {
            Some(now) => call.int(now),
            None => call.arg(b""),
        };
        call.arg(self.detail_flag().as_bytes());
        for zone in zones {
            call.ints(&zone_args(zone));
        }
        call
    }

    /// The first character of ARGV[2]: "1" the full reply, "0" the compact one.
    fn detail_flag(&self) -> &'static str {
        if self.full_outcomes {
            "1"
        } else {
            "0"
        }
    }

    /// One `lua/limit_req.lua` call with `flag` after the detail flag per hash slot of the zones
    /// (one call outside a cluster), combined; for calls that never need a rollback (a check, a
    /// charge after the response).
    async fn call_per_slot(&self, zones: &[KeyedZone<'_>], flag: &str) -> Result<Verdict, StoreError> {
        if zones.is_empty() {
            return Ok(decide_all(&[], self.clock.now_us()));
        }
        let keys: Vec<Vec<u8>> = zones.iter().map(|c| self.key_for(c.zone, &c.key)).collect();
        let groups = if self.is_cluster() { group_by_slot(&keys) } else { vec![(0..zones.len()).collect()] };
        self.bounded(async {
            let mut conn = self.connection().await?;
            let mut now_us = self.now_arg(|c| c.now_us());
            let mut outcomes: Vec<Option<ZoneOutcome>> = vec![None; zones.len()];
            let flags = format!("{}{flag}", self.detail_flag());
            for group in &groups {
                let reply: Vec<Value> = self.limit_call(zones, &keys, group, now_us, &flags).invoke(&mut conn).await?;
                let algorithms: Vec<Algorithm> = group.iter().map(|&i| zones[i].limit.algorithm).collect();
                let verdict = parse_reply(&reply, &algorithms, self.full_outcomes)?;
                now_us.get_or_insert(verdict.decided_us);
                for (&i, zone) in group.iter().zip(verdict.zones) {
                    outcomes[i] = Some(zone);
                }
            }
            combine_slots(outcomes, now_us)
        })
        .await
    }

    /// A request of one hash slot through the lane of the master that owns the slot, coalesced
    /// with the other requests of that slot (`slot_owners.rs`). `None`: no verdict and nothing
    /// charged (no owner known yet, or Redis did not run the call: a redirect, a cluster that is
    /// down, no connection), so the caller decides through redis-rs, which follows redirects.
    async fn decide_on_master(
        &self,
        owners: &Arc<SlotOwners>,
        zones: &[KeyedZone<'_>],
        keys: &[Vec<u8>],
    ) -> Result<Option<Vec<Value>>, StoreError> {
        let slot = slots::key_slot(&keys[0]);
        let Some(master) = owners.owner(slot) else { return Ok(None) };
        let call = self.lane_call(zones, keys).in_slot(slot);
        match tokio::time::timeout(self.config.timeout, lane::decide_on(&master, call)).await {
            Ok(Ok(reply)) => Ok(Some(reply)),
            Ok(Err(LaneError::NotRun(why))) => {
                tracing::debug!(reason = %why, slot, "the slot's master did not run the decision; through redis-rs");
                owners.mark_stale();
                Ok(None)
            }
            Ok(Err(LaneError::Failed(e))) => Err(e),
            Err(_) => Err(StoreError::Timeout(self.config.timeout)),
        }
    }

    /// The zones of one request over several hash slots: one call per slot (module docs).
    async fn decide_per_slot(
        &self,
        zones: &[KeyedZone<'_>],
        keys: &[Vec<u8>],
        groups: &[Vec<usize>],
    ) -> Result<Verdict, StoreError> {
        let mut conn = self.connection().await?;
        let mut rollback = Rollback::new(conn.clone(), self.config.timeout);
        let mut now_us = self.now_arg(|c| c.now_us());
        let mut outcomes: Vec<Option<ZoneOutcome>> = vec![None; zones.len()];
        let mut rejected = false;
        for group in groups {
            // Charge (and say how to take it back) until a slot rejects; after that only evaluate.
            let charging = !rejected;
            let flags = format!("{}{}", self.detail_flag(), if charging { "u" } else { "n" });
            let mut reply: Vec<Value> = self.limit_call(zones, keys, group, now_us, &flags).invoke(&mut conn).await?;
            let undo = if charging { reply.pop() } else { None };
            let algorithms: Vec<Algorithm> = group.iter().map(|&i| zones[i].limit.algorithm).collect();
            let verdict = parse_reply(&reply, &algorithms, self.full_outcomes)?;
            if now_us.is_none() {
                now_us = Some(micros(&reply[3])?);
            }
            if charging && verdict.admitted {
                if let Some(call) = restore_call(keys, group, undo)? {
                    rollback.push(call);
                }
            }
            rejected |= !verdict.admitted;
            for (&i, zone) in group.iter().zip(verdict.zones) {
                outcomes[i] = Some(zone);
            }
        }
        let verdict = combine_slots(outcomes, now_us)?;
        if verdict.admitted {
            rollback.disarm();
        } else {
            rollback.run().await;
        }
        Ok(verdict)
    }
}

/// One request's verdict from its per-slot calls: every zone answered by some slot, and the first
/// call's time (every slot's reply carries one) as when the request was decided.
fn combine_slots(outcomes: Vec<Option<ZoneOutcome>>, now_us: Option<u64>) -> Result<Verdict, StoreError> {
    let results = outcomes
        .into_iter()
        .map(|z| z.ok_or_else(|| StoreError::Reply("a zone of the request was in no slot group".into())))
        .collect::<Result<Vec<_>, _>>()?;
    let decided_us = now_us.ok_or_else(|| StoreError::Reply("a request over no hash slot".into()))?;
    Ok(Verdict::combine(results, decided_us))
}

/// The `lua/restore.lua` call that takes back one charging call (of the zones `group`), from the
/// undo records it returned; `None` when it wrote nothing.
fn restore_call(keys: &[Vec<u8>], group: &[usize], undo: Option<Value>) -> Result<Option<ScriptCall>, StoreError> {
    let Some(Value::Array(records)) = undo else {
        return Err(StoreError::Reply(format!("expected the undo records, got {undo:?}")));
    };
    if records.is_empty() {
        return Ok(None);
    }
    let mut call = RESTORE.call();
    for record in &records {
        let Value::Array(fields) = record else {
            return Err(StoreError::Reply(format!("expected an undo record, got {record:?}")));
        };
        let Some((index, args)) = fields.split_first() else {
            return Err(StoreError::Reply("empty undo record".into()));
        };
        let index = int(index)?;
        let key = usize::try_from(index)
            .ok()
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| group.get(i))
            .ok_or_else(|| StoreError::Reply(format!("undo record of key {index}, of {} keys", group.len())))?;
        call.key(&keys[*key]);
        for arg in args {
            match arg {
                Value::BulkString(bytes) => call.arg(bytes.as_slice()),
                Value::SimpleString(text) => call.arg(text.as_str()),
                Value::Int(n) => call.arg(*n),
                other => return Err(StoreError::Reply(format!("unexpected value in an undo record: {other:?}"))),
            };
        }
    }
    Ok(Some(call))
}

/// A stored value before parsing: a string, or the scores of a sorted set.
enum RawState {
    Text(Vec<u8>),
    Log(Vec<Vec<u8>>),
}

/// A zone's 6 values in `lua/limit_req.lua`'s ARGV (layout in its header): algorithm, count,
/// period_us, burst, delay (-1 = nodelay), cost. The config bounds each far below `i64::MAX`.
pub(super) fn zone_args(check: &KeyedZone<'_>) -> [i64; 6] {
    let limit = &check.limit;
    let delay = match limit.delay {
        DelayPolicy::NoDelay => -1,
        DelayPolicy::After(threshold) => threshold as i64,
    };
    [
        i64::from(limit.algorithm.id()),
        limit.rate.count as i64,
        limit.rate.period_us as i64,
        limit.burst as i64,
        delay,
        check.cost as i64,
    ]
}

/// Turns the script's reply (layouts in the header of `lua/limit_req.lua`) into a `Verdict`. The
/// zones come in the order of `algorithms`, each zone's algorithm as sent; `full`: whether the
/// script was asked for the full reply.
fn parse_reply(reply: &[Value], algorithms: &[Algorithm], full: bool) -> Result<Verdict, StoreError> {
    let expected = REPLY_HEAD
        + match (full, algorithms.len()) {
            (true, n) => n,
            // One zone: its admitted, delay and retry are the request's.
            (false, 1) => REPLY_ONE_ZONE_COMPACT,
            (false, n) => REPLY_ZONE_COMPACT * n,
        };
    if reply.len() != expected {
        return Err(StoreError::Reply(format!(
            "{} values for {} zones, expected {expected}",
            reply.len(),
            algorithms.len()
        )));
    }
    let now_us = micros(&reply[3])?;
    let zones = if full {
        reply[REPLY_HEAD..]
            .iter()
            .zip(algorithms)
            .map(|(zone, &algorithm)| parse_zone(zone, algorithm))
            .collect::<Result<Vec<_>, StoreError>>()?
    } else if algorithms.len() == 1 {
        let (head, zone) = (&reply[..3], &reply[REPLY_HEAD..]);
        vec![compact_zone([&head[0], &head[1], &head[2], &zone[0], &zone[1]], now_us)?]
    } else {
        reply[REPLY_HEAD..]
            .chunks_exact(REPLY_ZONE_COMPACT)
            .map(|z| compact_zone([&z[0], &z[1], &z[2], &z[3], &z[4]], now_us))
            .collect::<Result<_, _>>()?
    };
    Ok(Verdict {
        admitted: flag(&reply[0])?,
        delay_us: micros(&reply[1])?,
        retry_after_us: optional_micros(&reply[2])?,
        zones,
        decided_us: now_us,
    })
}

/// One zone of the compact reply: admitted, delay_us, retry_us, remaining, reset_us. What the
/// reply leaves out is filled with stand-ins nothing outside the memory store reads: no excess, a
/// state that expires when the quota is whole again, an empty bucket as `next` (never stored).
fn compact_zone(
    [admitted, delay, retry, remaining, reset]: [&Value; 5],
    now_us: u64,
) -> Result<ZoneOutcome, StoreError> {
    let reset_us = micros(reset)?;
    Ok(ZoneOutcome {
        admitted: flag(admitted)?,
        excess: 0.0,
        delay_us: micros(delay)?,
        retry_after_us: optional_micros(retry)?,
        remaining: micros(remaining)?,
        reset_us,
        expires_us: now_us.saturating_add(reset_us),
        next: State::Bucket(BucketState { level: 0.0, last_us: now_us }),
    })
}

/// One zone's array: the common values, then `next` in the algorithm's layout.
fn parse_zone(value: &Value, algorithm: Algorithm) -> Result<ZoneOutcome, StoreError> {
    let Value::Array(z) = value else {
        return Err(StoreError::Reply(format!("expected a zone's array, got {value:?}")));
    };
    let state_len = match algorithm {
        Algorithm::LeakyBucket | Algorithm::TokenBucket | Algorithm::FixedWindow | Algorithm::SlidingLog => 2,
        Algorithm::SlidingWindow => 3,
    };
    if z.len() != REPLY_ZONE_COMMON + state_len {
        return Err(StoreError::Reply(format!(
            "{} values for a {} zone, expected {}",
            z.len(),
            algorithm.as_str(),
            REPLY_ZONE_COMMON + state_len
        )));
    }
    let id = int(&z[0])?;
    if id != i64::from(algorithm.id()) {
        return Err(StoreError::Reply(format!("zone of algorithm {id}, expected {}", algorithm.id())));
    }
    let s = &z[REPLY_ZONE_COMMON..];
    let next = match algorithm {
        Algorithm::LeakyBucket => State::Bucket(BucketState { level: float(&s[0])?, last_us: micros(&s[1])? }),
        Algorithm::TokenBucket => State::Tokens(TokenState { tokens: float(&s[0])?, last_us: micros(&s[1])? }),
        Algorithm::FixedWindow => State::Window(WindowState { start_us: micros(&s[0])?, count: micros(&s[1])? }),
        Algorithm::SlidingWindow => {
            State::Sliding(SlidingState { start_us: micros(&s[0])?, prev: micros(&s[1])?, curr: micros(&s[2])? })
        }
        Algorithm::SlidingLog => {
            let len = micros(&s[0])?;
            let Value::Array(times) = &s[1] else {
                return Err(StoreError::Reply(format!("expected the log's entries, got {:?}", s[1])));
            };
            if times.len() as u64 != len {
                return Err(StoreError::Reply(format!("{} log entries, expected {len}", times.len())));
            }
            State::Log(times.iter().map(micros).collect::<Result<_, _>>()?)
        }
    };
    Ok(ZoneOutcome {
        admitted: flag(&z[1])?,
        excess: float(&z[2])?,
        delay_us: micros(&z[3])?,
        retry_after_us: optional_micros(&z[4])?,
        remaining: micros(&z[5])?,
        reset_us: micros(&z[6])?,
        expires_us: micros(&z[7])?,
        next,
    })
}

fn int(value: &Value) -> Result<i64, StoreError> {
    match value {
        Value::Int(n) => Ok(*n),
        other => Err(StoreError::Reply(format!("expected an integer, got {other:?}"))),
    }
}

fn flag(value: &Value) -> Result<bool, StoreError> {
    match int(value)? {
        0 => Ok(false),
        1 => Ok(true),
        n => Err(StoreError::Reply(format!("expected 0 or 1, got {n}"))),
    }
}

fn micros(value: &Value) -> Result<u64, StoreError> {
    let n = int(value)?;
    u64::try_from(n).map_err(|_| StoreError::Reply(format!("expected µs >= 0, got {n}")))
}

/// -1 is the script's "none".
fn optional_micros(value: &Value) -> Result<Option<u64>, StoreError> {
    match int(value)? {
        -1 => Ok(None),
        _ => micros(value).map(Some),
    }
}

/// Fractions come as "%.17g" strings, which parse back to the exact double.
fn float(value: &Value) -> Result<f64, StoreError> {
    let text = match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(text) => Some(text.as_str()),
        _ => None,
    };
    text.and_then(|t| t.parse::<f64>().ok())
        .filter(|f| f.is_finite())
        .ok_or_else(|| StoreError::Reply(format!("expected a decimal string, got {value:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn zone(algorithm: u8, outcome: [Value; 7], next: Vec<Value>) -> Value {
        let mut z = vec![Value::Int(algorithm.into())];
        z.extend(outcome);
        z.extend(next);
        Value::Array(z)
    }

    #[test]
    fn reply_becomes_a_verdict() {
        let t0: u64 = 1_700_000_000_000_000;
        let t0i = t0 as i64;
        let rejected = || {
            [
                Value::Int(0),
                bulk("2.5"),
                Value::Int(0),
                Value::Int(250_000),
                Value::Int(0),
                Value::Int(1_750_000),
                Value::Int(t0i + 1_750_000),
            ]
        };
        let admitted = || {
            [Value::Int(1), bulk("0"), Value::Int(0), Value::Int(-1), Value::Int(3), Value::Int(9), Value::Int(t0i + 9)]
        };
        let head = || vec![Value::Int(0), Value::Int(0), Value::Int(250_000), Value::Int(t0i)];
        let mut reply = head();
        reply.push(zone(0, rejected(), vec![bulk("1.75"), Value::Int(t0i)]));
        reply.push(zone(1, admitted(), vec![bulk("0.5"), Value::Int(t0i)]));
        reply.push(zone(2, admitted(), vec![Value::Int(t0i - 5), Value::Int(2)]));
        reply.push(zone(3, admitted(), vec![Value::Int(2), Value::Array(vec![Value::Int(t0i - 1), Value::Int(t0i)])]));
        reply.push(zone(4, admitted(), vec![Value::Int(t0i - 5), Value::Int(4), Value::Int(1)]));
        let algorithms = [
            Algorithm::LeakyBucket,
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow,
        ];
        let v = parse_reply(&reply, &algorithms, true).unwrap();
        assert!(!v.admitted);
        assert_eq!(v.retry_after_us, Some(250_000));
        assert_eq!(v.zones[0].excess, 2.5);
        assert_eq!(v.zones[0].retry_after_us, Some(250_000));
        assert_eq!(v.zones[0].expires_us, t0 + 1_750_000);
        assert_eq!(v.zones[0].next, State::Bucket(BucketState { level: 1.75, last_us: t0 }));
        assert_eq!(v.zones[1].next, State::Tokens(TokenState { tokens: 0.5, last_us: t0 }));
        assert_eq!(v.zones[1].remaining, 3);
        assert_eq!(v.zones[2].next, State::Window(WindowState { start_us: t0 - 5, count: 2 }));
        assert_eq!(v.zones[3].next, State::Log(vec![t0 - 1, t0]));
        assert_eq!(v.zones[4].next, State::Sliding(SlidingState { start_us: t0 - 5, prev: 4, curr: 1 }));
        // A full reply where a compact one was asked for; a log's entries missing.
        assert!(parse_reply(&reply, &algorithms, false).is_err());
        let mut no_entries = head();
        no_entries.push(zone(3, admitted(), vec![Value::Int(2), Value::Array(vec![])]));
        assert!(parse_reply(&no_entries, &algorithms[3..4], true).is_err());

        // Wrong zone count, wrong algorithm, wrong shapes.
        assert!(parse_reply(&reply, &algorithms[..4], true).is_err());
        let mut swapped = algorithms;
        swapped.swap(0, 1);
        assert!(parse_reply(&reply, &swapped, true).is_err());
        let mut bad = reply.clone();
        bad[1] = Value::Int(-3);
        assert!(parse_reply(&bad, &algorithms, true).is_err());
        bad[1] = bulk("x");
        assert!(parse_reply(&bad, &algorithms, true).is_err());
        let mut bad = reply.clone();
        bad[4] = zone(0, rejected(), vec![bulk("nan"), Value::Int(t0i)]);
        assert!(parse_reply(&bad, &algorithms, true).is_err());
        bad[4] = zone(0, rejected(), vec![bulk("1.75")]);
        assert!(parse_reply(&bad, &algorithms, true).is_err());
        bad[4] = Value::Int(0);
        assert!(parse_reply(&bad, &algorithms, true).is_err());
    }

    #[test]
    fn compact_reply_becomes_a_verdict() {
        let t0: u64 = 1_700_000_000_000_000;
        let ints = |v: &[i64]| v.iter().map(|&n| Value::Int(n)).collect::<Vec<_>>();
        // Rejected by the second zone (retry 250 ms); the first admitted with 3 left.
        let reply = ints(&[0, 0, 250_000, t0 as i64, 1, 0, -1, 3, 9, 0, 0, 250_000, 0, 1_750_000]);
        let algorithms = [Algorithm::TokenBucket, Algorithm::LeakyBucket];
        let v = parse_reply(&reply, &algorithms, false).unwrap();
        assert!(!v.admitted);
        assert_eq!(v.retry_after_us, Some(250_000));
        assert_eq!((v.zones[0].admitted, v.zones[0].remaining, v.zones[0].reset_us), (true, 3, 9));
        assert_eq!(v.zones[0].retry_after_us, None);
        assert_eq!((v.zones[1].admitted, v.zones[1].retry_after_us), (false, Some(250_000)));
        assert_eq!(v.zones[1].expires_us, t0 + 1_750_000);
        // One zone: its remaining and reset after the request's admitted, delay and retry.
        let one = ints(&[1, 40_000, -1, t0 as i64, 0, 1_000_000]);
        let v = parse_reply(&one, &algorithms[1..], false).unwrap();
        assert!(v.admitted && v.zones[0].admitted);
        assert_eq!((v.delay_us, v.zones[0].delay_us), (40_000, 40_000));
        assert_eq!((v.zones[0].remaining, v.zones[0].reset_us, v.zones[0].retry_after_us), (0, 1_000_000, None));
        assert!(parse_reply(&one[..5], &algorithms[1..], false).is_err());
        // Too few values, a compact reply where a full one was asked for, a bad flag.
        assert!(parse_reply(&reply[..13], &algorithms, false).is_err());
        assert!(parse_reply(&reply, &algorithms, true).is_err());
        let mut bad = reply.clone();
        bad[4] = Value::Int(2);
        assert!(parse_reply(&bad, &algorithms, false).is_err());
    }
}

#[cfg(test)]
mod future_size {
    use super::*;
    use crate::limit::{DelayPolicy, LimitReq, Rate, SystemClock};
    use crate::store::LimitStore;

    /// The store's decision future is allocated for every decision (the store trait boxes it):
    /// the rare paths (Cluster, redis-rs) are boxed inside so that it stays small (it was 7.6 KB).
    #[test]
    fn a_decision_future_stays_small() {
        let config = super::super::RedisStoreConfig {
            url: "redis://127.0.0.1:1".into(),
            timeout: std::time::Duration::from_millis(50),
            clock: super::super::RedisClock::Redis,
            key_prefix: "w:".into(),
            tls: None,
        };
        let store = RedisStore::new(config, Arc::new(SystemClock)).expect("a store (it connects lazily)");
        let rate = Rate::parse("1r/s").expect("a rate");
        let limit = LimitReq { algorithm: Algorithm::LeakyBucket, rate, burst: 0, delay: DelayPolicy::NoDelay };
        let zones = [KeyedZone::new("z", "k", limit, 1)];
        let boxed = LimitStore::decide(&store, &zones);
        let size = std::mem::size_of_val(&*boxed);
        assert!(size <= 1024, "the decision future is {size} bytes");
    }
}
