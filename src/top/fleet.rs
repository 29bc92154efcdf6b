//! Fleet-wide top keys on the Redis store: every [`SYNC_EVERY`], each instance publishes its view
//! (its tables' rows) and reads the others' and the resets announced since (`StoreAdmin::sync_fleet`,
//! `store/redis/fleet.rs`); `/top` on any instance then sums them.
//!
//! Why views rather than counting in Redis: counting there would cost a Redis write per limited
//! request, paid in a flood, when Redis is busiest; and the deny cache, which spares Redis one call
//! per rejected request, would have to call it anyway. A view costs each instance a few commands
//! per sync period, whatever the traffic, and none on the request path. The price: a fleet view
//! is up to one period old, and each instance's table only keeps the keys it sees most.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;

use super::{InstanceView, Tracker};
use crate::config::Runtime;
use crate::store::StoreAdmin;

pub const SYNC_EVERY: Duration = Duration::from_millis(500);
/// A view older than this is dropped (its instance stopped or lost Redis).
pub const STALE_AFTER_MS: u64 = 5_000;

pub fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// Rows idle longer than this are not listed: four half-lives, a sixteenth of their weight left.
pub fn max_idle_us(rt: &Runtime) -> u64 {
    rt.top.half_life.as_micros() as u64 * 4
}

/// This process's name in the fleet: host, pid and start time (a restart is a new instance).
pub fn instance_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()).filter(|h| !h.is_empty());
    format!("{}-{}-{}", host.unwrap_or_else(|| "weir".into()), std::process::id(), now_us() / 1000 % 1_000_000)
}

/// Shares this instance's view and reads the fleet's every `SYNC_EVERY`, for the process's life;
/// returns at once when the store is not shared (the process runs it, `process::lasting`).
pub async fn run(
    store: Arc<dyn StoreAdmin>,
    runtime: Arc<ArcSwap<Runtime>>,
    instance: String,
    top: Arc<Tracker>,
    on_reset: OnReset,
) {
    let mut tick = tokio::time::interval(SYNC_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stale: Vec<String> = Vec::new();
    loop {
        tick.tick().await;
        let rt = runtime.load_full();
        let now = now_us();
        let mut zones = top.local(now, max_idle_us(&rt));
        zones.retain(|z| !z.rows.is_empty());
        // Nothing to share: the old view goes, and an idle fleet leaves no key in Redis.
        let bytes = if zones.is_empty() {
            None
        } else {
            match serde_json::to_vec(&InstanceView { instance: instance.clone(), at_ms: now / 1000, zones }) {
                Ok(bytes) => Some(bytes),
                Err(e) => {
                    tracing::warn!(error = %e, "top keys: cannot encode this instance's view");
                    continue;
                }
            }
        };
        match store.sync_fleet(&instance, bytes, &stale).await {
            Ok(Some(sync)) => {
                for (zone, key) in &sync.resets {
                    top.forget(zone, key);
                    on_reset(zone, key);
                }
                let (fresh, old) = others(&sync.views, &instance, now / 1000);
                stale = old;
                top.set_fleet(fresh);
            }
            // Not shared: nothing to do, ever.
            Ok(None) => return,
            Err(e) => tracing::debug!(error = %e, "top keys: fleet sync failed; retrying"),
        }
    }
}

/// What else a reset announced by the fleet reaches (the leasing layer's leases of the key).
pub type OnReset = Box<dyn Fn(&str, &[u8]) + Send + Sync>;

/// The other instances' views that are fresh, and the ids of those gone quiet.
fn others(raw: &[Vec<u8>], me: &str, now_ms: u64) -> (Vec<InstanceView>, Vec<String>) {
    let mut fresh = Vec::new();
    let mut stale = Vec::new();
    for view in raw.iter().filter_map(|bytes| serde_json::from_slice::<InstanceView>(bytes).ok()) {
        if view.instance == me {
            continue;
        }
        if now_ms.saturating_sub(view.at_ms) > STALE_AFTER_MS {
            stale.push(view.instance);
        } else {
            fresh.push(view);
        }
    }
    (fresh, stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_fresh_views_of_others_and_names_stale_ones() {
        let view =
            |id: &str, at_ms| serde_json::to_vec(&InstanceView { instance: id.into(), at_ms, zones: vec![] }).unwrap();
        let raw = vec![view("me", 10_000), view("b", 9_000), view("c", 1_000), b"garbage".to_vec()];
        let (fresh, stale) = others(&raw, "me", 10_000);
        assert_eq!(fresh.iter().map(|v| v.instance.as_str()).collect::<Vec<_>>(), ["b"]);
        assert_eq!(stale, ["c"]);
    }
}
