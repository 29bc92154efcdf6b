//! Compilation of `[[limit_req_zone]]`: key, algorithm, rate (or `window` + `limit`), and per-key
//! overrides (`[[limit_req_zone.override]]`: a partner's own rate, or `rate = "unlimited"`).

use std::collections::HashMap;
use std::net::IpAddr;

use super::spanned::Spanned;
use ipnet::IpNet;

use super::checks::{check_name, key_spec, parse_duration, unique, MAX_BURST};
use super::each::Each;
use super::error::{ConfigError, Source};
use super::schema;
use crate::keys::{KeyPart, KeySpec};
use crate::limit::{Algorithm, Rate};
use crate::store::DEFAULT_MAX_KEYS;

/// A named space of `limit_req` state (nginx `limit_req_zone`).
#[derive(Debug, Clone)]
pub struct Zone {
    pub name: String,
    pub key: KeySpec,
    pub algorithm: Algorithm,
    /// Buckets: the sustained rate. Windows: `count` per `period_us`.
    pub rate: Rate,
    /// Checked in file order; the first that matches the request applies.
    pub overrides: Vec<Override>,
    /// Keys the in-process store keeps for the zone (`memory` store, `local` fallback).
    pub max_keys: usize,
    /// Count by response (`count_statuses`): when set, a request is only checked before it is
    /// forwarded, and charged after its response if the status is one of these (docs/charges.md).
    pub count_statuses: Option<Vec<u16>>,
    /// Charge from the response (`cost_from_response`): the cost comes from the upstream's
    /// response and is charged after it, possibly into debt (docs/charges.md).
    pub response_cost: Option<ResponseCost>,
    /// `lease`: decided from leases of the key's budget (docs/leases.md); `None`: exact.
    pub lease: Option<crate::limit::lease::LeaseSpec>,
}

/// A zone's `cost_from_response`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseCost {
    /// The upstream response header read (never the client's request); `None`: the response
    /// body bytes sent to the client (`body_bytes = true`, a byte quota), charged at the end.
    pub header: Option<http::HeaderName>,
    /// The cost when the header is missing or not a non-negative integer.
    pub default: u64,
    /// Reported costs above this are clamped to it.
    pub max: u64,
    /// How far past its burst a charge may push a bucket; `None`: the reference's burst + 1.
    pub max_debt: Option<u64>,
    /// Charged at the end of the response, from the trailer of that name if the upstream sent
    /// one (HTTP/2 upstreams), else from the header.
    pub trailer: bool,
    /// The access log's field for the header's value (`upstream_http_x_tokens_used`), which
    /// `weir replay` charges from.
    pub log_field: String,
}

/// The prefix of the access log's fields of upstream response headers (nginx's
/// `$upstream_http_NAME`, with `-` written `_`).
pub const RESPONSE_FIELD_PREFIX: &str = "upstream_http_";

/// The access log's field of the response body bytes sent (nginx's `$body_bytes_sent`), which
/// `weir replay` charges byte quotas from.
pub const BODY_BYTES_FIELD: &str = "body_bytes_sent";

/// The largest `max` and `max_debt` of a byte quota (`body_bytes = true`): 1 TiB.
const MAX_BODY_BYTES: i64 = 1 << 40;

/// The largest `default`, `max` and `max_debt` of `cost_from_response`.
const MAX_RESPONSE_COST: i64 = 1_000_000;
/// The longest window: envoyproxy/ratelimit's `year` (365 days, aligned to the epoch like every window).
const MAX_WINDOW_SECS: u64 = 365 * 86_400;

/// Different limits for some keys (hot keys, premium tenants), like Envoy's descriptor values.
#[derive(Debug, Clone)]
pub struct Override {
    pub matcher: OverrideMatch,
    /// `None`: `rate = "unlimited"`, the key is not limited by this zone.
    pub rate: Option<Rate>,
    /// Replaces the burst of every route's reference to the zone, for this key.
    pub burst: Option<u64>,
}

#[derive(Debug, Clone)]
pub enum OverrideMatch {
    /// `match = "203.0.113.0/24"` (zones keyed on `ip`).
    ClientIp(IpNet),
    /// `match = "header:X-Api-Key=partner-123"` (also `query:` and `cookie:`): that part of the
    /// key equals the value.
    Part(KeyPart, Vec<u8>),
}

/// Every zone that compiles, and an error for each that does not (see `each`).
pub fn compile_zones(src: &Source<'_>, list: Vec<Spanned<schema::LimitReqZone>>) -> Each<Zone> {
    let mut seen = HashMap::new();
    let mut out = Each::default();
    for zone in list {
        let name = zone.get_ref().name.get_ref().clone();
        out.push(&name, compile_zone(src, zone, &mut seen));
    }
    out
}

fn compile_zone(
    src: &Source<'_>,
    zone: Spanned<schema::LimitReqZone>,
    seen: &mut HashMap<String, usize>,
) -> Result<Zone, ConfigError> {
    let span = zone.span();
    let schema::LimitReqZone {
        name,
        key,
        algorithm,
        rate,
        window,
        limit,
        max_keys,
        bad_token_key,
        count_statuses,
        cost_from_response,
        lease,
        overrides,
    } = zone.into_inner();
    check_name(src, &name, "limit_req_zone.name")?;
    unique(src, seen, &name, "limit_req_zone")?;
    let zname = name.get_ref().clone();
    // No key: a zone for `[rls]` descriptors only (`compile` refuses it in a route).
    let key = match &key {
        Some(key) => key_spec(src, key, bad_token_key.as_ref(), "limit_req_zone", &zname)?,
        None => match &bad_token_key {
            Some(b) => {
                return Err(src.error_at(
                    &b.span(),
                    format!("limit_req_zone {zname:?}: bad_token_key: the zone has no key, so no token is checked"),
                ))
            }
            None => KeySpec::new(Vec::new()),
        },
    };
    let algorithm = match &algorithm {
        None => Algorithm::LeakyBucket,
        Some(a) => Algorithm::parse(a.get_ref()).ok_or_else(|| {
            src.error_at(
                &a.span(),
                format!(
            "limit_req_zone {zname:?}: algorithm: expected leaky_bucket, token_bucket, fixed_window, sliding_log \
             or sliding_window, got {:?}", a.get_ref()),
            )
        })?,
    };
    let rate = match (rate, window, limit) {
        (Some(r), None, None) => parse_rate(src, &r, &zname)?,
        (None, Some(w), Some(l)) if algorithm.is_window() => {
            let period = parse_duration(w.get_ref())
                .filter(|d| d.as_millis() >= 1 && d.as_secs() <= MAX_WINDOW_SECS)
                .ok_or_else(|| src.error_at(&w.span(), format!(
                    "limit_req_zone {zname:?}: window: expected a duration from \"1ms\" to \"365d\" like \"10s\" or \"30d\", got {:?}", w.get_ref())))?;
            // 0 blocks every key (envoyproxy/ratelimit's `requests_per_unit: 0`); a sliding log
            // of nothing is a fixed window of nothing, so it is left to the two counters.
            let least = if algorithm == Algorithm::SlidingLog { 1 } else { 0 };
            if !(least..=MAX_BURST).contains(l.get_ref()) {
                return Err(src.error_at(&l.span(), format!(
                    "limit_req_zone {zname:?}: limit must be {least}..={MAX_BURST} for {}, got {}", algorithm.as_str(), l.get_ref())));
            }
            Rate { count: *l.get_ref() as u64, period_us: period.as_micros() as u64 }
        }
        (None, w, l) if !algorithm.is_window() && (w.is_some() || l.is_some()) => {
            let at = w.map_or_else(|| span.clone(), |w| w.span());
            return Err(src.error_at(&at, format!(
                "limit_req_zone {zname:?}: window and limit apply to window algorithms; {} takes rate", algorithm.as_str())));
        }
        _ => {
            return Err(src.error_at(&span, format!(
                "limit_req_zone {zname:?}: give rate = \"10r/s\" (or, for window algorithms, window = \"10s\" and limit = 50)")))
        }
    };
    if algorithm == Algorithm::SlidingLog && rate.count > 10_000 {
        return Err(src.error_at(
            &span,
            format!(
                "limit_req_zone {zname:?}: sliding_log keeps one entry per admitted request; a limit of {} per window \
             would cost too much memory per key (at most 10000): use sliding_window",
                rate.count
            ),
        ));
    }
    let overrides = overrides
        .iter()
        .map(|o| compile_override(src, o.get_ref(), &key, algorithm, &zname))
        .collect::<Result<_, _>>()?;
    let max_keys = max_keys_of(src, max_keys.as_ref(), "limit_req_zone", &zname)?;
    let count_statuses = count_statuses.as_ref().map(|c| statuses_of(src, c, &zname)).transpose()?;
    let response_cost = cost_from_response.as_ref().map(|c| response_cost_of(src, c, algorithm, &zname)).transpose()?;
    let lease = lease
        .as_ref()
        .map(|l| {
            super::lease::compile_lease(src, l, &zname, algorithm, count_statuses.is_some(), response_cost.is_some())
        })
        .transpose()?;
    Ok(Zone { name: zname, key, algorithm, rate, overrides, max_keys, count_statuses, response_cost, lease })
}

/// A zone's `cost_from_response`: a header name, bounded numbers; leaky buckets only (debt is
/// a bucket level past its burst, which the window algorithms and the token bucket do not keep).
fn response_cost_of(
    src: &Source<'_>,
    spec: &Spanned<schema::ResponseCost>,
    algorithm: Algorithm,
    zone: &str,
) -> Result<ResponseCost, ConfigError> {
    let field = format!("limit_req_zone {zone:?}: cost_from_response");
    if algorithm != Algorithm::LeakyBucket {
        return Err(src.error_at(
            &spec.span(),
            format!(
                "{field}: only leaky_bucket zones can be charged from the response (this one is {})",
                algorithm.as_str()
            ),
        ));
    }
    let c = spec.get_ref();
    let body_bytes = c.body_bytes.unwrap_or(false);
    let header =
        match (&c.header, body_bytes) {
            (Some(h), false) => Some(http::HeaderName::from_bytes(h.get_ref().as_bytes()).map_err(|_| {
                src.error_at(&h.span(), format!("{field}: header {:?} is not a header name", h.get_ref()))
            })?),
            (None, true) => None,
            (Some(h), true) => {
                return Err(src.error_at(&h.span(), format!("{field}: give header or body_bytes = true, not both")))
            }
            (None, false) => {
                return Err(src.error_at(&spec.span(), format!("{field}: give header = \"NAME\" or body_bytes = true")))
            }
        };
    if body_bytes && (c.trailer.is_some() || c.default.is_some()) {
        return Err(src.error_at(
            &spec.span(),
            format!("{field}: body_bytes counts the bytes sent at the end; trailer and default do not apply"),
        ));
    }
    // A byte quota counts bytes: its caps go up to 1 TiB, a header's cost to 1,000,000.
    let top = if body_bytes { MAX_BODY_BYTES } else { MAX_RESPONSE_COST };
    let number = |v: Option<&Spanned<i64>>, name: &str, min: i64| -> Result<Option<u64>, ConfigError> {
        match v {
            None => Ok(None),
            Some(v) if (min..=top).contains(v.get_ref()) => Ok(Some(*v.get_ref() as u64)),
            Some(v) => {
                Err(src.error_at(&v.span(), format!("{field}: {name} must be {min}..={top}, got {}", v.get_ref())))
            }
        }
    };
    let default = number(c.default.as_ref(), "default", 0)?.unwrap_or(1);
    let max = number(c.max.as_ref(), "max", 1)?.unwrap_or(top as u64);
    let max_debt = number(c.max_debt.as_ref(), "max_debt", 0)?;
    if default > max {
        return Err(src.error_at(&spec.span(), format!("{field}: default ({default}) must not exceed max ({max})")));
    }
    let log_field = match &header {
        Some(h) => format!("{RESPONSE_FIELD_PREFIX}{}", h.as_str().replace('-', "_")),
        None => BODY_BYTES_FIELD.to_string(),
    };
    Ok(ResponseCost { header, default, max, max_debt, trailer: c.trailer.unwrap_or(false), log_field })
}

/// A zone's `count_statuses`: a non-empty list of HTTP statuses (100..=599).
fn statuses_of(src: &Source<'_>, list: &Spanned<Vec<i64>>, zone: &str) -> Result<Vec<u16>, ConfigError> {
    let bad = |why: String| src.error_at(&list.span(), format!("limit_req_zone {zone:?}: count_statuses: {why}"));
    if list.get_ref().is_empty() {
        return Err(bad("give at least one status, e.g. [401, 403]".into()));
    }
    list.get_ref()
        .iter()
        .map(|&s| {
            if (100..=599).contains(&s) {
                Ok(s as u16)
            } else {
                Err(bad(format!("{s} is not an HTTP status (100..=599)")))
            }
        })
        .collect()
}

/// Largest accepted `max_keys`: ~15 GB of state in one zone.
const MAX_MAX_KEYS: i64 = 100_000_000;

/// A zone's `max_keys`: 1..=100000000, default [`DEFAULT_MAX_KEYS`].
pub(super) fn max_keys_of(
    src: &Source<'_>,
    max_keys: Option<&Spanned<i64>>,
    kind: &str,
    zone: &str,
) -> Result<usize, ConfigError> {
    match max_keys {
        None => Ok(DEFAULT_MAX_KEYS),
        Some(m) if (1..=MAX_MAX_KEYS).contains(m.get_ref()) => Ok(*m.get_ref() as usize),
        Some(m) => Err(src.error_at(
            &m.span(),
            format!(
                "{kind} {zone:?}: max_keys: must be 1..={MAX_MAX_KEYS} (keys the zone keeps in memory), got {}",
                m.get_ref()
            ),
        )),
    }
}

fn parse_rate(src: &Source<'_>, rate: &Spanned<String>, zone: &str) -> Result<Rate, ConfigError> {
    Rate::parse(rate.get_ref()).map_err(|e| src.error_at(&rate.span(), format!("limit_req_zone {zone:?}: rate: {e}")))
}

/// An override's `match`: an IP or CIDR of the client, or `PART=value` (a key part, e.g.
/// `header:X-Api-Key`, and the value it must have). Shared by zone overrides and
/// `limit_rate_override`.
pub(super) fn parse_match(text: &str) -> Result<OverrideMatch, String> {
    if let Some(net) = text.parse::<IpNet>().ok().or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from)) {
        return Ok(OverrideMatch::ClientIp(net));
    }
    let (part, value) =
        text.split_once('=').ok_or_else(|| format!("expected an IP/CIDR or \"header:NAME=value\", got {text:?}"))?;
    let part = KeyPart::parse(part).map_err(|e| e.to_string())?;
    // Compared with the extracted key, which is bounded the same way (long values hashed).
    Ok(OverrideMatch::Part(part, crate::keys::bound(value.as_bytes().to_vec())))
}

fn compile_override(
    src: &Source<'_>,
    o: &schema::ZoneOverride,
    key: &KeySpec,
    algorithm: Algorithm,
    zone: &str,
) -> Result<Override, ConfigError> {
    let text = o.matches.get_ref();
    let at = o.matches.span();
    let matcher =
        parse_match(text).map_err(|e| src.error_at(&at, format!("limit_req_zone {zone:?}: override match: {e}")))?;
    match &matcher {
        OverrideMatch::ClientIp(_)
            if !key.parts.iter().any(|p| matches!(p, KeyPart::ClientIp | KeyPart::IpPrefix(_))) =>
        {
            return Err(src.error_at(
                &at,
                format!(
                    "limit_req_zone {zone:?}: override match {text:?} is an address, but the zone's key has no \"ip\""
                ),
            ));
        }
        OverrideMatch::Part(part, _) if !key.parts.contains(part) => {
            return Err(src.error_at(
                &at,
                format!("limit_req_zone {zone:?}: override match {text:?} names a part that is not in the zone's key"),
            ));
        }
        _ => {}
    }
    let rate = match &o.rate {
        Some(r) if r.get_ref() == "unlimited" => None,
        Some(r) => Some(parse_rate(src, r, zone)?),
        None => {
            return Err(
                src.error_at(&at, format!("limit_req_zone {zone:?}: override: give rate (or rate = \"unlimited\")"))
            )
        }
    };
    let burst = match &o.burst {
        None => None,
        Some(b) if algorithm.is_window() => {
            return Err(src.error_at(
                &b.span(),
                format!(
                    "limit_req_zone {zone:?}: {} has no burst; an override changes its rate (the count per window)",
                    algorithm.as_str()
                ),
            ))
        }
        Some(b) if (0..=MAX_BURST).contains(b.get_ref()) => Some(*b.get_ref() as u64),
        Some(b) => {
            return Err(
                src.error_at(&b.span(), format!("limit_req_zone {zone:?}: override burst must be 0..={MAX_BURST}"))
            )
        }
    };
    Ok(Override { matcher, rate, burst })
}

#[cfg(test)]
mod tests {
    //! A zone's settings as `weir check` refuses or compiles them.

    /// A login route's zone; `COUNT` is replaced by each test's zone settings.
    const LOGIN: &str = "[server]\nlisten = [\"127.0.0.1:1\"]\n[store]\nkind = \"memory\"\n[[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:2\"]\n\
        [[limit_req_zone]]\nname = \"fails\"\nkey = \"ip\"\nrate = \"1r/h\"\nCOUNT\n\
        [[route]]\nname = \"login\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_req = [ { zone = \"fails\" } ]\n";

    #[test]
    fn count_statuses_must_be_a_non_empty_list_of_http_statuses() {
        let conf = |count: &str| crate::config::from_text(&LOGIN.replace("COUNT", count), "t.toml");
        let rt = conf("count_statuses = [401, 403]").expect("valid");
        assert_eq!(rt.zones[0].count_statuses.as_deref(), Some(&[401, 403][..]));
        assert_eq!(conf("").expect("valid").zones[0].count_statuses, None);
        for bad in ["count_statuses = []", "count_statuses = [600]", "count_statuses = [-1]"] {
            let err = conf(bad).err().unwrap_or_else(|| panic!("{bad} accepted")).to_string();
            assert!(err.contains("count_statuses"), "{bad}: {err}");
        }
    }

    #[test]
    fn cost_from_response_is_checked_by_weir_check() {
        let conf = |zone: &str| {
            let text = LOGIN.replace("rate = \"1r/h\"\nCOUNT", zone);
            crate::config::from_text(&text, "t.toml").map(|rt| rt.zones[0].response_cost.clone())
        };
        let rc =
            conf("rate = \"1r/h\"\ncost_from_response = { header = \"X-Tokens-Used\" }").expect("valid").expect("set");
        assert_eq!(
            (rc.header.as_ref().map(|h| h.as_str()), rc.default, rc.max, rc.max_debt),
            (Some("x-tokens-used"), 1, 1_000_000, None)
        );
        assert_eq!(rc.log_field, "upstream_http_x_tokens_used");
        for (bad, says) in [
            (
                "algorithm = \"token_bucket\"\nrate = \"1r/h\"\ncost_from_response = { header = \"x\" }",
                "only leaky_bucket",
            ),
            ("rate = \"1r/h\"\ncost_from_response = { header = \"bad header\" }", "not a header name"),
            ("rate = \"1r/h\"\ncost_from_response = { header = \"x\", default = -1 }", "default must be"),
            ("rate = \"1r/h\"\ncost_from_response = { header = \"x\", max = 0 }", "max must be"),
            ("rate = \"1r/h\"\ncost_from_response = { header = \"x\", max_debt = 1000001 }", "max_debt must be"),
            ("rate = \"1r/h\"\ncost_from_response = { header = \"x\", default = 10, max = 5 }", "must not exceed"),
        ] {
            let err = conf(bad).err().unwrap_or_else(|| panic!("{bad} accepted")).to_string();
            assert!(err.contains("cost_from_response") && err.contains(says), "{bad}: {err}");
        }
    }
}
