//! The Redis store: every `limit_req` zone of a request decided by one call of `lua/limit_req.lua`,
//! the limit model in Lua, so a fleet of proxies shares one exact state.
//!
//! One `ConnectionManager` per store, created on the first decision so that its driver task lives
//! on the proxy's runtime (not on whatever runtime built the config); its clones pipeline
//! concurrent decisions over one socket and it reconnects by itself. Every decision is bounded by
//! `RedisStoreConfig::timeout`: the caller chooses what a failed decision means.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, Script, Value};
use async_trait::async_trait;
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use super::{LimitStore, StoreError, ZoneCheck};
use crate::limit::{decide_all, BucketState, Clock, DelayPolicy, State, Verdict, ZoneOutcome};

/// Whose clock decides: Redis `TIME` (one clock for the fleet) or the proxy's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisClock {
    Redis,
    Local,
}

#[derive(Debug, Clone)]
pub struct RedisStoreConfig {
    pub url: String,
    /// Upper bound of one decision, connecting included.
    pub timeout: Duration,
    pub clock: RedisClock,
    pub key_prefix: String,
}

pub struct RedisStore {
    config: RedisStoreConfig,
    clock: Arc<dyn Clock>,
    client: Client,
    conn: OnceCell<ConnectionManager>,
    script: Script,
    /// `lua/limit_conn.lua` and the lease TTL it is called with (see `redis_conn.rs`).
    pub(super) conn_script: Script,
    pub(super) lease_ttl: Duration,
}

/// Client keys longer than this are replaced by their SHA-256 in Redis key names.
const MAX_RAW_KEY_LEN: usize = 200;
/// Reply values before the per-zone ones, and per zone (see the header of `lua/limit_req.lua`).
const REPLY_HEAD: usize = 4;
const REPLY_PER_ZONE: usize = 8;

impl RedisStore {
    /// Parses the URL; does no I/O (the connection is made lazily on the proxy's runtime).
    pub fn new(config: RedisStoreConfig, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        let client = Client::open(config.url.as_str())?;
        Ok(Self {
            config,
            clock,
            client,
            conn: OnceCell::new(),
            script: Script::new(include_str!("../../lua/limit_req.lua")),
            conn_script: Script::new(include_str!("../../lua/limit_conn.lua")),
            lease_ttl: Duration::from_secs(30),
        })
    }

    /// Sets how long a concurrency lease lives without renewal.
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    pub(super) fn config(&self) -> &RedisStoreConfig {
        &self.config
    }

    pub(super) fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// The Redis key of one zone's state for one client key.
    pub fn key_for(&self, zone: &str, key: &[u8]) -> Vec<u8> {
        redis_key(&self.config.key_prefix, zone, key)
    }

    /// The stored state of one key, as the script left it (for tests and the admin API). `None`
    /// when absent, i.e. drained.
    pub async fn raw_state(&self, zone: &str, key: &[u8]) -> Result<Option<BucketState>, StoreError> {
        let redis_key = self.key_for(zone, key);
        let raw: Option<Vec<u8>> = self
            .bounded(async {
                let mut conn = self.connection().await?;
                Ok(::redis::cmd("GET").arg(&redis_key).query_async(&mut conn).await?)
            })
            .await?;
        raw.map(|raw| {
            parse_state(&raw).ok_or_else(|| {
                StoreError::Reply(format!("state {:?} is not \"<level> <last_us>\"", String::from_utf8_lossy(&raw)))
            })
        })
        .transpose()
    }

    /// The shared connection, made on first use. A failed connect is not cached: the next call
    /// tries again.
    pub(super) async fn connection(&self) -> Result<ConnectionManager, StoreError> {
        let conn = self
            .conn
            .get_or_try_init(|| async {
                // Short redis-side bounds and few retries: a decision waits at most
                // `config.timeout` anyway, and a backlog of reconnect attempts only delays recovery.
                let cfg = ConnectionManagerConfig::new()
                    .set_number_of_retries(2)
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_millis(500))
                    .set_response_timeout(Some(self.config.timeout.max(Duration::from_millis(50))))
                    .set_connection_timeout(Some(self.config.timeout.max(Duration::from_millis(200))));
                ConnectionManager::new_with_config(self.client.clone(), cfg).await
            })
            .await?;
        Ok(conn.clone())
    }

    pub(super) async fn bounded<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.config.timeout, work).await.map_err(|_| StoreError::Timeout(self.config.timeout))?
    }
}

#[async_trait]
impl LimitStore for RedisStore {
    async fn decide(&self, checks: &[ZoneCheck<'_>]) -> Result<Verdict, StoreError> {
        if checks.is_empty() {
            // Nothing to limit: no round trip.
            return Ok(decide_all(&[], self.clock.now_us()));
        }
        let mut call = self.script.prepare_invoke();
        for check in checks {
            call.key(self.key_for(check.zone, check.key));
        }
        match self.config.clock {
            RedisClock::Local => call.arg(self.clock.now_us()),
            RedisClock::Redis => call.arg(""),
        };
        for check in checks {
            let limit = &check.limit;
            call.arg(limit.rate.count).arg(limit.rate.period_us).arg(limit.burst);
            match limit.delay {
                DelayPolicy::NoDelay => call.arg(-1i64),
                DelayPolicy::After(threshold) => call.arg(threshold),
            };
            call.arg(check.cost);
        }
        let reply: Vec<Value> = self
            .bounded(async {
                let mut conn = self.connection().await?;
                Ok(call.invoke_async(&mut conn).await?)
            })
            .await?;
        parse_reply(&reply, checks.len())
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn inspect(&self, zone: &str, key: &[u8]) -> Result<Option<State>, StoreError> {
        Ok(self.raw_state(zone, key).await?.map(State::Bucket))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.bounded(async {
            let mut conn = self.connection().await?;
            ::redis::cmd("PING").query_async::<()>(&mut conn).await.map_err(StoreError::from)
        })
        .await
    }
}

/// `<prefix><zone>:{<key>}`: the client key is the hash tag, so one client's zones share a slot.
///
/// A key longer than 200 bytes, or one starting with `#`, is replaced by `#` and the hex SHA-256 of
/// the key: Redis key names stay bounded, and no raw key can collide with a hashed one.
pub fn redis_key(prefix: &str, zone: &str, key: &[u8]) -> Vec<u8> {
    let hashed;
    let key = if key.len() > MAX_RAW_KEY_LEN || key.first() == Some(&b'#') {
        let mut hex = String::with_capacity(65);
        hex.push('#');
        for byte in Sha256::digest(key) {
            let _ = write!(hex, "{byte:02x}");
        }
        hashed = hex;
        hashed.as_bytes()
    } else {
        key
    };
    let mut out = Vec::with_capacity(prefix.len() + zone.len() + key.len() + 3);
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(zone.as_bytes());
    out.extend_from_slice(b":{");
    out.extend_from_slice(key);
    out.push(b'}');
    out
}

/// Parses a stored "<level> <last_us>".
fn parse_state(raw: &[u8]) -> Option<BucketState> {
    let text = std::str::from_utf8(raw).ok()?;
    let (level, last_us) = text.split_once(' ')?;
    Some(BucketState { level: level.parse().ok()?, last_us: last_us.parse().ok()? })
}

/// Turns the script's reply (layout in the header of `lua/limit_req.lua`) into a `Verdict`.
fn parse_reply(reply: &[Value], zones: usize) -> Result<Verdict, StoreError> {
    let expected = REPLY_HEAD + REPLY_PER_ZONE * zones;
    if reply.len() != expected {
        return Err(StoreError::Reply(format!("{} values for {zones} zones, expected {expected}", reply.len())));
    }
    let zones = reply[REPLY_HEAD..]
        .chunks_exact(REPLY_PER_ZONE)
        .map(|z| {
            Ok(ZoneOutcome {
                admitted: flag(&z[0])?,
                excess: float(&z[1])?,
                delay_us: micros(&z[2])?,
                retry_after_us: optional_micros(&z[3])?,
                remaining: micros(&z[4])?,
                reset_us: micros(&z[5])?,
                expires_us: micros(&z[7])? + micros(&z[5])?,
                next: State::Bucket(BucketState { level: float(&z[6])?, last_us: micros(&z[7])? }),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(Verdict {
        admitted: flag(&reply[0])?,
        delay_us: micros(&reply[1])?,
        retry_after_us: optional_micros(&reply[2])?,
        zones,
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

    #[test]
    fn short_keys_are_kept_verbatim() {
        assert_eq!(redis_key("weir:", "per_ip", b"203.0.113.7"), b"weir:per_ip:{203.0.113.7}".to_vec());
    }

    #[test]
    fn long_and_hash_prefixed_keys_are_hashed() {
        let long = vec![b'a'; 201];
        let k = redis_key("weir:", "z", &long);
        assert_eq!(k.len(), "weir:z:{#}".len() + 64);
        assert!(k.starts_with(b"weir:z:{#"));
        assert_eq!(redis_key("weir:", "z", &[b'a'; 200]).len(), "weir:z:{}".len() + 200);
        // A raw key that looks like a hashed one is hashed too, so the two never meet.
        let hashed_name = &k["weir:z:{".len()..k.len() - 1];
        assert_ne!(redis_key("weir:", "z", hashed_name), k);
    }

    #[test]
    fn state_parses_exactly() {
        let s = parse_state(b"0.10000000000000001 1700000000000000").unwrap();
        assert_eq!(s.level, 0.1);
        assert_eq!(s.last_us, 1_700_000_000_000_000);
        assert_eq!(parse_state(b"garbage"), None);
        assert_eq!(parse_state(b"1 -5"), None);
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn reply_becomes_a_verdict() {
        let reply = vec![
            Value::Int(0),
            Value::Int(0),
            Value::Int(250_000),
            Value::Int(1_700_000_000_000_000),
            Value::Int(0),
            bulk("2.5"),
            Value::Int(0),
            Value::Int(250_000),
            Value::Int(0),
            Value::Int(1_750_000),
            bulk("1.75"),
            Value::Int(1_700_000_000_000_000),
        ];
        let v = parse_reply(&reply, 1).unwrap();
        assert!(!v.admitted);
        assert_eq!(v.retry_after_us, Some(250_000));
        assert_eq!(v.zones[0].excess, 2.5);
        assert_eq!(v.zones[0].retry_after_us, Some(250_000));
        assert!(matches!(v.zones[0].next, State::Bucket(b) if b.level == 1.75));
        assert!(parse_reply(&reply, 2).is_err());
        let mut bad = reply.clone();
        bad[1] = Value::Int(-3);
        assert!(parse_reply(&bad, 1).is_err());
        bad[1] = bulk("x");
        assert!(parse_reply(&bad, 1).is_err());
    }
}
