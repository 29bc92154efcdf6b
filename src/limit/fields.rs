//! A limit's items in the IETF `RateLimit-Policy` / `RateLimit` fields
//! (draft-ietf-httpapi-ratelimit-headers-10), written where both need them: once per route
//! reference when the config is compiled (`RateLimit-Policy`), and per request by the engine.

use super::LimitReq;

const SECOND_US: u64 = 1_000_000;

/// Whole seconds, rounded up.
pub fn ceil_secs(us: u64) -> u64 {
    us.div_ceil(SECOND_US)
}

/// Appends `"zone";a=1;b=2` (after ", " unless first). Written piece by piece: these fields are
/// built for every limited request, and `format!` costs several times as much.
pub fn item(out: &mut String, zone: &str, a: &str, a_value: u64, b: &str, b_value: u64) {
    if !out.is_empty() {
        out.push_str(", ");
    }
    let mut digits = itoa::Buffer::new();
    out.push('"');
    out.push_str(zone);
    out.push('"');
    out.push_str(a);
    out.push_str(digits.format(a_value));
    out.push_str(b);
    out.push_str(digits.format(b_value));
}

/// Appends the `RateLimit-Policy` item of `limit`, `"per_ip";q=21;w=3`: `q` the quota (a bucket's
/// capacity, a window's count), `w` the seconds a window lasts or an empty bucket takes to refill,
/// at least 1.
pub fn policy_item(out: &mut String, zone: &str, limit: &LimitReq) {
    let quota = limit.capacity();
    let window_us = if limit.algorithm.is_window() {
        limit.rate.period_us
    } else {
        limit.rate.time_for_us(quota as f64).ceil() as u64
    };
    item(out, zone, ";q=", quota, ";w=", ceil_secs(window_us).max(1));
}
