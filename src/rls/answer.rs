//! The engine's enforcement as Envoy's `RateLimitResponse`: the overall code, one status per
//! descriptor, and the rate-limit fields for Envoy to add to its response.
//!
//! Nothing is decided here: each descriptor's code, remaining count and reset time are read from
//! the engine's result of its zone (`Report::zones`, in the order of the plan's zones), and the
//! response fields are the ones the engine wrote for the domain's `rate_limit_headers`.

use std::time::Duration;

use super::plan::{Plan, Slot};
use super::proto::rate_limit_response::rate_limit::Unit;
use super::proto::rate_limit_response::{Code, RateLimit};
use super::proto::{DescriptorStatus, HeaderValue, RateLimitResponse};
use crate::config::FailurePolicy;
use crate::engine::Report;
use crate::limit::LimitReq;
use crate::store::KeyedZone;

/// The request header that carries a `delay` verdict's wait: Envoy cannot hold a request, so a
/// delay is answered OK and the wait is told to the upstream.
pub const DELAY_HEADER: &str = "x-weir-delay-ms";

/// `limit_remaining` of an `unlimited` descriptor: envoyproxy/ratelimit's MaxUint32.
pub const UNLIMITED_REMAINING: u32 = u32::MAX;

/// How the decision that counts answered the call as a whole.
pub struct Call {
    pub over_limit: bool,
    /// The rate-limit fields the engine wrote for the domain's `rate_limit_headers`
    /// (`Retry-After` included when over the limit).
    pub fields: Vec<(&'static str, String)>,
    /// A `delay` verdict's wait (Envoy cannot hold a request: it is told to the upstream).
    pub delay: Duration,
}

/// One zone's code and its `RateLimit` numbers (`r`, `t` in seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneAnswer {
    pub code: Code,
    pub counts: Option<(u64, u64)>,
}

/// Each zone of the engine's `report` as answered (in the order of the zones decided), the call
/// refused (`over_limit`) or not.
pub fn zone_answers(report: &Report<'_>, over_limit: bool) -> Vec<ZoneAnswer> {
    let denied_by_policy = over_limit && report.fallback == Some(FailurePolicy::Deny);
    report
        .zones
        .iter()
        .map(|z| {
            let code = match z.counts {
                // Dry-run zones never refuse and report no counts.
                _ if z.dry_run => Code::Ok,
                // `on_error = "deny"`: no zone was decided, every one answers OVER_LIMIT.
                None if denied_by_policy => Code::OverLimit,
                // Its own zone refused: a zone that another one rejected was not charged.
                _ if z.refused() => Code::OverLimit,
                _ => Code::Ok,
            };
            let counts = z.counts.filter(|_| !z.dry_run).map(|c| (c.remaining, c.reset_secs));
            ZoneAnswer { code, counts }
        })
        .collect()
}

/// The response to one request, from its plan, its zones' answers (`zone_answers`, or the
/// soft-limit decision's) and how the decision that counts answered the call.
pub fn respond(plan: &Plan<'_>, zones: &[ZoneAnswer], call: &Call) -> RateLimitResponse {
    let statuses = plan
        .slots
        .iter()
        .map(|slot| match slot {
            Slot::Unmatched => DescriptorStatus { code: Code::Ok.into(), ..DescriptorStatus::default() },
            Slot::Unlimited => DescriptorStatus {
                code: Code::Ok.into(),
                limit_remaining: UNLIMITED_REMAINING,
                ..DescriptorStatus::default()
            },
            Slot::Limited { zones: on, name, .. } => {
                // The zone that speaks for the descriptor: the first over its limit, else the one
                // with the least left (several zones on one rule are decided together).
                let Some(&i) = on
                    .iter()
                    .find(|&&i| zones[i].code == Code::OverLimit)
                    .or_else(|| on.iter().min_by_key(|&&i| zones[i].counts.map_or(u64::MAX, |(r, _)| r)))
                else {
                    return DescriptorStatus { code: Code::Ok.into(), ..DescriptorStatus::default() };
                };
                let answer = &zones[i];
                let mut limit = current_limit(&plan.keyed[i]);
                if let Some(name) = name {
                    limit.name = (*name).to_string();
                }
                // Over the limit with no verdict (`on_error = "deny"`): the `Retry-After: 1` it sends.
                let reset = answer.counts.map(|(_, t)| t).or((answer.code == Code::OverLimit).then_some(1));
                DescriptorStatus {
                    code: answer.code.into(),
                    current_limit: Some(limit),
                    limit_remaining: answer.counts.map_or(0, |(r, _)| u32::try_from(r).unwrap_or(u32::MAX)),
                    duration_until_reset: reset
                        .map(|t| prost_types::Duration { seconds: i64::try_from(t).unwrap_or(i64::MAX), nanos: 0 }),
                    quota: None,
                }
            }
        })
        .collect();

    // The fields the engine wrote for the domain's `rate_limit_headers`, `Retry-After` included.
    let response_headers = call.fields.iter().map(|(name, value)| header(name, value)).collect();
    let mut request_headers = Vec::new();
    if !call.delay.is_zero() {
        request_headers.push(header(DELAY_HEADER, &delay_ms(call.delay).to_string()));
    }
    RateLimitResponse {
        overall_code: if call.over_limit { Code::OverLimit } else { Code::Ok }.into(),
        statuses,
        response_headers_to_add: response_headers,
        request_headers_to_add: request_headers,
        ..RateLimitResponse::default()
    }
}

/// The response to a request with no zone to decide: OK, unlimited descriptors with
/// envoyproxy/ratelimit's MaxUint32 remaining.
pub fn undecided(plan: &Plan<'_>) -> RateLimitResponse {
    let statuses = plan
        .slots
        .iter()
        .map(|slot| DescriptorStatus {
            code: Code::Ok.into(),
            limit_remaining: if *slot == Slot::Unlimited { UNLIMITED_REMAINING } else { 0 },
            ..DescriptorStatus::default()
        })
        .collect();
    RateLimitResponse { overall_code: Code::Ok.into(), statuses, ..RateLimitResponse::default() }
}

/// A wait in whole milliseconds, rounded up (a 0 would say "no wait").
fn delay_ms(wait: Duration) -> u64 {
    u64::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(u64::MAX).max(1)
}

fn header(key: &str, value: &str) -> HeaderValue {
    HeaderValue { key: key.to_string(), value: value.to_string(), raw_value: Vec::new() }
}

/// A zone's limit in Envoy's terms: requests per second, minute, hour, day, week (7 days), month
/// (30 days) or year (365 days) when the zone's period is one of those (envoyproxy/ratelimit's
/// units), else its rate per second (rounded down, at least 1 when nonzero); `name` is the zone
/// (the rule's name replaces it when it has one).
pub fn current_limit(zone: &KeyedZone<'_>) -> RateLimit {
    const DAY: u64 = 86_400_000_000;
    let LimitReq { rate, .. } = zone.limit;
    let (count, unit) = match rate.period_us {
        1_000_000 => (rate.count, Unit::Second),
        60_000_000 => (rate.count, Unit::Minute),
        3_600_000_000 => (rate.count, Unit::Hour),
        DAY => (rate.count, Unit::Day),
        p if p == 7 * DAY => (rate.count, Unit::Week),
        p if p == 30 * DAY => (rate.count, Unit::Month),
        p if p == 365 * DAY => (rate.count, Unit::Year),
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
