//! `/top` as `weir top` reads it, and the rates it computes between two readings. Pure.

use std::collections::HashMap;

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Top {
    #[serde(default)]
    pub instance: String,
    #[serde(default)]
    pub instances: usize,
    #[serde(default)]
    pub store: StoreInfo,
    #[serde(default)]
    pub scope: Scope,
    #[serde(default)]
    pub routes: Vec<RouteInfo>,
    #[serde(default)]
    pub zones: Vec<ZoneInfo>,
    #[serde(default)]
    pub upstreams: Vec<UpstreamInfo>,
}

/// An upstream as `/top` lists it; `adaptive` only when it has an adaptive limit.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct UpstreamInfo {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub adaptive: Option<AdaptiveInfo>,
}

/// One upstream's adaptive limit on this instance (`AdaptiveLimit::status`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct AdaptiveInfo {
    #[serde(default)]
    pub limit: u64,
    #[serde(default)]
    pub in_flight: u64,
    #[serde(default)]
    pub waiting: u64,
    /// `None` until the first window was judged.
    #[serde(default)]
    pub ideal_ms: Option<f64>,
    /// Requests refused so far.
    #[serde(default)]
    pub shed: u64,
}

impl Top {
    /// The upstreams with an adaptive limit, in the config's order.
    pub fn adaptive(&self) -> impl Iterator<Item = (&str, &AdaptiveInfo)> {
        self.upstreams.iter().filter_map(|u| u.adaptive.as_ref().map(|a| (u.name.as_str(), a)))
    }
}

/// What each count covers: "this instance" or "fleet" (`/top`'s `scope`).
#[derive(Debug, Clone, Deserialize)]
pub struct Scope {
    pub routes: String,
    pub decisions: String,
    pub keys: String,
}

impl Default for Scope {
    /// An older `/top` without `scope`: everything but the keys was this instance's; the keys'
    /// scope is unknown.
    fn default() -> Self {
        let this = crate::top::view::THIS_INSTANCE.to_string();
        Scope { routes: this.clone(), decisions: this, keys: "?".into() }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StoreInfo {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub ready: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RouteInfo {
    pub route: String,
    #[serde(default)]
    pub zones: Vec<String>,
    /// Cumulative, by outcome (`weir_requests_total`).
    #[serde(default)]
    pub requests: HashMap<String, u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ZoneInfo {
    pub zone: String,
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub rate: String,
    /// Cumulative, by status (`weir_limit_req_decisions_total`).
    #[serde(default)]
    pub decisions: HashMap<String, u64>,
    #[serde(default)]
    pub rejected: Vec<KeyRow>,
    #[serde(default)]
    pub closest: Vec<KeyRow>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct KeyRow {
    pub id: String,
    pub key: String,
    #[serde(default)]
    pub rate: f64,
    #[serde(default)]
    pub rejected_rate: f64,
    #[serde(default)]
    pub delayed_rate: f64,
    #[serde(default)]
    pub fill: f64,
    #[serde(default)]
    pub instances: usize,
    /// A leased zone's key: the tokens the instance asked holds of it (docs/leases.md).
    #[serde(default)]
    pub lease_held: Option<u64>,
}

/// Requests, passed, delayed and rejected per second.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    pub requests: f64,
    pub passed: f64,
    pub delayed: f64,
    pub rejected: f64,
}

/// Splits outcome counters into passed / delayed / rejected (other outcomes count as requests).
fn split(counts: &HashMap<String, u64>) -> [u64; 4] {
    let get = |names: &[&str]| names.iter().map(|n| counts.get(*n).copied().unwrap_or(0)).sum::<u64>();
    let total = counts.values().sum();
    [
        total,
        get(&["passed", "unlimited", "fail_open", "delayed_dry_run", "rejected_dry_run"]),
        get(&["delayed"]),
        get(&["rejected", "conn_rejected", "fail_closed"]),
    ]
}

/// The rates between two readings of the same counters `seconds` apart (0 for a counter that went
/// backwards: the process restarted).
pub fn rates(before: Option<&HashMap<String, u64>>, now: &HashMap<String, u64>, seconds: f64) -> Rates {
    let Some(before) = before else { return Rates::default() };
    if seconds <= 0.0 {
        return Rates::default();
    }
    let (a, b) = (split(before), split(now));
    let r = |i: usize| b[i].saturating_sub(a[i]) as f64 / seconds;
    Rates { requests: r(0), passed: r(1), delayed: r(2), rejected: r(3) }
}

/// How the keys are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sort {
    Rejected,
    Rate,
    Fill,
}

impl Sort {
    pub fn next(self) -> Sort {
        match self {
            Sort::Rejected => Sort::Rate,
            Sort::Rate => Sort::Fill,
            Sort::Fill => Sort::Rejected,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Sort::Rejected => "rejected/s",
            Sort::Rate => "req/s",
            Sort::Fill => "fill",
        }
    }
}

/// Every listed key of every zone (each zone's "rejected" and "closest" lists, without
/// duplicates), ordered by `sort`.
pub fn keys(top: &Top, sort: Sort) -> Vec<(String, KeyRow)> {
    let mut out: Vec<(String, KeyRow)> = Vec::new();
    for zone in &top.zones {
        for row in zone.rejected.iter().chain(&zone.closest) {
            if !out.iter().any(|(z, r)| z == &zone.zone && r.id == row.id) {
                out.push((zone.zone.clone(), row.clone()));
            }
        }
    }
    let by = |r: &KeyRow| match sort {
        Sort::Rejected => (r.rejected_rate, r.rate),
        Sort::Rate => (r.rate, r.rejected_rate),
        Sort::Fill => (r.fill, r.rate),
    };
    out.sort_by(|a, b| {
        let (x, y) = (by(&a.1), by(&b.1));
        y.0.total_cmp(&x.0).then(y.1.total_cmp(&x.1)).then(a.1.key.cmp(&b.1.key))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_from_two_readings() {
        let before: HashMap<String, u64> = [("passed".into(), 10), ("rejected".into(), 0)].into();
        let now: HashMap<String, u64> = [("passed".into(), 30), ("rejected".into(), 40), ("delayed".into(), 2)].into();
        let r = rates(Some(&before), &now, 2.0);
        assert_eq!(r, Rates { requests: 31.0, passed: 10.0, delayed: 1.0, rejected: 20.0 });
        assert_eq!(rates(None, &now, 2.0), Rates::default());
        assert_eq!(rates(Some(&now), &before, 1.0).requests, 0.0, "a restart is not negative traffic");
    }

    #[test]
    fn adaptive_upstreams_are_read_from_top() {
        let top: Top = serde_json::from_str(
            r#"{"upstreams": [{"name": "plain", "servers": [], "adaptive": null},
                {"name": "app", "adaptive": {"limit": 12, "in_flight": 9, "waiting": 1, "ideal_ms": 20.5, "shed": 7}},
                {"name": "new", "adaptive": {"limit": 5, "in_flight": 0, "waiting": 0, "ideal_ms": null, "shed": 0}}]}"#,
        )
        .expect("parses");
        let adaptive: Vec<_> = top.adaptive().collect();
        assert_eq!(adaptive.len(), 2);
        assert_eq!(
            adaptive[0],
            ("app", &AdaptiveInfo { limit: 12, in_flight: 9, waiting: 1, ideal_ms: Some(20.5), shed: 7 })
        );
        assert_eq!(adaptive[1].1.ideal_ms, None);
        // An older `/top` without upstreams: nothing to show.
        let old: Top = serde_json::from_str("{}").expect("parses");
        assert_eq!(old.adaptive().count(), 0);
    }

    #[test]
    fn keys_are_deduplicated_and_sorted() {
        let row = |id: &str, rate, rejected, fill| KeyRow {
            id: id.into(),
            key: id.into(),
            rate,
            rejected_rate: rejected,
            fill,
            ..KeyRow::default()
        };
        let top = Top {
            zones: vec![ZoneInfo {
                zone: "z".into(),
                rejected: vec![row("a", 10.0, 9.0, 1.0)],
                closest: vec![row("a", 10.0, 9.0, 1.0), row("b", 20.0, 0.0, 0.9), row("c", 1.0, 0.0, 0.95)],
                ..ZoneInfo::default()
            }],
            ..Top::default()
        };
        let ids = |s| keys(&top, s).into_iter().map(|(_, r)| r.id).collect::<Vec<_>>();
        assert_eq!(ids(Sort::Rejected), ["a", "b", "c"]);
        assert_eq!(ids(Sort::Rate), ["b", "a", "c"]);
        assert_eq!(ids(Sort::Fill), ["a", "c", "b"]);
    }
}
