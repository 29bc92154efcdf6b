//! The ticket's contract, in process on a manual clock: nginx's order (all zones decided at
//! once, all or nothing; leases after the delay; charges at the head and at the end), what holds
//! whatever the client does (charged once, leases given back once, reported once), and the
//! failure policy with a store that fails.

use std::net::IpAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use http::{HeaderMap, HeaderValue, Method};

use super::*;
use crate::config::FailurePolicy;
use crate::engine::status::LimitStatus;
use crate::engine::Refusal;
use crate::limit::{ManualClock, State, Verdict};
use crate::store::{LimitStore, MemoryConnStore, MemoryStore, StoreAdmin, StoreError};

const T0: u64 = 1_700_000_000_000_000;

/// Two rate zones (per client and per API key) and a concurrency cap on `/api`; a login route
/// whose failures (401) are counted by response.
fn runtime(route_extra: &str) -> Arc<Runtime> {
    let text = format!(
        "[server]\nlisten = [\"127.0.0.1:1\"]\n[store]\nkind = \"memory\"\n\
         [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:2\"]\n\
         [[limit_req_zone]]\nname = \"per_ip\"\nkey = \"ip\"\nrate = \"1r/s\"\n\
         [[limit_req_zone]]\nname = \"per_key\"\nkey = \"header:X-Api-Key\"\nrate = \"100r/s\"\n\
         [[limit_req_zone]]\nname = \"fails\"\nkey = \"ip\"\nrate = \"1r/h\"\ncount_statuses = [401]\n\
         [[limit_conn_zone]]\nname = \"conn\"\nkey = \"ip\"\n\
         [[route]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"app\"\n{route_extra}\n\
         limit_req = [ {{ zone = \"per_ip\", burst = 1 }}, {{ zone = \"per_key\", burst = 10 }} ]\n\
         limit_conn = [ {{ zone = \"conn\", max = 1 }} ]\n\
         [[route]]\nname = \"login\"\npath_prefix = \"/login\"\nupstream = \"app\"\n\
         limit_req = [ {{ zone = \"fails\" }} ]\n"
    );
    Arc::new(crate::config::from_text(&text, "ticket.toml").expect("valid config"))
}

/// What the engine reported, for the assertions.
#[derive(Default)]
struct Recorder {
    reports: Mutex<Vec<(Option<usize>, Outcome)>>,
    fell_back: Mutex<Vec<FailurePolicy>>,
    leases: AtomicI64,
}

impl Observer for Recorder {
    fn fell_back(&self, policy: FailurePolicy) {
        self.fell_back.lock().unwrap().push(policy);
    }
    fn lease(&self, held: bool) {
        self.leases.fetch_add(if held { 1 } else { -1 }, Ordering::SeqCst);
    }
    fn finished(&self, _rt: &Runtime, report: &Report<'_>) {
        self.reports.lock().unwrap().push((report.route, report.outcome));
    }
}

struct World {
    rt: Arc<Runtime>,
    clock: Arc<ManualClock>,
    stores: Stores,
    /// The primary store unless the test gives another: its state, read where a test looks.
    memory: Arc<MemoryStore>,
    conns: ConnStores,
    conn_store: Arc<MemoryConnStore>,
    recorder: &'static Recorder,
}

impl World {
    fn new(rt: Arc<Runtime>, primary: Option<Arc<dyn LimitStore>>) -> World {
        let clock = Arc::new(ManualClock::new(T0));
        // Leaked, as the process's observer lives for the process: a few bytes per test.
        let recorder: &'static Recorder = Box::leak(Box::default());
        let memory = Arc::new(MemoryStore::new(clock.clone()));
        let primary = primary.unwrap_or_else(|| memory.clone());
        let stores = Stores::new(primary, MemoryStore::new(clock.clone())).observed_by(recorder);
        let conn_store = Arc::new(MemoryConnStore::default());
        let conns = ConnStores::new(conn_store.clone(), "memory", Arc::new(MemoryConnStore::default()), recorder);
        World { rt, clock, stores, memory, conns, conn_store, recorder }
    }

    fn ticket(&self, ip: &str) -> Ticket {
        let ip: IpAddr = ip.parse().expect("ip");
        Ticket::new(self.rt.clone(), Some(ip), self.recorder)
    }

    async fn held(&self, ip: &str) -> u32 {
        self.conn_store.held("conn", ip.as_bytes()).await.expect("memory")
    }

    fn reports(&self) -> Vec<(Option<usize>, Outcome)> {
        self.recorder.reports.lock().unwrap().clone()
    }
}

async fn rule<'t>(ticket: &'t mut Ticket, stores: &Stores, path: &str, api_key: &str) -> Ruling<'t> {
    let mut headers = HeaderMap::new();
    headers.insert("x-api-key", HeaderValue::from_str(api_key).expect("value"));
    headers.insert(http::header::HOST, HeaderValue::from_static("example.com"));
    let head = Head {
        method: &Method::GET,
        target: path.as_bytes(),
        authority: None,
        headers: &headers,
        client_ip: ticket.report().client_ip,
        route: None,
        unix_secs: None,
    };
    ticket.rule(&head, stores).await
}

fn delay_of(ruling: &Ruling<'_>) -> Option<Duration> {
    match ruling {
        Ruling::Forward { delay, .. } => Some(*delay),
        Ruling::Refuse(_) => None,
    }
}

#[tokio::test]
async fn a_refusal_charges_no_zone_and_takes_no_lease() {
    let w = World::new(runtime(""), None);
    // per_ip: 1r/s, burst 1: the first passes, the second waits 1 s, the third is refused.
    for (i, want) in [Some(Duration::ZERO), Some(Duration::from_secs(1)), None].into_iter().enumerate() {
        let mut t = w.ticket("192.0.2.1");
        let got = delay_of(&rule(&mut t, &w.stores, "/api/x", "k").await);
        assert_eq!(got, want, "request {i}");
        t.finish(Ending::Over, 0, &w.stores).await;
    }
    // All or nothing: the refused request charged per_key nothing, only the two admitted ones.
    let state = w.memory.state("per_key", b"k");
    assert!(matches!(state, Some(State::Bucket(b)) if b.level == 2.0), "{state:?}");
    assert_eq!(w.held("192.0.2.1").await, 0, "no lease was taken");
    let outcomes: Vec<Outcome> = w.reports().into_iter().map(|(_, o)| o).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::Limit(LimitStatus::Passed),
            Outcome::Limit(LimitStatus::Delayed),
            Outcome::Limit(LimitStatus::Rejected)
        ]
    );
}

#[tokio::test]
async fn leases_come_after_the_delay_and_go_back_exactly_once() {
    let w = World::new(runtime(""), None);
    let mut first = w.ticket("192.0.2.1");
    assert_eq!(delay_of(&rule(&mut first, &w.stores, "/api/x", "k").await), Some(Duration::ZERO));
    first.finish(Ending::Over, 0, &w.stores).await;
    let mut t = w.ticket("192.0.2.1");
    assert_eq!(delay_of(&rule(&mut t, &w.stores, "/api/x", "k").await), Some(Duration::from_secs(1)));
    assert_eq!(w.held("192.0.2.1").await, 0, "a delayed request is not counted while it waits");
    w.clock.advance_us(1_000_000);
    assert!(t.hold(&w.conns).await.is_ok());
    assert_eq!(w.held("192.0.2.1").await, 1);
    // The cap (max 1) is full for the same client: the next one is refused by limit_conn.
    w.clock.advance_us(1_000_000);
    let mut other = w.ticket("192.0.2.1");
    assert!(delay_of(&rule(&mut other, &w.stores, "/api/x", "k2").await).is_some());
    let refused = other.hold(&w.conns).await.map_err(|a| a.status);
    assert_eq!(refused, Err(503));
    other.finish(Ending::Over, 0, &w.stores).await;
    t.finish(Ending::Over, 0, &w.stores).await;
    t.finish(Ending::Over, 0, &w.stores).await;
    assert_eq!(w.held("192.0.2.1").await, 0);
    assert_eq!(w.recorder.leases.load(Ordering::SeqCst), 0, "one lease taken, given back once");
    drop(t);
    assert_eq!(w.reports().len(), 3, "each ticket reported once: {:?}", w.reports());
    assert_eq!(w.reports()[1].1, Outcome::ConnRejected);
}

#[tokio::test]
async fn a_client_gone_during_the_delay_takes_nothing_further() {
    let w = World::new(runtime(""), None);
    let mut first = w.ticket("192.0.2.1");
    rule(&mut first, &w.stores, "/api/x", "k").await;
    let mut t = w.ticket("192.0.2.1");
    assert_eq!(delay_of(&rule(&mut t, &w.stores, "/api/x", "k").await), Some(Duration::from_secs(1)));
    t.client_gone();
    assert!(t.hold(&w.conns).await.is_ok(), "nothing to hold");
    assert_eq!(w.held("192.0.2.1").await, 0);
    t.finish(Ending::ClientLeft, 0, &w.stores).await;
    assert_eq!(t.report().outcome, Outcome::ClientGone);
}

#[tokio::test]
async fn a_dropped_ticket_gives_its_lease_back_and_is_reported() {
    let w = World::new(runtime(""), None);
    let mut t = w.ticket("192.0.2.9");
    rule(&mut t, &w.stores, "/api/x", "k").await;
    assert!(t.hold(&w.conns).await.is_ok());
    assert_eq!(w.held("192.0.2.9").await, 1);
    drop(t);
    // The lease's own Drop gives it back on the runtime: wait for that task, boundedly.
    for _ in 0..100 {
        if w.held("192.0.2.9").await == 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(w.held("192.0.2.9").await, 0);
    assert_eq!(w.reports().len(), 1);
}

#[tokio::test]
async fn a_charge_decided_by_the_response_is_made_once_whatever_the_client_does() {
    let w = World::new(runtime(""), None);
    let counted = |w: &World| {
        let store = w.memory.clone();
        async move {
            match store.state("fails", b"192.0.2.7") {
                Some(State::Bucket(b)) => b.level,
                _ => 0.0,
            }
        }
    };
    // Never forwarded (the upstream was down): nothing owed.
    let mut t = w.ticket("192.0.2.7");
    assert!(delay_of(&rule(&mut t, &w.stores, "/login", "k").await).is_some());
    t.finish(Ending::ClientLeft, 0, &w.stores).await;
    assert_eq!(counted(&w).await, 0.0);
    // Forwarded, then the client left before the head: charged as if its status counted, once.
    let mut t = w.ticket("192.0.2.7");
    rule(&mut t, &w.stores, "/login", "k").await;
    t.forwarded();
    t.finish(Ending::ClientLeft, 0, &w.stores).await;
    t.finish(Ending::ClientLeft, 0, &w.stores).await;
    assert_eq!(counted(&w).await, 1.0);
    assert!(t.report().client_left_owing);
    // 1r/h, burst 0: the next login is refused at once.
    let mut t = w.ticket("192.0.2.7");
    assert!(delay_of(&rule(&mut t, &w.stores, "/login", "k").await).is_none());
    // Another client whose answer is a 200: not counted, at the head or at the end.
    let mut t = w.ticket("192.0.2.8");
    rule(&mut t, &w.stores, "/login", "k").await;
    t.forwarded();
    let fields = t.at_head(200, &HeaderMap::new(), &w.stores).await;
    assert!(fields.iter().any(|(name, _)| *name == "RateLimit"), "{fields:?}");
    t.body_ended();
    t.finish(Ending::ClientLeft, 0, &w.stores).await;
    let state = w.memory.state("fails", b"192.0.2.8");
    assert!(state.is_none(), "{state:?}");
}

/// A store that always fails, as a dead Redis does once its breaker is open.
struct DeadStore;

#[async_trait]
impl LimitStore for DeadStore {
    async fn decide(&self, _zones: &[KeyedZone<'_>]) -> Result<Verdict, StoreError> {
        Err(StoreError::CircuitOpen)
    }
    fn kind(&self) -> &'static str {
        "redis"
    }
}

#[tokio::test]
async fn a_failing_store_leaves_the_decision_to_the_routes_policy() {
    for (policy, want) in [
        ("allow", (Some(Duration::ZERO), Outcome::FailOpen)),
        ("deny", (None, Outcome::FailClosed)),
        // `local` decides in process with this instance's share: 1r/s, burst 1, as if alone.
        ("local", (Some(Duration::ZERO), Outcome::Limit(LimitStatus::Passed))),
    ] {
        let w = World::new(runtime(&format!("on_error = \"{policy}\"")), Some(Arc::new(DeadStore)));
        let mut t = w.ticket("192.0.2.1");
        let ruling = rule(&mut t, &w.stores, "/api/x", "k").await;
        if let Ruling::Refuse(answer) = &ruling {
            assert_eq!(answer.refusal, Refusal::LimiterUnavailable { route: "api", own_body: None }, "{policy}");
            assert!(answer.headers.contains(&("Retry-After", "1".to_string())), "{policy}");
        }
        assert_eq!((delay_of(&ruling), t.report().outcome), want, "{policy}");
        let fallback = t.report().fallback.map(FailurePolicy::as_str);
        assert_eq!(fallback, Some(policy));
        assert_eq!(*w.recorder.fell_back.lock().unwrap(), [t.report().fallback.expect("set")], "{policy}");
    }
}

/// `rule`'s future is moved into the front door's state on every request, zones or not: limit_req's
/// own future (~1 KB, a store's round trip) is boxed inside it, and only when a store must be
/// awaited (engine/mod.rs, the hot path's twins).
#[test]
fn the_rule_future_stays_small() {
    let world = World::new(runtime(""), None);
    let mut ticket = world.ticket("10.0.0.1");
    let headers = HeaderMap::new();
    let head = Head {
        method: &Method::GET,
        target: b"/api",
        authority: None,
        headers: &headers,
        client_ip: None,
        route: None,
        unix_secs: None,
    };
    let future = ticket.rule(&head, &world.stores);
    let size = std::mem::size_of_val(&future);
    // ~630 bytes in a debug build with limit_req's future boxed, ~1,500 without.
    assert!(size <= 768, "Ticket::rule's future is {size} bytes: box what it awaits");
}
