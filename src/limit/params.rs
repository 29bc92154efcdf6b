//! What a zone limits with: the algorithm and its parameters, as one `limit_req` reference sees them.

use super::Rate;

/// The rate-limiting algorithm of a zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// nginx `limit_req` (GCRA): `rate`, `burst`, `delay`/`nodelay`. The default.
    LeakyBucket,
    /// Refills `rate`, holds `burst + 1` tokens, a request spends `cost`; never delays.
    TokenBucket,
    /// `rate.count` per epoch-aligned window of `rate.period_us`.
    FixedWindow,
    /// At most `rate.count` admissions in any window of `rate.period_us` ending now (exact).
    SlidingLog,
    /// The two-counter estimate of a sliding window: previous window weighted by its overlap.
    SlidingWindow,
}

impl Algorithm {
    /// Every algorithm, in the order of `id()` (checked when this compiles). Each has its files
    /// named after `as_str()`: `src/limit/<name>.rs`, `lua/limit_req/<name>.lua`,
    /// `src/limit/tables/<name>.rs` (the recipe: docs/architecture.md).
    pub const ALL: [Algorithm; 5] = [
        Algorithm::LeakyBucket,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
    ];

    /// The config's name (`algorithm = "..."`).
    pub fn parse(text: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|algorithm| algorithm.as_str() == text)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
        }
    }

    /// The number the Lua script dispatches on (`lua/limit_req/prelude.lua` names it).
    pub const fn id(self) -> u8 {
        match self {
            Algorithm::LeakyBucket => 0,
            Algorithm::TokenBucket => 1,
            Algorithm::FixedWindow => 2,
            Algorithm::SlidingLog => 3,
            Algorithm::SlidingWindow => 4,
        }
    }

    /// Window algorithms count per window and know no burst or delay. (Every algorithm named, so
    /// that a new one has to say which it is.)
    pub const fn is_window(self) -> bool {
        match self {
            Algorithm::LeakyBucket | Algorithm::TokenBucket => false,
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => true,
        }
    }
}

// `Algorithm::ALL` is in id order, so `ALL[id]` is the algorithm of `id`.
const _: () = {
    let mut i = 0;
    while i < Algorithm::ALL.len() {
        assert!(Algorithm::ALL[i].id() as usize == i, "Algorithm::ALL is not in id() order");
        i += 1;
    }
};

/// The parameters of one `limit_req` reference: the zone's algorithm and rate plus the reference's
/// burst and delay (bucket algorithms only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitReq {
    pub algorithm: Algorithm,
    /// Bucket algorithms: the sustained rate. Window algorithms: `count` per window of `period_us`.
    pub rate: Rate,
    pub burst: u64,
    pub delay: DelayPolicy,
}

impl LimitReq {
    /// What one window or bucket holds: `burst + 1` for buckets, the count for windows.
    pub fn capacity(&self) -> u64 {
        if self.algorithm.is_window() {
            self.rate.count
        } else {
            self.burst + 1
        }
    }
}

/// Which excess requests wait (leaky bucket only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayPolicy {
    /// `nodelay`: everything within the burst is forwarded at once.
    NoDelay,
    /// `delay = N`: the first N excess requests go at once, later ones wait (N = 0: `burst` alone).
    After(u64),
}
