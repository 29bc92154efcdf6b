//! Logs are written when requests end; limits were decided when they started. Records are held
//! in a min-heap on their start time until no later line can start before them: the window is
//! the longest `$request_time` seen so far plus a slack of five seconds (for loggers that write a
//! little out of order), capped by `--reorder-window`. Memory is bounded by that window.
//!
//! For whole-second logs the records of one second are released together, so the replay can
//! place them inside their second.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use super::parse::Record;

const SLACK_US: u64 = 5_000_000;

pub struct Pending {
    pub seq: u64,
    /// Which file and line (index into the file list, 1-based line).
    pub origin: (usize, u64),
    /// Boxed: the heap moves its entries on every push and pop.
    pub rec: Box<Record>,
}

impl Pending {
    /// Start time, then the log's own order key for requests of the same start, then the line.
    fn key(&self) -> (u64, u64, u64) {
        (self.rec.start_us, self.rec.order.unwrap_or(0), self.seq)
    }
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

pub struct Reorder {
    heap: BinaryHeap<Reverse<Pending>>,
    cap_us: u64,
    longest_us: u64,
    /// The latest end time seen.
    horizon_us: u64,
}

impl Reorder {
    pub fn new(cap_us: u64) -> Self {
        Self { heap: BinaryHeap::new(), cap_us, longest_us: 0, horizon_us: 0 }
    }

    pub fn push(&mut self, p: Pending) {
        let took = p.rec.duration_us.unwrap_or(0);
        self.longest_us = self.longest_us.max(took);
        self.horizon_us = self.horizon_us.max(p.rec.start_us.saturating_add(took));
        self.heap.push(Reverse(p));
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    fn window_us(&self) -> u64 {
        (self.longest_us + SLACK_US).min(self.cap_us)
    }

    /// The next group of records that no later line can precede (all of one start time), or
    /// everything left when `flush`.
    pub fn pop_group(&mut self, flush: bool) -> Option<Vec<Pending>> {
        let first = self.heap.peek()?.0.rec.start_us;
        if !flush && first.saturating_add(self.window_us()) >= self.horizon_us {
            return None;
        }
        let mut group = Vec::new();
        while self.heap.peek().is_some_and(|p| p.0.rec.start_us == first) {
            if let Some(Reverse(p)) = self.heap.pop() {
                group.push(p);
            }
        }
        Some(group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::parse::Client;
    use http::{HeaderMap, Method};

    fn pending(seq: u64, start_ms: u64, took_ms: u64) -> Pending {
        let rec = Record {
            start_us: start_ms * 1000,
            duration_us: Some(took_ms * 1000),
            whole_second: false,
            client: Client::Unknown,
            method: Method::GET,
            target: "/".into(),
            host: None,
            headers: HeaderMap::new(),
            route: None,
            logged_status: None,
            response_status: None,
            client_left: false,
            body_bytes: 0,
            response_fields: Vec::new(),
            order: None,
        };
        Pending { seq, origin: (0, seq + 1), rec: Box::new(rec) }
    }

    fn seqs(group: Option<Vec<Pending>>) -> Vec<u64> {
        group.map(|g| g.iter().map(|p| p.seq).collect()).unwrap_or_default()
    }

    #[test]
    fn releases_in_start_order_once_the_window_has_passed() {
        let mut r = Reorder::new(300_000_000);
        // Logged in end order: the second line started first (a 1.5 s request).
        r.push(pending(0, 1_000, 0));
        r.push(pending(1, 0, 1_500));
        assert!(r.pop_group(false).is_none(), "nothing is sure before the window (1.5 s + 5 s) has passed");
        r.push(pending(2, 6_600, 0));
        assert_eq!(seqs(r.pop_group(false)), [1]);
        assert!(r.pop_group(false).is_none(), "1.0 s + 6.5 s is not yet past 6.6 s");
        r.push(pending(3, 6_600, 0));
        r.push(pending(4, 9_000, 0));
        assert_eq!(seqs(r.pop_group(false)), [0]);
        // Same start: one group, in log order.
        assert_eq!(seqs(r.pop_group(true)), [2, 3]);
        assert_eq!(seqs(r.pop_group(true)), [4]);
        assert!(r.is_empty());
    }

    #[test]
    fn the_window_is_capped() {
        let mut r = Reorder::new(1_000_000);
        r.push(pending(0, 0, 60_000));
        r.push(pending(1, 61_500, 0));
        assert_eq!(seqs(r.pop_group(false)), [0], "a 60 s request does not hold 60 s of lines with a 1 s cap");
    }
}
