//! Who is being limited, live: per zone, the keys with the most rejections and the keys closest
//! to their limit, in bounded memory (`table.rs`), for the admin API (`GET /top`), `weir top` and
//! the status page.
//!
//! Recorded from the decision path ([`record`], one call per decided request): a request that
//! passes far from its limit costs one comparison per zone and nothing else; only rejected,
//! delayed and near-limit requests (the limit at least `[top] near` full) reach the table.
//!
//! Per instance on the memory store. On Redis, each instance publishes its view every
//! [`fleet::SYNC_EVERY`] and reads the others' (`fleet.rs`): `/top` on any instance lists the
//! fleet's sum. Nothing of this touches Redis on the request path.

pub mod fleet;
mod sketch;
pub mod table;
pub mod view;

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, RwLock};

use crate::config::{Runtime, TopSettings};
use crate::limit::Verdict;
use crate::store::KeyedZone;

pub use table::{Event, Row, Table, TableSettings};
pub use view::{InstanceView, ZoneView};

/// This process's tables (one per zone, made on the zone's first recorded request).
pub static TOP: LazyLock<Tracker> = LazyLock::new(Tracker::default);

#[derive(Default)]
pub struct Tracker {
    zones: RwLock<HashMap<Box<str>, Mutex<Table>>>,
    /// The other instances' latest views (Redis store), as `fleet.rs` last read them.
    fleet: Mutex<Vec<InstanceView>>,
}

/// The hook of the decision path: records the zones of one decided group of a request (the
/// enforced group; dry-run zones are not who is being limited). Zones of a rejected request that
/// did not reject were not charged and are skipped, like in the statuses.
pub fn record(rt: &Runtime, zones: &[KeyedZone<'_>], verdict: &Verdict) {
    let settings = &rt.top;
    if !settings.enabled {
        return;
    }
    for (zone, outcome) in zones.iter().zip(&verdict.zones) {
        let event = match (verdict.admitted, outcome.admitted, outcome.delay_us) {
            (false, false, _) => Event::Rejected,
            (false, true, _) => continue,
            (true, _, 0) => Event::Passed,
            (true, _, _) => Event::Delayed,
        };
        let capacity = zone.limit.capacity().max(1);
        let fill = 1.0 - outcome.remaining.min(capacity) as f64 / capacity as f64;
        if event == Event::Passed && fill < settings.near {
            continue;
        }
        TOP.record(settings, zone.zone, &zone.key, event, fill, verdict.decided_us);
    }
}

/// The most the tables of `rt`'s zones can hold, in bytes (see `Table::bound_bytes`).
pub fn bound_bytes(rt: &Runtime) -> usize {
    rt.zones.len() * Table::bound_bytes(&table_settings(&rt.top))
}

fn table_settings(s: &TopSettings) -> TableSettings {
    TableSettings { capacity: s.keys, half_life_us: s.half_life.as_micros() as u64, sketch_width: s.sketch_width }
}

impl Tracker {
    pub fn record(&self, settings: &TopSettings, zone: &str, key: &[u8], event: Event, fill: f64, now_us: u64) {
        let wanted = table_settings(settings);
        {
            let zones = self.zones.read().unwrap_or_else(|p| p.into_inner());
            if let Some(table) = zones.get(zone) {
                let mut table = table.lock().unwrap_or_else(|p| p.into_inner());
                // A reload that resized the table starts it afresh.
                if table.settings() == wanted {
                    table.record(key, event, fill, now_us);
                    return;
                }
            }
        }
        let mut zones = self.zones.write().unwrap_or_else(|p| p.into_inner());
        let mut table = Table::new(wanted, now_us);
        table.record(key, event, fill, now_us);
        zones.insert(zone.into(), Mutex::new(table));
    }

    /// This instance's rows of every zone at `now_us` (keys seen within `max_idle_us`).
    pub fn local(&self, now_us: u64, max_idle_us: u64) -> Vec<ZoneView> {
        let zones = self.zones.read().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<ZoneView> = zones
            .iter()
            .map(|(zone, table)| {
                let rows = table.lock().unwrap_or_else(|p| p.into_inner()).rows(now_us, max_idle_us);
                ZoneView { zone: zone.to_string(), rows }
            })
            .collect();
        out.sort_by(|a, b| a.zone.cmp(&b.zone));
        out
    }

    /// Replaces the other instances' views (`fleet.rs`).
    pub fn set_fleet(&self, views: Vec<InstanceView>) {
        *self.fleet.lock().unwrap_or_else(|p| p.into_inner()) = views;
    }

    pub fn fleet(&self) -> Vec<InstanceView> {
        self.fleet.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Forgets a key that was reset, here and in the fleet views held.
    pub fn forget(&self, zone: &str, key: &[u8]) {
        if let Some(table) = self.zones.read().unwrap_or_else(|p| p.into_inner()).get(zone) {
            table.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        }
        for view in self.fleet.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
            for z in view.zones.iter_mut().filter(|z| z.zone == zone) {
                z.rows.retain(|r| r.key != key);
            }
        }
    }

    /// Bytes held by all tables (for the documentation's bound and the tests).
    pub fn bytes(&self) -> usize {
        let zones = self.zones.read().unwrap_or_else(|p| p.into_inner());
        zones.values().map(|t| t.lock().unwrap_or_else(|p| p.into_inner()).bytes()).sum()
    }
}
