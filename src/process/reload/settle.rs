//! When a change of the config file is complete, decided without a clock or a file system: the
//! watcher's thread feeds [`Settling`] the file events, the times it waits and the content it
//! reads, and does what [`Next`] says. The times are given, so the decision is tested on a
//! simulated clock (see `tests` below).

use std::time::{Duration, Instant};

use crate::fswatch::Change;

/// Editors and ConfigMap updates produce bursts of events; wait for this much quiet first.
pub(super) const DEBOUNCE: Duration = Duration::from_millis(200);
/// A directory that never stops changing must not postpone a reload forever.
pub(super) const MAX_DEBOUNCE: Duration = Duration::from_secs(1);
/// The file's content must read the same twice this far apart before it is applied.
pub(super) const STABLE_FOR: Duration = Duration::from_millis(300);
/// A file written and still open (no close after the last write) is not applied until it is
/// closed — or, in case the close was missed, once it has not changed for this long.
pub(super) const MAX_OPEN_WAIT: Duration = Duration::from_secs(30);

/// What the watcher does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Next {
    /// Wait for the next event, or until this time: then [`Settling::waited`].
    Wait(Instant),
    /// As [`Next::Wait`]: the file read the same twice but its writer has not closed it. Only
    /// the first time, so that it is logged once.
    WaitForClose(Instant),
    /// Read the file now and hand its content to [`Settling::read`].
    Read,
    /// The change is complete: apply this content (`None`: the file could not be read).
    Apply {
        content: Option<Vec<u8>>,
        /// False when its writer never closed it and [`MAX_OPEN_WAIT`] ran out.
        closed: bool,
    },
}

/// Where a round of settling is: quiet, then the content read twice [`STABLE_FOR`] apart.
#[derive(Debug)]
enum Phase {
    /// Waiting for [`DEBOUNCE`] without events, but no later than `deadline`.
    Quiet { quiet_until: Instant, deadline: Instant },
    /// Quiet: the content is wanted.
    ReadFirst,
    /// Read once; waiting until `until` to read again. `moved`: an event came meanwhile.
    Stable { first: Option<Vec<u8>>, until: Instant, moved: bool },
    /// Time to read again.
    ReadAgain { first: Option<Vec<u8>>, moved: bool },
    /// Settled: what to apply. Anything after it changes nothing.
    Settled { content: Option<Vec<u8>>, closed: bool },
}

/// One change of the file being settled, from its first event to the content to apply.
#[derive(Debug)]
pub(super) struct Settling {
    phase: Phase,
    /// A write not yet followed by a close: the writer may still be at it.
    open_writer: bool,
    /// When the file last changed (an event, or different content).
    last_change: Instant,
    /// [`Next::WaitForClose`] was given.
    told_open: bool,
}

impl Settling {
    /// `first` is the event that started it, at `now`.
    pub(super) fn start(first: Change, now: Instant) -> (Self, Next) {
        let mut settling = Settling {
            phase: Phase::ReadFirst,
            open_writer: first == Change::Written,
            last_change: now,
            told_open: false,
        };
        let next = settling.new_round(now);
        (settling, next)
    }

    /// An event about the file at `now`.
    pub(super) fn event(&mut self, change: Change, now: Instant) -> Next {
        if matches!(self.phase, Phase::Settled { .. }) {
            return self.after(now);
        }
        match change {
            Change::Written => self.open_writer = true,
            Change::Closed => self.open_writer = false,
            Change::Replaced => {}
        }
        match &mut self.phase {
            Phase::Quiet { quiet_until, .. } => {
                *quiet_until = now + DEBOUNCE;
                self.last_change = now;
            }
            Phase::Stable { moved, .. } | Phase::ReadAgain { moved, .. } => *moved = true,
            // The watcher reads before it waits again, so no event comes here; were one to
            // come, the quiet period starts over.
            Phase::ReadFirst => {
                self.last_change = now;
                return self.new_round(now);
            }
            Phase::Settled { .. } => {}
        }
        self.after(now)
    }

    /// No event came until `now`.
    pub(super) fn waited(&mut self, now: Instant) -> Next {
        self.after(now)
    }

    /// The file's content at `now` (`None`: it could not be read), after [`Next::Read`].
    pub(super) fn read(&mut self, content: Option<Vec<u8>>, now: Instant) -> Next {
        match std::mem::replace(&mut self.phase, Phase::ReadFirst) {
            Phase::ReadFirst => {
                self.phase = Phase::Stable { first: content, until: now + STABLE_FOR, moved: false };
                self.after(now)
            }
            Phase::ReadAgain { first, moved } => {
                if moved || first != content {
                    self.last_change = now;
                    return self.new_round(now);
                }
                if self.open_writer && now.saturating_duration_since(self.last_change) < MAX_OPEN_WAIT {
                    let next = self.new_round(now);
                    return match next {
                        Next::Wait(until) if !std::mem::replace(&mut self.told_open, true) => Next::WaitForClose(until),
                        next => next,
                    };
                }
                self.phase = Phase::Settled { content, closed: !self.open_writer };
                self.after(now)
            }
            // Not asked for: nothing changes.
            phase => {
                self.phase = phase;
                self.after(now)
            }
        }
    }

    /// Another round: quiet first, but never more than [`MAX_DEBOUNCE`] from now.
    fn new_round(&mut self, now: Instant) -> Next {
        self.phase = Phase::Quiet { quiet_until: now + DEBOUNCE, deadline: now + MAX_DEBOUNCE };
        self.after(now)
    }

    /// What is next at `now` in the current phase (moving on when its time has come).
    fn after(&mut self, now: Instant) -> Next {
        let (phase, next) = match std::mem::replace(&mut self.phase, Phase::ReadFirst) {
            Phase::Quiet { quiet_until, deadline } => {
                let until = quiet_until.min(deadline);
                if now < until {
                    (Phase::Quiet { quiet_until, deadline }, Next::Wait(until))
                } else {
                    (Phase::ReadFirst, Next::Read)
                }
            }
            Phase::Stable { first, until, moved } => {
                if now < until {
                    (Phase::Stable { first, until, moved }, Next::Wait(until))
                } else {
                    (Phase::ReadAgain { first, moved }, Next::Read)
                }
            }
            phase @ (Phase::ReadFirst | Phase::ReadAgain { .. }) => (phase, Next::Read),
            Phase::Settled { content, closed } => {
                let next = Next::Apply { content: content.clone(), closed };
                (Phase::Settled { content, closed }, next)
            }
        };
        self.phase = phase;
        next
    }
}

#[cfg(test)]
mod tests {
    //! On a simulated clock: every time is `T0` plus milliseconds, given by the test.

    use std::sync::OnceLock;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use Change::{Closed, Replaced, Written};

    fn at(ms: u64) -> Instant {
        static T0: OnceLock<Instant> = OnceLock::new();
        *T0.get_or_init(Instant::now) + Duration::from_millis(ms)
    }

    fn text(s: &str) -> Option<Vec<u8>> {
        Some(s.as_bytes().to_vec())
    }

    fn apply(s: &str) -> Next {
        Next::Apply { content: text(s), closed: true }
    }

    /// Reads `content` at `ms` and waits out what follows with no event, until the next read.
    fn read_then_wait(s: &mut Settling, content: Option<Vec<u8>>, ms: u64) -> Next {
        match s.read(content, at(ms)) {
            Next::Wait(until) | Next::WaitForClose(until) => {
                let next = s.waited(until);
                assert_eq!(next, Next::Read, "nothing but time passed until {until:?}");
                next
            }
            next => next,
        }
    }

    #[test]
    fn quiet_period_restarts_on_each_event_then_the_content_is_read_twice_stable_for_apart() {
        let (mut s, next) = Settling::start(Replaced, at(0));
        assert_eq!(next, Next::Wait(at(200)));
        assert_eq!(s.event(Replaced, at(150)), Next::Wait(at(350)));
        assert_eq!(s.event(Replaced, at(300)), Next::Wait(at(500)));
        assert_eq!(s.waited(at(499)), Next::Wait(at(500)), "not quiet long enough yet");
        assert_eq!(s.waited(at(500)), Next::Read);
        assert_eq!(s.read(text("a"), at(500)), Next::Wait(at(800)));
        assert_eq!(s.waited(at(799)), Next::Wait(at(800)));
        assert_eq!(s.waited(at(800)), Next::Read);
        assert_eq!(s.read(text("a"), at(800)), apply("a"));
        // Settled: later inputs change nothing.
        assert_eq!(s.event(Written, at(900)), apply("a"));
    }

    #[test]
    fn max_debounce_caps_a_stream_of_events() {
        let (mut s, _) = Settling::start(Replaced, at(0));
        for ms in (100..=800).step_by(100) {
            assert_eq!(s.event(Replaced, at(ms)), Next::Wait(at(ms + 200)), "at {ms} ms");
        }
        assert_eq!(s.event(Replaced, at(900)), Next::Wait(at(1000)), "the cap, not 1100 ms");
        assert_eq!(s.event(Replaced, at(1000)), Next::Read, "an event at the cap reads at once");
        assert_eq!(s.read(text("a"), at(1000)), Next::Wait(at(1300)));
    }

    #[test]
    fn content_that_changes_between_the_two_reads_is_not_applied() {
        let (mut s, _) = Settling::start(Replaced, at(0));
        assert_eq!(s.waited(at(200)), Next::Read);
        assert_eq!(read_then_wait(&mut s, text("half"), 200), Next::Read);
        // Different at 500 ms: a new round, quiet from now.
        assert_eq!(s.read(text("whole"), at(500)), Next::Wait(at(700)));
        assert_eq!(s.waited(at(700)), Next::Read);
        assert_eq!(read_then_wait(&mut s, text("whole"), 700), Next::Read);
        assert_eq!(s.read(text("whole"), at(1000)), apply("whole"));
    }

    #[test]
    fn an_event_between_the_two_reads_starts_over_even_when_the_content_reads_the_same() {
        let (mut s, _) = Settling::start(Replaced, at(0));
        assert_eq!(s.waited(at(200)), Next::Read);
        assert_eq!(s.read(text("a"), at(200)), Next::Wait(at(500)));
        assert_eq!(s.event(Replaced, at(300)), Next::Wait(at(500)), "the second read is still at 500 ms");
        assert_eq!(s.waited(at(500)), Next::Read);
        assert_eq!(s.read(text("a"), at(500)), Next::Wait(at(700)), "not applied: a new round");
        assert_eq!(s.waited(at(700)), Next::Read);
        assert_eq!(read_then_wait(&mut s, text("a"), 700), Next::Read);
        assert_eq!(s.read(text("a"), at(1000)), apply("a"));
    }

    #[test]
    fn a_file_written_in_place_is_applied_once_its_writer_closes_it() {
        let (mut s, _) = Settling::start(Written, at(0));
        assert_eq!(s.waited(at(200)), Next::Read);
        assert_eq!(read_then_wait(&mut s, text("half"), 200), Next::Read);
        // Stable but still open: wait, and say so once.
        assert_eq!(s.read(text("half"), at(500)), Next::WaitForClose(at(700)));
        assert_eq!(s.waited(at(700)), Next::Read);
        assert_eq!(read_then_wait(&mut s, text("half"), 700), Next::Read);
        assert_eq!(s.read(text("half"), at(1000)), Next::Wait(at(1200)), "told once only");
        // A replace (say, a chmod) is no close.
        assert_eq!(s.event(Replaced, at(1100)), Next::Wait(at(1300)));
        assert_eq!(s.waited(at(1300)), Next::Read);
        assert_eq!(read_then_wait(&mut s, text("half"), 1300), Next::Read);
        assert_eq!(s.read(text("half"), at(1600)), Next::Wait(at(1800)));
        // The writer finishes and closes.
        assert_eq!(s.event(Written, at(1700)), Next::Wait(at(1900)));
        assert_eq!(s.event(Closed, at(1750)), Next::Wait(at(1950)));
        assert_eq!(s.waited(at(1950)), Next::Read);
        assert_eq!(read_then_wait(&mut s, text("whole"), 1950), Next::Read);
        assert_eq!(s.read(text("whole"), at(2250)), apply("whole"));
    }

    #[test]
    fn a_write_after_a_close_waits_for_the_next_close() {
        let (mut s, _) = Settling::start(Written, at(0));
        assert_eq!(s.event(Closed, at(50)), Next::Wait(at(250)));
        assert_eq!(s.event(Written, at(100)), Next::Wait(at(300)));
        assert_eq!(s.waited(at(300)), Next::Read);
        assert_eq!(read_then_wait(&mut s, text("a"), 300), Next::Read);
        assert_eq!(s.read(text("a"), at(600)), Next::WaitForClose(at(800)));
    }

    #[test]
    fn a_file_written_and_never_closed_is_applied_after_max_open_wait_without_changes() {
        let (mut s, mut next) = Settling::start(Written, at(0));
        let mut now = at(0);
        let applied = loop {
            next = match next {
                Next::Wait(until) | Next::WaitForClose(until) => {
                    now = until;
                    s.waited(now)
                }
                Next::Read => s.read(text("a"), now),
                Next::Apply { content, closed } => break (content, closed),
            };
            assert!(now < at(40_000), "never applied");
        };
        assert_eq!(applied, (text("a"), false), "applied, and known to be unclosed");
        assert!(now >= at(0) + MAX_OPEN_WAIT, "applied after {:?}", now - at(0));
        assert!(now < at(0) + MAX_OPEN_WAIT + Duration::from_secs(1), "applied after {:?}", now - at(0));
    }

    #[test]
    fn a_file_that_vanishes_between_reads_is_not_applied_and_one_that_stays_gone_is_reported() {
        let (mut s, _) = Settling::start(Replaced, at(0));
        assert_eq!(s.waited(at(200)), Next::Read);
        assert_eq!(read_then_wait(&mut s, text("a"), 200), Next::Read);
        assert_eq!(s.read(None, at(500)), Next::Wait(at(700)), "gone: a new round");
        assert_eq!(s.waited(at(700)), Next::Read);
        assert_eq!(read_then_wait(&mut s, None, 700), Next::Read);
        // Gone twice: the reload reads it again and says why.
        assert_eq!(s.read(None, at(1000)), Next::Apply { content: None, closed: true });
    }

    /// A file history: events at their times, and what the file holds from each time on. The
    /// content also changes without an event now and then (an event lost).
    struct History {
        events: Vec<(u64, Change)>,
        contents: Vec<(u64, u32)>,
    }

    impl History {
        fn random(rng: &mut StdRng) -> Self {
            let mut events = Vec::new();
            let mut contents = vec![(0, 0)];
            let mut ms = 0;
            for version in 1..rng.gen_range(1..12) {
                ms += rng.gen_range(0..700);
                let change = [Written, Closed, Replaced][rng.gen_range(0..3)];
                events.push((ms, change));
                if change != Closed || rng.gen_bool(0.1) {
                    contents.push((ms, version));
                }
            }
            if rng.gen_bool(0.5) {
                events.push((ms + rng.gen_range(0..700), Closed));
            }
            History { events, contents }
        }

        fn content_at(&self, ms: u64) -> Option<Vec<u8>> {
            let version = self.contents.iter().rev().find(|(from, _)| *from <= ms).map_or(0, |(_, v)| *v);
            Some(version.to_string().into_bytes())
        }
    }

    fn ms_of(t: Instant) -> u64 {
        (t - at(0)).as_millis() as u64
    }

    /// Random histories of events and content, each driven to the end as the watcher's thread
    /// would: whatever happens, the content applied is the file's then, it read the same twice
    /// `STABLE_FOR` apart with no event between, an open writer is waited for, and nothing waits
    /// longer than it should.
    #[test]
    fn random_histories_apply_only_a_settled_content() {
        let mut rng = StdRng::seed_from_u64(36);
        for case in 0..20_000 {
            let h = History::random(&mut rng);
            let (first_ms, first) = (0, Written);
            let mut events = h.events.iter().copied().peekable();
            let (mut s, mut next) = Settling::start(first, at(first_ms));
            let mut now = first_ms;
            let mut event_times = vec![first_ms];
            let mut open = true;
            let mut reads: Vec<(u64, Option<Vec<u8>>)> = Vec::new();
            let mut told_open = 0;
            let (content, closed) = loop {
                assert!(now < 60_000, "case {case}: never settled");
                next = match next {
                    Next::Wait(until) | Next::WaitForClose(until) => {
                        let until = ms_of(until);
                        assert!(until > now, "case {case}: waits until {until} at {now}");
                        assert!(until - now <= 300, "case {case}: waits {} ms", until - now);
                        if matches!(next, Next::WaitForClose(_)) {
                            told_open += 1;
                        }
                        match events.next_if(|(t, _)| *t <= until) {
                            Some((t, change)) => {
                                now = now.max(t);
                                event_times.push(now);
                                match change {
                                    Written => open = true,
                                    Closed => open = false,
                                    Replaced => {}
                                }
                                s.event(change, at(now))
                            }
                            None => {
                                now = until;
                                s.waited(at(now))
                            }
                        }
                    }
                    Next::Read => {
                        let content = h.content_at(now);
                        reads.push((now, content.clone()));
                        s.read(content, at(now))
                    }
                    Next::Apply { content, closed } => break (content, closed),
                };
            };
            let [.., (first_read, first_content), (second_read, second_content)] = &reads[..] else {
                panic!("case {case}: applied with fewer than two reads")
            };
            assert_eq!(*second_read, now, "case {case}: applied what was read last");
            assert_eq!(content, h.content_at(now), "case {case}");
            assert_eq!(first_content, second_content, "case {case}");
            assert!(second_read - first_read >= 300, "case {case}: reads {first_read} and {second_read}");
            assert!(
                !event_times.iter().any(|t| t >= first_read && t <= second_read),
                "case {case}: an event between the two reads"
            );
            // Quiet for DEBOUNCE before the first read, or MAX_DEBOUNCE since the round began (at
            // the start, or at the read that found a change).
            let last_event = event_times.iter().copied().max().unwrap_or(0);
            let round_start = reads.len().checked_sub(3).map_or(first_ms, |i| reads[i].0);
            assert!(
                *first_read >= last_event + 200 || *first_read == round_start + 1000,
                "case {case}: read at {first_read}, events until {last_event}, the round from {round_start}"
            );
            assert_eq!(closed, !open, "case {case}");
            if !closed {
                // Since the last event: a change without an event is seen only between the two
                // reads of one round.
                let since = now - last_event;
                assert!(since >= 30_000, "case {case}: an open file applied after {since} ms");
            }
            assert!(told_open <= 1, "case {case}: told {told_open} times the file is open");
        }
    }
}
