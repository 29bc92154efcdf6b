//! The Redis store: the limit model in Lua scripts (`lua/`), so a fleet of proxies shares one
//! exact state. `limit_req.rs` decides rate limits (`lua/limit_req.lua`), `limit_conn.rs` takes
//! concurrency leases (`lua/limit_conn.lua`); this file is the store they share: its settings,
//! construction, connections, key names, health and the admin side (reset, inspect, fleet views).
//! Beside them: `script.rs` (limit_req's Lua parts joined into one script), `lane.rs` + `resp.rs`
//! (the decision lane and its RESP frames), `connection.rs` + `url.rs` (redis-rs: TLS, Cluster,
//! Sentinel), `slots.rs`, `slot_owners.rs`, `rollback.rs` (a Cluster's slots), `eviction.rs`
//! (whether Redis may evict limit state), `fleet.rs` (resets and the top-keys views).
//!
//! The connection (one server, a Redis Cluster or a Sentinel-watched master; `connection.rs`)
//! is created on the first decision so that its driver tasks live on the proxy's runtime (not on
//! whatever runtime built the config); it pipelines concurrent decisions and reconnects (and
//! follows failovers) by itself. Every decision is bounded by `RedisStoreConfig::timeout`: the
//! caller chooses what a failed decision means.

mod connection;
mod eviction;
mod fleet;
mod lane;
mod lease;
mod limit_conn;
mod limit_req;
mod quota;
mod resp;
mod rollback;
mod script;
mod slot_owners;
mod slots;
mod url;
mod zone_keys;

pub use eviction::{policy_can_evict, EvictionStatus};
pub use lease::{LeaseAsk, LeaseHolder};
pub use slots::key_slot;
use std::sync::Arc;
use std::time::Duration;
pub use url::{parse_redis_url, RedisTopology};
pub use zone_keys::ZoneKeys;

use async_trait::async_trait;

use self::connection::{Connector, RedisConn};
use self::eviction::Latest;
use self::lane::Lanes;
use self::slot_owners::SlotOwners;
use crate::limit::{Clock, State, Verdict};
use crate::store::{KeyedZone, LimitStore, StoreAdmin, StoreError, StoreHealth};

/// Whose clock decides: Redis `TIME` (one clock for the fleet) or the proxy's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisClock {
    Redis,
    Local,
}

#[derive(Debug, Clone)]
pub struct RedisStoreConfig {
    /// `redis://…`, `redis+cluster://…` or `redis+sentinel://…` (see `url.rs`).
    pub url: String,
    /// Upper bound of one decision, connecting included.
    pub timeout: Duration,
    pub clock: RedisClock,
    pub key_prefix: String,
    /// CA and client certificate for a `rediss://` URL; `None`: the default roots, no client cert.
    pub tls: Option<std::sync::Arc<RedisTls>>,
}

/// The TLS material of a `rediss://` store, read (and checked) at config load.
#[derive(Clone)]
pub struct RedisTls {
    pub ca_file: Option<std::path::PathBuf>,
    pub ca_pem: Option<Vec<u8>>,
    /// (cert file, cert PEM, key PEM) of the client certificate.
    pub client: Option<(std::path::PathBuf, Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTls {
    // Paths only: the key never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client.as_ref().map(|c| &c.0))
            .finish()
    }
}

impl RedisTls {
    pub(super) fn certificates(&self) -> ::redis::TlsCertificates {
        ::redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(_, cert, key)| ::redis::ClientTlsConfig { client_cert: cert.clone(), client_key: key.clone() }),
            root_cert: self.ca_pem.clone(),
        }
    }
}

pub struct RedisStore {
    config: RedisStoreConfig,
    clock: Arc<dyn Clock>,
    conns: Connector,
    /// The admin side's own connection (resets, the fleet's top-keys views): never queued
    /// behind decisions, and decisions never behind it.
    side: Connector,
    /// The id of the last reset read from the fleet's stream (`fleet.rs`).
    reset_cursor: std::sync::Mutex<String>,
    /// How long a concurrency lease lives without renewal (see `limit_conn.rs`).
    lease_ttl: Duration,
    /// Whether verdicts carry every zone's whole outcome (see `with_full_outcomes`).
    full_outcomes: bool,
    /// The eviction policy as last read (see `eviction.rs`).
    eviction: Latest,
    /// The per-thread, coalescing path of `limit_req` decisions (`lane.rs`); `None` where only
    /// redis-rs can go (TLS, Unix socket, Cluster, Sentinel).
    lanes: Option<Lanes>,
    /// On a plain-TCP Cluster: which master's lane decides a request of one hash slot
    /// (`slot_owners.rs`); `None` elsewhere, or with coalescing off.
    cluster_lanes: Option<Arc<SlotOwners>>,
}

/// Client keys longer than this are replaced by their SHA-256 in Redis key names.
const MAX_RAW_KEY_LEN: usize = 200;

impl RedisStore {
    /// Parses the URL; does no I/O (the connection is made lazily on the proxy's runtime).
    pub fn new(config: RedisStoreConfig, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        let conns = Connector::new(&config.url, config.timeout, config.tls.as_deref())?;
        let side = Connector::new(&config.url, config.timeout, config.tls.as_deref())?;
        let (lanes, cluster_lanes) = match parse_redis_url(&config.url) {
            Ok(RedisTopology::Single(url)) if config.tls.is_none() => {
                (lane::Target::for_url(&url, config.timeout).map(Lanes::new), None)
            }
            Ok(RedisTopology::Cluster(seeds)) if config.tls.is_none() => (None, SlotOwners::new(seeds, config.timeout)),
            _ => (None, None),
        };
        Ok(Self {
            lanes,
            cluster_lanes,
            config,
            clock,
            conns,
            side,
            reset_cursor: std::sync::Mutex::new(fleet::FIRST_RESET.to_string()),
            lease_ttl: Duration::from_secs(30),
            full_outcomes: false,
            eviction: Latest::default(),
        })
    }

    /// Makes every verdict carry each zone's whole outcome exactly as the model's: `excess`,
    /// `expires_us` and `next`, a sliding log's entries included. That costs Redis more (a %.17g
    /// per zone, O(entries) per sliding-log zone, a larger reply), so it is off by default: the
    /// compact reply has what the proxy reads (admitted, delay, retry, remaining, reset), and
    /// `excess`, `expires_us` and `next` are stand-ins (see `compact_zone`). For tests and
    /// debugging; `raw_state` reads a stored key either way.
    pub fn with_full_outcomes(mut self, on: bool) -> Self {
        self.full_outcomes = on;
        self
    }

    /// `[store] coalesce = false`: every decision its own call through redis-rs's shared
    /// connection, as before the decision lane (kept for A/B measurements and as a way out).
    pub fn with_coalescing(mut self, on: bool) -> Self {
        if !on {
            self.lanes = None;
            self.cluster_lanes = None;
        }
        self
    }

    /// Sets how long a concurrency lease lives without renewal.
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// Reads Redis's eviction policy now and every 30 s in the background, on a thread and
    /// connection of its own, warning when it can evict limit state (`eviction.rs`).
    pub fn watch_eviction_policy(&self) -> Result<(), String> {
        eviction::watch(&self.config.url, self.config.timeout, self.config.tls.as_deref(), self.eviction.clone())
    }

    /// "single", "cluster" or "sentinel": the deployment the URL names.
    pub fn topology(&self) -> &'static str {
        self.conns.kind()
    }

    fn config(&self) -> &RedisStoreConfig {
        &self.config
    }

    fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// Whether keys of different hash slots need separate calls.
    fn is_cluster(&self) -> bool {
        self.conns.is_cluster()
    }

    /// The Redis key of one zone's state for one client key.
    pub fn key_for(&self, zone: &str, key: &[u8]) -> Vec<u8> {
        redis_key(&self.config.key_prefix, zone, key)
    }

    /// The shared connection, made on first use. A failed connect is not cached: the next call
    /// tries again.
    async fn connection(&self) -> Result<RedisConn, StoreError> {
        self.conns.get().await
    }

    async fn bounded<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.config.timeout, work).await {
            Ok(result) => result,
            Err(_) => {
                self.conns.note_timeout();
                Err(StoreError::Timeout(self.config.timeout))
            }
        }
    }

    /// `now` as the scripts take it: the proxy's clock, or `None` for Redis `TIME`.
    fn now_arg(&self, local_now: impl FnOnce(&dyn Clock) -> u64) -> Option<u64> {
        match self.config.clock {
            RedisClock::Local => Some(local_now(self.clock.as_ref())),
            RedisClock::Redis => None,
        }
    }
}

#[async_trait]
impl LimitStore for RedisStore {
    // limit_req's decisions: `limit_req.rs`.
    async fn decide(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        self.decide_limit_req(zones).await
    }

    async fn peek(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        self.peek_limit_req(zones).await
    }

    async fn charge(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        self.charge_limit_req(zones).await
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}

/// The longest one count of keys per zone may take.
const ZONE_KEYS_TIMEOUT: Duration = Duration::from_secs(30);

#[async_trait]
impl StoreAdmin for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn inspect(&self, zone: &str, key: &[u8]) -> Result<Option<State>, StoreError> {
        self.raw_state(zone, key).await
    }

    async fn held(&self, zone: &str, key: &[u8]) -> Result<u32, StoreError> {
        self.held_leases(zone, key).await
    }

    async fn reset(&self, zone: &str, key: &[u8]) -> Result<(), StoreError> {
        self.bounded(self.reset_key(zone, key)).await
    }

    async fn lease_holders(&self, zone: &str, key: &[u8]) -> Result<Option<Vec<LeaseHolder>>, StoreError> {
        RedisStore::lease_holders(self, zone, key).await.map(Some)
    }

    /// One bounded `SCAN` (see `zone_keys.rs`), within [`ZONE_KEYS_TIMEOUT`], not a decision's
    /// budget. Not on a Cluster: each master would need its own scan.
    async fn zone_keys(&self, budget: u64) -> Result<ZoneKeys, StoreError> {
        if self.is_cluster() {
            return Err(StoreError::Reply(
                "counting keys per zone is not done on a Redis Cluster (each master would need its own SCAN)".into(),
            ));
        }
        let work = async {
            let mut conn = self.connection().await?;
            zone_keys::count(&mut conn, &self.config.key_prefix, budget).await
        };
        tokio::time::timeout(ZONE_KEYS_TIMEOUT, work).await.unwrap_or(Err(StoreError::Timeout(ZONE_KEYS_TIMEOUT)))
    }

    /// A write, not only a PING: a Redis that answers PING but refuses writes (`OOM command not
    /// allowed`, `BUSY` with a script running, a read-only replica) cannot decide.
    async fn ping(&self) -> Result<(), StoreError> {
        let probe_key = format!("{}health", self.config.key_prefix);
        self.bounded(self.conns.ping(probe_key.as_bytes())).await
    }

    /// The probe's answer, with the eviction policy's warnings once read.
    async fn health(&self) -> StoreHealth {
        let mut health = StoreHealth::from_ping(self.ping().await);
        let latest = self.eviction.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(Ok(status)) = latest {
            health.warnings.extend(status.warning());
            health.redis = Some(status);
        }
        health
    }

    async fn sync_fleet(
        &self,
        instance: &str,
        view: Option<Vec<u8>>,
        forget: &[String],
    ) -> Result<Option<crate::store::FleetSync>, StoreError> {
        self.bounded(self.exchange_views(instance, view, forget)).await.map(Some)
    }

    async fn quota_ledger(
        &self,
        zone: &str,
        key: &[u8],
        op: &str,
        args: &[String],
    ) -> Result<Option<Vec<String>>, StoreError> {
        self.quota_call(zone, key, op, args).await.map(Some)
    }
}

/// `<prefix><zone>:{<key>}`: the client key is the hash tag, so one client's zones share a slot.
///
/// A key longer than 200 bytes, or one starting with `#`, is replaced by `#` and the hex SHA-256 of
/// the key: Redis key names stay bounded, and no raw key can collide with a hashed one.
pub fn redis_key(prefix: &str, zone: &str, key: &[u8]) -> Vec<u8> {
    let hashed;
    let key = if key.len() > MAX_RAW_KEY_LEN || key.first() == Some(&b'#') {
        hashed = crate::keys::hashed(key);
        hashed.as_slice()
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
}
