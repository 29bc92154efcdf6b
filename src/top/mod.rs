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
pub mod text;
pub mod view;

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};

use crate::config::{Runtime, TopSettings};
use crate::engine::LimitStatus;
use crate::limit::Verdict;
use crate::store::KeyedZone;

pub use table::{Row, Table, TableSettings};
pub use view::{InstanceView, ZoneView};

/// A process's tables (one per zone, made on the zone's first recorded request). The serving
/// process owns one (`process::lasting::Lasting`) and hands it to the engine as an observer (`Stores::observed_by`),
/// the admin API and the fleet sync; replay has none, so it never feeds a live view.
#[derive(Default)]
pub struct Tracker {
    zones: RwLock<HashMap<Box<str>, Mutex<Table>>>,
    /// The other instances' latest views (Redis store), as `fleet.rs` last read them.
    fleet: Mutex<Vec<InstanceView>>,
}

/// The live view watches the engine's decisions (`engine::Observer`): each enforced decision
/// reaches the tables when `[top]` is enabled.
impl crate::engine::Observer for Tracker {
    fn decided(&self, rt: &Runtime, zones: &[KeyedZone<'_>], verdict: &Verdict) {
        if rt.top.enabled {
            self.record_verdict(&rt.top, zones, verdict);
        }
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
    /// [`record`]'s work: which zones of the verdict reach the tables, as what.
    pub fn record_verdict(&self, settings: &TopSettings, zones: &[KeyedZone<'_>], verdict: &Verdict) {
        for (zone, outcome) in zones.iter().zip(&verdict.zones) {
            let event = match (verdict.admitted, outcome.admitted, outcome.delay_us) {
                (false, false, _) => LimitStatus::Rejected,
                (false, true, _) => continue,
                (true, _, 0) => LimitStatus::Passed,
                (true, _, _) => LimitStatus::Delayed,
            };
            // A leased zone's local admission tells what this instance holds, not how full the
            // key is (the fleet's debits are in Redis): only its rejections reach the table.
            if event == LimitStatus::Passed && zone.lease.is_some() {
                continue;
            }
            let capacity = zone.limit.capacity().max(1);
            let fill = 1.0 - outcome.remaining.min(capacity) as f64 / capacity as f64;
            if event == LimitStatus::Passed && fill < settings.near {
                continue;
            }
            self.record(settings, zone.zone, &zone.key, event, fill, verdict.decided_us);
        }
    }

    pub fn record(&self, settings: &TopSettings, zone: &str, key: &[u8], event: LimitStatus, fill: f64, now_us: u64) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{decide_all, Algorithm, DelayPolicy, LimitReq, Rate, ZoneInput};

    const T0: u64 = 1_700_000_000_000_000;

    fn limit(rate: &str, burst: u64, delay: DelayPolicy) -> LimitReq {
        LimitReq { algorithm: Algorithm::LeakyBucket, rate: Rate::parse(rate).unwrap(), burst, delay }
    }

    /// Decides `zones` for one request on the model, with each zone's state after `before` earlier
    /// requests at the same instant, and records it.
    fn request(tracker: &Tracker, zones: &[KeyedZone<'_>], before: &[usize]) {
        let mut states: Vec<Option<crate::limit::State>> = vec![None; zones.len()];
        for (i, z) in zones.iter().enumerate() {
            for _ in 0..before[i] {
                let v = decide_all(&[ZoneInput { limit: &z.limit, state: states[i].clone(), cost: 1 }], T0);
                states[i] = Some(v.zones[0].next.clone());
            }
        }
        let inputs: Vec<ZoneInput<'_>> =
            zones.iter().zip(&states).map(|(z, s)| ZoneInput { limit: &z.limit, state: s.clone(), cost: 1 }).collect();
        tracker.record_verdict(&TopSettings::default(), zones, &decide_all(&inputs, T0));
    }

    fn listed(tracker: &Tracker) -> Vec<(String, Vec<u8>)> {
        let mut out: Vec<(String, Vec<u8>)> = tracker
            .local(T0, u64::MAX)
            .into_iter()
            .flat_map(|z| z.rows.into_iter().map(move |r| (z.zone.clone(), r.key)))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn only_rejected_delayed_and_near_limit_requests_are_recorded() {
        let t = Tracker::default();
        let wide = limit("10r/s", 10, DelayPolicy::NoDelay);
        // Far from the limit (1 of 11 used): not recorded.
        request(&t, &[KeyedZone::new("wide", "calm", wide, 1)], &[0]);
        assert!(listed(&t).is_empty());
        // Over half full: recorded.
        request(&t, &[KeyedZone::new("wide", "busy", wide, 1)], &[6]);
        // Delayed (burst 5, no nodelay): recorded whatever the fill.
        request(&t, &[KeyedZone::new("slow", "queued", limit("10r/s", 5, DelayPolicy::After(0)), 1)], &[1]);
        assert_eq!(listed(&t), [("slow".to_string(), b"queued".to_vec()), ("wide".to_string(), b"busy".to_vec())]);
    }

    #[test]
    fn a_rejected_request_records_only_its_rejecting_zones() {
        let t = Tracker::default();
        let tight = limit("1r/s", 0, DelayPolicy::NoDelay);
        let loose = limit("100r/s", 100, DelayPolicy::NoDelay);
        request(&t, &[KeyedZone::new("loose", "k", loose, 1), KeyedZone::new("tight", "k", tight, 1)], &[0, 1]);
        let rows = t.local(T0, u64::MAX);
        assert_eq!(listed(&t), [("tight".to_string(), b"k".to_vec())]);
        let row = &rows.iter().find(|z| z.zone == "tight").unwrap().rows[0];
        assert!(row.rejected_rate > 0.0 && row.fill == 1.0, "{row:?}");
        t.forget("tight", b"k");
        assert!(listed(&t).is_empty());
    }
}

#[cfg(test)]
mod engine_observer_tests {
    use std::sync::Arc;

    use super::Tracker;
    use crate::engine::Groups;
    use crate::engine::{Ruling, Stores, Ticket};
    use crate::store::decided_at_once;
    use crate::store::{KeyedZone, MemoryStore};

    const LOGIN: &str = "[server]\nlisten = [\"127.0.0.1:1\"]\n[store]\nkind = \"memory\"\n[[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:2\"]\n\
        [[limit_req_zone]]\nname = \"fails\"\nkey = \"ip\"\nrate = \"1r/h\"\nCOUNT\n\
        [[route]]\nname = \"login\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_req = [ { zone = \"fails\" } ]\n";

    #[test]
    fn decisions_reach_the_tables_of_the_observing_tracker_only() {
        let rt = crate::config::from_text(&LOGIN.replace("COUNT", ""), "t.toml").expect("valid");
        let route = &rt.routes[0];
        let keyed = Groups::new(vec![KeyedZone::new("fails", b"k".to_vec(), route.limits[0].limit, 1)]);
        let t0 = 1_700_000_000_000_000;
        let clock = Arc::new(crate::limit::ManualClock::new(t0));
        let store = || Arc::new(MemoryStore::new(clock.clone()));
        let top = Arc::new(Tracker::default());
        let listed = || -> Vec<(String, Vec<u8>, bool)> {
            let zones = top.local(t0, u64::MAX);
            zones
                .into_iter()
                .flat_map(|z| z.rows.into_iter().map(move |r| (z.zone.clone(), r.key, r.rejected_rate > 0.0)))
                .collect()
        };
        let pass_then_reject = |stores: &Stores| {
            let mut ticket = Ticket::unobserved(&rt, None);
            assert!(matches!(decided_at_once(ticket.rule_zones(route, &keyed, stores)), Ruling::Forward { .. }));
            assert!(matches!(decided_at_once(ticket.rule_zones(route, &keyed, stores)), Ruling::Refuse(_)));
        };
        // Replay's stores have no observer: deciding there leaves the serving process's view alone.
        pass_then_reject(&Stores::new(store(), MemoryStore::new(clock.clone())));
        assert_eq!(listed(), []);
        pass_then_reject(
            &Stores::new(store(), MemoryStore::new(clock.clone())).observed_by(Box::leak(Box::new(top.clone()))),
        );
        assert_eq!(listed(), [("fails".to_string(), b"k".to_vec(), true)], "the key, with its rejection");
    }
}
