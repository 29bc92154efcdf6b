//! One request's life in the engine. A front door takes a [`Ticket`] when a request arrives and
//! drives it through a few calls, acting only between them (the contract is in `engine/mod.rs`):
//!
//! 1. [`Ticket::rule`]: admit and limit_req → forward, forward after a delay, or refuse;
//! 2. [`Ticket::hold`]: after any delay, limit_conn's leases → held, or refuse;
//! 3. settle, as the answer arrives: [`Ticket::forwarded`], [`Ticket::at_head`],
//!    [`Ticket::body_ended`], [`Ticket::at_trailers`];
//! 4. [`Ticket::finish`]: the charges still owed, the leases given back, the report.
//!
//! What the engine guarantees holds whatever the client does: response-decided charges are made
//! exactly once from the moment the request was forwarded, leases are given back exactly once,
//! and every request is reported once. A ticket dropped without `finish` (a panic, a path that
//! skipped it) still gives its leases back (`Lease`'s own `Drop`) and is reported; the charges
//! it still owed are lost with it, which is why every front door calls `finish`.

use std::net::IpAddr;
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::admit::{admit, Forward, Head};
use super::after_response::{Ending, ResponseCharges};
use super::dry_run::Groups;
use super::lease::Lease;
use super::limit_conn;
use super::limit_req::{self, Action, Enforcement};
use super::observe::{Observer, Unobserved};
use super::outcome::Outcome;
use super::pacing::Pace;
use super::refusal::Answer;
use super::result::{Door, Report, ZoneResult};
use super::status::{LimitStatus, Statuses};
use super::stores::{ConnStores, Stores};
use crate::config::{FailurePolicy, Route, Runtime};
use crate::store::{KeyedConn, KeyedZone};

/// What the front door does with a request after [`Ticket::rule`] (or [`Ticket::rule_zones`]).
pub enum Ruling<'t> {
    /// Forward it, rewritten as decided (`Forward`), once it has waited `delay` (zero: at once).
    /// Then [`Ticket::hold`].
    Forward { forward: Forward, delay: Duration },
    /// Answer it with this instead; the ticket is settled, only `finish` remains.
    Refuse(Answer<'t>),
}

/// One request's engine state, from its head to its report. `R` holds the config snapshot the
/// request started with, kept to its end, so a reload never changes a request mid-flight: an
/// `Arc` for the serving front doors, a borrow for replay (one snapshot for the whole log).
pub struct Ticket<R: Deref<Target = Runtime> = Arc<Runtime>> {
    rt: R,
    observer: &'static dyn Observer,
    door: Door,
    route: Option<usize>,
    client_ip: Option<IpAddr>,
    outcome: Outcome,
    /// limit_req's word for the request, and each keyed zone's result.
    limit_req: Option<LimitStatus>,
    zones: Vec<ZoneResult>,
    /// Rate-limit fields to add to the upstream's response.
    fields: Vec<(&'static str, String)>,
    /// When the limits were decided (µs since the epoch), for the access log and `weir replay`.
    decided_us: Option<u64>,
    /// The failure policy that decided limit_req, when the store could not.
    fallback: Option<FailurePolicy>,
    delay: Duration,
    /// limit_conn's keyed zones and words; `None` when no limit_conn zone keyed the request.
    conn: Option<Box<ConnPart>>,
    leases: Vec<Lease>,
    /// Charges decided by the response (boxed, `None` when the route has none: rare, and the
    /// ticket is copied with the request's future).
    charges: Option<Box<ResponseCharges>>,
    /// The client left after the request was forwarded and before its answer was complete, with
    /// response-decided charges owed.
    client_left_owing: bool,
    /// Under the upstream's adaptive limit (the route's, or the request's own by `priority_from`).
    priority: crate::adaptive::Priority,
    /// `limit_rate`: the response body's pace (boxed: rare, and the ticket moves with the request).
    pace: Option<Box<Pace>>,
    reported: bool,
}

/// limit_conn's part of a ticket, boxed: only a request that a limit_conn zone keys pays for it,
/// and the ticket is copied with the request's future (the proxy's context) on every request.
struct ConnPart {
    /// The keyed zones, until `hold` takes their leases (after limit_req's delay).
    pending: Vec<PendingConn>,
    /// limit_conn's words, once `hold` asked.
    statuses: Statuses,
}

/// limit_conn's words of a request no limit_conn zone keyed.
static NO_CONN_STATUSES: Statuses = Statuses { overall: None, zones: Vec::new() };

/// A limit_conn zone keyed for this request, owned until its lease is taken.
#[derive(Clone)]
struct PendingConn {
    reference: usize,
    key: Vec<u8>,
    dry_run: bool,
}

impl PendingConn {
    /// The zone as the stores take it, named and capped by `route`'s reference in `rt`.
    fn keyed<'r>(self, rt: &'r Runtime, route: &Route) -> KeyedConn<'r> {
        let limit = &route.conn_limits[self.reference];
        let zone = &rt.conn_zones[limit.zone].name;
        KeyedConn { zone, key: self.key, max: limit.max, dry_run: self.dry_run, reference: self.reference }
    }
}

impl<R: Deref<Target = Runtime>> Ticket<R> {
    /// A ticket on the snapshot `rt`; `client_ip` is the address the request counts against
    /// (`engine::client_ip`).
    pub fn new(rt: R, client_ip: Option<IpAddr>, observer: &'static dyn Observer) -> Self {
        Ticket {
            rt,
            observer,
            door: Door::Proxy,
            route: None,
            client_ip,
            outcome: Outcome::Unlimited,
            limit_req: None,
            zones: Vec::new(),
            fields: Vec::new(),
            decided_us: None,
            fallback: None,
            delay: Duration::ZERO,
            conn: None,
            leases: Vec::new(),
            charges: None,
            client_left_owing: false,
            priority: crate::adaptive::Priority::default(),
            pace: None,
            reported: false,
        }
    }

    /// A ticket of the rate limit service, for one call of `domain`.
    pub fn for_rls(rt: R, domain: &str, observer: &'static dyn Observer) -> Self {
        let mut ticket = Self::new(rt, None, observer);
        ticket.door = Door::Rls { domain: Box::new(domain.to_string()) };
        ticket
    }

    /// A ticket nobody observes (replay, tests).
    pub fn unobserved(rt: R, client_ip: Option<IpAddr>) -> Self {
        Self::new(rt, client_ip, &Unobserved)
    }

    pub fn runtime(&self) -> &R {
        &self.rt
    }

    /// The route matched, once one did.
    pub fn route(&self) -> Option<&Route> {
        self.route.and_then(|i| self.rt.routes.get(i))
    }

    /// The address the request counts against, once the front door has resolved it.
    pub fn counts_against(&mut self, client_ip: Option<IpAddr>) {
        self.client_ip = client_ip;
    }

    /// What was decided so far, in the one shape every front door reads: the access log, the
    /// trace span, replay and the rate limit service read it, and the observers are handed it
    /// when the ticket is finished.
    pub fn report(&self) -> Report<'_> {
        Report {
            door: &self.door,
            route: self.route,
            client_ip: self.client_ip,
            outcome: self.outcome,
            limit_req: self.limit_req,
            zones: &self.zones,
            limit_conn: self.conn.as_ref().map_or(&NO_CONN_STATUSES, |c| &c.statuses),
            delay: self.delay,
            decided_us: self.decided_us,
            fallback: self.fallback,
            client_left_owing: self.client_left_owing,
        }
    }

    /// Its priority under the upstream's adaptive limit, once ruled.
    pub fn priority(&self) -> crate::adaptive::Priority {
        self.priority
    }

    /// The response body's pace, when `limit_rate` applies.
    pub fn pace(&mut self) -> Option<&mut Pace> {
        self.pace.as_deref_mut()
    }

    /// A front door's own verdict on the request (the upstream was busy or down, the adaptive
    /// limit shed it, a rewrite failed): the outcome it is reported with.
    pub fn settle_as(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }

    /// Step 1: admit (route, access, keys, cost) then limit_req through the stores.
    pub async fn rule(&mut self, head: &Head<'_>, stores: &Stores) -> Ruling<'_> {
        let rt: &Runtime = &self.rt;
        let plan = match admit(rt, head) {
            Ok(plan) => plan,
            Err(refused) => {
                self.route = refused.route;
                self.outcome = refused.outcome;
                return Ruling::Refuse(refused.answer);
            }
        };
        self.route = Some(plan.route);
        self.priority = plan.priority;
        for zone in &plan.empty_keys {
            self.observer.empty_key(zone);
        }
        let route = &rt.routes[plan.route];
        // The pace's clock starts with the response (`at_head`); the rate is decided now.
        self.pace = plan.pace.map(|p| Box::new(Pace::new(p, Instant::now())));
        let pending: Vec<PendingConn> = plan
            .conns
            .into_all()
            .into_iter()
            .map(|c| PendingConn { reference: c.reference, key: c.key, dry_run: c.dry_run })
            .collect();
        if !pending.is_empty() {
            self.conn = Some(Box::new(ConnPart { pending, statuses: Statuses::default() }));
        }
        let mut delay = Duration::ZERO;
        if !plan.zones.is_empty() {
            let at_once = stores
                .primary
                .in_process()
                .and_then(|store| limit_req::enforce_at_once(store, rt, route, &plan.zones, stores));
            let mut enforcement = match at_once {
                Some(decided) => decided,
                // Boxed: this future is ~1 KB and `rule`'s own is moved into the front door's
                // state on every request, zones or not.
                None => Box::pin(limit_req::enforce(rt, route, &plan.zones, stores)).await,
            };
            let mut words = Words {
                limit_req: &mut self.limit_req,
                zones: &mut self.zones,
                outcome: &mut self.outcome,
                decided_us: &mut self.decided_us,
                fallback: &mut self.fallback,
            };
            record_limit(&mut words, &mut enforcement);
            match enforcement.action {
                Action::Reject(answer) => {
                    self.conn = None;
                    give_keys(&mut self.zones, plan.zones.into_all().into_iter().map(|z| z.key));
                    return Ruling::Refuse(answer);
                }
                Action::Delay(d) => {
                    delay = d;
                    self.observer.delayed(rt, plan.route, d);
                }
                Action::Forward => {}
            }
            self.fields = enforcement.headers;
        }
        self.delay = delay;
        if !plan.zones.is_empty() {
            let charges = ResponseCharges::new(rt, route, &plan.zones);
            self.charges = (!charges.is_empty()).then(|| Box::new(charges));
            give_keys(&mut self.zones, plan.zones.into_all().into_iter().map(|z| z.key));
        }
        Ruling::Forward { forward: plan.forward, delay }
    }

    /// Step 1 for a front door that keys zones itself (the rate limit service keys them from
    /// descriptors, under its domain's `route`): limit_req on `zones`, the same ruling as
    /// [`Self::rule`]'s (a forward rewrites nothing; the fields to add are [`Self::head_fields`]).
    /// Called again for a second decision, it replaces the first's words and results (the rate
    /// limit service's soft limits).
    pub async fn rule_zones<'z>(
        &mut self,
        route: &'z Route,
        zones: &Groups<KeyedZone<'z>>,
        stores: &Stores,
    ) -> Ruling<'z> {
        let mut enforcement = limit_req::enforce(&self.rt, route, zones, stores).await;
        record_limit(&mut self.words(), &mut enforcement);
        give_keys(&mut self.zones, zones.all().iter().map(|z| z.key.clone()));
        self.fields = std::mem::take(&mut enforcement.headers);
        self.delay = Duration::ZERO;
        match enforcement.action {
            Action::Reject(answer) => Ruling::Refuse(answer),
            Action::Delay(delay) => {
                self.delay = delay;
                Ruling::Forward { forward: Forward::default(), delay }
            }
            Action::Forward => Ruling::Forward { forward: Forward::default(), delay: Duration::ZERO },
        }
    }

    /// The client left while its request waited out limit_req's delay: nothing further is taken
    /// for it (no lease, no upstream place), as nginx drops it.
    pub fn client_gone(&mut self) {
        self.outcome = Outcome::ClientGone;
        self.conn = None;
    }

    /// Step 2, after any delay: limit_conn's leases, all or none (nginx's order: a delayed
    /// request is not counted while it waits; a rejected one never takes a lease).
    pub async fn hold(&mut self, stores: &ConnStores) -> Result<(), Answer<'_>> {
        let Some(part) = self.conn.as_deref_mut().filter(|c| !c.pending.is_empty()) else { return Ok(()) };
        let rt: &Runtime = &self.rt;
        let Some(route) = self.route.and_then(|i| rt.routes.get(i)) else { return Ok(()) };
        let keyed = std::mem::take(&mut part.pending).into_iter().map(|c| c.keyed(rt, route)).collect();
        let conn = limit_conn::acquire(rt, route, &Groups::new(keyed), stores).await;
        self.leases = conn.leases;
        part.statuses = conn.statuses;
        match conn.reject {
            Some(answer) => {
                self.outcome = Outcome::of_conn_rejection(conn.fallback);
                Err(answer)
            }
            None => Ok(()),
        }
    }

    /// Step 3: the request is on its way to the upstream; its response-decided charges are owed
    /// from now on, whatever the client does.
    pub fn forwarded(&mut self) {
        if let Some(charges) = &mut self.charges {
            charges.forwarded();
        }
    }

    /// Step 3: the upstream's response head (`status`, its headers). Charges what is due at the
    /// head (before the client sees the status, and before any lease is given back, so the
    /// client's next request is checked against it), starts the body's pace, and returns the
    /// rate-limit fields to add to the response.
    pub async fn at_head(
        &mut self,
        status: u16,
        headers: &http::HeaderMap,
        stores: &Stores,
    ) -> Vec<(&'static str, String)> {
        if self.owes() {
            self.charge_at_head(status, headers, stores).await;
        }
        self.head_fields()
    }

    /// Step 3: the upstream's body ended; what is still owed is what it reported.
    pub fn body_ended(&mut self) {
        if let Some(charges) = &mut self.charges {
            charges.body_ended();
        }
    }

    /// Step 3: the upstream's trailers (HTTP/2), for zones charged from a trailer.
    pub async fn at_trailers(&mut self, trailers: &http::HeaderMap, stores: &Stores) {
        if let Some(charges) = self.charges.as_mut().filter(|c| !c.is_empty()) {
            charges.at_trailers(trailers, stores).await;
        }
    }

    /// Step 4, exactly once, however the request ended: charges what is still owed (`ending`,
    /// and `body_bytes` of the answer's body sent to the client), gives the leases back, and
    /// reports the request. A second call does nothing.
    pub async fn finish(&mut self, ending: Ending, body_bytes: u64, stores: &Stores) {
        if self.finish_settled() {
            return;
        }
        if let Some(charges) = self.charges.as_mut().filter(|c| !c.is_empty()) {
            self.client_left_owing = ending == Ending::ClientLeft && charges.unfinished();
            charges.finish(ending, body_bytes, stores).await;
        }
        for lease in self.leases.drain(..) {
            lease.release().await;
        }
        self.tell();
    }

    /// limit_conn's zones keyed for this request and not held (yet), enforced ones first: what
    /// `hold` would ask for, for a front door that estimates concurrency itself (replay).
    pub fn pending_conns(&self) -> Groups<KeyedConn<'_>> {
        let rt: &Runtime = &self.rt;
        let Some(route) = self.route.and_then(|i| rt.routes.get(i)) else { return Groups::new(Vec::new()) };
        let pending = self.conn.iter().flat_map(|c| &c.pending);
        Groups::new(pending.map(|c| c.clone().keyed(rt, route)).collect())
    }

    /// Tells the observer, once.
    fn tell(&mut self) {
        if std::mem::replace(&mut self.reported, true) {
            return;
        }
        self.observer.finished(&self.rt, &self.report());
    }
}

/// The proxy's hot path: each `async` step's synchronous twin, for when it has nothing to await.
/// An `async` step's future is moved into the phase's state even when it returns at once; these
/// moves were ~1 % of a request's instructions for `hold`, `at_head` and `finish` together.
impl<R: Deref<Target = Runtime>> Ticket<R> {
    /// Whether charges decided by the response are still owed (else `at_head` is `head_fields`).
    pub fn owes(&self) -> bool {
        self.charges.as_ref().is_some_and(|c| !c.is_empty())
    }

    /// [`Self::at_head`]'s charges alone.
    pub async fn charge_at_head(&mut self, status: u16, headers: &http::HeaderMap, stores: &Stores) {
        if let Some(charges) = &mut self.charges {
            charges.at_head(status, headers, stores).await;
        }
    }

    /// [`Self::at_head`]'s synchronous part: the body's pace starts, the fields to add.
    pub fn head_fields(&mut self) -> Vec<(&'static str, String)> {
        if let Some(pace) = &mut self.pace {
            // No head start for the time spent waiting on the upstream.
            pace.restart(Instant::now());
        }
        std::mem::take(&mut self.fields)
    }

    /// [`Self::finish`] without awaiting when nothing is owed and no lease is held: reports the
    /// request and returns true; false when `finish` has work to do.
    pub fn finish_settled(&mut self) -> bool {
        if self.owes() || !self.leases.is_empty() {
            return false;
        }
        self.tell();
        true
    }

    /// Whether `hold` has leases to ask for (a limit_conn zone had a key).
    pub fn wants_leases(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| !c.pending.is_empty())
    }
}

impl<R: Deref<Target = Runtime>> Drop for Ticket<R> {
    /// A ticket never finished is still reported; its leases go back by their own `Drop`.
    fn drop(&mut self) {
        self.tell();
    }
}

/// The ticket's words of limit_req, borrowed apart from its snapshot.
struct Words<'t> {
    limit_req: &'t mut Option<LimitStatus>,
    zones: &'t mut Vec<ZoneResult>,
    outcome: &'t mut Outcome,
    decided_us: &'t mut Option<u64>,
    fallback: &'t mut Option<FailurePolicy>,
}

impl<R: Deref<Target = Runtime>> Ticket<R> {
    fn words(&mut self) -> Words<'_> {
        Words {
            limit_req: &mut self.limit_req,
            zones: &mut self.zones,
            outcome: &mut self.outcome,
            decided_us: &mut self.decided_us,
            fallback: &mut self.fallback,
        }
    }
}

/// limit_req's result into the ticket's words: statuses (moved into the ticket), outcome, the
/// failure policy that decided, when it was decided.
fn record_limit(words: &mut Words<'_>, enforcement: &mut Enforcement<'_>) {
    // The store's own time orders the decisions; the local clock when no store decided (read
    // only then: it is not needed on the usual path).
    *words.decided_us =
        Some(enforcement.decided_us.unwrap_or_else(|| crate::limit::Clock::now_us(&crate::limit::SystemClock)));
    *words.outcome = Outcome::of_limit_req(enforcement.fallback, enforcement.overall);
    *words.fallback = enforcement.fallback;
    *words.limit_req = enforcement.overall;
    *words.zones = std::mem::take(&mut enforcement.zones);
}

/// Each zone's key into its result (the results are in the order of the keyed zones).
fn give_keys(results: &mut [ZoneResult], keys: impl IntoIterator<Item = Vec<u8>>) {
    for (result, key) in results.iter_mut().zip(keys) {
        result.key = key;
    }
}

#[cfg(test)]
mod tests;
