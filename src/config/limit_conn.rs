//! Compilation of the concurrency side of the config: `limit_conn_zone` and a route's `limit_conn`
//! references.

use std::collections::HashMap;
use std::ops::Range;

use super::spanned::Spanned;

use super::checks::key_spec;
use super::each::Each;
use super::error::{ConfigError, Source};
use super::limit_req::Zone;
use super::schema;
use crate::keys::KeySpec;

/// Largest `max` of a `limit_conn` reference (nginx: 65535).
const MAX_CONN: i64 = 65_535;

/// A named space of concurrency counters (nginx `limit_conn_zone`).
#[derive(Debug, Clone)]
pub struct ConnZone {
    pub name: String,
    pub key: KeySpec,
    /// Keys with requests in flight the in-process store keeps for the zone.
    pub max_keys: usize,
}

/// One `limit_conn` reference of a route: at most `max` requests in flight per key, fleet-wide.
#[derive(Debug, Clone)]
pub struct ConnLimit {
    pub zone: usize,
    pub max: u32,
    pub dry_run: bool,
    /// `when` / `unless`: the reference applies to a request only when they say so.
    pub conditions: super::conditions::Conditions,
}

type Here<'a> = &'a dyn Fn(&Range<usize>, String) -> ConfigError;

/// Every zone that compiles, and an error for each that does not (see `each`).
pub fn compile_conn_zones(
    src: &Source<'_>,
    list: Vec<Spanned<schema::LimitConnZone>>,
    req_zones: &[Zone],
) -> Each<ConnZone> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Each::default();
    for zone in list {
        let name = zone.get_ref().name.get_ref().clone();
        out.push(&name, compile_conn_zone(src, zone, req_zones, &mut seen));
    }
    out
}

fn compile_conn_zone(
    src: &Source<'_>,
    zone: Spanned<schema::LimitConnZone>,
    req_zones: &[Zone],
    seen: &mut HashMap<String, usize>,
) -> Result<ConnZone, ConfigError> {
    let schema::LimitConnZone { name, key, max_keys, bad_token_key, lease } = zone.into_inner();
    super::checks::check_name(src, &name, "limit_conn_zone.name")?;
    if let Some(lease) = &lease {
        return Err(src.error_at(&lease.span(), super::lease::not_for_limit_conn(name.get_ref())));
    }
    super::checks::unique(src, seen, &name, "limit_conn_zone")?;
    if req_zones.iter().any(|z| z.name == *name.get_ref()) {
        return Err(src.error_at(
            &name.span(),
            format!("limit_conn_zone {:?}: a limit_req_zone has the same name; give each zone its own", name.get_ref()),
        ));
    }
    let key = key_spec(src, &key, bad_token_key.as_ref(), "limit_conn_zone", name.get_ref())?;
    let max_keys = super::limit_req::max_keys_of(src, max_keys.as_ref(), "limit_conn_zone", name.get_ref())?;
    Ok(ConnZone { name: name.into_inner(), key, max_keys })
}

pub fn compile_conn_refs(
    refs: &[Spanned<schema::LimitConnRef>],
    zones: &[ConnZone],
    route_dry_run: bool,
    here: Here<'_>,
) -> Result<Vec<ConnLimit>, ConfigError> {
    let mut out: Vec<ConnLimit> = Vec::new();
    for r in refs {
        let r = r.get_ref();
        let zone = zones.iter().position(|z| z.name == *r.zone.get_ref()).ok_or_else(|| {
            let known: Vec<&str> = zones.iter().map(|z| z.name.as_str()).collect();
            let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
            here(&r.zone.span(), format!("limit_conn: unknown zone {:?} (defined: {known})", r.zone.get_ref()))
        })?;
        if out.iter().any(|c| c.zone == zone) {
            return Err(here(&r.zone.span(), format!("limit_conn: zone {:?} is referenced twice", r.zone.get_ref())));
        }
        if !(1..=MAX_CONN).contains(r.max.get_ref()) {
            return Err(here(
                &r.max.span(),
                format!("limit_conn: max must be 1..={MAX_CONN}, got {}", r.max.get_ref()),
            ));
        }
        let conditions = super::conditions::compile(r.when.as_ref(), r.unless.as_ref(), here)?;
        out.push(ConnLimit { zone, max: *r.max.get_ref() as u32, dry_run: r.dry_run || route_dry_run, conditions });
    }
    Ok(out)
}
