//! Compilation of the concurrency side of a route: `limit_conn_zone`, `limit_conn` references,
//! `limit_conn_status`, and `allow` / `deny` rules.

use std::collections::HashMap;
use std::ops::Range;

use super::spanned::Spanned;
use ipnet::IpNet;

use super::checks::key_spec;
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
#[derive(Debug, Clone, Copy)]
pub struct ConnLimit {
    pub zone: usize,
    pub max: u32,
    pub dry_run: bool,
}

/// One `allow` or `deny` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessRule {
    pub net: IpNet,
    pub allow: bool,
}

type Here<'a> = &'a dyn Fn(&Range<usize>, String) -> ConfigError;

pub fn compile_conn_zones(
    src: &Source<'_>,
    list: Vec<Spanned<schema::LimitConnZone>>,
    req_zones: &[Zone],
) -> Result<Vec<ConnZone>, ConfigError> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for zone in list {
        let schema::LimitConnZone { name, key, max_keys, bad_token_key } = zone.into_inner();
        super::checks::check_name(src, &name, "limit_conn_zone.name")?;
        super::checks::unique(src, &mut seen, &name, "limit_conn_zone")?;
        if req_zones.iter().any(|z| z.name == *name.get_ref()) {
            return Err(src.error_at(
                &name.span(),
                format!(
                    "limit_conn_zone {:?}: a limit_req_zone has the same name; give each zone its own",
                    name.get_ref()
                ),
            ));
        }
        let key = key_spec(src, &key, bad_token_key.as_ref(), "limit_conn_zone", name.get_ref())?;
        let max_keys = super::limit_req::max_keys_of(src, max_keys.as_ref(), "limit_conn_zone", name.get_ref())?;
        out.push(ConnZone { name: name.into_inner(), key, max_keys });
    }
    Ok(out)
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
        out.push(ConnLimit { zone, max: *r.max.get_ref() as u32, dry_run: r.dry_run || route_dry_run });
    }
    Ok(out)
}

/// A rejection status: 400..=599, like nginx's `limit_req_status` / `limit_conn_status`.
pub fn status(value: Option<&Spanned<i64>>, default: u16, field: &str, here: Here<'_>) -> Result<u16, ConfigError> {
    match value {
        None => Ok(default),
        Some(s) if (400..=599).contains(s.get_ref()) => Ok(*s.get_ref() as u16),
        Some(s) => Err(here(&s.span(), format!("{field}: must be 400..=599, got {}", s.get_ref()))),
    }
}

/// `allow` and `deny` entries merged in file order (by their position in the text), so the first
/// rule written is the first rule checked, whichever list it is in — nginx's semantics.
pub fn access_rules(
    allow: &[Spanned<String>],
    deny: &[Spanned<String>],
    here: Here<'_>,
) -> Result<Vec<AccessRule>, ConfigError> {
    let mut rules: Vec<(usize, AccessRule)> = Vec::new();
    for (list, is_allow, field) in [(allow, true, "allow"), (deny, false, "deny")] {
        for entry in list {
            let text = entry.get_ref();
            let net = if text == "all" {
                None
            } else {
                Some(text.parse::<IpNet>().ok().or_else(|| text.parse::<std::net::IpAddr>().ok().map(IpNet::from)))
            };
            let nets: Vec<IpNet> = match net {
                // nginx's `all`: every IPv4 and IPv6 address.
                None => vec![IpNet::V4(Default::default()), IpNet::V6(Default::default())],
                Some(Some(n)) => vec![n],
                Some(None) => {
                    return Err(here(
                        &entry.span(),
                        format!("{field}: {text:?} is not an IP address, a CIDR like \"10.0.0.0/8\", or \"all\""),
                    ))
                }
            };
            for net in nets {
                rules.push((entry.span().start, AccessRule { net, allow: is_allow }));
            }
        }
    }
    rules.sort_by_key(|(pos, _)| *pos);
    Ok(rules.into_iter().map(|(_, r)| r).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::access::allowed;

    #[test]
    fn first_matching_rule_in_file_order_wins() {
        let text = "allow = [\"10.0.0.0/8\", \"2001:db8::/32\"]\ndeny = [\"all\"]\n";
        #[derive(serde::Deserialize)]
        struct T {
            allow: Vec<Spanned<String>>,
            deny: Vec<Spanned<String>>,
        }
        let t: T = toml::from_str(text).unwrap();
        let here = |_: &Range<usize>, m: String| ConfigError { file: "t".into(), line: None, message: m };
        let rules = access_rules(&t.allow, &t.deny, &here).unwrap();
        assert!(allowed(&rules, "10.1.2.3".parse().unwrap()));
        assert!(allowed(&rules, "2001:db8::7".parse().unwrap()));
        assert!(!allowed(&rules, "192.0.2.1".parse().unwrap()));
        assert!(!allowed(&rules, "::1".parse().unwrap()));

        // deny written first: it wins over a later allow.
        let text = "deny = [\"10.0.0.1\"]\nallow = [\"10.0.0.0/8\"]\n";
        let t: T = toml::from_str(text).unwrap();
        let rules = access_rules(&t.allow, &t.deny, &here).unwrap();
        assert!(!allowed(&rules, "10.0.0.1".parse().unwrap()));
        assert!(allowed(&rules, "10.0.0.2".parse().unwrap()));
        assert!(allowed(&[], "10.0.0.2".parse().unwrap()));

        let bad: T = toml::from_str("allow = [\"10.0.0.0/33\"]\ndeny = []").unwrap();
        assert!(access_rules(&bad.allow, &bad.deny, &here).is_err());
    }
}
