//! When the health loop starts each upstream's active health check and DNS lookup round,
//! decided without a clock: the loop gives the time and which of its tasks still run, and
//! starts what [`Schedule::due`] says. So the timing is tested on a simulated clock (`tests`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One kept upstream as the health loop sees it at a tick.
#[derive(Debug, Clone)]
pub(super) struct Watched {
    pub name: String,
    /// `health_check.interval`, when the upstream has active checks.
    pub check_every: Option<Duration>,
    /// `resolve_interval`, when one of its servers is a host name.
    pub lookup_every: Option<Duration>,
    /// Its previous check is still running.
    pub checking: bool,
    /// Its previous lookup round is still running.
    pub looking_up: bool,
}

/// What to start for one upstream now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Start {
    pub check: bool,
    pub lookup: bool,
}

/// When each upstream's next check and lookup are due.
#[derive(Debug, Default)]
pub(super) struct Schedule {
    check_due: HashMap<String, Instant>,
    lookup_due: HashMap<String, Instant>,
}

impl Schedule {
    /// At `now`, with `upstreams` the ones kept now: what to start for each (in their order). A
    /// new upstream is checked at once and looked up `lookup_every` after it appeared (it was
    /// resolved when it was configured); the next check or lookup is due its interval after the
    /// previous one started, and waits while that one still runs: one at a time per upstream.
    pub(super) fn due(&mut self, now: Instant, upstreams: &[Watched]) -> Vec<Start> {
        // Upstreams a reload removed start afresh if they come back.
        let kept = |name: &String| upstreams.iter().any(|u| &u.name == name);
        self.check_due.retain(|name, _| kept(name));
        self.lookup_due.retain(|name, _| kept(name));
        upstreams.iter().map(|upstream| self.due_one(now, upstream)).collect()
    }

    fn due_one(&mut self, now: Instant, upstream: &Watched) -> Start {
        let mut start = Start::default();
        if let Some(every) = upstream.check_every {
            let due = self.check_due.get(&upstream.name).is_none_or(|t| *t <= now);
            if !upstream.checking && due {
                self.check_due.insert(upstream.name.clone(), now + every);
                start.check = true;
            }
        }
        if let Some(every) = upstream.lookup_every {
            let due = self.lookup_due.entry(upstream.name.clone()).or_insert(now + every);
            if !upstream.looking_up && *due <= now {
                *due = now + every;
                start.lookup = true;
            }
        }
        start
    }
}

#[cfg(test)]
mod tests {
    //! On a simulated clock: every time is `T0` plus milliseconds, given by the test.

    use std::sync::OnceLock;

    use super::*;

    fn at(ms: u64) -> Instant {
        static T0: OnceLock<Instant> = OnceLock::new();
        *T0.get_or_init(Instant::now) + Duration::from_millis(ms)
    }

    const CHECK: Start = Start { check: true, lookup: false };
    const LOOKUP: Start = Start { check: false, lookup: true };
    const NOTHING: Start = Start { check: false, lookup: false };

    /// An upstream checked every second, no host names, nothing running.
    fn checked(name: &str) -> Watched {
        Watched {
            name: name.into(),
            check_every: Some(Duration::from_secs(1)),
            lookup_every: None,
            checking: false,
            looking_up: false,
        }
    }

    /// An upstream with host names looked up every 5 s, no active checks, nothing running.
    fn named(name: &str) -> Watched {
        Watched { check_every: None, lookup_every: Some(Duration::from_secs(5)), ..checked(name) }
    }

    fn running(mut u: Watched) -> Watched {
        u.checking = true;
        u.looking_up = true;
        u
    }

    #[test]
    fn a_new_upstream_is_checked_at_once_then_every_interval_after_the_previous_start() {
        let mut s = Schedule::default();
        let api = [checked("api")];
        assert_eq!(s.due(at(0), &api), [CHECK], "checked at once, without waiting for traffic");
        assert_eq!(s.due(at(50), &api), [NOTHING]);
        assert_eq!(s.due(at(999), &api), [NOTHING], "not before the interval");
        assert_eq!(s.due(at(1000), &api), [CHECK]);
        // A late tick: the next is due an interval after this start, not after the due time.
        assert_eq!(s.due(at(2300), &api), [CHECK]);
        assert_eq!(s.due(at(3000), &api), [NOTHING]);
        assert_eq!(s.due(at(3300), &api), [CHECK]);
    }

    #[test]
    fn never_two_checks_at_once_for_one_upstream() {
        let mut s = Schedule::default();
        assert_eq!(s.due(at(0), &[checked("api")]), [CHECK]);
        // The check outlasts its interval: none is started beside it.
        for ms in [1000, 1500, 4000] {
            assert_eq!(s.due(at(ms), &[running(checked("api"))]), [NOTHING], "at {ms} ms");
        }
        // Done: the overdue check starts at once, and the next is due an interval later.
        assert_eq!(s.due(at(4050), &[checked("api")]), [CHECK]);
        assert_eq!(s.due(at(5049), &[checked("api")]), [NOTHING]);
        assert_eq!(s.due(at(5050), &[checked("api")]), [CHECK]);
    }

    #[test]
    fn each_upstream_keeps_its_own_schedule() {
        let mut s = Schedule::default();
        let fast = Watched { check_every: Some(Duration::from_millis(300)), ..checked("fast") };
        assert_eq!(s.due(at(0), &[checked("api"), fast.clone()]), [CHECK, CHECK]);
        assert_eq!(s.due(at(300), &[checked("api"), fast.clone()]), [NOTHING, CHECK]);
        assert_eq!(s.due(at(600), &[checked("api"), running(fast.clone())]), [NOTHING, NOTHING]);
        assert_eq!(s.due(at(1000), &[checked("api"), fast]), [CHECK, CHECK]);
    }

    #[test]
    fn a_removed_upstream_is_forgotten_and_checked_at_once_when_it_comes_back() {
        let mut s = Schedule::default();
        assert_eq!(s.due(at(0), &[checked("api"), checked("other")]), [CHECK, CHECK]);
        assert_eq!(s.due(at(200), &[checked("other")]), [NOTHING], "api removed by a reload");
        // Back before its old due time: it starts afresh, at once.
        assert_eq!(s.due(at(400), &[checked("api"), checked("other")]), [CHECK, NOTHING]);
        assert_eq!(s.due(at(1000), &[checked("api"), checked("other")]), [NOTHING, CHECK]);
        assert_eq!(s.due(at(1400), &[checked("api"), checked("other")]), [CHECK, NOTHING]);
    }

    #[test]
    fn checks_turned_off_by_a_reload_start_nothing_and_resume_when_turned_on() {
        let mut s = Schedule::default();
        let off = Watched { check_every: None, ..checked("api") };
        assert_eq!(s.due(at(0), &[checked("api")]), [CHECK]);
        assert_eq!(s.due(at(2000), std::slice::from_ref(&off)), [NOTHING]);
        assert_eq!(s.due(at(3000), &[checked("api")]), [CHECK], "overdue: at once");
    }

    #[test]
    fn host_names_are_looked_up_an_interval_after_the_upstream_appears_one_round_at_a_time() {
        let mut s = Schedule::default();
        assert_eq!(s.due(at(0), &[named("api")]), [NOTHING], "resolved when it was configured");
        assert_eq!(s.due(at(4999), &[named("api")]), [NOTHING]);
        assert_eq!(s.due(at(5000), &[named("api")]), [LOOKUP]);
        // A slow resolver: the next round waits for this one.
        assert_eq!(s.due(at(10_000), &[running(named("api"))]), [NOTHING]);
        assert_eq!(s.due(at(12_000), &[named("api")]), [LOOKUP]);
        assert_eq!(s.due(at(16_999), &[named("api")]), [NOTHING]);
        assert_eq!(s.due(at(17_000), &[named("api")]), [LOOKUP]);
        // Removed and back: an interval from its return.
        assert_eq!(s.due(at(18_000), &[]), Vec::<Start>::new());
        assert_eq!(s.due(at(19_000), &[named("api")]), [NOTHING]);
        assert_eq!(s.due(at(23_999), &[named("api")]), [NOTHING]);
        assert_eq!(s.due(at(24_000), &[named("api")]), [LOOKUP]);
    }

    #[test]
    fn checks_and_lookups_of_one_upstream_are_scheduled_apart() {
        let mut s = Schedule::default();
        let both = Watched { lookup_every: Some(Duration::from_secs(5)), ..checked("api") };
        let checking = Watched { checking: true, ..both.clone() };
        assert_eq!(s.due(at(0), std::slice::from_ref(&both)), [CHECK]);
        // A check still running does not hold back the lookup, nor the other way round.
        assert_eq!(s.due(at(5000), std::slice::from_ref(&checking)), [LOOKUP]);
        let looking_up = Watched { looking_up: true, ..both.clone() };
        assert_eq!(s.due(at(5100), std::slice::from_ref(&looking_up)), [CHECK]);
        assert_eq!(s.due(at(10_000), std::slice::from_ref(&both)), [Start { check: true, lookup: true }]);
    }
}
