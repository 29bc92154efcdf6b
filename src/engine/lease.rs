//! A held concurrency lease: renewed in the background while its request runs, released when the
//! request ends — in the logging phase normally, and by `Drop` on any path that skips it, so a
//! slot is never leaked by an early return, a client abort or a panic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::debug;

use super::observe::Observer;
use crate::store::{ConnStore, LeaseKey};

/// Unique per process start, so lease ids of different instances never collide.
static INSTANCE: LazyLock<String> = LazyLock::new(|| {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}", std::process::id(), nanos)
});
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A fresh lease id: `<instance>:<counter>`.
pub fn new_lease_id() -> String {
    format!("{}:{}", *INSTANCE, NEXT.fetch_add(1, Ordering::Relaxed))
}

pub struct Lease {
    store: Arc<dyn ConnStore>,
    keys: Vec<LeaseKey>,
    id: String,
    observer: &'static dyn Observer,
    renewer: Option<tokio::task::JoinHandle<()>>,
    released: bool,
}

impl Lease {
    /// Starts holding a lease the store has granted.
    pub fn hold(store: Arc<dyn ConnStore>, keys: Vec<LeaseKey>, id: String, observer: &'static dyn Observer) -> Lease {
        observer.lease(true);
        let renewer = store.renew_every().map(|every| {
            let (store, keys, id) = (store.clone(), keys.clone(), id.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    if let Err(e) = store.renew(&keys, &id).await {
                        // The next renewal may succeed; the lease's TTL covers two more attempts.
                        debug!(lease = %id, error = %e, "lease renewal failed");
                    }
                }
            })
        });
        Lease { store, keys, id, observer, renewer, released: false }
    }

    pub async fn release(mut self) {
        self.stop();
        if let Err(e) = self.store.release(&self.keys, &self.id).await {
            debug!(lease = %self.id, error = %e, "lease release failed; it expires by itself");
        }
    }

    fn stop(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        if !self.released {
            self.released = true;
            self.observer.lease(false);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.stop();
        let (store, keys, id) = (self.store.clone(), std::mem::take(&mut self.keys), std::mem::take(&mut self.id));
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let _ = store.release(&keys, &id).await;
                });
            }
            // No runtime (process exit): the lease expires by its TTL.
            Err(_) => debug!(lease = %id, "lease dropped outside a runtime; it expires by itself"),
        }
    }
}
