//! Compilation of a route's `limit_rate`, `limit_rate_after` and `limit_rate_override` (nginx's
//! `limit_rate`, `limit_rate_after` and a per-key `$limit_rate`): sizes in bytes with nginx's
//! suffixes (k = 1024, m = 1024², g = 1024³).

use super::limit_req::parse_match;
use super::schema;
use super::spanned::Spanned;
use super::ConfigError;
use crate::config::OverrideMatch;

/// The largest size accepted: 1 TiB (a second, or a body's free head start).
const MAX_SIZE: u64 = 1 << 40;

/// How a route's response bodies are paced.
#[derive(Debug, Clone)]
pub struct LimitRate {
    /// Bytes a second; `None`: full speed (only an override can pace).
    pub rate: Option<u64>,
    /// The first bytes of each body, sent at full speed.
    pub after: u64,
    /// Checked in file order: the first that matches the request gives its rate (`None`: full speed).
    pub overrides: Vec<(OverrideMatch, Option<u64>)>,
}

/// `None` when the route sets none of the three.
pub fn compile(
    rate: Option<&Spanned<String>>,
    after: Option<&Spanned<String>>,
    overrides: &[Spanned<schema::RateOverride>],
    here: &impl Fn(&std::ops::Range<usize>, String) -> ConfigError,
) -> Result<Option<LimitRate>, ConfigError> {
    if rate.is_none() && after.is_none() && overrides.is_empty() {
        return Ok(None);
    }
    let size = |v: &Spanned<String>, field: &str| {
        parse_size(v.get_ref()).map_err(|e| here(&v.span(), format!("{field}: {e}")))
    };
    let rate = rate.map(|r| size(r, "limit_rate")).transpose()?;
    let after = after.map(|a| size(a, "limit_rate_after")).transpose()?.unwrap_or(0);
    let mut compiled = Vec::with_capacity(overrides.len());
    for o in overrides {
        let o = o.get_ref();
        let matcher = parse_match(o.matches.get_ref())
            .map_err(|e| here(&o.matches.span(), format!("limit_rate_override: {e}")))?;
        let rate = match o.rate.get_ref().as_str() {
            "unlimited" => None,
            _ => Some(size(&o.rate, "limit_rate_override: rate")?),
        };
        compiled.push((matcher, rate));
    }
    if rate == Some(0) || compiled.iter().any(|(_, r)| *r == Some(0)) {
        let at = overrides.first().map_or_else(|| 0..0, |o| o.span());
        return Err(here(&at, "limit_rate: a rate must be above 0 (\"unlimited\" for full speed)".into()));
    }
    Ok(Some(LimitRate { rate, after, overrides: compiled }))
}

/// `"512k"`, `"1m"`, `"2g"`, `"100"`: bytes, with nginx's binary suffixes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&t[..i], c.to_ascii_lowercase()),
        _ => (t, ' '),
    };
    let factor: u64 = match unit {
        ' ' => 1,
        'k' => 1 << 10,
        'm' => 1 << 20,
        'g' => 1 << 30,
        _ => return Err(format!("expected a size like \"512k\", \"1m\" or \"2g\", got {text:?}")),
    };
    let n: u64 =
        digits.parse().map_err(|_| format!("expected a size like \"512k\", \"1m\" or \"2g\", got {text:?}"))?;
    match n.checked_mul(factor) {
        Some(bytes) if bytes <= MAX_SIZE => Ok(bytes),
        _ => Err(format!("{text:?} is over 1 TiB")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_nginx_suffixes_and_refuse_the_rest() {
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("512k"), Ok(512 * 1024));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        for bad in ["", "k", "1.5m", "-1k", "1t", "1 m x", "2000g"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }
}
