//! The stores a front door hands the engine, made once by the process and kept across reloads:
//! for limit_req ([`Stores`]) and for limit_conn's leases ([`ConnStores`]), each the configured
//! store with the in-process one of the `local` failure policy, and who is told what was decided.

use std::sync::Arc;

use super::lease::LeaseKeeper;
use super::observe::{Observer, Unobserved};
use crate::store::{ConnStore, LimitStore, MemoryConnStore, MemoryStore};

/// The stores a decision can use: the configured one, and the in-process one of the `local`
/// failure policy (kept across reloads like the main store).
pub struct Stores {
    pub primary: Arc<dyn LimitStore>,
    pub local: MemoryStore,
    /// Who is told what was decided (the serving process: metrics and the live view, made once
    /// and kept for the process's life; replay and tests: nobody). A plain reference: no shared
    /// counter touched per request.
    pub observer: &'static dyn Observer,
}

impl Stores {
    pub fn new(primary: Arc<dyn LimitStore>, local: MemoryStore) -> Self {
        Self { primary, local, observer: &Unobserved }
    }

    /// Tells `observer` of every decision.
    pub fn observed_by(self, observer: &'static dyn Observer) -> Self {
        Self { observer, ..self }
    }
}

pub struct ConnStores {
    pub primary: Arc<dyn ConnStore>,
    /// The store's kind for metrics and logs (`memory`, `redis`, …).
    pub kind: &'static str,
    /// The `local` failure policy's in-process counters.
    pub local: Arc<MemoryConnStore>,
    /// Who is told of store failures and of leases taken and given back.
    pub observer: &'static dyn Observer,
    /// Keeps the primary store's leases alive (the process runs it).
    pub keeper: Arc<LeaseKeeper>,
}

impl ConnStores {
    /// `primary` with its keeper, `local` for the `local` failure policy.
    pub fn new(
        primary: Arc<dyn ConnStore>,
        kind: &'static str,
        local: Arc<MemoryConnStore>,
        observer: &'static dyn Observer,
    ) -> Self {
        let keeper = LeaseKeeper::new(primary.clone());
        ConnStores { primary, kind, local, observer, keeper }
    }
}
