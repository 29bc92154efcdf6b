//! What one upstream address remembers across reloads and DNS changes (requests in flight,
//! passive failures), shared by the pool that picks servers and the health checks that clear them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Instant;

use prometheus::IntGauge;

use crate::metrics::METRICS;

/// Milliseconds on a process-wide monotonic clock.
pub(super) fn now_ms() -> u64 {
    static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);
    EPOCH.elapsed().as_millis() as u64
}

/// What one address remembers across reloads and DNS changes.
pub struct ServerState {
    pub addr: SocketAddr,
    pub(super) in_flight: AtomicUsize,
    pub(super) in_flight_gauge: IntGauge,
    /// Until when (ms, [`now_ms`]) passive health keeps the server out; 0: it is in.
    pub(super) down_until: AtomicU64,
    pub(super) fails: Mutex<(u32, u64)>,
}

impl ServerState {
    pub(super) fn new(upstream: &str, addr: SocketAddr) -> Self {
        let in_flight_gauge = METRICS.upstream_in_flight.with_label_values(&[upstream, &super::show_addr(addr)]);
        Self {
            addr,
            in_flight: AtomicUsize::new(0),
            in_flight_gauge,
            down_until: AtomicU64::new(0),
            fails: Mutex::new((0, 0)),
        }
    }

    pub(super) fn lock_fails(&self) -> MutexGuard<'_, (u32, u64)> {
        self.fails.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// The active check passed `rise` times: positive evidence that beats earlier failures.
    pub(super) fn clear_failures(&self) {
        self.down_until.store(0, Ordering::Release);
        *self.lock_fails() = (0, 0);
    }

    pub(super) fn passive_down(&self, now: u64) -> bool {
        self.down_until.load(Ordering::Acquire) > now
    }

    /// Takes a place on the server unless it already has `max` requests in flight.
    pub(super) fn take(&self, max: Option<usize>) -> bool {
        let taken = match max {
            None => {
                self.in_flight.fetch_add(1, Ordering::AcqRel);
                true
            }
            Some(max) => {
                self.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| (c < max).then_some(c + 1)).is_ok()
            }
        };
        if taken {
            self.in_flight_gauge.inc();
        }
        taken
    }
}

/// Per address, the state of every current (and still busy former) server.
pub(super) type States = Arc<Mutex<HashMap<SocketAddr, Arc<ServerState>>>>;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
