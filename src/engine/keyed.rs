//! The key step of both limit kinds, in one room: a request's facts become each zone's key (an
//! empty key does not limit; a key that needs a verified token the request lacks refuses it with
//! 401), its cost, and each zone's effective limit (a per-key override). Pure: the proxy and
//! replay key a route's zones here; the rate limit service keys a descriptor's zone with
//! [`keyed_zone`].

use super::after_response::charged_after_response;
use super::dry_run::Groups;
use crate::config::{Cost, Route, Runtime};
use crate::keys::{BadToken, KeySpec, RequestFacts};
use crate::limit::DelayPolicy;
use crate::store::{KeyedConn, KeyedZone};

/// The key step of limit_req: the route's zones that limit this request, each with its key,
/// effective limit, cost and dry-run flag, enforced ones first. Empty keys are not limited
/// (nginx's allow-list idiom), nor are keys an override exempts (`rate = "unlimited"`); a matching
/// override replaces the rate (and burst) for this key.
pub fn keyed_zones<'a>(
    rt: &'a Runtime,
    route: &Route,
    facts: &RequestFacts<'_>,
    cost: u64,
    empty: &mut Vec<&'a str>,
) -> Result<Groups<KeyedZone<'a>>, Unauthorized<'a>> {
    let mut keyed = Vec::with_capacity(route.limits.len());
    for (i, zl) in route.limits.iter().enumerate() {
        // A reference its conditions exempt is not keyed at all: no bucket for a made-up token.
        if !zl.conditions.is_empty() && !super::conditions::applies(&zl.conditions, facts) {
            continue;
        }
        let zone = &rt.zones[zl.zone];
        let Some(key) = request_key(&zone.name, &zone.key, facts)? else {
            empty.push(&zone.name);
            continue;
        };
        keyed.extend(keyed_zone(rt, route, i, key, facts, cost));
    }
    // Zones charged after the response last in each group (stable; `Groups::new` keeps this
    // order), so each group splits into "charged now" and "checked now, charged after the response".
    if !keyed.is_sorted_by_key(|z| charged_after_response(rt, route, z)) {
        keyed.sort_by_key(|z| charged_after_response(rt, route, z));
    }
    Ok(Groups::new(keyed))
}

/// One of the route's zone references (`route.limits[reference]`) with its key for this request:
/// the effective limit (a matching override's rate and burst), or `None` when an override exempts
/// the key (`rate = "unlimited"`). The proxy and replay key a zone by its key spec
/// ([`keyed_zones`]); the rate limit service by a descriptor's values (`rls::plan`).
pub fn keyed_zone<'a>(
    rt: &'a Runtime,
    route: &Route,
    reference: usize,
    key: Vec<u8>,
    facts: &RequestFacts<'_>,
    cost: u64,
) -> Option<KeyedZone<'a>> {
    let zl = &route.limits[reference];
    let zone = &rt.zones[zl.zone];
    let mut limit = zl.limit;
    if let Some(o) = super::overrides::override_for(zone, facts) {
        limit.rate = o.rate?;
        if let Some(burst) = o.burst {
            limit.burst = burst;
            if let DelayPolicy::After(d) = limit.delay {
                limit.delay = DelayPolicy::After(d.min(burst));
            }
        }
    }
    Some(KeyedZone { zone: &zone.name, key, limit, cost, dry_run: zl.dry_run, reference, lease: zone.lease })
}

/// The key step of limit_conn: the route's conn zones whose key for this request is not empty
/// (empty keys are not limited), enforced ones first.
pub fn keyed_conns<'a>(
    rt: &'a Runtime,
    route: &Route,
    facts: &RequestFacts<'_>,
    empty: &mut Vec<&'a str>,
) -> Result<Groups<KeyedConn<'a>>, Unauthorized<'a>> {
    let mut keyed = Vec::with_capacity(route.conn_limits.len());
    for (i, cl) in route.conn_limits.iter().enumerate() {
        if !cl.conditions.is_empty() && !super::conditions::applies(&cl.conditions, facts) {
            continue;
        }
        let zone = &rt.conn_zones[cl.zone];
        match request_key(&zone.name, &zone.key, facts)? {
            Some(key) => {
                keyed.push(KeyedConn { zone: &zone.name, key, max: cl.max, dry_run: cl.dry_run, reference: i })
            }
            None => empty.push(&zone.name),
        }
    }
    Ok(Groups::new(keyed))
}

/// The key step's one rule for both limit kinds: a zone's key for this request, `None` when it is
/// empty (not limited, like nginx; the caller lists the zone for `Observer::empty_key`); an error when the key needs a verified
/// token the request does not have and the zone has no `bad_token_key`.
pub fn request_key<'z>(
    zone_name: &'z str,
    spec: &KeySpec,
    facts: &RequestFacts<'_>,
) -> Result<Option<Vec<u8>>, Unauthorized<'z>> {
    let key = spec.extract(facts).map_err(|bad| Unauthorized { zone: zone_name, bad })?;
    Ok((!key.is_empty()).then_some(key))
}

/// A zone that refuses the request (401): its key needs a claim of a verified token.
#[derive(Debug)]
pub struct Unauthorized<'z> {
    pub zone: &'z str,
    pub bad: BadToken,
}

/// The cost of a request: the route's `cost`, or the value of its `cost_header` clamped to
/// `min_cost`..`max_cost`. A header that is not a non-negative integer is the client's error (400).
pub fn request_cost(cost: &Cost, headers: &http::HeaderMap) -> std::result::Result<u64, String> {
    let Some(name) = &cost.header else { return Ok(cost.default) };
    let Some(value) = headers.get(name) else { return Ok(cost.default) };
    let text = std::str::from_utf8(value.as_bytes()).map_err(|_| format!("{name} is not a number"))?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{name} must be a non-negative integer"));
    }
    // All digits: only overflow can fail, and an overflowing cost is clamped like any large one.
    Ok(text.parse::<u64>().unwrap_or(u64::MAX).clamp(cost.min, cost.max))
}
