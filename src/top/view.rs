//! What `/top` shows: this instance's rows merged with the fleet's, keys of secret parts hashed,
//! each row with an id a reset can name, and the per-route and per-zone counts of `/metrics`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::Row;
use crate::config::Runtime;
use crate::keys::KeyPart;
use crate::metrics::METRICS;

/// One zone's rows as one instance sees them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZoneView {
    pub zone: String,
    pub rows: Vec<Row>,
}

/// What an instance publishes for the others (Redis store).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceView {
    pub instance: String,
    /// When it was taken (ms since the epoch): views older than `fleet::STALE_AFTER` are dropped.
    pub at_ms: u64,
    pub zones: Vec<ZoneView>,
}

/// A key as merged over instances.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    pub row: Row,
    /// Instances that saw the key.
    pub instances: usize,
}

/// Sums each key's rates over the views (a key limited on two instances counts on both), keeps its
/// highest fill and its most recent request.
pub fn merge<'a>(views: impl IntoIterator<Item = &'a ZoneView>) -> HashMap<String, Vec<Merged>> {
    let mut zones: HashMap<String, HashMap<Vec<u8>, Merged>> = HashMap::new();
    for view in views {
        let keys = zones.entry(view.zone.clone()).or_default();
        for row in &view.rows {
            keys.entry(row.key.clone())
                .and_modify(|m| {
                    m.row.rate += row.rate;
                    m.row.rejected_rate += row.rejected_rate;
                    m.row.delayed_rate += row.delayed_rate;
                    m.row.fill = m.row.fill.max(row.fill);
                    m.row.idle_s = m.row.idle_s.min(row.idle_s);
                    m.instances += 1;
                })
                .or_insert_with(|| Merged { row: row.clone(), instances: 1 });
        }
    }
    zones.into_iter().map(|(zone, keys)| (zone, keys.into_values().collect())).collect()
}

/// The id of a key in a zone: stable over instances and restarts, reveals nothing of the key.
pub fn key_id(zone: &str, key: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(zone.as_bytes());
    h.update([0]);
    h.update(key);
    hex(&h.finalize()[..8])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How a key is shown: as is for client addresses; `sha256:<12 hex>` when a part of the zone's key
/// is a header, query argument or cookie (API keys, tokens), unless `reveal_keys`. An operator
/// who knows a customer's key finds it with `printf %s KEY | sha256sum`.
pub fn shown_key(secret: bool, key: &[u8]) -> String {
    if secret {
        format!("sha256:{}", &hex(&Sha256::digest(key))[..12])
    } else {
        String::from_utf8_lossy(key).into_owned()
    }
}

/// Whether the zone's keys are secrets to hide: a part may carry a credential, or the zone has no
/// `key` at all (a rate limit service zone, keyed by descriptor values, which are usually request
/// headers such as API keys).
pub fn zone_is_secret(rt: &Runtime, zone: &str) -> bool {
    !rt.top.reveal_keys
        && rt
            .zones
            .iter()
            .find(|z| z.name == zone)
            .is_none_or(|z| z.key.parts.is_empty() || z.key.parts.iter().any(is_secret))
}

/// What a count covers: "this instance" (its own counters), or "fleet" (every instance's views,
/// summed: per-key rates on the Redis store).
pub const THIS_INSTANCE: &str = "this instance";
pub const FLEET: &str = "fleet";

/// The scope of the per-key rows: fleet-wide where instances share their views (Redis).
pub fn keys_scope(rt: &Runtime) -> &'static str {
    if matches!(rt.store, crate::config::StoreSettings::Redis(..)) {
        FLEET
    } else {
        THIS_INSTANCE
    }
}

/// Parts that may carry a credential or a person's identity (API keys, tokens, claims such as an
/// e-mail address); addresses, route names, constants and path parts (already in the access log)
/// are not.
fn is_secret(part: &KeyPart) -> bool {
    match part {
        KeyPart::Header(_) | KeyPart::Query(_) | KeyPart::Cookie(_) | KeyPart::Claim(_) => true,
        KeyPart::ClientIp | KeyPart::IpPrefix(_) | KeyPart::Route | KeyPart::Const(_) | KeyPart::PathPart(_) => false,
    }
}

/// `GET /top`: per zone the `n` keys with the most rejections and the `n` closest to their limit
/// (fleet-wide when `fleet` holds the other instances' views), and per route and zone the request
/// counters (cumulative: a client takes rates from two readings). `scope` says which counts are
/// this instance's and which the fleet's. Every string is escaped (`text::escape`): keys come from
/// clients, names from the config and the host.
/// `held` answers, for a leased zone's key, the tokens this instance holds of it (its live leases):
/// each row of a leased zone shows it as `lease_held`, and the zone its `lease`.
pub fn top_json(
    rt: &Runtime,
    local: &[ZoneView],
    fleet: &[InstanceView],
    n: usize,
    extra: Value,
    held: &dyn Fn(&str, &[u8]) -> Option<u64>,
) -> Value {
    let merged = merge(local.iter().chain(fleet.iter().flat_map(|v| v.zones.iter())));
    let zone_counts = counts("weir_limit_req_decisions_total", "zone", "status");
    let route_counts = counts("weir_requests_total", "route", "outcome");
    let zones: Vec<Value> = rt
        .zones
        .iter()
        .map(|zone| {
            let secret = zone_is_secret(rt, &zone.name);
            let mut rows = merged.get(&zone.name).cloned().unwrap_or_default();
            let show = |m: &Merged| {
                let mut row = json!({
                    "id": key_id(&zone.name, &m.row.key),
                    "key": shown_key(secret, &m.row.key),
                    "rate": m.row.rate,
                    "rejected_rate": m.row.rejected_rate,
                    "delayed_rate": m.row.delayed_rate,
                    "fill": m.row.fill,
                    "idle_s": m.row.idle_s,
                    "instances": m.instances,
                });
                if zone.lease.is_some() {
                    row["lease_held"] = json!(held(&zone.name, &m.row.key).unwrap_or(0));
                }
                row
            };
            rows.sort_by(|a, b| {
                b.row.rejected_rate.total_cmp(&a.row.rejected_rate).then(b.row.rate.total_cmp(&a.row.rate))
            });
            let rejected: Vec<Value> = rows.iter().filter(|m| m.row.rejected_rate > 0.0).take(n).map(show).collect();
            rows.sort_by(|a, b| b.row.fill.total_cmp(&a.row.fill).then(b.row.rate.total_cmp(&a.row.rate)));
            let closest: Vec<Value> = rows.iter().take(n).map(show).collect();
            let mut view = json!({
                "zone": zone.name,
                "key": zone.key.parts.iter().map(KeyPart::to_string).collect::<Vec<_>>().join("+"),
                "hashed": secret,
                "scope": keys_scope(rt),
                "decisions_scope": THIS_INSTANCE,
                "rate": zone.rate.to_string(),
                "algorithm": zone.algorithm.as_str(),
                "decisions": zone_counts.get(&zone.name).cloned().unwrap_or_default(),
                "rejected": rejected,
                "closest": closest,
            });
            if let Some(spec) = zone.lease {
                view["lease"] = json!({ "tokens": spec.tokens, "lifetime_ms": spec.lifetime_us as f64 / 1e3,
                                        "held_scope": THIS_INSTANCE });
            }
            view
        })
        .collect();
    let routes: Vec<Value> = rt
        .routes
        .iter()
        .map(|route| {
            let zones: Vec<&str> = route.limits.iter().map(|l| rt.zones[l.zone].name.as_str()).collect();
            json!({
                "route": route.name,
                "zones": zones,
                "scope": THIS_INSTANCE,
                "requests": route_counts.get(&route.name).cloned().unwrap_or_default(),
            })
        })
        .collect();
    let mut out = json!({
        "enabled": rt.top.enabled,
        "half_life_s": rt.top.half_life.as_secs_f64(),
        "instances": 1 + fleet.len(),
        "scope": { "routes": THIS_INSTANCE, "decisions": THIS_INSTANCE, "keys": keys_scope(rt) },
        "routes": routes,
        "zones": zones,
    });
    if let (Value::Object(fields), Value::Object(more)) = (&mut out, extra) {
        fields.extend(more);
    }
    super::text::escape_json(&mut out);
    out
}

/// One counter family by its `by` label: `{value of by: {value of what: count}}`.
fn counts(name: &str, by: &str, what: &str) -> HashMap<String, serde_json::Map<String, Value>> {
    let mut out: HashMap<String, serde_json::Map<String, Value>> = HashMap::new();
    for (labels, value) in METRICS.counter_values(name) {
        let label = |n: &str| labels.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        if let (Some(key), Some(kind)) = (label(by), label(what)) {
            out.entry(key).or_default().insert(kind.to_lowercase(), json!(value as u64));
        }
    }
    out
}

/// The raw key of the row `id` in `zone`, if this instance or a fleet view lists it (resets of a
/// hashed key go by id: its display form cannot be reversed).
pub fn find_by_id(local: &[ZoneView], fleet: &[InstanceView], zone: &str, id: &str) -> Option<Vec<u8>> {
    local
        .iter()
        .chain(fleet.iter().flat_map(|v| v.zones.iter()))
        .filter(|z| z.zone == zone)
        .flat_map(|z| z.rows.iter())
        .find(|r| key_id(zone, &r.key) == id)
        .map(|r| r.key.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, rate: f64, rejected: f64, fill: f64) -> Row {
        Row { key: key.into(), rate, rejected_rate: rejected, delayed_rate: 0.0, fill, idle_s: 1.0 }
    }

    #[test]
    fn merges_instances_by_key() {
        let a = ZoneView { zone: "z".into(), rows: vec![row("k", 5.0, 4.0, 1.0), row("only-a", 1.0, 0.0, 0.5)] };
        let b = ZoneView { zone: "z".into(), rows: vec![row("k", 3.0, 2.0, 0.75)] };
        let merged = merge([&a, &b]);
        let k = merged["z"].iter().find(|m| m.row.key == b"k").unwrap();
        assert_eq!((k.row.rate, k.row.rejected_rate, k.row.fill, k.instances), (8.0, 6.0, 1.0, 2));
        assert_eq!(merged["z"].len(), 2);
    }

    #[test]
    fn secret_keys_are_hashed_and_ids_are_stable() {
        assert_eq!(shown_key(false, b"203.0.113.7"), "203.0.113.7");
        let shown = shown_key(true, b"sk_live_abcdef");
        assert!(shown.starts_with("sha256:") && !shown.contains("abcdef"), "{shown}");
        assert_eq!(shown.len(), "sha256:".len() + 12);
        assert_eq!(key_id("z", b"k"), key_id("z", b"k"));
        assert_ne!(key_id("z", b"k"), key_id("y", b"k"));
        let views = [ZoneView { zone: "z".into(), rows: vec![row("secret", 1.0, 1.0, 1.0)] }];
        assert_eq!(find_by_id(&views, &[], "z", &key_id("z", b"secret")), Some(b"secret".to_vec()));
        assert_eq!(find_by_id(&views, &[], "y", &key_id("z", b"secret")), None);
    }

    #[test]
    fn rows_round_trip_through_json_with_any_bytes() {
        let r = Row { key: vec![b'a', 0, 0xff, b'%', b' '], ..row("", 1.0, 0.0, 0.0) };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Row>(&text).unwrap(), r);
        let ip = serde_json::to_value(row("2001:db8::1", 1.0, 0.0, 0.0)).unwrap();
        assert_eq!(ip["key"], "2001:db8::1");
    }
}
