//! One upstream's adaptive limit on this instance: the places in flight, the learning
//! [`Controller`], and an optional short queue where waiting requests are served most important
//! first. State lives behind one mutex held for a few hundred nanoseconds per request; nothing
//! awaits while holding it.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntGauge};
use tokio::sync::oneshot;

use super::admission::{Occupancy, Priority, ShedReason};
use super::controller::{Controller, Settings};
use crate::metrics::METRICS;

/// The queue (`queue = N`, `queue_timeout`); `max_waiting = 0`: refuse at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueSettings {
    pub max_waiting: usize,
    pub timeout: Duration,
}

/// `[upstream.adaptive]` as compiled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveSpec {
    pub controller: Settings,
    pub queue: QueueSettings,
}

type WaiterKey = (Reverse<Priority>, u64);

struct State {
    controller: Controller,
    queue: QueueSettings,
    occupancy: Occupancy,
    /// Most important first, then oldest first.
    waiters: BTreeMap<WaiterKey, oneshot::Sender<()>>,
    next_waiter: u64,
}

struct Gauges {
    limit: IntGauge,
    in_flight: IntGauge,
    waiting: IntGauge,
    ideal_seconds: prometheus::Gauge,
    shed: Vec<IntCounter>,
}

pub struct AdaptiveLimit {
    pub name: String,
    state: Mutex<State>,
    gauges: Gauges,
}

/// The clock the controller reads (µs): the wall clock, so that the instances of a fleet probe
/// on the same grid (`controller`). A step back only delays a window; it never panics.
fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

impl AdaptiveLimit {
    pub fn new(name: &str, spec: AdaptiveSpec) -> Self {
        let controller = Controller::new(spec.controller);
        let shed = Priority::ALL
            .iter()
            .flat_map(|p| {
                ShedReason::ALL
                    .iter()
                    .map(move |r| METRICS.adaptive.shed.with_label_values(&[name, p.as_str(), r.as_str()]))
            })
            .collect();
        let gauges = Gauges {
            limit: METRICS.adaptive.limit.with_label_values(&[name]),
            in_flight: METRICS.adaptive.in_flight.with_label_values(&[name]),
            waiting: METRICS.adaptive.waiting.with_label_values(&[name]),
            ideal_seconds: METRICS.adaptive.ideal_latency.with_label_values(&[name]),
            shed,
        };
        gauges.limit.set(i64::from(controller.limit()));
        let state = State {
            controller,
            queue: spec.queue,
            occupancy: Occupancy::default(),
            waiters: BTreeMap::new(),
            next_waiter: 0,
        };
        Self { name: name.to_string(), state: Mutex::new(state), gauges }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// New settings on reload; what was learned stays.
    pub fn reconfigure(&self, spec: AdaptiveSpec) {
        let mut state = self.lock();
        if state.controller.settings() != spec.controller {
            state.controller.reconfigure(spec.controller);
        }
        state.queue = spec.queue;
        self.gauges.limit.set(i64::from(state.controller.limit()));
    }

    pub fn limit(&self) -> u32 {
        self.lock().controller.limit()
    }

    /// For `GET /upstreams` and the status page: limit, places in use and waiting, the learned
    /// latency without a queue, requests shed so far.
    pub fn status(&self) -> serde_json::Value {
        let state = self.lock();
        let shed: u64 = self.gauges.shed.iter().map(|c| c.get()).sum();
        serde_json::json!({
            "limit": state.controller.limit(),
            "in_flight": state.occupancy.total(),
            "waiting": state.waiters.len(),
            "ideal_ms": state.controller.ideal().map(|d| d.as_secs_f64() * 1000.0),
            "shed": shed,
        })
    }

    pub fn in_flight(&self) -> u32 {
        self.lock().occupancy.total()
    }

    fn shed(&self, priority: Priority, reason: ShedReason) -> ShedReason {
        let index = priority as usize * ShedReason::ALL.len() + reason as usize;
        if let Some(counter) = self.gauges.shed.get(index) {
            counter.inc();
        }
        reason
    }

    fn entered(&self, state: &mut State, priority: Priority) {
        state.occupancy.enter(priority);
        let in_flight = state.occupancy.total();
        state.controller.observe_in_flight(in_flight);
        self.gauges.in_flight.set(i64::from(in_flight));
    }

    /// A place now, a place after waiting in the queue, or the reason there is none.
    pub async fn acquire(self: &Arc<Self>, priority: Priority) -> Result<Permit, ShedReason> {
        let (key, receiver, timeout) = {
            let mut state = self.lock();
            if state.controller.probing() {
                // A probe ends by its deadline even when no answer comes to end it.
                state.controller.expire(now_us());
            }
            let limit = state.controller.limit();
            let queued_ahead = state.waiters.keys().next().is_some_and(|(Reverse(p), _)| *p >= priority);
            if !queued_ahead && state.occupancy.may_enter(limit, priority) {
                self.entered(&mut state, priority);
                return Ok(Permit::new(self.clone(), priority));
            }
            if state.queue.max_waiting == 0 {
                return Err(self.shed(priority, ShedReason::OverLimit));
            }
            if state.waiters.len() >= state.queue.max_waiting {
                // Full: the least important (then newest) waiter leaves if it matters less.
                let last = state.waiters.keys().next_back().copied();
                match last {
                    Some(last @ (Reverse(p), _)) if p < priority => {
                        state.waiters.remove(&last);
                        self.shed(p, ShedReason::Displaced);
                    }
                    _ => return Err(self.shed(priority, ShedReason::QueueFull)),
                }
            }
            let (sender, receiver) = oneshot::channel();
            let key = (Reverse(priority), state.next_waiter);
            state.next_waiter += 1;
            state.waiters.insert(key, sender);
            self.gauges.waiting.set(state.waiters.len() as i64);
            (key, receiver, state.queue.timeout)
        };
        // If this future is dropped (the client left), the receiver goes with it and the place
        // handed to it is passed on (see `hand_over`).
        let mut receiver = receiver;
        match tokio::time::timeout(timeout, &mut receiver).await {
            Ok(Ok(())) => Ok(Permit::new(self.clone(), priority)),
            Ok(Err(_)) => Err(ShedReason::Displaced),
            Err(_) => {
                let mut state = self.lock();
                if state.waiters.remove(&key).is_none() {
                    // Handed a place (or displaced) just as the time ran out.
                    if receiver.try_recv().is_ok() {
                        return Ok(Permit::new(self.clone(), priority));
                    }
                    return Err(ShedReason::Displaced);
                }
                self.gauges.waiting.set(state.waiters.len() as i64);
                Err(self.shed(priority, ShedReason::QueueTimeout))
            }
        }
    }

    /// Whether a retry may go on with its place: not while others are refused or waiting.
    pub fn allows_retry(&self) -> bool {
        let state = self.lock();
        state.waiters.is_empty() && state.occupancy.total() <= state.controller.limit()
    }

    fn release(&self, priority: Priority, latency: Option<Duration>) {
        let mut state = self.lock();
        state.occupancy.leave(priority);
        if let Some(latency) = latency {
            self.learn(&mut state, latency);
        }
        self.hand_over(&mut state);
        self.gauges.in_flight.set(i64::from(state.occupancy.total()));
    }

    fn learn(&self, state: &mut State, latency: Duration) {
        let in_flight = state.occupancy.total();
        if let Some(verdict) = state.controller.sample(now_us(), latency, in_flight) {
            tracing::debug!(upstream = %self.name, ?verdict, limit = state.controller.limit(),
                ideal_ms = state.controller.ideal().map(|d| d.as_secs_f64() * 1000.0),
                probing = state.controller.probing(), "adaptive window");
            self.gauges.limit.set(i64::from(state.controller.limit()));
            if let Some(ideal) = state.controller.ideal() {
                self.gauges.ideal_seconds.set(ideal.as_secs_f64());
            }
        }
    }

    /// Free places go to the waiters, most important first.
    fn hand_over(&self, state: &mut State) {
        while let Some((&key, _)) = state.waiters.first_key_value() {
            let (Reverse(priority), _) = key;
            if !state.occupancy.may_enter(state.controller.limit(), priority) {
                break;
            }
            let Some(sender) = state.waiters.remove(&key) else { break };
            // Taken before the waiter wakes; a waiter that is gone gives nothing back.
            if sender.send(()).is_ok() {
                self.entered(state, priority);
            }
        }
        self.gauges.waiting.set(state.waiters.len() as i64);
    }
}

/// A place under the limit, given back when dropped (by the proxy when the upstream's answer has
/// ended, or when the request ends). The latency sample is the upstream's: from the moment the
/// request was fully sent to it (the last byte of the client's body read, or the head of a
/// request without one; again at each retry) to the upstream's response head. The client's own
/// upload pace is not the upstream's latency.
pub struct Permit {
    limit: Arc<AdaptiveLimit>,
    priority: Priority,
    since: Instant,
    /// The current attempt's request was fully sent (`since` is then when).
    sent: bool,
    latency: Option<Duration>,
}

impl Permit {
    fn new(limit: Arc<AdaptiveLimit>, priority: Priority) -> Self {
        Self { limit, priority, since: Instant::now(), sent: false, latency: None }
    }

    /// The request is now fully sent to the upstream (its body ended, or it has none): the
    /// sample starts here. Whatever came before (the client's upload) was the client's time.
    pub fn sent(&mut self) {
        if !self.sent {
            self.sent = true;
            self.since = Instant::now();
        }
    }

    /// The response head arrived. An answer that came before the request was fully sent (an
    /// early 413, a 408 to a client whose body stalled) gives no sample: the time was the
    /// client's, not the upstream's work.
    pub fn answered(&mut self) {
        if self.sent {
            self.latency.get_or_insert_with(|| self.since.elapsed());
        }
    }

    /// The attempt timed out: its time counts, so the limit learns the upstream is too slow
    /// (once the request was fully sent; before, the client may be what was slow).
    pub fn timed_out(&mut self) {
        if self.sent {
            self.latency.get_or_insert_with(|| self.since.elapsed());
        }
    }

    /// The request goes to another server with the same place: what the failed attempt taught
    /// (a timeout) is learned now, and the next sample starts when the retry is sent.
    pub fn retried(&mut self) {
        if let Some(latency) = self.latency.take() {
            let mut state = self.limit.lock();
            self.limit.learn(&mut state, latency);
        }
        self.sent = false;
        self.since = Instant::now();
    }

    pub fn allows_retry(&self) -> bool {
        self.limit.allows_retry()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.limit.release(self.priority, self.latency);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptive::controller::Settings;

    /// A limit of exactly `places` (min = max) with a queue of `waiting`.
    fn limit(name: &str, places: u32, waiting: usize) -> Arc<AdaptiveLimit> {
        let controller =
            Settings { min_limit: places, max_limit: places, initial_limit: places, ..Settings::default() };
        let queue = QueueSettings { max_waiting: waiting, timeout: Duration::from_secs(5) };
        Arc::new(AdaptiveLimit::new(name, AdaptiveSpec { controller, queue }))
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_queue_the_excess_is_refused_at_once() {
        let l = limit("test-refuse", 2, 0);
        let a = l.acquire(Priority::Normal).await;
        let b = l.acquire(Priority::Normal).await;
        assert!(a.is_ok() && b.is_ok());
        assert_eq!(l.acquire(Priority::Normal).await.err(), Some(ShedReason::OverLimit));
        drop(a);
        assert!(l.acquire(Priority::Normal).await.is_ok(), "a place given back is free again");
    }

    #[tokio::test(start_paused = true)]
    async fn high_priority_takes_its_own_places_when_the_others_hold_every_one() {
        let l = limit("test-high-reserve", 8, 0);
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(l.acquire(Priority::Low).await);
        }
        assert!(held.iter().all(Result::is_ok));
        assert_eq!(l.acquire(Priority::Normal).await.err(), Some(ShedReason::OverLimit));
        // A quarter of 8, at least 2: past the limit, and no more.
        let high = [l.acquire(Priority::High).await, l.acquire(Priority::High).await];
        assert!(high.iter().all(Result::is_ok));
        assert_eq!(l.acquire(Priority::High).await.err(), Some(ShedReason::OverLimit));
        assert_eq!(l.in_flight(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn freed_places_go_to_the_most_important_waiter_first() {
        // (Normal above low: high would take a place of its own at once, see below.)
        let l = limit("test-order", 1, 8);
        let held = l.acquire(Priority::Low).await.ok();
        let (low, high) = (l.clone(), l.clone());
        let low = tokio::spawn(async move { low.acquire(Priority::Low).await.map(|_| ()) });
        tokio::task::yield_now().await;
        let high = tokio::spawn(async move {
            let permit = high.acquire(Priority::Normal).await;
            // Hold the place a moment: the low waiter must still be waiting meanwhile.
            tokio::time::sleep(Duration::from_millis(10)).await;
            permit.map(|_| ())
        });
        tokio::task::yield_now().await;
        assert_eq!(l.lock().waiters.len(), 2);
        drop(held);
        assert_eq!(high.await.ok(), Some(Ok(())));
        assert_eq!(low.await.ok(), Some(Ok(())), "the low waiter gets the place after the high one");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_displaces_its_least_important_waiter() {
        let l = limit("test-displace", 1, 1);
        let _held = l.acquire(Priority::Normal).await.ok();
        let low = l.clone();
        let low = tokio::spawn(async move { low.acquire(Priority::Low).await.map(|_| ()) });
        tokio::task::yield_now().await;
        // Another low one finds the queue full of equals ...
        assert_eq!(l.acquire(Priority::Low).await.err(), Some(ShedReason::QueueFull));
        // ... a more important one takes the low one's seat.
        let high = l.clone();
        let _high = tokio::spawn(async move { high.acquire(Priority::Normal).await.map(|_| ()) });
        assert_eq!(low.await.ok(), Some(Err(ShedReason::Displaced)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_leaves_after_queue_timeout() {
        let l = limit("test-timeout", 1, 4);
        let _held = l.acquire(Priority::Normal).await.ok();
        let started = tokio::time::Instant::now();
        assert_eq!(l.acquire(Priority::Normal).await.err(), Some(ShedReason::QueueTimeout));
        assert!(started.elapsed() >= Duration::from_secs(5));
        assert!(l.lock().waiters.is_empty(), "the timed-out waiter is gone from the queue");
    }
}
