//! A request's descriptors → its domain route's keyed zones: validated, matched against the rules
//! (which zone reference), keyed by their values, with `hits_addend` as the cost; the engine's
//! `keyed_zone` then gives each its effective limit (overrides, exemptions), from the request
//! facts a descriptor stands for. Pure: no store, no I/O.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue};

use super::proto::rate_limit_descriptor::RateLimitOverride;
use super::proto::rate_limit_response::rate_limit::Unit;
use super::proto::RateLimitRequest;
use super::rules::{descriptor_key, find_path};
use super::Domain;
use super::Rule;
use crate::config::Runtime;
use crate::engine::keyed_zone;
use crate::keys::{self, RequestFacts};
use crate::limit::Rate;
use crate::store::KeyedZone;

/// The entry Envoy's `remote_address` action sends: the client address.
const REMOTE_ADDRESS: &str = "remote_address";

/// The largest `hits_addend` accepted (the proxy's largest `cost`).
pub const MAX_HITS: u64 = 1_000_000;

/// A request Envoy would never send; answered INVALID_ARGUMENT with this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// How one descriptor of a request is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot<'a> {
    /// Nothing limits it: no rule (or an unknown domain), a rule without a limit, a key an
    /// override exempts, or a rule another matched rule `replaces`.
    Unmatched,
    /// An `unlimited` rule: OK, with envoyproxy/ratelimit's MaxUint32 remaining.
    Unlimited,
    /// Its zones (indices into `Plan::keyed`), the rule's name, and whether it is a soft limit.
    Limited { zones: Vec<usize>, name: Option<&'a str>, quota: bool },
}

/// What one request asks of the store.
#[derive(Debug)]
pub struct Plan<'a> {
    /// The zones to decide, enforced ones first (the order `Groups` keeps), one per distinct
    /// (zone, key): two descriptors that land on the same counter are charged once, together.
    pub keyed: Vec<KeyedZone<'a>>,
    /// Per descriptor of the request, in order.
    pub slots: Vec<Slot<'a>>,
}

impl Plan<'_> {
    pub fn unmatched(&self) -> usize {
        self.slots.iter().filter(|s| **s == Slot::Unmatched).count()
    }

    /// Whether `keyed[zone]` is a soft limit: every descriptor on it came from a `quota_mode` rule.
    pub fn is_quota(&self, zone: usize) -> bool {
        let mut on_it = self.slots.iter().filter_map(|s| match s {
            Slot::Limited { zones, quota, .. } if zones.contains(&zone) => Some(*quota),
            _ => None,
        });
        on_it.next().is_some_and(|first| first && on_it.all(|q| q))
    }
}

/// One descriptor's entries, the rules they walk (when they reach one), its cost, and the
/// caller's limit when the domain honours it.
struct Matched<'r, 'a> {
    entries: Vec<(&'r str, &'r str)>,
    path: Option<Vec<&'a Rule>>,
    hits: u64,
    limit: Option<Rate>,
}

/// The seconds of each of Envoy's units (envoyproxy/ratelimit's `UnitToDivider`: a month is 30
/// days, a year 365), by `RateLimitResponse.RateLimit.Unit` number.
fn unit_seconds(unit: i32) -> Option<u64> {
    match Unit::try_from(unit).ok()? {
        Unit::Second => Some(1),
        Unit::Minute => Some(60),
        Unit::Hour => Some(3600),
        Unit::Day => Some(86_400),
        Unit::Week => Some(7 * 86_400),
        Unit::Month => Some(30 * 86_400),
        Unit::Year => Some(365 * 86_400),
        Unit::Unknown => None,
    }
}

/// A `RateLimitOverride` as a window's count and period (0 blocks, as in the config).
fn override_rate(o: &RateLimitOverride) -> Result<Rate, String> {
    let seconds = unit_seconds(o.unit).ok_or_else(|| format!("limit override unit {} is not a known unit", o.unit))?;
    Ok(Rate { count: u64::from(o.requests_per_unit), period_us: seconds * 1_000_000 })
}

/// Checks the request's shape and matches its descriptors. `domain` is `None` for a domain the
/// config does not have: every descriptor is then unmatched (allowed), as envoyproxy/ratelimit does.
pub fn plan<'a>(
    rt: &'a Runtime,
    domain: Option<&'a Domain>,
    req: &RateLimitRequest,
    max_descriptors: usize,
) -> Result<Plan<'a>, Invalid> {
    if req.domain.is_empty() {
        return Err(Invalid("domain must not be empty".into()));
    }
    if req.descriptors.is_empty() {
        return Err(Invalid("give at least one descriptor".into()));
    }
    if req.descriptors.len() > max_descriptors {
        return Err(Invalid(format!(
            "{} descriptors in one request; at most {max_descriptors} (rls.max_descriptors)",
            req.descriptors.len()
        )));
    }
    let request_hits = if req.hits_addend == 0 { 1 } else { u64::from(req.hits_addend) };
    // First every descriptor's rules, so a rule's `replaces` applies whatever the order.
    let mut matched: Vec<Matched<'_, 'a>> = Vec::with_capacity(req.descriptors.len());
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return Err(Invalid(format!("descriptor {i} has no entries")));
        }
        let mut entries = Vec::with_capacity(d.entries.len());
        for e in &d.entries {
            if e.key.is_empty() || e.value.is_empty() {
                return Err(Invalid(format!("descriptor {i}: entry keys and values must not be empty")));
            }
            entries.push((e.key.as_str(), e.value.as_str()));
        }
        // 64 bits, as in Envoy's API: a large value is refused below, never truncated to 0.
        let hits = d.hits_addend.unwrap_or(request_hits);
        if hits > MAX_HITS {
            return Err(Invalid(format!("descriptor {i}: hits_addend {hits} is over {MAX_HITS}")));
        }
        let path = domain.and_then(|dm| find_path(&dm.rules, &entries, dm.pattern_order));
        let limit = match (&d.limit, domain.and_then(|dm| dm.limit_override)) {
            (Some(o), Some(_)) => Some(override_rate(o).map_err(|e| Invalid(format!("descriptor {i}: {e}")))?),
            _ => None,
        };
        matched.push(Matched { entries, path, hits, limit });
    }
    let replaced: HashSet<&str> = matched
        .iter()
        .filter(|m| m.limit.is_none())
        .filter_map(|m| m.path.as_ref().and_then(|p| p.last()))
        .filter(|rule| rule.unlimited || !rule.limits.is_empty())
        .flat_map(|rule| rule.replaces.iter().map(String::as_str))
        .collect();

    let mut counters = Counters { rt, keyed: Vec::new(), by_counter: HashMap::new() };
    let mut slots = Vec::with_capacity(matched.len());
    for Matched { entries, path, hits, limit } in &matched {
        let slot = match (domain, path, limit) {
            (Some(domain), _, Some(rate)) => counters.caller_limited(domain, entries, *hits, *rate),
            (Some(domain), Some(path), None) => match path.last() {
                Some(rule) if rule.name.as_deref().is_some_and(|n| replaced.contains(n)) => Slot::Unmatched,
                Some(rule) if rule.unlimited => Slot::Unlimited,
                Some(rule) => counters.rule_limited(domain, rule, entries, path, *hits),
                None => Slot::Unmatched,
            },
            _ => Slot::Unmatched,
        };
        slots.push(slot);
    }
    let keyed = counters.keyed;
    Ok(enforced_first(Plan { keyed, slots }))
}

/// The zones a request asks for, one per distinct (zone, key): two descriptors that land on the
/// same counter are charged once, with both costs, so the store decides it atomically.
struct Counters<'a> {
    rt: &'a Runtime,
    keyed: Vec<KeyedZone<'a>>,
    by_counter: HashMap<(usize, Vec<u8>), usize>,
}

impl<'a> Counters<'a> {
    /// The slot of `key` in the route's limit `reference`, new or shared; `None` when an override
    /// exempts the key (`rate = "unlimited"`). `rate` replaces the limit's (the caller's limit).
    fn counter(
        &mut self,
        domain: &'a Domain,
        reference: usize,
        key: Vec<u8>,
        entries: &[(&str, &str)],
        hits: u64,
        rate: Option<Rate>,
    ) -> Option<usize> {
        let limit = &domain.route.limits[reference];
        if let Some(&slot) = self.by_counter.get(&(limit.zone, key.clone())) {
            let z = &mut self.keyed[slot];
            z.cost = z.cost.saturating_add(hits);
            z.dry_run &= limit.dry_run;
            return Some(slot);
        }
        // Headers only for a zone with overrides to match: most descriptors need none.
        let headers =
            if self.rt.zones[limit.zone].overrides.is_empty() { HeaderMap::new() } else { as_headers(entries) };
        let mut facts = RequestFacts::new(client_ip(entries), &headers, None);
        facts.route = &domain.route.name;
        let mut z = keyed_zone(self.rt, &domain.route, reference, key.clone(), &facts, hits)?;
        if let Some(rate) = rate {
            z.limit.rate = rate;
        }
        self.by_counter.insert((limit.zone, key), self.keyed.len());
        self.keyed.push(z);
        Some(self.keyed.len() - 1)
    }

    /// A descriptor on its rule's zones, keyed by its values (a shared threshold's pattern).
    fn rule_limited(
        &mut self,
        domain: &'a Domain,
        rule: &'a Rule,
        entries: &[(&str, &str)],
        path: &[&Rule],
        hits: u64,
    ) -> Slot<'a> {
        let key = descriptor_key(entries, path);
        let zones: Vec<usize> = rule
            .limits
            .iter()
            .filter_map(|&reference| self.counter(domain, reference, key.clone(), entries, hits, None))
            .collect();
        if zones.is_empty() {
            Slot::Unmatched
        } else {
            Slot::Limited { zones, name: rule.name.as_deref(), quota: rule.quota }
        }
    }

    /// A descriptor carrying Envoy's `limit` on a domain that honours it: decided by the domain's
    /// `limit_override_zone` at the caller's rate, whatever the rules say (as envoyproxy/ratelimit
    /// does), its own counter per descriptor and rate, so a changed limit starts afresh.
    fn caller_limited(&mut self, domain: &'a Domain, entries: &[(&str, &str)], hits: u64, rate: Rate) -> Slot<'a> {
        let Some(reference) = domain.limit_override else { return Slot::Unmatched };
        let mut key = descriptor_key(entries, &[]);
        key.extend_from_slice(format!("\u{1f}limit={}/{}", rate.count, rate.period_us / 1_000_000).as_bytes());
        match self.counter(domain, reference, keys::bound(key), entries, hits, Some(rate)) {
            Some(slot) => Slot::Limited { zones: vec![slot], name: None, quota: false },
            None => Slot::Unmatched,
        }
    }
}

/// The client address a descriptor names (its `remote_address` entry), for `ip` overrides.
fn client_ip(entries: &[(&str, &str)]) -> Option<IpAddr> {
    entries.iter().find(|(k, _)| *k == REMOTE_ADDRESS).and_then(|(_, v)| v.parse().ok())
}

/// A descriptor's entries as request headers named by their keys, for `header:` overrides: a
/// `request_headers` action whose `descriptor_key` is the header's name gives the header as sent.
/// Entries that cannot be a header (name or value) are left out.
fn as_headers(entries: &[(&str, &str)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (key, value) in entries {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(key.as_bytes()), HeaderValue::from_str(value)) {
            headers.append(name, value);
        }
    }
    headers
}

/// Reorders the zones as `Groups` does (enforced first, each group in request order) and
/// follows the descriptors' slots, so an index into `keyed` is one into `Groups::all`.
fn enforced_first(plan: Plan<'_>) -> Plan<'_> {
    let Plan { keyed, slots } = plan;
    let mut order: Vec<usize> = (0..keyed.len()).collect();
    order.sort_by_key(|&i| keyed[i].dry_run);
    let mut new_index = vec![0; keyed.len()];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new;
    }
    let mut moved: Vec<Option<KeyedZone<'_>>> = keyed.into_iter().map(Some).collect();
    let keyed = order.iter().filter_map(|&old| moved[old].take()).collect();
    let slots = slots
        .into_iter()
        .map(|s| match s {
            Slot::Limited { zones, name, quota } => {
                Slot::Limited { zones: zones.into_iter().map(|old| new_index[old]).collect(), name, quota }
            }
            other => other,
        })
        .collect();
    Plan { keyed, slots }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::proto::rate_limit_descriptor::Entry;
    use crate::rls::proto::RateLimitDescriptor;

    const CONFIG: &str = r#"
[limit_req_zone]
name = "per_ip"
rate = "10r/s"

[[limit_req_zone]]
name = "shadow"
rate = "1r/s"

[rls]
listen = ["127.0.0.1:8081"]
max_descriptors = 4

[[rls.domain]]
name = "edge"

[[rls.domain.descriptor]]
key = "remote_address"
zone = "per_ip"
burst = 5

[[rls.domain.descriptor]]
key = "path"
zone = "shadow"
dry_run = true
"#;

    fn runtime() -> Runtime {
        crate::config::from_text(&CONFIG.replacen("[limit_req_zone]", "[[limit_req_zone]]", 1), "test.toml")
            .expect("test config compiles")
    }

    fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries.iter().map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() }).collect(),
            limit: None,
            hits_addend: hits,
        }
    }

    fn limited(zones: &[usize]) -> Slot<'static> {
        Slot::Limited { zones: zones.to_vec(), name: None, quota: false }
    }

    fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
        RateLimitRequest { domain: domain.into(), descriptors, hits_addend: hits }
    }

    #[test]
    fn descriptors_become_keyed_zones_with_hits_as_cost() {
        let rt = runtime();
        let rls = rt.rls.as_ref().expect("[rls]");
        let domain = rls.domain("edge");
        let req = request(
            "edge",
            vec![
                descriptor(&[("path", "/login")], None),
                descriptor(&[("remote_address", "1.2.3.4")], Some(3)),
                descriptor(&[("unknown", "x")], None),
            ],
            2,
        );
        let plan = plan(&rt, domain, &req, rls.max_descriptors).expect("valid");
        assert_eq!(plan.keyed.len(), 2);
        assert_eq!(
            (plan.keyed[0].zone, plan.keyed[0].key.as_slice(), plan.keyed[0].cost),
            ("per_ip", &b"1.2.3.4"[..], 3)
        );
        assert_eq!(plan.keyed[0].limit.burst, 5);
        assert!(!plan.keyed[0].dry_run && plan.keyed[1].dry_run, "enforced zones first");
        assert_eq!((plan.keyed[1].zone, plan.keyed[1].cost), ("shadow", 2), "the request's hits_addend");
        assert_eq!(plan.slots, vec![limited(&[1]), limited(&[0]), Slot::Unmatched]);
        assert_eq!(plan.unmatched(), 1);
    }

    #[test]
    fn the_same_counter_twice_is_one_charge() {
        let rt = runtime();
        let rls = rt.rls.as_ref().expect("[rls]");
        let d = descriptor(&[("remote_address", "1.2.3.4")], None);
        let plan = plan(&rt, rls.domain("edge"), &request("edge", vec![d.clone(), d], 0), 4).expect("valid");
        assert_eq!(plan.keyed.len(), 1);
        assert_eq!(plan.keyed[0].cost, 2);
        assert_eq!(plan.slots, vec![limited(&[0]), limited(&[0])]);
    }

    const OVERRIDES: &str = r#"
[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "10r/s"

[[limit_req_zone.override]]
match = "10.1.0.0/16"
rate = "100r/s"
burst = 50

[[limit_req_zone.override]]
match = "192.0.2.1"
rate = "unlimited"

[[limit_req_zone]]
name = "per_key"
key = "header:X-Api-Key"
rate = "1r/s"

[[limit_req_zone.override]]
match = "header:X-Api-Key=partner"
rate = "50r/s"

[rls]
listen = ["127.0.0.1:8081"]

[[rls.domain]]
name = "edge"

[[rls.domain.descriptor]]
key = "remote_address"
zone = "per_ip"
burst = 5

[[rls.domain.descriptor]]
key = "x-api-key"
zone = "per_key"
"#;

    #[test]
    fn zone_overrides_apply_to_the_facts_a_descriptor_names() {
        let rt = crate::config::from_text(OVERRIDES, "test.toml").expect("test config compiles");
        let domain = rt.rls.as_ref().and_then(|r| r.domain("edge"));
        let one = |entries: &[(&str, &str)]| {
            let plan = plan(&rt, domain, &request("edge", vec![descriptor(entries, None)], 0), 4).expect("valid");
            plan.keyed.first().map(|z| (z.limit.rate.count, z.limit.rate.period_us, z.limit.burst))
        };
        assert_eq!(one(&[("remote_address", "203.0.113.9")]), Some((10, 1_000_000, 5)));
        assert_eq!(one(&[("remote_address", "10.1.2.3")]), Some((100, 1_000_000, 50)), "the override's rate and burst");
        assert_eq!(one(&[("remote_address", "192.0.2.1")]), None, "rate = \"unlimited\" exempts the key");
        assert_eq!(one(&[("x-api-key", "partner")]), Some((50, 1_000_000, 0)));
        assert_eq!(one(&[("x-api-key", "other")]), Some((1, 1_000_000, 0)));
    }

    #[test]
    fn unknown_domains_leave_everything_unmatched() {
        let rt = runtime();
        let req = request("other", vec![descriptor(&[("remote_address", "1.2.3.4")], None)], 0);
        let plan = plan(&rt, None, &req, 4).expect("valid");
        assert!(plan.keyed.is_empty());
        assert_eq!(plan.unmatched(), 1);
    }

    #[test]
    fn malformed_requests_are_refused() {
        let rt = runtime();
        let domain = rt.rls.as_ref().and_then(|r| r.domain("edge"));
        let one = || vec![descriptor(&[("remote_address", "1.2.3.4")], None)];
        let bad = [
            request("", one(), 0),
            request("edge", vec![], 0),
            request("edge", vec![descriptor(&[("a", "b")], None); 5], 0),
            request("edge", vec![descriptor(&[], None)], 0),
            request("edge", vec![descriptor(&[("", "b")], None)], 0),
            request("edge", vec![descriptor(&[("a", "")], None)], 0),
            request("edge", vec![descriptor(&[("a", "b")], Some(2_000_000))], 0),
        ];
        for req in &bad {
            assert!(plan(&rt, domain, req, 4).is_err(), "{req:?}");
        }
    }

    const RULES: &str = r#"
[[limit_req_zone]]
name = "a"
algorithm = "fixed_window"
window = "1m"
limit = 5

[[limit_req_zone]]
name = "b"
algorithm = "fixed_window"
window = "1d"
limit = 50

[rls]
listen = ["127.0.0.1:8081"]

[[rls.domain]]
name = "d"

[[rls.domain.descriptor]]
key = "user"
name = "per_user"
limit_req = [{ zone = "a" }, { zone = "b" }]

[[rls.domain.descriptor]]
key = "vip"
zone = "b"
replaces = ["per_user"]

[[rls.domain.descriptor]]
key = "free"
unlimited = true

[[rls.domain.descriptor]]
key = "free"
value = "quiet"
exempt = true

[[rls.domain.descriptor]]
key = "svc"
value = "s*"
share_threshold = true
quota_mode = true
zone = "a"
"#;

    #[test]
    fn rules_become_slots_names_replaces_and_soft_limits() {
        let rt = crate::config::from_text(RULES, "test.toml").expect("test config compiles");
        let domain = rt.rls.as_ref().and_then(|r| r.domain("d"));
        let slots = |descriptors: Vec<RateLimitDescriptor>| {
            let p = plan(&rt, domain, &request("d", descriptors, 0), 8).expect("valid");
            let zones: Vec<(&str, Vec<u8>)> = p.keyed.iter().map(|z| (z.zone, z.key.clone())).collect();
            (p.slots.clone(), zones, (0..p.keyed.len()).map(|i| p.is_quota(i)).collect::<Vec<_>>())
        };
        let (s, zones, _) = slots(vec![descriptor(&[("user", "u1")], None)]);
        assert_eq!(s, vec![Slot::Limited { zones: vec![0, 1], name: Some("per_user"), quota: false }]);
        assert_eq!(zones, vec![("a", b"u1".to_vec()), ("b", b"u1".to_vec())], "two zones, one key");
        let (s, zones, _) = slots(vec![descriptor(&[("user", "u1")], None), descriptor(&[("vip", "u1")], None)]);
        assert_eq!(s[0], Slot::Unmatched, "per_user is replaced: neither checked nor charged");
        assert_eq!(zones, vec![("b", b"u1".to_vec())]);
        let (s, _, _) = slots(vec![descriptor(&[("free", "x")], None), descriptor(&[("free", "quiet")], None)]);
        assert_eq!(s, vec![Slot::Unlimited, Slot::Unmatched], "unlimited vs exempt");
        let (s, zones, quota) = slots(vec![descriptor(&[("svc", "s1")], None), descriptor(&[("svc", "s2")], None)]);
        assert_eq!(zones, vec![("a", b"\x1es*".to_vec())], "a shared threshold: one counter for both values");
        assert_eq!(s[0], s[1]);
        assert_eq!(quota, vec![true]);
    }
}
