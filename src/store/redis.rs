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
use crate::limit::{decide_all, Algorithm, BucketState, Clock, DelayPolicy, State, Verdict, ZoneOutcome};

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
    /// Whether verdicts carry the sliding log's entries (see `with_log_entries`).
    log_entries: bool,
}

/// Client keys longer than this are replaced by their SHA-256 in Redis key names.
const MAX_RAW_KEY_LEN: usize = 200;
/// Reply values before the per-zone arrays, and the values every zone's array starts with (see the
/// header of `lua/limit_req.lua`).
const REPLY_HEAD: usize = 4;
const REPLY_ZONE_COMMON: usize = 8;
/// The largest integer a Lua number (a double) holds exactly.
const MAX_EXACT: u64 = 1 << 53;

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
            log_entries: false,
        })
    }

    /// Makes every verdict carry a sliding-log zone's entries in `ZoneOutcome::next`, exactly as
    /// the model's. That costs O(entries) per request instead of O(log entries), so it is off by
    /// default, and then a sliding-log zone's `next` is `State::Log(vec![])` (nothing outside the
    /// memory store reads `next`; `raw_state` reads a stored log). For tests and debugging.
    pub fn with_log_entries(mut self, on: bool) -> Self {
        self.log_entries = on;
        self
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
            Some(RawState::Text(text)) => parse_state(&text).map(Some).ok_or_else(|| {
                StoreError::Reply(format!("state {:?} is in no known format", String::from_utf8_lossy(&text)))
            }),
            Some(RawState::Log(scores)) => {
                let entries = scores
                    .iter()
                    .map(|score| {
                        std::str::from_utf8(score).ok().and_then(parse_time).ok_or_else(|| {
                            StoreError::Reply(format!("log entry {:?} is not µs", String::from_utf8_lossy(score)))
                        })
                    })
                    .collect::<Result<Vec<u64>, StoreError>>()?;
                Ok(Some(State::Log(entries)))
            }
        }
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
        call.arg(if self.log_entries { "1" } else { "0" });
        for check in checks {
            let limit = &check.limit;
            call.arg(limit.algorithm.id()).arg(limit.rate.count).arg(limit.rate.period_us).arg(limit.burst);
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
        let algorithms: Vec<Algorithm> = checks.iter().map(|c| c.limit.algorithm).collect();
        parse_reply(&reply, &algorithms, self.log_entries)
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn inspect(&self, zone: &str, key: &[u8]) -> Result<Option<State>, StoreError> {
        self.raw_state(zone, key).await
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

/// A stored value before parsing: a string, or the scores of a sorted set.
enum RawState {
    Text(Vec<u8>),
    Log(Vec<Vec<u8>>),
}

/// Parses a stored string (formats in the header of `lua/limit_req.lua`): "<level> <last_us>",
/// "t <tokens> <last_us>", "f <start_us> <count>" or "s <start_us> <prev> <curr>".
fn parse_state(raw: &[u8]) -> Option<State> {
    let text = std::str::from_utf8(raw).ok()?;
    let words: Vec<&str> = text.split(' ').collect();
    let float = |w: &str| w.parse::<f64>().ok().filter(|f| f.is_finite());
    Some(match words.as_slice() {
        ["t", tokens, last_us] => State::Tokens { tokens: float(tokens)?, last_us: parse_time(last_us)? },
        ["f", start_us, count] => State::Window { start_us: parse_time(start_us)?, count: parse_time(count)? },
        ["s", start_us, prev, curr] => {
            State::Sliding { start_us: parse_time(start_us)?, prev: parse_time(prev)?, curr: parse_time(curr)? }
        }
        [level, last_us] => State::Bucket(BucketState { level: float(level)?, last_us: parse_time(last_us)? }),
        _ => return None,
    })
}

/// A non-negative integer as the script writes it (digits; a sorted-set score may also come as a
/// float's text, e.g. "1.7e+15"), at most 2^53.
fn parse_time(text: &str) -> Option<u64> {
    if let Ok(n) = text.parse::<u64>() {
        return (n <= MAX_EXACT).then_some(n);
    }
    let f = text.parse::<f64>().ok()?;
    (f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f <= MAX_EXACT as f64).then_some(f as u64)
}

/// Turns the script's reply (layout in the header of `lua/limit_req.lua`) into a `Verdict`. The
/// zones come in the order of `algorithms`, each zone's algorithm as sent; `log_entries`: whether
/// the script was asked for the sliding log's entries.
fn parse_reply(reply: &[Value], algorithms: &[Algorithm], log_entries: bool) -> Result<Verdict, StoreError> {
    let expected = REPLY_HEAD + algorithms.len();
    if reply.len() != expected {
        return Err(StoreError::Reply(format!(
            "{} values for {} zones, expected {expected}",
            reply.len(),
            algorithms.len()
        )));
    }
    let zones = reply[REPLY_HEAD..]
        .iter()
        .zip(algorithms)
        .map(|(zone, &algorithm)| parse_zone(zone, algorithm, log_entries))
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(Verdict {
        admitted: flag(&reply[0])?,
        delay_us: micros(&reply[1])?,
        retry_after_us: optional_micros(&reply[2])?,
        zones,
    })
}

/// One zone's array: the common values, then `next` in the algorithm's layout.
fn parse_zone(value: &Value, algorithm: Algorithm, log_entries: bool) -> Result<ZoneOutcome, StoreError> {
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
        Algorithm::TokenBucket => State::Tokens { tokens: float(&s[0])?, last_us: micros(&s[1])? },
        Algorithm::FixedWindow => State::Window { start_us: micros(&s[0])?, count: micros(&s[1])? },
        Algorithm::SlidingWindow => {
            State::Sliding { start_us: micros(&s[0])?, prev: micros(&s[1])?, curr: micros(&s[2])? }
        }
        Algorithm::SlidingLog => {
            let len = micros(&s[0])?;
            let Value::Array(times) = &s[1] else {
                return Err(StoreError::Reply(format!("expected the log's entries, got {:?}", s[1])));
            };
            // Empty unless the store asked for the entries.
            let expected = if log_entries { len } else { 0 };
            if times.len() as u64 != expected {
                return Err(StoreError::Reply(format!("{} log entries, expected {expected}", times.len())));
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
        let leaky = State::Bucket(BucketState { level: 0.1, last_us: 1_700_000_000_000_000 });
        assert_eq!(parse_state(b"0.10000000000000001 1700000000000000"), Some(leaky));
        assert_eq!(
            parse_state(b"t 2.5 1700000000000000"),
            Some(State::Tokens { tokens: 2.5, last_us: 1_700_000_000_000_000 })
        );
        assert_eq!(
            parse_state(b"f 1699999980000000 7"),
            Some(State::Window { start_us: 1_699_999_980_000_000, count: 7 })
        );
        assert_eq!(
            parse_state(b"s 1699999980000000 3 4"),
            Some(State::Sliding { start_us: 1_699_999_980_000_000, prev: 3, curr: 4 })
        );
        for bad in ["garbage", "1 -5", "t 1", "f 1.5 2", "s 1 2", "x 1 2", "1 2 3", "inf 5", ""] {
            assert_eq!(parse_state(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(parse_time("1700000000000000"), Some(1_700_000_000_000_000));
        assert_eq!(parse_time("1.7e+15"), Some(1_700_000_000_000_000));
        assert_eq!(parse_time("1.5"), None);
        assert_eq!(parse_time("-1"), None);
        assert_eq!(parse_time("18014398509481984"), None);
    }

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
        assert_eq!(v.zones[1].next, State::Tokens { tokens: 0.5, last_us: t0 });
        assert_eq!(v.zones[1].remaining, 3);
        assert_eq!(v.zones[2].next, State::Window { start_us: t0 - 5, count: 2 });
        assert_eq!(v.zones[3].next, State::Log(vec![t0 - 1, t0]));
        assert_eq!(v.zones[4].next, State::Sliding { start_us: t0 - 5, prev: 4, curr: 1 });
        // Entries sent although not asked for, or missing although asked for.
        assert!(parse_reply(&reply, &algorithms, false).is_err());
        let mut no_entries = head();
        no_entries.push(zone(3, admitted(), vec![Value::Int(2), Value::Array(vec![])]));
        assert_eq!(parse_reply(&no_entries, &algorithms[3..4], false).unwrap().zones[0].next, State::Log(vec![]));
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
}
