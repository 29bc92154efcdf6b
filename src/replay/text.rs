//! Limits, rates, durations and keys as the report and the TOML snippet write them.

use std::fmt::Write as _;

use crate::limit::{Algorithm, DelayPolicy, LimitReq, Rate};

/// `2r/s`, `600r/m`, `5r/h`, else `N per 10s`.
pub fn rate_text(rate: &Rate) -> String {
    match rate.period_us {
        1_000_000 => format!("{}r/s", rate.count),
        60_000_000 => format!("{}r/m", rate.count),
        3_600_000_000 => format!("{}r/h", rate.count),
        p => format!("{} per {}", rate.count, duration_text(p)),
    }
}

pub fn duration_text(us: u64) -> String {
    if us.is_multiple_of(1_000_000) {
        format!("{}s", us / 1_000_000)
    } else {
        format!("{}ms", us / 1000)
    }
}

/// A reference's limit in one line: `2r/s burst=5 nodelay`, `50 per 10s (fixed_window)`.
pub fn limit_text(l: &LimitReq) -> String {
    if l.algorithm.is_window() {
        return format!("{} per {} ({})", l.rate.count, duration_text(l.rate.period_us), l.algorithm.as_str());
    }
    let mut s = format!("{} burst={}", rate_text(&l.rate), l.burst);
    match (l.algorithm, l.delay) {
        (Algorithm::TokenBucket, _) => s.push_str(" (token_bucket)"),
        (_, DelayPolicy::NoDelay) => s.push_str(" nodelay"),
        (_, DelayPolicy::After(0)) => {}
        (_, DelayPolicy::After(d)) => {
            let _ = write!(s, " delay={d}");
        }
    }
    s
}

/// A key as text: bytes that are not UTF-8 escaped, composite parts joined by `|`.
pub fn key_text(key: &[u8]) -> String {
    key.escape_ascii().to_string().replace("\\x1f", "|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_rates_and_keys_as_text() {
        let l = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("600r/m").unwrap(),
            burst: 20,
            delay: DelayPolicy::After(10),
        };
        assert_eq!(limit_text(&l), "600r/m burst=20 delay=10");
        let w = LimitReq {
            algorithm: Algorithm::FixedWindow,
            rate: Rate { count: 50, period_us: 10_000_000 },
            burst: 0,
            delay: DelayPolicy::After(0),
        };
        assert_eq!(limit_text(&w), "50 per 10s (fixed_window)");
        assert_eq!(rate_text(&Rate { count: 3, period_us: 1_500_000 }), "3 per 1500ms");
        assert_eq!(key_text(b"192.0.2.1\x1fk\xff"), "192.0.2.1|k\\xff");
    }
}
