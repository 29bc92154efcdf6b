//! Timestamps as logs write them, to microseconds since the Unix epoch: nginx's `$time_local`
//! (`10/Oct/2000:13:55:36 -0700`, whole seconds), `$msec` (`1700000000.123`: seconds with a
//! fraction, parsed exactly as a decimal, never through a float), and RFC 3339.

use chrono::DateTime;

const US: i64 = 1_000_000;

/// A point in time and whether the log wrote it to the whole second only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub us: u64,
    pub whole_second: bool,
}

/// nginx `$time_local` / `$time_iso8601`-less common log time: `10/Oct/2000:13:55:36 -0700`.
pub fn nginx_local(text: &str) -> Option<u64> {
    let t = DateTime::parse_from_str(text, "%d/%b/%Y:%H:%M:%S %z").ok()?;
    u64::try_from(t.timestamp()).ok()?.checked_mul(US as u64)
}

/// RFC 3339 (`2026-11-22T20:37:31.123456Z`, any offset); fractions beyond microseconds are cut.
pub fn rfc3339(text: &str) -> Option<Stamp> {
    let t = DateTime::parse_from_rfc3339(text).ok()?;
    let us = t.timestamp().checked_mul(US)?.checked_add(i64::from(t.timestamp_subsec_micros()))?;
    let whole_second = !text.contains('.');
    Some(Stamp { us: u64::try_from(us).ok()?, whole_second })
}

/// Seconds since the epoch with an optional fraction (`$msec`: `1700000000.123`), exactly.
pub fn epoch_seconds(text: &str) -> Option<Stamp> {
    let (secs, frac) = match text.split_once('.') {
        Some((s, f)) => (s, Some(f)),
        None => (text, None),
    };
    let secs = decimal(secs)?;
    let frac_us = match frac {
        None => 0,
        Some(f) if f.is_empty() || f.len() > 9 || !f.bytes().all(|b| b.is_ascii_digit()) => return None,
        // Digits past the sixth (nanoseconds) are cut, like every other time here.
        Some(f) => {
            let kept = &f[..f.len().min(6)];
            decimal(kept)? * 10u64.pow(6 - kept.len() as u32)
        }
    };
    Some(Stamp { us: secs.checked_mul(US as u64)?.checked_add(frac_us)?, whole_second: frac.is_none() })
}

/// A duration in seconds as nginx's `$request_time` writes it (`0.123`), to microseconds; `-` is none.
pub fn seconds_to_us(text: &str) -> Option<u64> {
    epoch_seconds(text).map(|s| s.us)
}

/// A `--from`/`--to` argument: RFC 3339, epoch seconds, or nginx's local time.
pub fn parse_arg(text: &str) -> Option<u64> {
    epoch_seconds(text).map(|s| s.us).or_else(|| rfc3339(text).map(|s| s.us)).or_else(|| nginx_local(text))
}

fn decimal(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Combined logs repeat the same second on thousands of lines: parse each distinct text once.
#[derive(Default)]
pub struct LocalTimeCache {
    last_text: Vec<u8>,
    last_us: u64,
}

impl LocalTimeCache {
    pub fn parse(&mut self, text: &[u8]) -> Option<u64> {
        if !self.last_text.is_empty() && self.last_text == text {
            return Some(self.last_us);
        }
        let us = nginx_local(std::str::from_utf8(text).ok()?)?;
        self.last_text.clear();
        self.last_text.extend_from_slice(text);
        self.last_us = us;
        Some(us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_local_time_with_offset() {
        // 13:55:36 at -07:00 is 20:55:36 UTC; 2000-10-10T20:55:36Z = 971211336.
        assert_eq!(nginx_local("10/Oct/2000:13:55:36 -0700"), Some(971_211_336_000_000));
        assert_eq!(nginx_local("10/Oct/2000:20:55:36 +0000"), Some(971_211_336_000_000));
        assert_eq!(nginx_local("10/Foo/2000:13:55:36 -0700"), None);
        assert_eq!(nginx_local("10/Oct/2000:13:55:36"), None);
    }

    #[test]
    fn epoch_seconds_are_exact_decimals() {
        assert_eq!(epoch_seconds("1700000000.123"), Some(Stamp { us: 1_700_000_000_123_000, whole_second: false }));
        assert_eq!(epoch_seconds("1700000000.000001").map(|s| s.us), Some(1_700_000_000_000_001));
        assert_eq!(epoch_seconds("1700000000.1234567").map(|s| s.us), Some(1_700_000_000_123_456));
        assert_eq!(epoch_seconds("1700000000"), Some(Stamp { us: 1_700_000_000_000_000, whole_second: true }));
        for bad in ["", ".5", "1.", "1e9", "-1", "1.2.3", "12a"] {
            assert_eq!(epoch_seconds(bad), None, "{bad}");
        }
        assert_eq!(seconds_to_us("0.250"), Some(250_000));
    }

    #[test]
    fn rfc3339_keeps_microseconds_and_offsets() {
        assert_eq!(
            rfc3339("2023-11-14T22:13:20.000250Z"),
            Some(Stamp { us: 1_700_000_000_000_250, whole_second: false })
        );
        assert_eq!(
            rfc3339("2023-11-14T23:13:20+01:00").map(|s| (s.us, s.whole_second)),
            Some((1_700_000_000_000_000, true))
        );
        assert_eq!(rfc3339("yesterday"), None);
    }

    #[test]
    fn arguments_take_any_of_the_forms() {
        let want = Some(1_700_000_000_000_000);
        assert_eq!(parse_arg("1700000000"), want);
        assert_eq!(parse_arg("2023-11-14T22:13:20Z"), want);
        assert_eq!(parse_arg("14/Nov/2023:22:13:20 +0000"), want);
    }

    #[test]
    fn the_cache_answers_like_the_parser() {
        let mut c = LocalTimeCache::default();
        assert_eq!(c.parse(b"10/Oct/2000:13:55:36 -0700"), Some(971_211_336_000_000));
        assert_eq!(c.parse(b"10/Oct/2000:13:55:36 -0700"), Some(971_211_336_000_000));
        assert_eq!(c.parse(b"10/Oct/2000:13:55:37 -0700"), Some(971_211_337_000_000));
        assert_eq!(c.parse(b"garbage"), None);
    }
}
