//! What the engine tells the world about its decisions, through one small trait: `metrics/`
//! (counters and histograms) and `top/` (the live view's tables) implement it, the process hands
//! one to the engine with the stores, and replay and the unit tests hand [`Unobserved`]. The
//! engine imports neither `metrics/` nor `top/`: what it decides is the same whoever watches.

use std::sync::Arc;
use std::time::Duration;

use super::result::Report;
use crate::config::{FailurePolicy, Runtime};
use crate::limit::Verdict;
use crate::store::KeyedZone;

/// Every method has a default that does nothing: an observer implements what it watches.
pub trait Observer: Send + Sync {
    /// A zone's key was empty for a request: that zone does not limit it.
    fn empty_key(&self, _zone: &str) {}

    /// One call to the limit store, and how long it took.
    fn store_call(&self, _took: Duration) {}

    /// The limit store failed (`cause`: timeout, redis, reply, circuit_open).
    fn store_failed(&self, _store: &'static str, _cause: &'static str) {}

    /// An enforced decision was left to the failure policy.
    fn fell_back(&self, _policy: FailurePolicy) {}

    /// A concurrency lease was taken (`true`) or given back (`false`).
    fn lease(&self, _held: bool) {}

    /// The store decided a request's enforced zones (the live view's tables watch these).
    fn decided(&self, _rt: &Runtime, _zones: &[KeyedZone<'_>], _verdict: &Verdict) {}

    /// limit_req holds a request of `route` for `delay` (reported when the wait begins: the
    /// waits in progress are visible while they last).
    fn delayed(&self, _rt: &Runtime, _route: usize, _delay: Duration) {}

    /// A request is over, however it ended.
    fn finished(&self, _rt: &Runtime, _report: &Report<'_>) {}
}

/// Nobody watches: replay (its decisions are not this process's traffic) and unit tests.
pub struct Unobserved;

impl Observer for Unobserved {}

/// Two observers, each told everything (the serving process: metrics, then the live view).
impl<A: Observer, B: Observer> Observer for (A, B) {
    fn empty_key(&self, zone: &str) {
        self.0.empty_key(zone);
        self.1.empty_key(zone);
    }
    fn store_call(&self, took: Duration) {
        self.0.store_call(took);
        self.1.store_call(took);
    }
    fn store_failed(&self, store: &'static str, cause: &'static str) {
        self.0.store_failed(store, cause);
        self.1.store_failed(store, cause);
    }
    fn fell_back(&self, policy: FailurePolicy) {
        self.0.fell_back(policy);
        self.1.fell_back(policy);
    }
    fn lease(&self, held: bool) {
        self.0.lease(held);
        self.1.lease(held);
    }
    fn decided(&self, rt: &Runtime, zones: &[KeyedZone<'_>], verdict: &Verdict) {
        self.0.decided(rt, zones, verdict);
        self.1.decided(rt, zones, verdict);
    }
    fn delayed(&self, rt: &Runtime, route: usize, delay: Duration) {
        self.0.delayed(rt, route, delay);
        self.1.delayed(rt, route, delay);
    }
    fn finished(&self, rt: &Runtime, report: &Report<'_>) {
        self.0.finished(rt, report);
        self.1.finished(rt, report);
    }
}

impl<T: Observer + ?Sized> Observer for Arc<T> {
    fn empty_key(&self, zone: &str) {
        (**self).empty_key(zone);
    }
    fn store_call(&self, took: Duration) {
        (**self).store_call(took);
    }
    fn store_failed(&self, store: &'static str, cause: &'static str) {
        (**self).store_failed(store, cause);
    }
    fn fell_back(&self, policy: FailurePolicy) {
        (**self).fell_back(policy);
    }
    fn lease(&self, held: bool) {
        (**self).lease(held);
    }
    fn decided(&self, rt: &Runtime, zones: &[KeyedZone<'_>], verdict: &Verdict) {
        (**self).decided(rt, zones, verdict);
    }
    fn delayed(&self, rt: &Runtime, route: usize, delay: Duration) {
        (**self).delayed(rt, route, delay);
    }
    fn finished(&self, rt: &Runtime, report: &Report<'_>) {
        (**self).finished(rt, report);
    }
}
