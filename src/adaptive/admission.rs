//! Who may take a place under the limit: pure. Lower priorities leave room for what the higher
//! ones use, so that when the limit is reached the least important traffic is refused first
//! while the most important still finds room.

/// A request's importance: `low` < `normal` < `high`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    Low,
    #[default]
    Normal,
    High,
}

impl Priority {
    pub const ALL: [Priority; 3] = [Priority::Low, Priority::Normal, Priority::High];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == text)
    }
}

/// High priority's own places: while it holds fewer than this, a high-priority request is admitted
/// whatever the lower priorities hold — past the limit if they took every place (requests that
/// hold a place without using the upstream, slow readers, must not shut it out). A quarter of the
/// limit, at least 2, at most the limit itself: the places in flight are at most
/// `limit + high_reserve(limit)`.
pub fn high_reserve(limit: u32) -> u32 {
    limit.div_ceil(4).max(2).min(limit)
}

/// Weight of the newest count in each priority's average use (per admission or release).
const USE_SMOOTHING: f64 = 0.02;

/// Places in use under the limit, by priority, and each priority's average use. A request may
/// take a place only if the places left after it cover what the priorities above it use on
/// average plus three standard deviations of Poisson-like bursts: the higher ones keep room for
/// their bursts while the lower ones absorb the refusals. A priority without traffic reserves
/// nothing, so a single priority may use the whole limit; no reserve is more than half of it.
#[derive(Debug, Clone, Default)]
pub struct Occupancy {
    in_use: [u32; 3],
    average: [f64; 3],
}

impl Occupancy {
    pub fn total(&self) -> u32 {
        self.in_use.iter().sum()
    }

    /// Places kept free for the priorities above `priority`.
    pub fn reserve(&self, priority: Priority) -> u32 {
        Priority::ALL
            .iter()
            .filter(|p| **p > priority)
            .map(|p| {
                let mean = self.average[*p as usize];
                (mean + 3.0 * mean.sqrt()).ceil() as u32
            })
            .sum()
    }

    /// Whether a request of `priority` may take a place under `limit` now. The reserve is at
    /// most half the limit: a lower priority is refused first, never shut out. High priority
    /// also has places of its own ([`high_reserve`]) that hold even when the lower priorities
    /// have taken every place under the limit.
    pub fn may_enter(&self, limit: u32, priority: Priority) -> bool {
        if priority == Priority::High && self.in_use[Priority::High as usize] < high_reserve(limit) {
            return true;
        }
        self.total() + self.reserve(priority).min(limit / 2) < limit
    }

    pub fn enter(&mut self, priority: Priority) {
        self.in_use[priority as usize] += 1;
        self.smooth();
    }

    pub fn leave(&mut self, priority: Priority) {
        let slot = &mut self.in_use[priority as usize];
        *slot = slot.saturating_sub(1);
        self.smooth();
    }

    fn smooth(&mut self) {
        for (average, in_use) in self.average.iter_mut().zip(self.in_use) {
            *average += USE_SMOOTHING * (f64::from(in_use) - *average);
        }
    }
}

/// Why a request was refused a place (the access log's and the metric's word).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// At the limit, and no queue (or a queue of higher priorities only).
    OverLimit,
    /// The queue was full of requests at least as important.
    QueueFull,
    /// Waited `queue_timeout` without a place.
    QueueTimeout,
    /// A more important request took its place in the queue.
    Displaced,
}

impl ShedReason {
    pub const ALL: [ShedReason; 4] =
        [ShedReason::OverLimit, ShedReason::QueueFull, ShedReason::QueueTimeout, ShedReason::Displaced];

    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::OverLimit => "over_limit",
            ShedReason::QueueFull => "queue_full",
            ShedReason::QueueTimeout => "queue_timeout",
            ShedReason::Displaced => "displaced",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `high` and `low` places in use for long enough that the averages are theirs.
    fn with(high: u32, low: u32) -> Occupancy {
        let mut o = Occupancy::default();
        (0..high).for_each(|_| o.enter(Priority::High));
        (0..low).for_each(|_| o.enter(Priority::Low));
        (0..2000).for_each(|_| o.smooth());
        o
    }

    #[test]
    fn one_priority_may_use_the_whole_limit() {
        let o = with(0, 9);
        assert!(o.may_enter(10, Priority::Low));
        let o = with(0, 10);
        assert!(!o.may_enter(10, Priority::Low));
        assert!(!o.may_enter(10, Priority::Normal));
    }

    #[test]
    fn high_priority_has_places_of_its_own_past_what_the_others_hold() {
        // Low holds every place of 20: high still gets its reserve of 5, and no more.
        let mut o = with(0, 20);
        assert_eq!(high_reserve(20), 5);
        for held in 0..5 {
            assert!(o.may_enter(20, Priority::High), "high holds {held}");
            o.enter(Priority::High);
        }
        assert!(!o.may_enter(20, Priority::High));
        assert!(!o.may_enter(20, Priority::Normal));
        // At least 2, never more than the limit itself.
        assert_eq!(high_reserve(2), 2);
        assert_eq!(high_reserve(1), 1);
        assert_eq!(high_reserve(0), 0);
        let o = with(1, 0);
        assert!(!o.may_enter(1, Priority::High), "a limit of 1 held by high is full");
    }

    #[test]
    fn lower_priorities_leave_room_for_what_higher_ones_use() {
        // High holds about 4 places: low must leave 4 + 3·2 = 10 free.
        let o = with(4, 5);
        assert_eq!(o.reserve(Priority::Low), 10);
        assert_eq!(o.reserve(Priority::High), 0);
        assert!(o.may_enter(20, Priority::Low));
        let o = with(4, 6);
        assert!(!o.may_enter(20, Priority::Low));
        assert!(o.may_enter(11, Priority::High));
    }

    #[test]
    fn no_priority_is_shut_out() {
        // High's reserve (10) is over half of a limit of 12: low still gets half.
        let o = with(4, 1);
        assert!(o.may_enter(12, Priority::Low));
        let o = with(4, 2);
        assert!(!o.may_enter(12, Priority::Low));
    }

    #[test]
    fn priorities_parse_their_own_words_only() {
        for p in Priority::ALL {
            assert_eq!(Priority::parse(p.as_str()), Some(p));
        }
        assert_eq!(Priority::parse("HIGH"), None);
        assert_eq!(Priority::parse(""), None);
    }
}
