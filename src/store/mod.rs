//! Where limit state lives. Every store answers the same question — "may this request pass, and
//! after how long?" — for all `limit_req` zones of a request at once, all-or-nothing; and takes
//! concurrency leases (nginx `limit_conn`) in all conn zones of a request, all or none.
//!
//! The traits are here: the request's (`LimitStore`, `ConnStore`) and the operator's
//! (`StoreAdmin`: inspect, reset, readiness, fleet sync), which every store implements apart so
//! the engine's trait objects carry only the hot path. `memory/` is the in-process twin (the
//! model itself), `redis/` the fleet-wide store (Lua scripts in `lua/`), `guard/` what stands in
//! front of Redis (circuit breaker, deny cache), `bounded` the size-capped map both in-process
//! caches share.

mod bounded;
mod guard;
mod leased;
mod memory;
mod redis;

use std::time::Duration;

use async_trait::async_trait;

use crate::limit::{LimitReq, State, Verdict, ZoneOutcome};

pub use self::guard::GuardedStore;
pub use self::leased::{KeyLeases, LeaseLedger, LeasedStore, ModelLedger};
pub use self::memory::{
    decided_at_once, ready_now, MemoryAdmin, MemoryConnStore, MemoryStore, ZoneLimits, DEFAULT_MAX_KEYS,
};
pub use self::redis::{
    key_slot, parse_redis_url, policy_can_evict, redis_key, EvictionStatus, LeaseAsk, LeaseHolder, RedisClock,
    RedisStore, RedisStoreConfig, RedisTls, RedisTopology, ZoneKeys,
};

/// One `limit_req` zone of one request: built once by the key step (`engine::limit_req`), then read
/// by the store, the response headers and the statuses of the log. Borrows the zone's name from
/// the config snapshot the request holds; the key is the request's own.
#[derive(Debug, Clone)]
pub struct KeyedZone<'a> {
    /// The zone's stable name: state is keyed by it, so reloads that change a rate keep counters.
    pub zone: &'a str,
    /// The client key (already bounded in length by `keys`). Never empty: empty keys are not limited.
    pub key: Vec<u8>,
    /// The effective limit: the route's reference, or a matching per-key override of it.
    pub limit: LimitReq,
    pub cost: u64,
    /// Shadow mode: decided and reported, never enforced (decided apart from enforced zones).
    pub dry_run: bool,
    /// Which of the route's `limit_req` references this is (index into `Route::limits`); the stores
    /// ignore it.
    pub reference: usize,
    /// The zone's `lease` (docs/leases.md): decided from this instance's lease of the key's budget
    /// by the leasing layer (`store::leased`); `None`, and for every store below that layer: exact.
    pub lease: Option<crate::limit::lease::LeaseSpec>,
}

impl<'a> KeyedZone<'a> {
    /// An enforced zone outside any route (tests, tools): reference 0.
    pub fn new(zone: &'a str, key: impl Into<Vec<u8>>, limit: LimitReq, cost: u64) -> Self {
        KeyedZone { zone, key: key.into(), limit, cost, dry_run: false, reference: 0, lease: None }
    }
}

/// A refusal decided before the store's state is read (a deny-cache hit, a full memory zone): the
/// zones `retry_us` gives a retry time reject for it, the others are reported as not charged
/// (nothing was written, and their state is not known here); the request's retry is the longest.
pub(crate) fn refused_unread(zones: &[KeyedZone<'_>], retry_us: impl Fn(usize) -> Option<u64>, now_us: u64) -> Verdict {
    let mut longest = None;
    let results = zones
        .iter()
        .enumerate()
        .map(|(n, check)| match retry_us(n) {
            Some(retry) => {
                longest = longest.max(Some(retry));
                ZoneOutcome::rejected_for(&check.limit, check.cost, retry, now_us)
            }
            None => ZoneOutcome::not_charged(&check.limit, now_us),
        })
        .collect();
    Verdict { admitted: false, delay_us: 0, retry_after_us: longest, zones: results, decided_us: now_us }
}

/// What `/readyz` says about the store.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StoreHealth {
    /// Whether the store decides now (false: the failure policy answers every request).
    pub ready: bool,
    /// Why it is not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Settings that put the limits at risk (e.g. a Redis eviction policy).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Redis's eviction settings, once read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis: Option<EvictionStatus>,
}

impl StoreHealth {
    /// Ready when the probe answered; otherwise not, with its error as the reason.
    pub fn from_ping(ping: Result<(), StoreError>) -> Self {
        match ping {
            Ok(()) => StoreHealth { ready: true, ..StoreHealth::default() },
            Err(e) => StoreHealth { ready: false, reason: Some(e.to_string()), ..StoreHealth::default() },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the limit store did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    #[error("unexpected reply from the limit script: {0}")]
    Reply(String),
    /// The decision lane's connection failed (store/redis/lane.rs).
    #[error("redis connection: {0}")]
    Connection(String),
    /// Redis answered a decision with an error (OOM, BUSY, a script error).
    #[error("redis: {0}")]
    Server(String),
    #[error("the limit store is unreachable (circuit open; probing in the background)")]
    CircuitOpen,
}

/// What a request asks of the rate-limit store: deciding, peeking and charging. Nothing else is
/// here, so the engine's trait object carries only these (admin, readiness and fleet-sync calls are
/// on [`StoreAdmin`]).
#[async_trait]
pub trait LimitStore: Send + Sync {
    /// Decides every zone of one request atomically: charges all of them or none.
    async fn decide(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError>;

    /// The in-process store itself, when this is one: its decisions need no future (the proxy's
    /// hot path decides through it at once; a boxed future per decision and the moves of the
    /// awaiting futures cost more than the in-process decision itself).
    fn in_process(&self) -> Option<&MemoryStore> {
        None
    }

    /// What `decide` would say now, charging nothing (count by response: a request is checked
    /// before it is forwarded and charged once its response is known). A store that cannot
    /// evaluate without writing says so, and the failure policy answers.
    async fn peek(&self, _zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        Err(StoreError::Reply(format!("the {} store cannot check a zone without charging it", self.kind())))
    }

    /// Charges every zone after its response (charge from the response), in one atomic call: never
    /// refused, each zone's level capped at its `limit` — the caller raises the reference's burst
    /// by the debt cap (`engine::after_response`). Leaky buckets only keep debt.
    async fn charge(&self, _zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        Err(StoreError::Reply(format!("the {} store cannot charge after the response", self.kind())))
    }

    /// "memory" or "redis", for logs and metrics.
    fn kind(&self) -> &'static str;
}

/// What the operator's side asks of a store, off the request path: the admin API (inspect,
/// reset), `/readyz` (ping, health), the live view's fleet sync, and tests (held). Named for its
/// callers: the engine never holds one, and the admin API holds nothing else. Made from the same
/// `Arc`s as the stores it tends (`process::lasting::Lasting::admin`: the guarded Redis store
/// itself, or `MemoryAdmin` over both memory stores), so a reset reaches the state the engine
/// decides on, and the guard's deny cache.
#[async_trait]
pub trait StoreAdmin: Send + Sync {
    /// "memory" or "redis", for the admin's answers (the same as the store's `LimitStore::kind`).
    fn kind(&self) -> &'static str;

    /// The stored state of one key (for the admin API); `None` when absent, i.e. fully drained.
    async fn inspect(&self, _zone: &str, _key: &[u8]) -> Result<Option<State>, StoreError> {
        Err(StoreError::Reply(format!("the {} store keeps no rate-limit state to inspect", self.kind())))
    }

    /// Leases held for one key (admin API, tests).
    async fn held(&self, _zone: &str, _key: &[u8]) -> Result<u32, StoreError> {
        Err(StoreError::Reply(format!("the {} store keeps no concurrency leases", self.kind())))
    }

    /// Forgets one key's state in a zone (admin reset): fleet-wide where the store is shared, and
    /// announced to the other instances (see [`StoreAdmin::sync_fleet`]).
    async fn reset(&self, _zone: &str, _key: &[u8]) -> Result<(), StoreError> {
        Err(StoreError::Reply(format!("the {} store cannot reset keys", self.kind())))
    }

    /// The live holders of a leased key's budget (docs/leases.md), for the admin's `GET /limits`.
    /// `None`: the store keeps no holders (memory: it ignores `lease`).
    async fn lease_holders(&self, _zone: &str, _key: &[u8]) -> Result<Option<Vec<LeaseHolder>>, StoreError> {
        Ok(None)
    }

    /// How many keys each zone holds in the store, examining at most about `budget` keys (the
    /// admin's `GET /zones`). The memory store's counts are its `weir_memory_keys` series.
    async fn zone_keys(&self, _budget: u64) -> Result<ZoneKeys, StoreError> {
        Err(StoreError::Reply(format!(
            "the {} store does not count keys here; its counts per zone are the weir_memory_keys metric",
            self.kind()
        )))
    }

    /// Whether the store answers now, writes included (the breaker's probe).
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Readiness and warnings, for `/readyz`.
    async fn health(&self) -> StoreHealth {
        StoreHealth::from_ping(self.ping().await)
    }

    /// Shares this instance's top-keys view (`src/top/fleet.rs`) and reads the fleet's: publishes
    /// `view` as `instance`'s (`None`: nothing to share, its old view is dropped), drops the views
    /// of the instances in `forget`, and returns every instance's view with the resets announced
    /// since the previous call. `None`: the store is not shared (memory), there is no fleet.
    async fn sync_fleet(
        &self,
        _instance: &str,
        _view: Option<Vec<u8>>,
        _forget: &[String],
    ) -> Result<Option<FleetSync>, StoreError> {
        Ok(None)
    }

    /// One atomic step on an Envoy RLQS ledger (`lua/rlqs_demand.lua`; `src/rls/quota/ledger.rs`
    /// says what `op` and `args` mean): the script's reply. `None`: the store is not shared
    /// (memory), so the caller keeps its ledger in process.
    async fn quota_ledger(
        &self,
        _zone: &str,
        _key: &[u8],
        _op: &str,
        _args: &[String],
    ) -> Result<Option<Vec<String>>, StoreError> {
        Ok(None)
    }
}

/// What [`StoreAdmin::sync_fleet`] read.
#[derive(Debug, Default)]
pub struct FleetSync {
    /// Every instance's latest view, this one's included.
    pub views: Vec<Vec<u8>>,
    /// Keys reset by any instance since the previous call: (zone, key).
    pub resets: Vec<(String, Vec<u8>)>,
}

/// One `limit_conn` zone of one request, built once by the key step (`engine::limit_conn`).
#[derive(Debug, Clone)]
pub struct KeyedConn<'a> {
    pub zone: &'a str,
    /// The client key; never empty (empty keys are not limited).
    pub key: Vec<u8>,
    /// Requests in flight allowed per key, fleet-wide.
    pub max: u32,
    pub dry_run: bool,
    /// Index into `Route::conn_limits`; the stores ignore it.
    pub reference: usize,
}

impl<'a> KeyedConn<'a> {
    /// An enforced conn zone outside any route (tests, tools): reference 0.
    pub fn new(zone: &'a str, key: impl Into<Vec<u8>>, max: u32) -> Self {
        KeyedConn { zone, key: key.into(), max, dry_run: false, reference: 0 }
    }
}

/// Where a held lease lives, to renew and release it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseKey {
    pub zone: String,
    pub key: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnVerdict {
    pub admitted: bool,
    /// Index of the first zone at its max, when rejected.
    pub rejected: Option<usize>,
    /// Leases each zone held before this request.
    pub held: Vec<u32>,
}

/// What a request asks of the concurrency store: acquiring, renewing and releasing its leases
/// (counting them is [`StoreAdmin::held`]).
#[async_trait]
pub trait ConnStore: Send + Sync {
    /// Takes `lease` in every zone if each holds fewer than its max; otherwise takes nothing.
    async fn acquire(&self, zones: &[KeyedConn<'_>], lease: &str) -> Result<ConnVerdict, StoreError>;
    /// Extends a held lease (only where it still exists).
    async fn renew(&self, keys: &[LeaseKey], lease: &str) -> Result<(), StoreError>;
    async fn release(&self, keys: &[LeaseKey], lease: &str) -> Result<(), StoreError>;
    /// How often a held lease must be renewed; `None` when leases never expire (in-process).
    fn renew_every(&self) -> Option<Duration>;
}
