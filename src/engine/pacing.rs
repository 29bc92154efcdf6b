//! nginx's `limit_rate`: a response body sent no faster than a rate, after a free head start
//! (`limit_rate_after`). The rate is decided per request ([`rate_for`], overrides first); the
//! pace is kept per response ([`Pace`]) and says how long to wait before each chunk, so that by
//! any time `t` at most `after + rate × (t − start)` bytes have gone out — nginx's rule, with the
//! request's start as `start`. Waiting is the front door's (a timer, no thread blocked).

use std::time::{Duration, Instant};

use crate::config::{LimitRate, OverrideMatch};
use crate::keys::RequestFacts;

/// The pace for one request: the first override that matches, else the route's rate; `None`
/// when the body goes at full speed.
pub fn rate_for(limit: &LimitRate, facts: &RequestFacts<'_>) -> Option<(u64, u64)> {
    let matched = limit.overrides.iter().find(|(m, _)| match m {
        OverrideMatch::ClientIp(net) => facts.client_ip.is_some_and(|ip| net.contains(&ip)),
        OverrideMatch::Part(part, value) => part.value(facts) == *value,
    });
    let rate = match matched {
        Some((_, rate)) => *rate,
        None => limit.rate,
    };
    rate.map(|r| (r, limit.after))
}

/// One response body's pace.
#[derive(Debug, Clone)]
pub struct Pace {
    rate: u64,
    after: u64,
    started: Instant,
    sent: u64,
}

impl Pace {
    pub fn new((rate, after): (u64, u64), started: Instant) -> Self {
        Pace { rate: rate.max(1), after, started, sent: 0 }
    }

    /// Starts the clock again at `now` (when the response begins: the time spent waiting for
    /// the upstream is no head start).
    pub fn restart(&mut self, now: Instant) {
        self.started = now;
    }

    /// How long to wait, at `now`, before sending the next `len` bytes (and counts them sent).
    pub fn before(&mut self, len: usize, now: Instant) -> Option<Duration> {
        self.sent = self.sent.saturating_add(len as u64);
        let paced = self.sent.checked_sub(self.after).filter(|&b| b > 0)?;
        let due = self.started + Duration::from_secs_f64(paced as f64 / self.rate as f64);
        due.checked_duration_since(now).filter(|d| !d.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_goes_at_full_speed_for_its_head_start_then_at_the_rate() {
        let t0 = Instant::now();
        let mut pace = Pace::new((1 << 20, 1 << 20), t0);
        // The first MiB at full speed.
        assert_eq!(pace.before(512 << 10, t0), None);
        assert_eq!(pace.before(512 << 10, t0), None);
        // Then a MiB a second: 256 KiB more is due a quarter second in.
        assert_eq!(pace.before(256 << 10, t0), Some(Duration::from_millis(250)));
        // Late already (the client read slowly): no wait.
        assert_eq!(pace.before(256 << 10, t0 + Duration::from_secs(2)), None);
        // 10 MiB in all are due 9 s after the start, whatever the chunks.
        let mut pace = Pace::new((1 << 20, 1 << 20), t0);
        let mut last = None;
        for _ in 0..160 {
            last = pace.before(64 << 10, t0);
        }
        assert_eq!(last, Some(Duration::from_secs(9)));
    }
}
