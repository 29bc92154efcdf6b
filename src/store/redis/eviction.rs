//! Whether Redis may evict limit state. Under `maxmemory`, a Redis with `allkeys-*` evicts any key,
//! and one with `volatile-*` any key with a TTL — every Weir key has one (it expires when drained).
//! An evicted key reads as "drained": its client gets its whole burst back, and an attacker who
//! floods new keys can make that happen on purpose. Only `noeviction` (Redis refuses writes when
//! full, and the failure policy decides) keeps limits exact; Weir should have a Redis of its own.
//!
//! The policy is read at start and every [`CHECK_EVERY`] in the background, from `INFO memory`
//! (allowed on managed Redis, where `CONFIG` is often renamed or disabled), falling back to
//! `CONFIG GET`. A risky policy is logged at `warn`, exported as `weir_redis_eviction_risk` and
//! shown by `/readyz`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tracing::{info, warn};

use super::connection::{Connector, RedisConn};
use crate::metrics::METRICS;
use crate::store::StoreError;

/// How often the policy is read again (an operator may change it at run time).
pub const CHECK_EVERY: Duration = Duration::from_secs(30);

/// What Weir knows of Redis's eviction settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EvictionStatus {
    /// `maxmemory-policy`, e.g. "noeviction" or "allkeys-lru".
    pub maxmemory_policy: String,
    /// `maxmemory` in bytes; 0 = no limit (Redis then never evicts, whatever the policy).
    pub maxmemory: u64,
    /// Whether Redis may evict limit state now.
    pub eviction_risk: bool,
    /// Where the values came from: "INFO memory" or "CONFIG GET".
    pub source: &'static str,
}

impl EvictionStatus {
    fn new(policy: String, maxmemory: u64, source: &'static str) -> Self {
        let eviction_risk = maxmemory > 0 && policy_can_evict(&policy);
        Self { maxmemory_policy: policy, maxmemory, eviction_risk, source }
    }

    /// The warning an operator should act on, if any.
    pub fn warning(&self) -> Option<String> {
        self.eviction_risk.then(|| {
            format!(
                "redis maxmemory-policy is {} with maxmemory {} bytes: when Redis is full it may evict rate-limit \
                 state, and a client whose state is evicted gets its whole burst back. Set maxmemory-policy \
                 noeviction on a Redis dedicated to Weir",
                self.maxmemory_policy, self.maxmemory
            )
        })
    }
}

/// `allkeys-*` evicts any key; `volatile-*` keys with a TTL, which every Weir key has.
pub fn policy_can_evict(policy: &str) -> bool {
    policy != "noeviction"
}

/// Parses `INFO memory`'s `maxmemory:` and `maxmemory_policy:` lines.
pub fn parse_info(text: &str) -> Option<(String, u64)> {
    let field = |name: &str| {
        text.lines().find_map(|l| l.trim().strip_prefix(name).and_then(|v| v.strip_prefix(':')).map(str::trim))
    };
    let policy = field("maxmemory_policy")?.to_string();
    let maxmemory = field("maxmemory")?.parse().ok()?;
    Some((policy, maxmemory))
}

/// Every text in a reply: one server's `INFO`, or a cluster's, one per master.
fn texts(value: &::redis::Value) -> Vec<String> {
    use ::redis::Value;
    match value {
        Value::BulkString(bytes) => vec![String::from_utf8_lossy(bytes).into_owned()],
        Value::SimpleString(text) => vec![text.clone()],
        Value::VerbatimString { text, .. } => vec![text.clone()],
        Value::Array(items) | Value::Set(items) => items.iter().flat_map(texts).collect(),
        Value::Map(pairs) => pairs.iter().flat_map(|(_, v)| texts(v)).collect(),
        _ => Vec::new(),
    }
}

/// Reads the settings over `conn`: `INFO memory` (on a cluster, every master's: the riskiest
/// counts), else `CONFIG GET`.
pub async fn read_status(conn: &mut RedisConn) -> Result<EvictionStatus, StoreError> {
    let info: Result<::redis::Value, _> = ::redis::cmd("INFO").arg("memory").query_async(conn).await;
    let parsed: Vec<(String, u64)> =
        info.as_ref().map(|v| texts(v).iter().filter_map(|t| parse_info(t)).collect()).unwrap_or_default();
    let statuses: Vec<EvictionStatus> =
        parsed.into_iter().map(|(policy, maxmemory)| EvictionStatus::new(policy, maxmemory, "INFO memory")).collect();
    if let Some(worst) = statuses.iter().find(|s| s.eviction_risk).or(statuses.first()) {
        return Ok(worst.clone());
    }
    let policy: Vec<String> = ::redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").query_async(conn).await?;
    let maxmemory: Vec<String> = ::redis::cmd("CONFIG").arg("GET").arg("maxmemory").query_async(conn).await?;
    match (policy.get(1), maxmemory.get(1).and_then(|m| m.parse().ok())) {
        (Some(policy), Some(maxmemory)) => Ok(EvictionStatus::new(policy.clone(), maxmemory, "CONFIG GET")),
        _ => Err(StoreError::Reply(format!(
            "neither INFO memory nor CONFIG GET told the eviction policy (INFO: {})",
            info.err().map_or_else(|| "no maxmemory_policy line".to_string(), |e| e.to_string())
        ))),
    }
}

/// The latest result of the background check, shared with `/readyz`.
pub type Latest = Arc<Mutex<Option<Result<EvictionStatus, String>>>>;

/// Starts the background check on a thread of its own (with its own connection), so that it runs
/// from start-up, before any request. Lives as long as the process.
pub fn watch(url: &str, timeout: Duration, tls: Option<&super::RedisTls>, latest: Latest) -> Result<(), String> {
    let connector = Connector::new(url, timeout, tls).map_err(|e| format!("store: {e}"))?;
    std::thread::Builder::new()
        .name("weir-redis-eviction".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    warn!(error = %e, "cannot check the redis eviction policy: no runtime");
                    return;
                }
            };
            runtime.block_on(async move {
                // A generous bound: this is no request's budget.
                let bound = timeout.max(Duration::from_secs(2));
                loop {
                    let result = tokio::time::timeout(bound, async {
                        let mut conn = connector.get().await?;
                        read_status(&mut conn).await
                    })
                    .await
                    .unwrap_or(Err(StoreError::Timeout(bound)))
                    .map_err(|e| e.to_string());
                    record(&latest, result);
                    tokio::time::sleep(CHECK_EVERY).await;
                }
            });
        })
        .map_err(|e| format!("cannot start the redis eviction check: {e}"))?;
    Ok(())
}

/// Stores a check's result; logs when what it says changes.
fn record(latest: &Latest, result: Result<EvictionStatus, String>) {
    let mut slot = latest.lock().unwrap_or_else(|p| p.into_inner());
    let changed = match (&*slot, &result) {
        (Some(Ok(old)), Ok(new)) => old != new,
        (Some(Err(_)), Err(_)) => false,
        _ => true,
    };
    if changed {
        match &result {
            Ok(status) => match status.warning() {
                Some(warning) => warn!(policy = %status.maxmemory_policy, maxmemory = status.maxmemory, "{warning}"),
                None => info!(
                    policy = %status.maxmemory_policy,
                    maxmemory = status.maxmemory,
                    "redis eviction policy keeps limit state (noeviction or no maxmemory)"
                ),
            },
            Err(e) => info!(error = %e, "cannot read the redis eviction policy; will try again"),
        }
    }
    if let Ok(status) = &result {
        METRICS.redis_eviction_risk.set(i64::from(status.eviction_risk));
    }
    // A failed check keeps the last known settings: Redis being down is reported elsewhere.
    if result.is_ok() || slot.is_none() {
        *slot = Some(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_info_memory() {
        let info = "# Memory\r\nused_memory:1000\r\nmaxmemory:2097152\r\nmaxmemory_human:2.00M\r\n\
                    maxmemory_policy:allkeys-lru\r\n";
        assert_eq!(parse_info(info), Some(("allkeys-lru".to_string(), 2_097_152)));
        assert_eq!(parse_info("# Memory\r\nused_memory:1\r\n"), None);
    }

    #[test]
    fn only_noeviction_or_no_limit_is_safe() {
        for (policy, maxmemory, risk) in [
            ("noeviction", 1 << 20, false),
            ("allkeys-lru", 1 << 20, true),
            ("volatile-ttl", 1 << 20, true),
            ("volatile-lru", 1 << 20, true),
            ("allkeys-random", 0, false),
        ] {
            let status = EvictionStatus::new(policy.to_string(), maxmemory, "INFO memory");
            assert_eq!(status.eviction_risk, risk, "{policy} {maxmemory}");
            assert_eq!(status.warning().is_some(), risk);
        }
    }
}
