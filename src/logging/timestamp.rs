//! The `timestamp` of a JSON log line, `2026-11-23T02:17:07.532817Z` (UTC, microseconds), as
//! `tracing_subscriber`'s default timer writes it. The date and time of day change once a second:
//! they are formatted then and kept; each line adds only its microseconds.

use std::time::{SystemTime, UNIX_EPOCH};

/// The formatted second last seen (one per thread: see `line`).
#[derive(Default)]
pub struct Timestamps {
    second: Option<i64>,
    /// `YYYY-MM-DDTHH:MM:SS` of `second`, then the last line's `.ffffffZ`.
    text: String,
    prefix_len: usize,
}

impl Timestamps {
    /// The timestamp of `now`.
    pub fn at(&mut self, now: SystemTime) -> &str {
        let (second, micros) = unix_parts(now);
        if self.second != Some(second) {
            self.text = match chrono::DateTime::from_timestamp(second, 0) {
                Some(t) => t.format("%Y-%m-%dT%H:%M:%S").to_string(),
                None => "1970-01-01T00:00:00".to_string(), // beyond chrono's range: a broken clock
            };
            self.prefix_len = self.text.len();
            self.second = Some(second);
        }
        self.text.truncate(self.prefix_len);
        // `.` and six digits: micros + 1_000_000 has seven, the first a 1 that the dot replaces.
        let mut digits = itoa::Buffer::new();
        self.text.push('.');
        self.text.push_str(&digits.format(1_000_000 + micros)[1..]);
        self.text.push('Z');
        &self.text
    }
}

/// Whole seconds since the epoch (floored, also before 1970) and the microseconds past them.
fn unix_parts(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (i64::try_from(d.as_secs()).unwrap_or(i64::MAX), d.subsec_micros()),
        Err(before) => {
            let d = before.duration();
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            match d.subsec_nanos() {
                0 => (-secs, 0),
                n => (-secs - 1, (1_000_000_000 - n) / 1_000),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn text(ts: &mut Timestamps, t: SystemTime) -> String {
        ts.at(t).to_string()
    }

    #[test]
    fn rfc3339_with_microseconds_like_tracing() {
        let mut ts = Timestamps::default();
        let t = UNIX_EPOCH + Duration::new(1_795_400_227, 532_817_999);
        assert_eq!(text(&mut ts, t), "2026-11-23T02:17:07.532817Z");
        // Same second again (the cached prefix), then the next second and a whole one.
        assert_eq!(text(&mut ts, t + Duration::from_micros(5)), "2026-11-23T02:17:07.532822Z");
        assert_eq!(text(&mut ts, t + Duration::from_millis(500)), "2026-11-23T02:17:08.032817Z");
        assert_eq!(text(&mut ts, UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00.000000Z");
        assert_eq!(text(&mut ts, UNIX_EPOCH - Duration::from_micros(1)), "1969-12-31T23:59:59.999999Z");
    }

    #[test]
    fn matches_the_parser_replay_reads_it_with() {
        let mut ts = Timestamps::default();
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 250_000_000);
        assert_eq!(text(&mut ts, t), "2023-11-14T22:13:20.250000Z");
    }
}
