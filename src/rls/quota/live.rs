//! What the admin's `GET /rlqs` shows: per divided zone and key, the Envoys that hold a share
//! (their streams on this instance, and every holder fleet-wide as the ledger showed it at the
//! last report here), each one's demand and grant. The streams write here after each division
//! (one lock, a few map operations: the report has just made one or two ledger round trips); the
//! admin API reads it. Nothing here decides anything.
//!
//! Bounded: a stream's holders leave when it abandons a bucket or ends, so the map holds at most
//! `max_quota_streams × max_quota_buckets` holders of this instance; of the fleet's, each key
//! keeps the first [`FLEET_KEPT`] (in id order) and their count.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use super::assign::{Budget, Grant, Holder};

/// Fleet holders kept per key (the count is kept whole).
pub const FLEET_KEPT: usize = 64;
/// Keys `GET /rlqs` lists unless told (`?n=`), and the most it may be told; holders per key listed.
pub const DEFAULT_KEYS: usize = 50;
pub const MAX_KEYS: usize = 500;
pub const MAX_HOLDERS_SHOWN: usize = 100;

/// One holder of this instance: a stream's bucket.
#[derive(Debug, Clone)]
struct Share {
    /// The stream (this instance's name and its number).
    stream: String,
    demand: f64,
    granted: Grant,
    at_us: u64,
}

/// One divided zone and key.
#[derive(Debug, Clone)]
struct KeyShares {
    domain: String,
    budget: Budget,
    here: HashMap<String, Share>,
    /// The ledger's view at the last report of a holder here: at most [`FLEET_KEPT`] holders.
    fleet: Vec<Holder>,
    fleet_count: usize,
    /// The sum of every fleet holder's `tokens_per_fill` (all of them, not only those kept).
    fleet_granted: u64,
    fleet_us: u64,
}

/// One division, as a stream records it.
pub struct Divided<'a> {
    pub domain: &'a str,
    pub zone: &'a str,
    pub key: &'a [u8],
    pub budget: Budget,
    pub stream: &'a str,
    pub holder: &'a str,
    pub demand: f64,
    pub granted: Grant,
    /// The ledger's holders before this one's claim (its own grant in it is the old one).
    pub view: Vec<Holder>,
    pub now_us: u64,
}

#[derive(Default)]
pub struct Live {
    /// Streams open on this instance (counted from the stream's start, refused ones briefly too).
    pub(super) open: Arc<AtomicUsize>,
    keys: Mutex<HashMap<(String, Vec<u8>), KeyShares>>,
}

impl Live {
    pub fn record(&self, d: Divided<'_>) {
        let mut fleet = d.view;
        // The view was read before the claim: this holder's grant is the one just made.
        match fleet.iter_mut().find(|h| h.id == d.holder) {
            Some(me) => (me.demand, me.grant) = (d.demand, d.granted),
            None => fleet.push(Holder { id: d.holder.to_string(), demand: d.demand, grant: d.granted }),
        }
        fleet.sort_by(|a, b| a.id.cmp(&b.id));
        let fleet_count = fleet.len();
        let fleet_granted = fleet.iter().map(|h| h.grant.tokens_per_fill).sum();
        fleet.truncate(FLEET_KEPT);
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let entry = keys.entry((d.zone.to_string(), d.key.to_vec())).or_insert_with(|| KeyShares {
            domain: d.domain.to_string(),
            budget: d.budget,
            here: HashMap::new(),
            fleet: Vec::new(),
            fleet_count: 0,
            fleet_granted: 0,
            fleet_us: 0,
        });
        entry.domain = d.domain.to_string();
        entry.budget = d.budget;
        entry.here.insert(
            d.holder.to_string(),
            Share { stream: d.stream.to_string(), demand: d.demand, granted: d.granted, at_us: d.now_us },
        );
        (entry.fleet, entry.fleet_count, entry.fleet_granted, entry.fleet_us) =
            (fleet, fleet_count, fleet_granted, d.now_us);
    }

    /// `holder` no longer holds a share here (its bucket was abandoned, or its stream ended).
    pub fn forget(&self, zone: &str, key: &[u8], holder: &str) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let id = (zone.to_string(), key.to_vec());
        if let Some(entry) = keys.get_mut(&id) {
            entry.here.remove(holder);
            if entry.here.is_empty() {
                keys.remove(&id);
            }
        }
    }

    /// Every holder of `stream` (it ended).
    pub fn forget_stream(&self, stream: &str) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.retain(|_, entry| {
            entry.here.retain(|_, s| s.stream != stream);
            !entry.here.is_empty()
        });
    }

    pub fn streams(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// The document of `GET /rlqs`: at most `n` keys (by domain, zone, key), each with at most
    /// [`MAX_HOLDERS_SHOWN`] holders, this instance's first. `shown` is how a zone's key is
    /// shown, `(id, key)` (hashed when secret, as in `GET /top`). Strings are not escaped here
    /// (the caller does).
    pub fn json(&self, n: usize, now_us: u64, shown: impl Fn(&str, &[u8]) -> (String, String)) -> Value {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let mut ids: Vec<&(String, Vec<u8>)> = keys.keys().collect();
        ids.sort_by(|a, b| (&keys[*a].domain, &a.0, &a.1).cmp(&(&keys[*b].domain, &b.0, &b.1)));
        let total = ids.len();
        let rows: Vec<Value> = ids
            .into_iter()
            .take(n)
            .map(|id| {
                let k = &keys[id];
                let (key_id, key) = shown(&id.0, &id.1);
                let per_second = |g: &Grant| k.budget.per_second(g.tokens_per_fill);
                let mut here: Vec<(&String, &Share)> = k.here.iter().collect();
                here.sort_by(|a, b| a.0.cmp(b.0));
                let mut holders: Vec<Value> = here
                    .iter()
                    .map(|(holder, s)| {
                        json!({
                            "holder": holder, "here": true, "stream": s.stream,
                            "demand_per_s": round3(s.demand),
                            "rate_per_s": round3(per_second(&s.granted)),
                            "tokens_per_fill": s.granted.tokens_per_fill, "max_tokens": s.granted.max_tokens,
                            "age_ms": now_us.saturating_sub(s.at_us) / 1000,
                        })
                    })
                    .collect();
                holders.extend(k.fleet.iter().filter(|h| !k.here.contains_key(&h.id)).map(|h| {
                    json!({
                        "holder": h.id, "here": false,
                        "demand_per_s": round3(h.demand),
                        "rate_per_s": round3(per_second(&h.grant)),
                        "tokens_per_fill": h.grant.tokens_per_fill, "max_tokens": h.grant.max_tokens,
                    })
                }));
                let listed = holders.len();
                holders.truncate(MAX_HOLDERS_SHOWN);
                json!({
                    "domain": k.domain,
                    "zone": id.0,
                    "id": key_id,
                    "key": key,
                    "budget": {
                        "rate_per_s": round3(k.budget.per_second(k.budget.rate_tokens)),
                        "tokens_per_fill": k.budget.rate_tokens,
                        "fill_interval_s": k.budget.fill_interval_s,
                        "max_tokens": k.budget.max_tokens,
                    },
                    "holders_here": k.here.len(),
                    "holders_fleet": k.fleet_count,
                    "fleet_granted_per_s": round3(k.budget.per_second(k.fleet_granted)),
                    "fleet_age_ms": now_us.saturating_sub(k.fleet_us) / 1000,
                    "holders": holders,
                    "holders_truncated": listed > MAX_HOLDERS_SHOWN || k.fleet_count > k.fleet.len(),
                })
            })
            .collect();
        json!({ "streams": self.streams(), "keys": rows, "keys_total": total, "truncated": total > n })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Rate;

    fn holder(id: &str, tpf: u64) -> Holder {
        Holder { id: id.into(), demand: 1.0, grant: Grant { tokens_per_fill: tpf, max_tokens: 1 } }
    }

    fn divided<'a>(key: &'a [u8], stream: &'a str, holder: &'a str, tpf: u64, view: Vec<Holder>) -> Divided<'a> {
        Divided {
            domain: "edge",
            zone: "api",
            key,
            budget: Budget::of(Rate::parse("60r/s").unwrap(), 30),
            stream,
            holder,
            demand: 12.5,
            granted: Grant { tokens_per_fill: tpf, max_tokens: 10 },
            view,
            now_us: 1_000_000,
        }
    }

    fn shown(_: &str, key: &[u8]) -> (String, String) {
        ("id".into(), String::from_utf8_lossy(key).into_owned())
    }

    #[test]
    fn a_holders_own_grant_replaces_the_views_old_one_and_streams_leave() {
        let live = Live::default();
        live.record(divided(b"k", "w-1", "w-1/aa", 200, vec![holder("w-1/aa", 0), holder("other-3/bb", 300)]));
        live.record(divided(b"k", "w-2", "w-2/aa", 100, vec![holder("other-3/bb", 300)]));
        let v = live.json(10, 2_000_000, shown);
        let key = &v["keys"][0];
        assert_eq!((key["holders_here"].as_u64(), key["holders_fleet"].as_u64()), (Some(2), Some(2)));
        let holders = key["holders"].as_array().unwrap();
        // w-1/aa from its own record (200), w-2/aa too; other-3/bb from the ledger's view.
        let rates: Vec<(&str, bool, u64)> = holders
            .iter()
            .map(|h| {
                (h["holder"].as_str().unwrap(), h["here"].as_bool().unwrap(), h["tokens_per_fill"].as_u64().unwrap())
            })
            .collect();
        assert_eq!(rates, vec![("w-1/aa", true, 200), ("w-2/aa", true, 100), ("other-3/bb", false, 300)]);
        assert_eq!(holders[0]["age_ms"], 1000);
        assert_eq!(holders[0]["demand_per_s"], 12.5);
        live.forget_stream("w-1");
        assert_eq!(live.json(10, 0, shown)["keys"][0]["holders_here"], 1);
        live.forget("api", b"k", "w-2/aa");
        assert_eq!(live.json(10, 0, shown)["keys_total"], 0, "a key with no holder here is dropped");
    }

    #[test]
    fn the_view_is_bounded() {
        let live = Live::default();
        let many: Vec<Holder> = (0..FLEET_KEPT + 40).map(|i| holder(&format!("x-{i:03}"), 1)).collect();
        live.record(divided(b"k", "w-1", "w-1/aa", 1, many));
        let keys: Vec<Vec<u8>> = (0..20).map(|i| format!("k{i:02}").into_bytes()).collect();
        for k in &keys {
            live.record(divided(k, "w-1", "w-1/bb", 1, Vec::new()));
        }
        let v = live.json(5, 0, shown);
        assert_eq!((v["keys"].as_array().unwrap().len(), v["keys_total"].as_u64()), (5, Some(21)));
        assert_eq!(v["truncated"], true);
        let k = &v["keys"][0];
        assert_eq!(k["key"], "k");
        assert_eq!(k["holders_fleet"].as_u64(), Some((FLEET_KEPT + 41) as u64), "the count is whole");
        assert!(k["holders"].as_array().unwrap().len() <= FLEET_KEPT + 1);
        assert_eq!(k["holders_truncated"], true);
        assert_eq!(k["fleet_granted_per_s"].as_f64(), Some((FLEET_KEPT + 41) as f64 / 2.0), "over every holder");
    }
}
