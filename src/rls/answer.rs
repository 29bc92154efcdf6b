//! The enforcement step's outcome as Envoy's `RateLimitResponse`: the overall code, one status per
//! descriptor, and the rate-limit fields for Envoy to add to its response.
//!
//! The enforcement step reports each enforced zone's remaining count and reset time only in its
//! draft `RateLimit` field (`"zone";r=N;t=S`, one item per zone in order); the domain's route
//! always asks for that field, and this module reads the counts back from it, then writes the
//! fields the domain's `rate_limit_headers` asks for.

use std::time::Duration;

use super::plan::Plan;
use super::proto::rate_limit_response::rate_limit::Unit;
use super::proto::rate_limit_response::{Code, RateLimit};
use super::proto::{DescriptorStatus, HeaderValue, RateLimitResponse};
use crate::config::{FailurePolicy, HeaderMode, Route};
use crate::limit::LimitReq;
use crate::engine::limit_req::{Action, Enforcement};
use crate::engine::status::LimitStatus;
use crate::store::KeyedZone;

/// The request header that carries a `delay` verdict's wait: Envoy cannot hold a request, so a
/// delay is answered OK and the wait is told to the upstream.
pub const DELAY_HEADER: &str = "x-weir-delay-ms";

/// One zone's `r` and `t` from the draft `RateLimit` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remaining {
    pub remaining: u64,
    pub reset_secs: u64,
}

/// The items of a `RateLimit` field, in order. Zone names are plain (`config::checks`), so
/// the field splits on `", "` and `;`.
pub fn parse_remaining(field: &str) -> Vec<Remaining> {
    field
        .split(", ")
        .filter_map(|item| {
            let mut r = None;
            let mut t = None;
            for param in item.split(';').skip(1) {
                match param.split_once('=') {
                    Some(("r", v)) => r = v.parse().ok(),
                    Some(("t", v)) => t = v.parse().ok(),
                    _ => {}
                }
            }
            Some(Remaining { remaining: r?, reset_secs: t? })
        })
        .collect()
}

/// The response to one request, from its plan and the enforcement outcome.
pub fn respond(plan: &Plan<'_>, enforcement: &Enforcement<'_>, route: &Route, mode: HeaderMode) -> RateLimitResponse {
    let rejected = matches!(enforcement.action, Action::Reject { .. });
    let denied_by_policy = rejected && enforcement.fallback == Some(FailurePolicy::Deny);
    let field = |name: &str| enforcement.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str());
    let remaining = field("RateLimit").map(parse_remaining).unwrap_or_default();
    let enforced = plan.keyed.iter().take_while(|z| !z.dry_run).count();

    let zone_codes: Vec<Code> = plan
        .keyed
        .iter()
        .enumerate()
        .map(|(i, z)| {
            if z.dry_run || !rejected {
                return Code::Ok;
            }
            if denied_by_policy {
                return Code::OverLimit;
            }
            // Its zone's word is REJECTED and this key has nothing left (a zone that another one
            // rejected was not charged and reports what it had: `proxy::headers::remaining`).
            let zone_index = route.limits[z.reference].zone;
            let rejecting =
                enforcement.statuses.zones.iter().any(|&(zi, s)| zi == zone_index && s == LimitStatus::Rejected)
                    && remaining.get(i).is_some_and(|r| r.remaining == 0);
            if rejecting {
                Code::OverLimit
            } else {
                Code::Ok
            }
        })
        .collect();

    let statuses = plan
        .slots
        .iter()
        .map(|slot| match slot {
            None => DescriptorStatus { code: Code::Ok.into(), ..DescriptorStatus::default() },
            Some(i) => {
                let zone = &plan.keyed[*i];
                let counts = (*i < enforced).then(|| remaining.get(*i).copied()).flatten();
                DescriptorStatus {
                    code: zone_codes[*i].into(),
                    current_limit: Some(current_limit(zone)),
                    limit_remaining: counts.map_or(0, |c| u32::try_from(c.remaining).unwrap_or(u32::MAX)),
                    duration_until_reset: counts.map(|c| prost_types::Duration {
                        seconds: i64::try_from(c.reset_secs).unwrap_or(i64::MAX),
                        nanos: 0,
                    }),
                    quota: None,
                }
            }
        })
        .collect();

    let mut response_headers = Vec::new();
    match mode {
        HeaderMode::Draft => {
            for name in ["RateLimit-Policy", "RateLimit"] {
                if let Some(v) = field(name) {
                    response_headers.push(header(name, v));
                }
            }
        }
        HeaderMode::Legacy => response_headers.extend(legacy(&plan.keyed[..enforced], &remaining)),
        HeaderMode::None => {}
    }
    if let Some(v) = field("Retry-After") {
        response_headers.push(header("Retry-After", v));
    }
    let mut request_headers = Vec::new();
    if let Action::Delay(wait) = enforcement.action {
        request_headers.push(header(DELAY_HEADER, &delay_ms(wait).to_string()));
    }
    RateLimitResponse {
        overall_code: if rejected { Code::OverLimit } else { Code::Ok }.into(),
        statuses,
        response_headers_to_add: response_headers,
        request_headers_to_add: request_headers,
        ..RateLimitResponse::default()
    }
}

/// A wait in whole milliseconds, rounded up (a 0 would say "no wait").
fn delay_ms(wait: Duration) -> u64 {
    u64::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(u64::MAX).max(1)
}

fn header(key: &str, value: &str) -> HeaderValue {
    HeaderValue { key: key.to_string(), value: value.to_string(), raw_value: Vec::new() }
}

/// `X-RateLimit-Limit/-Remaining/-Reset` of the tightest enforced zone (fewest left).
fn legacy(zones: &[KeyedZone<'_>], remaining: &[Remaining]) -> Vec<HeaderValue> {
    let Some((zone, counts)) = zones.iter().zip(remaining).min_by_key(|(_, c)| c.remaining) else {
        return Vec::new();
    };
    vec![
        header("X-RateLimit-Limit", &zone.limit.capacity().to_string()),
        header("X-RateLimit-Remaining", &counts.remaining.to_string()),
        header("X-RateLimit-Reset", &counts.reset_secs.to_string()),
    ]
}

/// A zone's limit in Envoy's terms: requests per second, minute, hour or day when the zone's
/// period is one of those, else its rate per second (rounded down, at least 1 when nonzero);
/// `name` is the zone.
pub fn current_limit(zone: &KeyedZone<'_>) -> RateLimit {
    let LimitReq { rate, .. } = zone.limit;
    let (count, unit) = match rate.period_us {
        1_000_000 => (rate.count, Unit::Second),
        60_000_000 => (rate.count, Unit::Minute),
        3_600_000_000 => (rate.count, Unit::Hour),
        86_400_000_000 => (rate.count, Unit::Day),
        period => {
            let per_second = u128::from(rate.count) * 1_000_000 / u128::from(period.max(1));
            (u64::try_from(per_second).unwrap_or(u64::MAX).max(u64::from(rate.count > 0)), Unit::Second)
        }
    };
    RateLimit {
        name: zone.zone.to_string(),
        requests_per_unit: u32::try_from(count).unwrap_or(u32::MAX),
        unit: unit.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, DelayPolicy, Rate};

    #[test]
    fn reads_the_draft_field_back() {
        assert_eq!(
            parse_remaining("\"per_ip\";r=17;t=1, \"b\";r=0;t=60"),
            vec![Remaining { remaining: 17, reset_secs: 1 }, Remaining { remaining: 0, reset_secs: 60 }]
        );
        assert!(parse_remaining("").is_empty());
    }

    #[test]
    fn limits_in_envoy_units() {
        let zone = |rate: &str| {
            let limit = LimitReq {
                algorithm: Algorithm::LeakyBucket,
                rate: Rate::parse(rate).unwrap(),
                burst: 0,
                delay: DelayPolicy::NoDelay,
            };
            current_limit(&KeyedZone::new("z", "k", limit, 1))
        };
        assert_eq!((zone("10r/s").requests_per_unit, zone("10r/s").unit()), (10, Unit::Second));
        assert_eq!((zone("30r/m").requests_per_unit, zone("30r/m").unit()), (30, Unit::Minute));
        assert_eq!(zone("30r/m").name, "z");
        assert_eq!(delay_ms(Duration::from_micros(1)), 1);
        assert_eq!(delay_ms(Duration::from_millis(250)), 250);
    }
}
