//! Rates in nginx's notation: `10r/s`, `600r/m`, `5r/h`, kept exact as "count per period".

use std::fmt;

/// `count` requests per `period_us` microseconds. Never normalised, so `1r/m` stays exact
/// (nginx truncates it to 16 milli-requests per second, i.e. one request per 62.5 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u64,
    pub period_us: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    #[error("expected a rate like \"10r/s\", \"600r/m\" or \"5r/h\", got {0:?}")]
    Syntax(String),
    #[error("the rate must be at least 1 request per period, got {0:?}")]
    Zero(String),
    #[error("rate {0:?} is too high (at most 1000000 requests per second)")]
    TooHigh(String),
}

const SECOND_US: u64 = 1_000_000;
/// Above this a single key would need sub-microsecond spacing, which the microsecond clock cannot express.
const MAX_PER_SECOND: u64 = 1_000_000;

impl Rate {
    pub fn parse(text: &str) -> Result<Rate, RateError> {
        let syntax = || RateError::Syntax(text.to_string());
        let (count, unit) = text.trim().split_once("r/").ok_or_else(syntax)?;
        if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
            return Err(syntax());
        }
        let count: u64 = count.parse().map_err(|_| syntax())?;
        let period_us = match unit {
            "s" => SECOND_US,
            "m" => 60 * SECOND_US,
            "h" => 3600 * SECOND_US,
            _ => return Err(syntax()),
        };
        if count == 0 {
            return Err(RateError::Zero(text.to_string()));
        }
        if count.saturating_mul(SECOND_US) / period_us > MAX_PER_SECOND {
            return Err(RateError::TooHigh(text.to_string()));
        }
        Ok(Rate { count, period_us })
    }

    /// Microseconds needed for `requests` (possibly fractional) to drain: `requests / rate`.
    pub fn time_for_us(&self, requests: f64) -> f64 {
        requests * self.period_us as f64 / self.count as f64
    }

    /// Requests drained in `elapsed_us`: `elapsed * rate`. The operation order is mirrored by the
    /// Lua scripts so both sides round identically.
    pub fn drained_in(&self, elapsed_us: u64) -> f64 {
        (elapsed_us as f64 * self.count as f64) / self.period_us as f64
    }

    /// The period in whole seconds (1, 60 or 3600).
    pub fn period_secs(&self) -> u64 {
        self.period_us / SECOND_US
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.period_us {
            SECOND_US => write!(f, "{}r/s", self.count),
            p if p == 60 * SECOND_US => write!(f, "{}r/m", self.count),
            p if p == 3600 * SECOND_US => write!(f, "{}r/h", self.count),
            // A window given as `window` + `limit`.
            p => write!(f, "{} per {}ms", self.count, p / 1000),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nginx_units_exactly() {
        assert_eq!(Rate::parse("10r/s").unwrap(), Rate { count: 10, period_us: 1_000_000 });
        assert_eq!(Rate::parse("600r/m").unwrap(), Rate { count: 600, period_us: 60_000_000 });
        assert_eq!(Rate::parse("5r/h").unwrap(), Rate { count: 5, period_us: 3_600_000_000 });
        // 1r/m is one request per 60 s, not nginx's 62.5 s.
        assert_eq!(Rate::parse("1r/m").unwrap().time_for_us(1.0), 60_000_000.0);
    }

    #[test]
    fn rejects_bad_rates() {
        for bad in ["10/s", "10r/d", "r/s", "-1r/s", "1.5r/s", "", "10 r/s", "10r/"] {
            assert!(matches!(Rate::parse(bad), Err(RateError::Syntax(_))), "{bad}");
        }
        assert!(matches!(Rate::parse("0r/s"), Err(RateError::Zero(_))));
        assert!(matches!(Rate::parse("2000000r/s"), Err(RateError::TooHigh(_))));
        assert!(Rate::parse("99999999999999999999999r/s").is_err());
    }

    #[test]
    fn displays_as_written() {
        assert_eq!(Rate::parse("600r/m").unwrap().to_string(), "600r/m");
    }
}
