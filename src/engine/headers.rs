//! What a client is told about its limits: IETF draft-ietf-httpapi-ratelimit-headers-10
//! `RateLimit-Policy` / `RateLimit` fields, `Retry-After`, and the short JSON rejection body.
//!
//! For a bucket the quota `q` is its capacity (`burst + 1` requests) and `w` the seconds an empty
//! bucket needs to refill it; for a window algorithm `q` is the count per window and `w` the
//! window. `r` is what could pass right now and `t` the seconds until the quota is whole again (or,
//! when rejected, until the request would pass).

use crate::config::ZoneLimit;
use crate::limit::fields::{ceil_secs, item, policy_item};
use crate::limit::{Verdict, ZoneOutcome};
use crate::store::KeyedZone;

/// `RateLimit-Policy: "per_ip";q=21;w=3` for the zones of a route whose references are
/// `configured` (`Route::limits`): each zone's item as compiled, unless a key's override changed
/// its limit.
pub fn policy(configured: &[ZoneLimit], zones: &[KeyedZone<'_>]) -> String {
    let mut out = String::with_capacity(32 * zones.len());
    for z in zones {
        match configured.get(z.reference) {
            Some(configured) if configured.limit == z.limit => {
                if !out.is_empty() {
                    out.push_str(", ");
                }
                out.push_str(&configured.policy);
            }
            _ => policy_item(&mut out, z.zone, &z.limit),
        }
    }
    out
}

/// `RateLimit: "per_ip";r=17;t=1`
pub fn remaining(zones: &[KeyedZone<'_>], verdict: &Verdict) -> String {
    let mut out = String::with_capacity(32 * zones.len());
    for (z, out_z) in zones.iter().zip(&verdict.zones) {
        let (r, t) = zone_remaining(z, verdict.admitted, out_z);
        item(&mut out, z.zone, ";r=", r, ";t=", t);
    }
    out
}

/// One zone's `r` and `t`: what could pass right now, and the whole seconds until its quota is
/// whole again (when it rejected: until the request would pass). `request_admitted` is the
/// verdict of the zone's whole group.
pub fn zone_remaining(zone: &KeyedZone<'_>, request_admitted: bool, out: &ZoneOutcome) -> (u64, u64) {
    let (r, t_us) = match (request_admitted, out.admitted) {
        (true, _) => (out.remaining, out.reset_us),
        // Rejected here: nothing left until the retry time.
        (false, false) => (0, out.retry_after_us.unwrap_or(out.reset_us)),
        // Another zone rejected, so this one was not charged.
        (false, true) => (out.remaining + zone.cost, out.reset_us),
    };
    (r, ceil_secs(t_us))
}

/// `X-RateLimit-Limit/-Remaining/-Reset` (draft-polli-03 style, as many clients still expect) for
/// the tightest zone: the one with the fewest requests left.
pub fn legacy(zones: &[KeyedZone<'_>], verdict: &Verdict) -> Vec<(&'static str, String)> {
    let tightest = zones.iter().zip(&verdict.zones).min_by_key(|(_, out)| {
        if verdict.admitted || !out.admitted {
            if out.admitted {
                out.remaining
            } else {
                0
            }
        } else {
            u64::MAX
        }
    });
    let Some((zone, out)) = tightest else {
        return Vec::new();
    };
    let (r, t_us) =
        if out.admitted { (out.remaining, out.reset_us) } else { (0, out.retry_after_us.unwrap_or(out.reset_us)) };
    vec![
        ("X-RateLimit-Limit", zone.limit.capacity().to_string()),
        ("X-RateLimit-Remaining", r.to_string()),
        ("X-RateLimit-Reset", ceil_secs(t_us).to_string()),
    ]
}

/// Whole seconds, rounded up, at least 1 (a 0 would invite an immediate retry storm).
pub fn retry_after_secs(retry_after_us: u64) -> u64 {
    ceil_secs(retry_after_us).max(1)
}

/// The zone whose rejection sets the retry time (the latest one), for the body and logs.
pub fn rejecting_zone<'a>(zones: &[KeyedZone<'a>], verdict: &Verdict) -> Option<&'a str> {
    zones
        .iter()
        .zip(&verdict.zones)
        .filter(|(_, out)| !out.admitted)
        .max_by_key(|(_, out)| out.retry_after_us.unwrap_or(u64::MAX))
        .map(|(z, _)| z.zone)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{decide_all, Algorithm, DelayPolicy, LimitReq, Rate, ZoneInput};

    const T0: u64 = 1_700_000_000_000_000;

    #[test]
    fn formats_draft_10_fields() {
        let limit = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("10r/s").unwrap(),
            burst: 20,
            delay: DelayPolicy::NoDelay,
        };
        let zones = [KeyedZone::new("per_ip", "k", limit, 1)];
        assert_eq!(policy(&[], &zones), "\"per_ip\";q=21;w=3");
        // The item compiled for the route's reference, unless an override changed the limit.
        let configured =
            [ZoneLimit { zone: 0, limit, dry_run: false, policy: "compiled".into(), conditions: Default::default() }];
        assert_eq!(policy(&configured, &zones), "compiled");
        let overridden = [KeyedZone::new("per_ip", "k", LimitReq { burst: 4, ..limit }, 1), zones[0].clone()];
        assert_eq!(policy(&configured, &overridden), "\"per_ip\";q=5;w=1, compiled");
        let v = decide_all(&[ZoneInput { limit: &limit, state: None, cost: 1 }], T0);
        assert_eq!(remaining(&zones, &v), "\"per_ip\";r=20;t=1");
    }

    #[test]
    fn rejected_zone_reports_zero_and_retry() {
        let limit = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("1r/m").unwrap(),
            burst: 0,
            delay: DelayPolicy::NoDelay,
        };
        let first = decide_all(&[ZoneInput { limit: &limit, state: None, cost: 1 }], T0);
        let v = decide_all(&[ZoneInput { limit: &limit, state: Some(first.zones[0].next.clone()), cost: 1 }], T0 + 1);
        let zones = [KeyedZone::new("slow", "k", limit, 1)];
        assert!(!v.admitted);
        assert_eq!(remaining(&zones, &v), "\"slow\";r=0;t=60");
        assert_eq!(retry_after_secs(v.retry_after_us.unwrap()), 60);
        assert_eq!(rejecting_zone(&zones, &v), Some("slow"));
        assert_eq!(policy(&[], &zones), "\"slow\";q=1;w=60");
    }

    #[test]
    fn legacy_fields_name_the_tightest_zone() {
        let loose = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("10r/s").unwrap(),
            burst: 20,
            delay: DelayPolicy::NoDelay,
        };
        let tight = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("1r/s").unwrap(),
            burst: 2,
            delay: DelayPolicy::NoDelay,
        };
        let zones = [KeyedZone::new("loose", "k", loose, 1), KeyedZone::new("tight", "k", tight, 1)];
        let v = decide_all(
            &[ZoneInput { limit: &loose, state: None, cost: 1 }, ZoneInput { limit: &tight, state: None, cost: 1 }],
            T0,
        );
        assert_eq!(
            legacy(&zones, &v),
            vec![
                ("X-RateLimit-Limit", "3".to_string()),
                ("X-RateLimit-Remaining", "2".to_string()),
                ("X-RateLimit-Reset", "1".to_string())
            ]
        );
    }

    #[test]
    fn retry_after_is_at_least_one_second() {
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1_000_001), 2);
    }
}
