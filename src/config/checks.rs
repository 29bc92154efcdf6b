//! The shared checks of config compilation: names, uniqueness, keys, durations, CIDRs. A leaf:
//! every section module (`compile`, `route`, `zones`, `conn`, `store`, `upstream`) uses it, and it
//! uses none of them, so the modules import in one direction only.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use super::spanned::Spanned;
use ipnet::IpNet;

use super::error::{ConfigError, Source};
use super::schema;
use crate::keys::{KeyPart, KeySpec, TokenPolicy};

/// The largest `burst` (and `delay`) of a limit.
pub(super) const MAX_BURST: i64 = 1_000_000;

pub(super) fn parse_cidr(text: &str) -> Option<IpNet> {
    text.parse::<IpNet>().ok().or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from))
}

/// A zone's `key`: one part or a list (composite), and its `bad_token_key` (the key of requests
/// whose token cannot be verified, when the key reads a claim).
pub(super) fn key_spec(
    src: &Source<'_>,
    key: &Spanned<schema::OneOrMany>,
    bad_token_key: Option<&Spanned<schema::OneOrMany>>,
    what: &str,
    zone: &str,
) -> Result<KeySpec, ConfigError> {
    let parts = key_parts(src, key, &format!("{what} {zone:?}: key"))?;
    let mut spec = KeySpec::new(parts);
    if let Some(fallback) = bad_token_key {
        let field = format!("{what} {zone:?}: bad_token_key");
        if !spec.reads_claims() {
            return Err(
                src.error_at(&fallback.span(), format!("{field}: the key reads no jwt: claim, so no token is checked"))
            );
        }
        let parts = key_parts(src, fallback, &field)?;
        if parts.iter().any(|p| matches!(p, KeyPart::Claim(_))) {
            return Err(
                src.error_at(&fallback.span(), format!("{field}: the fallback for a bad token cannot read the token"))
            );
        }
        spec.on_bad_token = TokenPolicy::Fallback(parts);
    }
    Ok(spec)
}

fn key_parts(src: &Source<'_>, key: &Spanned<schema::OneOrMany>, field: &str) -> Result<Vec<KeyPart>, ConfigError> {
    let items = key.get_ref().items();
    if items.is_empty() {
        return Err(src.error_at(&key.span(), format!("{field} must not be empty")));
    }
    items.iter().map(|k| KeyPart::parse(k).map_err(|e| src.error_at(&key.span(), format!("{field}: {e}")))).collect()
}

/// Names appear in headers, Redis keys, logs and metric labels: keep them plain.
pub(super) fn check_name(src: &Source<'_>, name: &Spanned<String>, field: &str) -> Result<(), ConfigError> {
    let n = name.get_ref();
    let ok = !n.is_empty() && n.len() <= 128 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(src.error_at(&name.span(), format!("{field}: {n:?} must be 1-128 characters of A-Z a-z 0-9 _ - .")))
    }
}

pub(super) fn unique(
    src: &Source<'_>,
    seen: &mut HashMap<String, usize>,
    name: &Spanned<String>,
    what: &str,
) -> Result<(), ConfigError> {
    let line = src.line_of(&name.span());
    match seen.insert(name.get_ref().clone(), line) {
        Some(first) => Err(src.error_at(
            &name.span(),
            format!("duplicate {what} name {:?} (first defined on line {first})", name.get_ref()),
        )),
        None => Ok(()),
    }
}

pub(super) fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// `"25ms"`, `"1s"`, `"500us"`, `"2m"`, `"1h"`: a number and a unit.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    match unit {
        "us" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        "h" => Some(Duration::from_secs(n.checked_mul(3600)?)),
        "d" => Some(Duration::from_secs(n.checked_mul(86_400)?)),
        _ => None,
    }
}
