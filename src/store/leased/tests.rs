//! The layer on a simulated clock, with the model's own ledger (`lease::grant`/`give_back`) as
//! the store that grants, and the memory store as the exact zones' store: all or nothing across
//! leased and exact zones, refusals without a call while the budget is known empty.

use std::sync::atomic::AtomicUsize;

use super::*;
use crate::limit::lease::{give_back, grant, Ledger};
use crate::limit::{Algorithm, DelayPolicy, ManualClock, Rate};
use crate::store::MemoryStore;

const T0: u64 = 1_700_000_000_000_000;

/// The model's ledger for one key, counting the calls it takes.
struct ModelLedger {
    ledger: Mutex<Ledger>,
    clock: Arc<ManualClock>,
    calls: AtomicUsize,
}

#[async_trait]
impl LeaseLedger for ModelLedger {
    async fn grant(&self, zone: &KeyedZone<'_>, _holder: &str, ask: LeaseAsk) -> Result<Grant, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut ledger = self.ledger.lock().unwrap();
        let (g, next) = grant(&zone.limit, &ledger, self.clock.now_us(), 1, ask.min, ask.want, ask.lifetime_us);
        *ledger = next;
        Ok(g)
    }

    async fn give_back(
        &self,
        zone: &KeyedZone<'_>,
        _: &str,
        unused: u64,
        window: Option<u64>,
    ) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut ledger = self.ledger.lock().unwrap();
        *ledger = give_back(&zone.limit, &ledger, self.clock.now_us(), 1, unused, window);
        Ok(())
    }
}

fn bucket(rate: &str, burst: u64) -> LimitReq {
    LimitReq { algorithm: Algorithm::LeakyBucket, rate: Rate::parse(rate).unwrap(), burst, delay: DelayPolicy::NoDelay }
}

fn layer() -> (LeasedStore, Arc<ModelLedger>, Arc<MemoryStore>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let ledger = Arc::new(ModelLedger { ledger: Mutex::new(Ledger::default()), clock: clock.clone(), calls: 0.into() });
    let exact = Arc::new(MemoryStore::new(clock.clone()));
    let store = LeasedStore::new(exact.clone(), ledger.clone(), ledger.clone(), clock.clone());
    (store, ledger, exact, clock)
}

const SPEC: LeaseSpec = LeaseSpec { tokens: 10, lifetime_us: 1_000_000 };

fn leased(limit: LimitReq) -> KeyedZone<'static> {
    KeyedZone { lease: Some(SPEC), ..KeyedZone::new("leased", b"k".to_vec(), limit, 1) }
}

#[tokio::test]
async fn an_exact_refusal_leaves_the_leased_tokens_and_a_leased_refusal_charges_nothing() {
    let (store, ledger, exact, clock) = layer();
    let strict = KeyedZone::new("exact", b"k".to_vec(), bucket("1r/m", 0), 1);
    let both = [leased(bucket("100r/s", 99)), strict.clone()];
    // Warm the lease: requests of the leased zone alone (the lease doubles toward 10).
    for _ in 0..30 {
        assert!(store.decide(&both[..1]).await.unwrap().admitted);
        clock.advance_us(1_000);
        tokio::task::yield_now().await;
    }
    let held = store.held("leased", b"k");
    assert!(held >= 3, "holds {held}");
    // The exact zone admits once, then refuses: the refused request's leased token goes back.
    assert!(store.decide(&both).await.unwrap().admitted);
    let after_first = store.held("leased", b"k");
    assert!(after_first >= 1, "the next request is decided from the lease");
    let refused = store.decide(&both).await.unwrap();
    assert!(!refused.admitted && refused.zones[0].admitted && !refused.zones[1].admitted);
    assert_eq!(store.held("leased", b"k"), after_first, "the refused request spent no lease token");
    let _ = ledger;
    // A leased zone that refuses leaves the exact zone uncharged.
    let exact_before = exact.state("fresh", b"k");
    let (store, ledger, exact, _clock) = layer();
    let tiny = [leased(bucket("1r/m", 0)), KeyedZone::new("fresh", b"k".to_vec(), bucket("100r/s", 10), 1)];
    assert!(store.decide(&tiny).await.unwrap().admitted);
    let charged = exact.state("fresh", b"k");
    assert!(!store.decide(&tiny).await.unwrap().admitted);
    assert_eq!(exact.state("fresh", b"k"), charged, "the exact zone was not charged for a leased refusal");
    assert_ne!(exact_before, charged);
    // The budget is known empty: further refusals cost the ledger no call.
    let calls = ledger.calls.load(Ordering::SeqCst);
    for _ in 0..20 {
        assert!(!store.decide(&tiny).await.unwrap().admitted);
    }
    assert_eq!(ledger.calls.load(Ordering::SeqCst), calls, "refusals while known empty ask nothing");
}

#[tokio::test]
async fn a_busy_key_is_decided_locally_and_gives_back_when_cold() {
    let (store, ledger, _exact, clock) = layer();
    let zone = [leased(bucket("1000r/s", 999))];
    for _ in 0..200 {
        assert!(store.decide(&zone).await.unwrap().admitted);
        clock.advance_us(2_000);
        tokio::task::yield_now().await;
    }
    let calls = ledger.calls.load(Ordering::SeqCst);
    assert!(calls <= 200 / 5, "{calls} ledger calls for 200 decisions");
    // Cold for half a lifetime: the keeper's sweep gives the unused tokens back.
    let held = store.held("leased", b"k");
    assert!(held > 0);
    clock.advance_us(SPEC.lifetime_us / 2);
    store.0.sweep().await;
    assert_eq!(store.held("leased", b"k"), 0);
    let level = match &ledger.ledger.lock().unwrap().state {
        Some(State::Bucket(b)) => b.level,
        other => panic!("{other:?}"),
    };
    // 200 spent over 0.4 s at 1000/s drained, then 0.5 s more: nothing of the lease is left.
    assert!(level < 1.0, "the bucket still counts {level}");
}

#[tokio::test]
async fn the_tally_adds_up_through_refunds_give_backs_and_expiry() {
    let (store, ledger, _exact, clock) = layer();
    let tally_holds = |store: &LeasedStore| {
        let seen = store.key_leases("leased", b"k").expect("the key is leased");
        let t = seen.tally;
        assert_eq!(t.granted - t.spent - t.given_back - t.expired_unused, seen.held, "{seen:?}");
        assert_eq!(seen.leases.iter().map(|l| l.tokens_left).sum::<u64>(), seen.held, "{seen:?}");
        seen
    };
    assert!(store.key_leases("leased", b"k").is_none(), "a key never leased has no leases");
    let zone = [leased(bucket("1000r/s", 999))];
    for _ in 0..40 {
        assert!(store.decide(&zone).await.unwrap().admitted);
        clock.advance_us(1_000);
        tokio::task::yield_now().await;
    }
    let seen = tally_holds(&store);
    assert_eq!(seen.tally.spent, 40);
    assert_eq!(seen.holder, store.holder());
    assert!(seen.leases.iter().all(|l| l.ends_in_ms > 0.0 && l.ends_in_ms <= 1_000.0), "{seen:?}");
    // An exact zone's refusal refunds the leased token: spent does not count it.
    let strict = KeyedZone::new("exact", b"k".to_vec(), bucket("1r/m", 0), 1);
    let both = [leased(bucket("1000r/s", 999)), strict];
    assert!(store.decide(&both).await.unwrap().admitted);
    assert!(!store.decide(&both).await.unwrap().admitted);
    assert_eq!(tally_holds(&store).tally.spent, 41);
    // Cold for half a lifetime: given back; a lease left to end counts as expired.
    clock.advance_us(SPEC.lifetime_us / 2);
    store.0.sweep().await;
    let cold = tally_holds(&store);
    assert!(cold.tally.given_back > 0 && cold.held == 0, "{cold:?}");
    assert!(store.decide(&zone).await.unwrap().admitted);
    tokio::task::yield_now().await;
    clock.advance_us(SPEC.lifetime_us + 1);
    let ended = tally_holds(&store);
    assert!(ended.held == 0 && ended.tally.expired_unused > 0, "the new lease ended unspent: {ended:?}");
    assert!(ledger.calls.load(Ordering::SeqCst) > 0);
}

/// The model's ledger answering only after the caller's task yielded a few times, so that the
/// key's other requests pile up waiting for the ask in flight.
struct SlowLedger(Arc<ModelLedger>);

#[async_trait]
impl LeaseLedger for SlowLedger {
    async fn grant(&self, zone: &KeyedZone<'_>, holder: &str, ask: LeaseAsk) -> Result<Grant, StoreError> {
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        self.0.grant(zone, holder, ask).await
    }

    async fn give_back(&self, zone: &KeyedZone<'_>, h: &str, unused: u64, w: Option<u64>) -> Result<(), StoreError> {
        self.0.give_back(zone, h, unused, w).await
    }
}

/// Many requests waiting on one key's asks (the rate limit service's calls in flight): a request
/// that waits through many answers is neither an error (which the zone's `on_error` would have
/// answered, admitting past the lease: 107 of a window's 100 through the real binary) nor admitted
/// outside a lease.
#[tokio::test]
async fn requests_waiting_through_many_answers_never_pass_the_window() {
    let clock = Arc::new(ManualClock::new(T0));
    let model = Arc::new(ModelLedger { ledger: Mutex::new(Ledger::default()), clock: clock.clone(), calls: 0.into() });
    let slow = Arc::new(SlowLedger(model));
    let store = LeasedStore::new(Arc::new(MemoryStore::new(clock.clone())), slow.clone(), slow, clock.clone());
    let window = LimitReq {
        algorithm: Algorithm::FixedWindow,
        rate: Rate::parse("100r/m").unwrap(),
        burst: 0,
        delay: DelayPolicy::NoDelay,
    };
    let (mut admitted, mut errors) = (0, 0);
    for _ in 0..4 {
        let mut wave = tokio::task::JoinSet::new();
        for _ in 0..64 {
            let store = store.clone();
            wave.spawn(async move { store.decide(&[leased(window)]).await.map(|v| v.admitted) });
        }
        while let Some(done) = wave.join_next().await {
            match done.expect("the task ran") {
                Ok(true) => admitted += 1,
                Ok(false) => {}
                Err(_) => errors += 1,
            }
        }
        clock.advance_us(1_000);
    }
    assert_eq!(errors, 0, "contention is not a store failure");
    assert!(admitted <= 100, "{admitted} admitted in one window of 100");
    assert!(admitted >= 90, "only {admitted} of 256 admitted in a window of 100");
}

/// The model's multi-key ledger as a store that batches (`LeaseLedger::batches`), or not,
/// counting its round trips; a call answers after a few yields, so that asks pile up meanwhile.
struct Batching {
    model: super::ModelLedger,
    round_trips: AtomicUsize,
    batches: bool,
}

impl Batching {
    fn new(clock: Arc<ManualClock>, batches: bool) -> Arc<Self> {
        Arc::new(Batching { model: super::ModelLedger::new(clock), round_trips: 0.into(), batches })
    }
}

#[async_trait]
impl LeaseLedger for Batching {
    async fn grant(&self, zone: &KeyedZone<'_>, holder: &str, ask: LeaseAsk) -> Result<Grant, StoreError> {
        self.round_trips.fetch_add(1, Ordering::SeqCst);
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        self.model.grant(zone, holder, ask).await
    }

    async fn grants(&self, asks: &[(KeyedZone<'_>, LeaseAsk)], holder: &str) -> Result<Vec<Grant>, StoreError> {
        self.round_trips.fetch_add(1, Ordering::SeqCst);
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        let mut grants = Vec::new();
        for (zone, ask) in asks {
            grants.push(self.model.grant(zone, holder, *ask).await?);
        }
        Ok(grants)
    }

    async fn give_back(&self, zone: &KeyedZone<'_>, h: &str, unused: u64, w: Option<u64>) -> Result<(), StoreError> {
        self.round_trips.fetch_add(1, Ordering::SeqCst);
        self.model.give_back(zone, h, unused, w).await
    }

    fn batches(&self) -> bool {
        self.batches
    }
}

fn key_zone(limit: LimitReq, key: usize) -> KeyedZone<'static> {
    KeyedZone { lease: Some(SPEC), ..KeyedZone::new("leased", format!("k{key}").into_bytes(), limit, 1) }
}

/// Lets the spawned sender and renewals run.
async fn let_tasks_run() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Cold keys asked for at once go to the store together: one call carries the asks made while
/// another was in flight.
#[tokio::test]
async fn asks_made_while_a_call_is_in_flight_go_in_one_call() {
    let clock = Arc::new(ManualClock::new(T0));
    let ledger = Batching::new(clock.clone(), true);
    let store = LeasedStore::new(Arc::new(MemoryStore::new(clock.clone())), ledger.clone(), ledger.clone(), clock);
    let mut wave = tokio::task::JoinSet::new();
    for key in 0..32 {
        let store = store.clone();
        wave.spawn(async move { store.decide(&[key_zone(bucket("100r/s", 99), key)]).await.map(|v| v.admitted) });
    }
    while let Some(done) = wave.join_next().await {
        assert!(done.expect("the task ran").expect("no store error"), "a cold key's first request is admitted");
    }
    let trips = ledger.round_trips.load(Ordering::SeqCst);
    // The first ask goes alone, the 31 made while it is in flight together.
    assert!(trips <= 3, "32 cold keys took {trips} round trips");
    assert_eq!(ledger.model.calls(), 32, "one grant per key");
}

/// Eight busy keys: their renewals ride on one another's calls (top-ups), so the store is asked
/// far less often than one call per key's renewal, and no key ever holds more than its lease.
#[tokio::test]
async fn busy_keys_top_up_on_each_others_calls() {
    let mut trips = Vec::new();
    for batches in [false, true] {
        let clock = Arc::new(ManualClock::new(T0));
        let ledger = Batching::new(clock.clone(), batches);
        let store =
            LeasedStore::new(Arc::new(MemoryStore::new(clock.clone())), ledger.clone(), ledger.clone(), clock.clone());
        let mut admitted = 0;
        for _ in 0..400 {
            for key in 0..8 {
                admitted += usize::from(store.decide(&[key_zone(bucket("1000r/s", 999), key)]).await.unwrap().admitted);
                assert!(store.held("leased", format!("k{key}").as_bytes()) <= SPEC.tokens);
            }
            let_tasks_run().await;
            clock.advance_us(1_000);
        }
        assert_eq!(admitted, 3200, "every request is under the limit (batches: {batches})");
        trips.push(ledger.round_trips.load(Ordering::SeqCst));
    }
    let (alone, together) = (trips[0], trips[1]);
    eprintln!("round trips: {together} batched, {alone} one key a call");
    assert!(together * 3 <= alone, "{together} round trips batched against {alone} one key a call");
}

/// A request that leaves while its ask is in a batched call (its future dropped: a client gone,
/// a deadline) drops only its own answer: the tokens granted for it go back to the store, and the
/// key's next request asks afresh.
#[tokio::test]
async fn a_grant_for_a_request_that_left_goes_back() {
    use futures_util::FutureExt;
    let clock = Arc::new(ManualClock::new(T0));
    let ledger = Batching::new(clock.clone(), true);
    let store = LeasedStore::new(Arc::new(MemoryStore::new(clock.clone())), ledger.clone(), ledger.clone(), clock);
    let zone = [key_zone(bucket("100r/s", 99), 0)];
    assert!(store.decide(&zone).now_or_never().is_none(), "the ask waits for its call");
    let_tasks_run().await;
    // The grant was made, then given back: one grants call and one give-back, nothing held.
    assert_eq!(ledger.round_trips.load(Ordering::SeqCst), 2, "the grant's tokens went back");
    assert_eq!(store.held("leased", b"k0"), 0);
    assert!(store.decide(&zone).await.unwrap().admitted, "the key's next request asks afresh");
    assert_eq!(ledger.model.calls(), 3);
}
