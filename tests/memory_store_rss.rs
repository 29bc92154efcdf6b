//! The memory store under a flood of distinct keys: 2M random keys through the store API, in
//! process, must leave the resident set bounded (the zone keeps at most `max_keys` keys) and
//! every decision answered. Alone in its test binary: RSS is per process.

use std::sync::Arc;

use weir::limit::{Algorithm, DelayPolicy, LimitReq, ManualClock, Rate};
use weir::store::{KeyedZone, MemoryStore};

const KEYS: u64 = 2_000_000;
const T0: u64 = 1_700_000_000_000_000;

/// Resident set size of this process, in bytes (`/proc/self/statm`, field 2, in pages).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|f| f.parse().ok()).expect("statm's resident field");
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

#[test]
fn two_million_random_keys_keep_rss_bounded() {
    // The keys' clock does not move: no state ever expires, so only the cap can bound memory.
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::new(clock);
    let limit = LimitReq {
        algorithm: Algorithm::LeakyBucket,
        rate: Rate::parse("1r/m").expect("rate"),
        burst: 5,
        delay: DelayPolicy::NoDelay,
    };
    let before = rss_bytes();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut admitted = 0u64;
    for _ in 0..KEYS {
        // xorshift: distinct-enough random keys, as an attacker would send them.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = format!("{x:016x}-203.0.113.{}", x % 251);
        let verdict = store.decide_now(&[KeyedZone::new("per_key", key.as_bytes(), limit, 1)]);
        admitted += u64::from(verdict.admitted);
    }
    let after = rss_bytes();
    let grown_mb = (after.saturating_sub(before)) as f64 / 1e6;
    let keys = store.len();
    println!(
        "2M random keys: RSS {:.1} MB -> {:.1} MB (+{grown_mb:.1} MB), {keys} keys held, {admitted} admitted, {:.0} bytes/key held",
        before as f64 / 1e6,
        after as f64 / 1e6,
        (after.saturating_sub(before)) as f64 / keys.max(1) as f64
    );
    assert!(admitted > 0, "decisions were made");
    assert!(keys <= 1_000_064, "the default cap (1M keys per zone, rounded up per shard) holds: {keys}");
    assert!(grown_mb < 200.0, "RSS grew by {grown_mb:.1} MB for 2M keys; the cap should bound it near 1M keys");
}
