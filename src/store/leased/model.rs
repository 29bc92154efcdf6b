//! A ledger in process on the model itself (`lease::grant`, `lease::give_back`), one
//! `lease::Ledger` per key on a caller's clock: what `weir replay --instances N` simulates a fleet
//! against (N leasing layers, one ledger), and what the layer's unit tests grant from. Its asks
//! answer at once: a simulated fleet has no round trip.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::LeaseLedger;
use crate::limit::lease::{give_back, grant, Grant, Ledger};
use crate::limit::Clock;
use crate::store::{KeyedZone, LeaseAsk, StoreError};

pub struct ModelLedger {
    keys: Mutex<HashMap<(String, Vec<u8>), Ledger>>,
    /// Holder ids, numbered as they first ask (the model counts holders by number).
    holders: Mutex<HashMap<String, u64>>,
    clock: Arc<dyn Clock>,
    calls: AtomicU64,
}

impl ModelLedger {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        ModelLedger { keys: Mutex::default(), holders: Mutex::default(), clock, calls: AtomicU64::new(0) }
    }

    /// Grants and give-backs so far: the store calls a fleet would have made.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn holder(&self, holder: &str) -> u64 {
        let mut holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        let next = holders.len() as u64 + 1;
        *holders.entry(holder.to_string()).or_insert(next)
    }
}

#[async_trait]
impl LeaseLedger for ModelLedger {
    async fn grant(&self, zone: &KeyedZone<'_>, holder: &str, ask: LeaseAsk) -> Result<Grant, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let instance = self.holder(holder);
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let ledger = keys.entry((zone.zone.to_string(), zone.key.clone())).or_default();
        let (g, next) = grant(&zone.limit, ledger, self.clock.now_us(), instance, ask.min, ask.want, ask.lifetime_us);
        *ledger = next;
        Ok(g)
    }

    async fn give_back(
        &self,
        zone: &KeyedZone<'_>,
        holder: &str,
        unused: u64,
        window_start_us: Option<u64>,
    ) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let instance = self.holder(holder);
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let ledger = keys.entry((zone.zone.to_string(), zone.key.clone())).or_default();
        *ledger = give_back(&zone.limit, ledger, self.clock.now_us(), instance, unused, window_start_us);
        Ok(())
    }
}
