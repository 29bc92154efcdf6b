//! The leasing layer (issue 47, docs/leases.md): a `LimitStore` in front of the configured store
//! that answers leased zones from this instance's lease of each key's budget, without a round
//! trip while it holds tokens. Every front door decides through the engine's store (the proxy,
//! the rate limit service), so each gets leasing from this one layer.
//!
//! Per leased key it keeps a [`Lessee`] (the pure model: what is held, how big the next lease is,
//! whether the budget is known empty) and drives it: a request spends a token locally; with none
//! it asks the ledger (Redis, `lua/limit_req/lease.lua`) for a lease and waits for the answer,
//! one ask per key at a time; a busy key renews in the background before running dry; while the
//! store said the budget is empty, a refusal costs no call. Zones without a lease go to the inner
//! store in one call; a request mixing both stays all or nothing (the local admissions are
//! refunded to their leases when the exact zones reject, and the exact zones are not asked when a
//! leased zone rejects). Unused tokens go back at reload, at exit and when a key goes cold
//! ([`LeasedStore::run`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch, Notify};

use crate::limit::lease::{Answered, Grant, LeaseSpec, Lessee, LocalDecision, Spent};
use crate::limit::{BucketState, Clock, LimitReq, State, Verdict, ZoneOutcome};
use crate::metrics::METRICS;
use crate::store::{KeyedZone, LeaseAsk, LimitStore, StoreError};

mod model;
pub use model::ModelLedger;

/// Where leases come from: the shared store's grant and give-back (`RedisStore`).
#[async_trait]
pub trait LeaseLedger: Send + Sync {
    async fn grant(&self, zone: &KeyedZone<'_>, holder: &str, ask: LeaseAsk) -> Result<Grant, StoreError>;
    /// Several keys' grants, answered in order as if granted one by one; a store that can makes
    /// them in one round trip (Redis: one script call).
    async fn grants(&self, asks: &[(KeyedZone<'_>, LeaseAsk)], holder: &str) -> Result<Vec<Grant>, StoreError> {
        let mut grants = Vec::with_capacity(asks.len());
        for (zone, ask) in asks {
            grants.push(self.grant(zone, holder, *ask).await?);
        }
        Ok(grants)
    }
    /// Whether [`LeaseLedger::grants`] makes several grants in one round trip: then the layer
    /// sends its asks together (one call in flight at a time, the asks made meanwhile in the
    /// next), and tops up its other busy keys in the same call. A ledger that answers at once
    /// (the model's, `weir replay`'s simulated fleet) is asked directly.
    fn batches(&self) -> bool {
        false
    }
    async fn give_back(
        &self,
        zone: &KeyedZone<'_>,
        holder: &str,
        unused: u64,
        window_start_us: Option<u64>,
    ) -> Result<(), StoreError>;
}

/// Leased keys kept at most; past it, a new key's zone is decided exactly (the inner store).
const MAX_KEYS: usize = 100_000;
/// After a failed ask, asks fail at once for this long (the zone's `on_error` answers): a Redis
/// that is down costs each request no timeout.
const PAUSE_AFTER_FAILURE_US: u64 = 250_000;
/// How often the keeper looks for cold keys, ended leases and a reload.
const SWEEP_EVERY: Duration = Duration::from_millis(20);
/// Asks one request makes at most (each granted, then spent by the key's other requests first, or
/// dead on arrival) before it is refused. Waiting for another request's ask is not counted: under
/// contention a request may wait through many answers, and only a store that does not answer
/// (no answer within a lifetime) is a failure for the zone's `on_error` to answer.
const MAX_ASKS: usize = 4;

/// Grants one batched call carries at most (the asks beyond it go in the next).
const MAX_GRANTS_PER_CALL: usize = 64;
/// Keys looked at for top-ups per batched call at most: a call stays cheap however many keys are
/// leased here (the keys not looked at renew on their own, as without batching).
const MAX_TOP_UP_SCAN: usize = 1024;

/// One leased key.
struct Entry {
    zone: String,
    key: Vec<u8>,
    state: Mutex<KeyState>,
    /// Bumped when an ask is answered: requests waiting for it decide again.
    answers: watch::Sender<u64>,
}

struct KeyState {
    lessee: Lessee,
    /// The limit and lease the key was last decided with (for renewals and give-backs).
    limit: LimitReq,
    spec: LeaseSpec,
    last_used_us: u64,
    /// Where this key's tokens went since it was first leased here (the admin's view):
    /// `granted − spent − given_back − expired_unused` is what is held.
    tally: Tally,
}

/// Tokens of one key through this instance's hands since its entry was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    /// Granted by the store (dead-on-arrival grants included).
    pub granted: u64,
    /// Spent by admitted requests (refunds of all-or-nothing refusals taken off).
    pub spent: u64,
    /// Given back unused (key gone cold, a dead-on-arrival grant).
    pub given_back: u64,
    /// Left in leases that ended.
    pub expired_unused: u64,
}

/// This instance's side of one leased key now (`GET /limits`), on its own clock.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KeyLeases {
    /// This instance's id among the key's holders in Redis.
    pub holder: String,
    /// Tokens usable now (the sum over `leases`).
    pub held: u64,
    /// The live leases, oldest first.
    pub leases: Vec<LeaseNow>,
    /// An ask for a lease is in flight.
    pub asking: bool,
    /// The store said the budget is empty for this long: refusals until then cost no call.
    pub known_empty_for_ms: Option<f64>,
    #[serde(flatten)]
    pub tally: Tally,
}

/// One live lease.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LeaseNow {
    pub tokens_left: u64,
    pub ends_in_ms: f64,
}

impl KeyState {
    /// Takes the tokens left in leases that ended by `now_us` and counts them, in the metric and
    /// the tally, once (by the keeper or by an admin read, whichever comes first).
    fn count_expired(&mut self, zone: &str, now_us: u64) {
        let expired = self.lessee.take_expired(now_us);
        if expired > 0 {
            METRICS.lease_tokens.with_label_values(&[zone, "expired_unused"]).inc_by(expired);
            self.tally.expired_unused += expired;
        }
    }
}

impl Entry {
    fn lock(&self) -> MutexGuard<'_, KeyState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The key as a zone of one request of `cost`, for the ledger.
    fn zone(&self, limit: LimitReq, spec: LeaseSpec, cost: u64) -> KeyedZone<'_> {
        KeyedZone {
            zone: &self.zone,
            key: self.key.clone(),
            limit,
            cost,
            dry_run: false,
            reference: 0,
            lease: Some(spec),
        }
    }
}

/// An ask in flight: if it ends without an answer (an error, the request's future dropped), the
/// lessee learns it failed and the requests waiting for it decide again.
struct InFlight<'a> {
    entry: &'a Entry,
    answered: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.entry.lock().lessee.failed();
        }
        self.entry.answers.send_modify(|n| *n += 1);
    }
}

/// Unused tokens to give back: the key, its limit and lease, the tokens, their window.
type Return = (Arc<Entry>, LimitReq, LeaseSpec, u64, Option<u64>);

enum Taken {
    Admitted { spent: Option<Spent>, held: u64, ends_us: Option<u64> },
    Refused { retry_us: Option<u64> },
}

/// An ask waiting for the next batched call (`Shared::send_batches`).
struct Pending {
    entry: Arc<Entry>,
    limit: LimitReq,
    spec: LeaseSpec,
    ask: LeaseAsk,
    sent_us: u64,
    /// Where a request's ask is answered; `None`: a renewal or a top-up, settled by the sender.
    reply: Option<oneshot::Sender<Result<Grant, StoreError>>>,
}

/// The asks waiting to be sent, and whether a call is being sent now.
#[derive(Default)]
struct Batch {
    pending: Vec<Pending>,
    sending: bool,
}

struct Shared {
    inner: Arc<dyn LimitStore>,
    ledger: Arc<dyn LeaseLedger>,
    /// The keeper's give-backs (cold keys, reload, exit): a ledger whose connection lives on the
    /// keeper's own runtime, which outlives the proxy's at exit.
    returns: Arc<dyn LeaseLedger>,
    clock: Arc<dyn Clock>,
    /// This instance's id among the key's holders.
    holder: String,
    keys: Mutex<HashMap<Vec<u8>, Arc<Entry>>>,
    batch: Mutex<Batch>,
    paused_until_us: AtomicU64,
    reloaded: AtomicBool,
    stop: Notify,
    stopped: (Mutex<bool>, Condvar),
    running: AtomicBool,
}

/// The layer; cheap to clone (one shared state).
#[derive(Clone)]
pub struct LeasedStore(Arc<Shared>);

impl LeasedStore {
    /// `returns` takes the keeper's give-backs (see [`LeasedStore::run`]): a ledger of its own, so
    /// that its connection is made on the keeper's runtime.
    pub fn new(
        inner: Arc<dyn LimitStore>,
        ledger: Arc<dyn LeaseLedger>,
        returns: Arc<dyn LeaseLedger>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        // Unique within the process too (weir replay's simulated fleet is one process).
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let holder = format!("i{}{:012}{n}", std::process::id(), nanos % 1_000_000_000_000);
        LeasedStore(Arc::new(Shared {
            inner,
            ledger,
            returns,
            clock,
            holder,
            keys: Mutex::new(HashMap::new()),
            batch: Mutex::default(),
            paused_until_us: AtomicU64::new(0),
            reloaded: AtomicBool::new(false),
            stop: Notify::new(),
            stopped: (Mutex::new(false), Condvar::new()),
            running: AtomicBool::new(false),
        }))
    }

    /// A new config is in force: every lease is given back at the keeper's next round (a
    /// reload may change a zone's limit or lease).
    pub fn reloaded(&self) {
        self.0.reloaded.store(true, Ordering::Release);
    }

    /// A key was reset (by any instance, announced through the fleet sync): this instance's
    /// leases of it are void, not given back (the key's state in Redis is gone), and its next
    /// request asks afresh.
    pub fn void(&self, zone: &str, key: &[u8]) {
        self.0.lock_keys().remove(&map_key(zone, key));
    }

    /// Tokens this instance holds for one key now (tests, the admin's view).
    pub fn held(&self, zone: &str, key: &[u8]) -> u64 {
        let now = self.0.clock.now_us();
        self.0.lock_keys().get(&map_key(zone, key)).map_or(0, |e| e.lock().lessee.held(now))
    }

    /// This instance's id among a key's holders (the field of the holders' hash in Redis).
    pub fn holder(&self) -> &str {
        &self.0.holder
    }

    /// This instance's leases of one key now; `None` when it has not leased the key (or forgot it).
    pub fn key_leases(&self, zone: &str, key: &[u8]) -> Option<KeyLeases> {
        let now = self.0.clock.now_us();
        let entry = self.0.lock_keys().get(&map_key(zone, key)).cloned()?;
        let mut st = entry.lock();
        // Ended leases counted now, not at the keeper's next round, so the tally adds up.
        st.count_expired(&entry.zone, now);
        let ms = |us: u64| us as f64 / 1e3;
        let leases: Vec<LeaseNow> = st
            .lessee
            .live(now)
            .into_iter()
            .map(|(tokens_left, ends)| LeaseNow { tokens_left, ends_in_ms: ms(ends - now) })
            .collect();
        Some(KeyLeases {
            holder: self.0.holder.clone(),
            held: leases.iter().map(|l| l.tokens_left).sum(),
            leases,
            asking: st.lessee.in_flight(),
            known_empty_for_ms: st.lessee.empty_until_us(now).map(|until| ms(until - now)),
            tally: st.tally,
        })
    }

    /// The keeper, for the process's life: gives back the leases of cold keys, forgets idle
    /// ones, counts tokens that expired unused, gives everything back after a reload and at exit.
    pub async fn run(&self) {
        let shared = &self.0;
        shared.running.store(true, Ordering::Release);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(SWEEP_EVERY) => {}
                _ = shared.stop.notified() => {
                    shared.give_back_all().await;
                    let (done, signal) = &shared.stopped;
                    *done.lock().unwrap_or_else(|p| p.into_inner()) = true;
                    signal.notify_all();
                    return;
                }
            }
            if shared.reloaded.swap(false, Ordering::AcqRel) {
                shared.give_back_all().await;
            } else {
                shared.sweep().await;
            }
        }
    }

    /// At exit: gives every unused token back, waiting at most `timeout`; how many keys held some.
    pub fn release_at_exit(&self, timeout: Duration) -> usize {
        let shared = &self.0;
        if !shared.running.load(Ordering::Acquire) {
            return 0;
        }
        let count = shared.lock_keys().len();
        shared.stop.notify_one();
        let (done, signal) = &shared.stopped;
        let guard = done.lock().unwrap_or_else(|p| p.into_inner());
        let (guard, waited) =
            signal.wait_timeout_while(guard, timeout, |done| !*done).unwrap_or_else(|p| p.into_inner());
        if waited.timed_out() && !*guard {
            tracing::warn!(keys = count, ?timeout, "budget leases not all given back at exit; the rest expire unused");
        }
        count
    }
}

/// One failed call's error for each of its asks (a Redis error is not `Clone`: its words are kept).
fn same_error(error: &StoreError) -> StoreError {
    match error {
        StoreError::Timeout(d) => StoreError::Timeout(*d),
        StoreError::CircuitOpen => StoreError::CircuitOpen,
        other => StoreError::Connection(other.to_string()),
    }
}

fn map_key(zone: &str, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(zone.len() + 1 + key.len());
    k.extend_from_slice(zone.as_bytes());
    k.push(0);
    k.extend_from_slice(key);
    k
}

impl Shared {
    fn lock_keys(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Arc<Entry>>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The key's entry; `None` when the map is full (the zone is then decided exactly).
    fn entry(&self, zone: &KeyedZone<'_>, spec: LeaseSpec) -> Option<Arc<Entry>> {
        let mut keys = self.lock_keys();
        let k = map_key(zone.zone, &zone.key);
        if let Some(e) = keys.get(&k) {
            return Some(e.clone());
        }
        if keys.len() >= MAX_KEYS {
            return None;
        }
        let entry = Arc::new(Entry {
            zone: zone.zone.to_string(),
            key: zone.key.clone(),
            state: Mutex::new(KeyState {
                lessee: Lessee::default(),
                limit: zone.limit,
                spec,
                last_used_us: 0,
                tally: Tally::default(),
            }),
            answers: watch::channel(0).0,
        });
        keys.insert(k, entry.clone());
        Some(entry)
    }

    /// One leased zone of a request, decided from the key's lease (asking for one if needed).
    async fn take(
        self: &Arc<Self>,
        zone: &KeyedZone<'_>,
        spec: LeaseSpec,
        entry: &Arc<Entry>,
    ) -> Result<Taken, StoreError> {
        let mut asks = 0;
        loop {
            let now = self.clock.now_us();
            let (decision, waiting, spent, held, ends_us) = {
                let mut st = entry.lock();
                st.limit = zone.limit;
                st.spec = spec;
                st.last_used_us = now;
                let decision = st.lessee.decide(&spec, now, zone.cost);
                if matches!(decision, LocalDecision::Admit { .. }) {
                    st.tally.spent += zone.cost;
                }
                let waiting = matches!(decision, LocalDecision::Wait).then(|| entry.answers.subscribe());
                (decision, waiting, st.lessee.last_spent(), st.lessee.held(now), st.lessee.ends_us(now))
            };
            match decision {
                LocalDecision::Admit { renew } => {
                    METRICS.lease_local_decisions.with_label_values(&[zone.zone, "admitted"]).inc();
                    if let Some(want) = renew {
                        self.renew_in_background(entry.clone(), want, now);
                    }
                    return Ok(Taken::Admitted { spent, held, ends_us });
                }
                LocalDecision::Refuse { retry_at_us } => {
                    METRICS.lease_local_decisions.with_label_values(&[zone.zone, "rejected"]).inc();
                    return Ok(Taken::Refused { retry_us: Some(retry_at_us.saturating_sub(now)) });
                }
                LocalDecision::Wait => {
                    if let Some(mut rx) = waiting {
                        let most = Duration::from_micros(spec.lifetime_us);
                        if tokio::time::timeout(most, rx.changed()).await.is_err() {
                            return Err(StoreError::Timeout(most));
                        }
                    }
                }
                LocalDecision::Ask { min, want } => {
                    if let Some(retry_us) = self.ask(entry, zone, spec, min, want, now).await? {
                        return Ok(Taken::Refused { retry_us });
                    }
                    asks += 1;
                    if asks >= MAX_ASKS {
                        // Every grant went to the key's other requests here first: the budget
                        // is being spent as fast as it comes, so this one is refused (never
                        // admitted outside a lease: that would pass the bound).
                        return Ok(Taken::Refused { retry_us: Some(0) });
                    }
                }
            }
        }
    }

    /// Asks the ledger for a lease (the lessee has marked the ask in flight). `Ok(None)`: tokens
    /// came (or a dead grant went back): decide again; `Ok(Some(retry))`: the store refused.
    async fn ask(
        self: &Arc<Self>,
        entry: &Arc<Entry>,
        zone: &KeyedZone<'_>,
        spec: LeaseSpec,
        min: u64,
        want: u64,
        sent_us: u64,
    ) -> Result<Option<Option<u64>>, StoreError> {
        let mut in_flight = InFlight { entry, answered: false };
        if sent_us < self.paused_until_us.load(Ordering::Acquire) {
            return Err(StoreError::CircuitOpen);
        }
        let ask = LeaseAsk { min, want, lifetime_us: spec.lifetime_us };
        let granted = match self.batched() {
            Some(runtime) => {
                let (reply, answer) = oneshot::channel();
                let pending =
                    Pending { entry: entry.clone(), limit: zone.limit, spec, ask, sent_us, reply: Some(reply) };
                self.enqueue(&runtime, pending);
                answer.await.unwrap_or_else(|_| Err(StoreError::Reply("a batched lease ask went unanswered".into())))
            }
            None => self.ledger.grant(zone, &self.holder, ask).await,
        };
        let grant = match granted {
            Ok(grant) => grant,
            Err(e) => {
                self.pause();
                return Err(e);
            }
        };
        let (answered, arrived) = self.record(entry, &spec, sent_us, &grant);
        in_flight.answered = true;
        drop(in_flight);
        Ok(self.account(zone, answered, &grant, sent_us, arrived).await)
    }

    /// Asks fail at once for a while (a store that just failed costs no timeout per request).
    fn pause(&self) {
        self.paused_until_us.store(self.clock.now_us() + PAUSE_AFTER_FAILURE_US, Ordering::Release);
    }

    /// The store's answer to the ask sent at `sent_us`, taken by the key's lessee and tally.
    fn record(&self, entry: &Entry, spec: &LeaseSpec, sent_us: u64, grant: &Grant) -> (Answered, u64) {
        let arrived = self.clock.now_us();
        let mut st = entry.lock();
        st.tally.granted += grant.tokens;
        let answered = st.lessee.answered(spec, sent_us, arrived, grant);
        if let Answered::Dead { unused } = answered {
            st.tally.given_back += unused;
        }
        (answered, arrived)
    }

    /// An answer's metrics, and a dead grant's tokens given back: `None` when tokens came (or
    /// went back), `Some(retry)` when the store refused.
    async fn account(
        &self,
        zone: &KeyedZone<'_>,
        answered: Answered,
        grant: &Grant,
        sent_us: u64,
        arrived: u64,
    ) -> Option<Option<u64>> {
        let name = zone.zone;
        match answered {
            Answered::Granted => {
                METRICS.lease_grants.with_label_values(&[name, "granted"]).inc();
                METRICS.lease_tokens.with_label_values(&[name, "leased"]).inc_by(grant.tokens);
                None
            }
            Answered::Refused => {
                METRICS.lease_grants.with_label_values(&[name, "refused"]).inc();
                Some(grant.retry_after_us.map(|r| (sent_us + r).saturating_sub(arrived)))
            }
            Answered::Dead { unused } => {
                METRICS.lease_grants.with_label_values(&[name, "dead_on_arrival"]).inc();
                self.give_back_unheld(zone, unused, grant.window_start_us).await;
                None
            }
        }
    }

    /// Granted tokens no lease holds (dead on arrival, or their asker left) back to the store.
    async fn give_back_unheld(&self, zone: &KeyedZone<'_>, unused: u64, window_start_us: Option<u64>) {
        match self.ledger.give_back(zone, &self.holder, unused, window_start_us).await {
            Ok(()) => METRICS.lease_tokens.with_label_values(&[zone.zone, "returned"]).inc_by(unused),
            Err(e) => {
                tracing::debug!(zone = zone.zone, error = %e, "granted tokens no lease holds were not given back")
            }
        }
    }

    /// The runtime batched calls are sent from, when the ledger batches and there is one.
    fn batched(&self) -> Option<tokio::runtime::Handle> {
        if !self.ledger.batches() {
            return None;
        }
        tokio::runtime::Handle::try_current().ok()
    }

    fn lock_batch(&self) -> MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues an ask for the next batched call, starting the sender if no call is being sent.
    /// The sender is a task of its own: a request that leaves early drops only its own answer.
    fn enqueue(self: &Arc<Self>, runtime: &tokio::runtime::Handle, pending: Pending) {
        let start = {
            let mut batch = self.lock_batch();
            batch.pending.push(pending);
            !std::mem::replace(&mut batch.sending, true)
        };
        if start {
            runtime.spawn(self.clone().send_batches());
        }
    }

    /// Sends the waiting asks, at most [`MAX_GRANTS_PER_CALL`] per call, with top-ups of this
    /// instance's other busy keys in the room left, until none wait.
    async fn send_batches(self: Arc<Self>) {
        loop {
            let mut calls: Vec<Pending> = {
                let mut batch = self.lock_batch();
                if batch.pending.is_empty() {
                    batch.sending = false;
                    return;
                }
                let n = batch.pending.len().min(MAX_GRANTS_PER_CALL);
                batch.pending.drain(..n).collect()
            };
            self.add_top_ups(&mut calls);
            let asks: Vec<(KeyedZone<'_>, LeaseAsk)> =
                calls.iter().map(|p| (p.entry.zone(p.limit, p.spec, p.ask.min), p.ask)).collect();
            let answers = self.ledger.grants(&asks, &self.holder).await;
            drop(asks);
            match answers {
                Ok(grants) if grants.len() == calls.len() => {
                    for (pending, grant) in calls.into_iter().zip(grants) {
                        self.settle(pending, grant).await;
                    }
                }
                Ok(grants) => {
                    let e = StoreError::Reply(format!("{} lease grants for {} asks", grants.len(), calls.len()));
                    self.fail_all(calls, &e);
                }
                Err(e) => self.fail_all(calls, &e),
            }
        }
    }

    /// A batched grant to its ask: a request's answer to the request (its tokens back to the
    /// store if the request left meanwhile), a renewal's or top-up's taken here.
    async fn settle(&self, pending: Pending, grant: Grant) {
        let Pending { entry, limit, spec, ask, sent_us, reply } = pending;
        match reply {
            Some(reply) => {
                if let Err(Ok(grant)) = reply.send(Ok(grant)) {
                    // The request left: nobody holds these tokens (its in-flight mark is gone).
                    if grant.tokens > 0 {
                        let zone = entry.zone(limit, spec, grant.tokens);
                        self.give_back_unheld(&zone, grant.tokens, grant.window_start_us).await;
                    }
                }
            }
            None => {
                let (answered, arrived) = self.record(&entry, &spec, sent_us, &grant);
                entry.answers.send_modify(|n| *n += 1);
                let zone = entry.zone(limit, spec, ask.min);
                self.account(&zone, answered, &grant, sent_us, arrived).await;
            }
        }
    }

    /// A failed batched call: every request asking gets the error, every renewal is marked failed.
    fn fail_all(&self, calls: Vec<Pending>, error: &StoreError) {
        self.pause();
        for pending in calls {
            match pending.reply {
                Some(reply) => {
                    let _ = reply.send(Err(same_error(error)));
                }
                None => {
                    pending.entry.lock().lessee.failed();
                    pending.entry.answers.send_modify(|n| *n += 1);
                }
            }
        }
    }

    /// Fills the call's room with top-ups of this instance's busy keys that have used a quarter of
    /// their lease ([`Lessee::top_up`]): they ride on a call made anyway, and so ask less often
    /// on their own.
    fn add_top_ups(&self, calls: &mut Vec<Pending>) {
        let room = MAX_GRANTS_PER_CALL.saturating_sub(calls.len());
        let now = self.clock.now_us();
        if room == 0 || now < self.paused_until_us.load(Ordering::Acquire) {
            return;
        }
        let keys = self.lock_keys();
        for entry in keys.values().take(MAX_TOP_UP_SCAN) {
            if calls.len() >= MAX_GRANTS_PER_CALL {
                break;
            }
            let mut st = entry.lock();
            let spec = st.spec;
            if let Some(want) = st.lessee.top_up(&spec, now) {
                let ask = LeaseAsk { min: 1, want, lifetime_us: spec.lifetime_us };
                calls.push(Pending { entry: entry.clone(), limit: st.limit, spec, ask, sent_us: now, reply: None });
            }
        }
    }

    /// A busy key's next lease, asked before it runs dry, off the request's path: in the next
    /// batched call, or on a task of its own when the ledger does not batch.
    fn renew_in_background(self: &Arc<Self>, entry: Arc<Entry>, want: u64, sent_us: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            entry.lock().lessee.failed();
            return;
        };
        let (limit, spec) = {
            let st = entry.lock();
            (st.limit, st.spec)
        };
        if self.ledger.batches() {
            if sent_us < self.paused_until_us.load(Ordering::Acquire) {
                entry.lock().lessee.failed();
                return;
            }
            let ask = LeaseAsk { min: 1, want, lifetime_us: spec.lifetime_us };
            self.enqueue(&runtime, Pending { entry, limit, spec, ask, sent_us, reply: None });
            return;
        }
        let shared = self.clone();
        runtime.spawn(async move {
            let zone = entry.zone(limit, spec, 1);
            let _ = shared.ask(&entry, &zone, spec, 1, want, sent_us).await;
        });
    }

    /// Undoes the local admissions of a request another zone refused.
    fn refund(&self, taken: &[(Arc<Entry>, Spent)]) {
        let now = self.clock.now_us();
        for (entry, spent) in taken {
            let mut st = entry.lock();
            st.lessee.refund(*spent, now);
            st.tally.spent = st.tally.spent.saturating_sub(spent.cost());
        }
    }

    /// Counts expired tokens, gives back the leases of keys gone cold (no request for half a
    /// lifetime), and forgets keys idle for two lifetimes with nothing held.
    async fn sweep(&self) {
        let now = self.clock.now_us();
        let mut returns = Vec::new();
        {
            let mut keys = self.lock_keys();
            keys.retain(|_, entry| {
                let mut st = entry.lock();
                st.count_expired(&entry.zone, now);
                let idle = now.saturating_sub(st.last_used_us);
                if st.lessee.in_flight() {
                    return true;
                }
                let held = st.lessee.held(now);
                if held > 0 && idle >= st.spec.lifetime_us / 2 {
                    for (unused, window) in st.lessee.take_unused_by_window(now) {
                        st.tally.given_back += unused;
                        returns.push((entry.clone(), st.limit, st.spec, unused, window));
                    }
                    return true;
                }
                held > 0 || idle < 2 * st.spec.lifetime_us
            });
        }
        self.give_back(returns).await;
    }

    /// Every unused token back, every key forgotten (reload, exit).
    async fn give_back_all(&self) {
        let now = self.clock.now_us();
        let entries: Vec<Arc<Entry>> = self.lock_keys().drain().map(|(_, e)| e).collect();
        let mut returns = Vec::new();
        for entry in entries {
            let mut st = entry.lock();
            for (unused, window) in st.lessee.take_unused_by_window(now) {
                returns.push((entry.clone(), st.limit, st.spec, unused, window));
            }
        }
        self.give_back(returns).await;
    }

    async fn give_back(&self, returns: Vec<Return>) {
        for (entry, limit, spec, unused, window) in returns {
            let zone = entry.zone(limit, spec, unused);
            match self.returns.give_back(&zone, &self.holder, unused, window).await {
                Ok(()) => METRICS.lease_tokens.with_label_values(&[&entry.zone, "returned"]).inc_by(unused),
                Err(e) => tracing::debug!(zone = %entry.zone, error = %e, "unused lease tokens not given back"),
            }
        }
    }
}

/// A leased zone admitted from this instance's lease: what it holds is its "remaining".
fn admitted_locally(held: u64, ends_us: Option<u64>, now_us: u64) -> ZoneOutcome {
    let ends = ends_us.unwrap_or(now_us);
    ZoneOutcome {
        admitted: true,
        excess: 0.0,
        delay_us: 0,
        retry_after_us: None,
        remaining: held,
        reset_us: ends.saturating_sub(now_us),
        expires_us: ends,
        next: State::Bucket(BucketState { level: 0.0, last_us: now_us }),
    }
}

#[async_trait]
impl LimitStore for LeasedStore {
    async fn decide(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        if zones.iter().all(|z| z.lease.is_none()) {
            return self.0.inner.decide(zones).await;
        }
        let shared = &self.0;
        let now = shared.clock.now_us();
        let mut taken: Vec<(Arc<Entry>, Spent)> = Vec::new();
        let mut outcomes: Vec<Option<ZoneOutcome>> = vec![None; zones.len()];
        for (i, zone) in zones.iter().enumerate() {
            let Some(spec) = zone.lease else { continue };
            let Some(entry) = shared.entry(zone, spec) else { continue };
            match shared.take(zone, spec, &entry).await {
                Err(e) => {
                    shared.refund(&taken);
                    return Err(e);
                }
                Ok(Taken::Admitted { spent, held, ends_us }) => {
                    if let Some(spent) = spent {
                        taken.push((entry, spent));
                    }
                    outcomes[i] = Some(admitted_locally(held, ends_us, now));
                }
                Ok(Taken::Refused { retry_us }) => {
                    // All or nothing: what the other zones took goes back, the exact ones are
                    // not asked.
                    shared.refund(&taken);
                    let zones_out = zones
                        .iter()
                        .enumerate()
                        .map(|(n, z)| {
                            if n == i {
                                ZoneOutcome::rejected_for(&z.limit, z.cost, retry_us.unwrap_or(0), now)
                            } else {
                                ZoneOutcome::not_charged(&z.limit, now)
                            }
                        })
                        .collect();
                    return Ok(Verdict {
                        admitted: false,
                        delay_us: 0,
                        retry_after_us: retry_us,
                        zones: zones_out,
                        decided_us: now,
                    });
                }
            }
        }
        let exact: Vec<usize> = (0..zones.len()).filter(|&i| outcomes[i].is_none()).collect();
        if exact.is_empty() {
            let zones = outcomes.into_iter().flatten().collect();
            return Ok(Verdict { admitted: true, delay_us: 0, retry_after_us: None, zones, decided_us: now });
        }
        let rest: Vec<KeyedZone<'_>> = exact.iter().map(|&i| zones[i].clone()).collect();
        let verdict = match shared.inner.decide(&rest).await {
            Ok(verdict) => verdict,
            Err(e) => {
                shared.refund(&taken);
                return Err(e);
            }
        };
        if !verdict.admitted {
            shared.refund(&taken);
            for (i, outcome) in outcomes.iter_mut().enumerate() {
                if outcome.is_some() {
                    *outcome = Some(ZoneOutcome::not_charged(&zones[i].limit, now));
                }
            }
        }
        for (j, &i) in exact.iter().enumerate() {
            outcomes[i] = verdict.zones.get(j).cloned();
        }
        let zones = outcomes
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| StoreError::Reply("the store answered for fewer zones than asked".into()))?;
        Ok(Verdict { zones, ..verdict })
    }

    async fn peek(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        self.0.inner.peek(zones).await
    }

    async fn charge(&self, zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        self.0.inner.charge(zones).await
    }

    fn kind(&self) -> &'static str {
        self.0.inner.kind()
    }
}

#[cfg(test)]
mod tests;
