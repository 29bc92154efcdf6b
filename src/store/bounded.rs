//! A bounded map of expiring entries, the one cache structure of the in-process stores (the memory
//! store's zones and the deny cache), over the `lru` crate. It is not synchronised: callers keep
//! one per shard behind a mutex, because a limit decision must read and write several keys
//! atomically, which no concurrent cache offers.
//!
//! **Which entry goes when it is full.** nginx evicts the least recently used state, live or not,
//! so an attacker who floods new keys can push a limited key's state out and get its full burst
//! back. Here, to make room for one more key:
//! 1. entries that have expired are dropped (an expired entry means exactly what its absence
//!    means: nothing is lost);
//! 2. otherwise, among the [`SAMPLE`] least recently used entries, the one that expires first is
//!    evicted — it is the closest to "drained", so its key gains the least from losing it —
//!    skipping entries that are *protected* (their key was rejected and its retry time has not
//!    come: exactly the state an attacker wants gone);
//! 3. if all of them are protected, nothing is evicted: the caller refuses the new key
//!    ([`Full`]), as nginx answers its limit status when it cannot allocate a state.
//!
//! A rejected key's entry is marked as used on every rejection, so it stays at the recent end;
//! a flood of fresh keys (each expiring after one request's worth of drain) is always evicted
//! before any entry that will stay limited longer.

use std::hash::Hash;

use lru::LruCache;

/// Least recently used entries looked at to pick a victim (Redis's eviction samples 5).
pub const SAMPLE: usize = 8;
/// Expired entries dropped from the least recently used end on each insertion, at most (nginx
/// drops up to two on each lookup): keeps the map near the live set without a sweep.
const EXPIRED_PER_INSERT: usize = 2;

/// An entry that stops meaning anything at some time.
pub trait Expiring {
    /// When the entry becomes equivalent to its absence (µs); it is live while `now < expires_us`.
    fn expires_us(&self) -> u64;
    /// Until when the entry must not be evicted (µs); 0 when it may be.
    fn protected_until_us(&self) -> u64 {
        0
    }
}

/// What the map dropped since it was last asked ([`Bounded::take_stats`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// Expired entries removed (no information lost).
    pub expired: u64,
    /// Live entries evicted to make room.
    pub evicted: u64,
}

/// No entry could be evicted to make room: every candidate is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

pub struct Bounded<K: Hash + Eq, V> {
    map: LruCache<K, V>,
    cap: usize,
    dropped: Dropped,
}

impl<K: Hash + Eq + Clone, V: Expiring> Bounded<K, V> {
    /// At most `cap` entries (at least 1). Nothing is allocated up front.
    pub fn new(cap: usize) -> Self {
        Self { map: LruCache::unbounded(), cap: cap.max(1), dropped: Dropped::default() }
    }

    /// Changes the capacity; a smaller one takes effect as entries are inserted (never by
    /// evicting protected entries at once).
    pub fn set_cap(&mut self, cap: usize) {
        self.cap = cap.max(1);
    }

    /// Entries held, expired ones included until they are dropped.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The live entry of `key`, marked as just used; `None` when absent or expired (an expired
    /// entry stays until it is overwritten or dropped to make room: one lookup per call).
    pub fn get_mut(&mut self, key: &K, now_us: u64) -> Option<&mut V> {
        self.map.get_mut(key).filter(|v| v.expires_us() > now_us)
    }

    /// The live entry of `key`, leaving the recency order alone.
    pub fn peek(&self, key: &K, now_us: u64) -> Option<&V> {
        self.map.peek(key).filter(|v| v.expires_us() > now_us)
    }

    /// Removes `key`'s entry; whether there was one.
    pub fn remove(&mut self, key: &K) -> bool {
        self.map.pop(key).is_some()
    }

    /// Removes every entry whose key matches; how many.
    pub fn remove_where(&mut self, matches: impl Fn(&K) -> bool) -> usize {
        let doomed: Vec<K> = self.map.iter().filter(|(k, _)| matches(k)).map(|(k, _)| k.clone()).collect();
        for key in &doomed {
            self.map.pop(key);
        }
        doomed.len()
    }

    pub fn contains(&self, key: &K) -> bool {
        self.map.contains(key)
    }

    /// Stores `value` for `key` as the most recently used. A new key should have been given room
    /// by [`Bounded::make_room`] first; if not, the map may hold one entry over its capacity.
    pub fn put(&mut self, key: K, value: V) {
        self.map.put(key, value);
    }

    /// Makes room for one new entry (see the module docs for the order); `Err(Full)` when every
    /// candidate is protected.
    pub fn make_room(&mut self, now_us: u64) -> Result<(), Full> {
        // Cheap upkeep first: expired entries at the least recently used end.
        for _ in 0..EXPIRED_PER_INSERT {
            match self.map.peek_lru() {
                Some((_, v)) if v.expires_us() <= now_us => {
                    self.map.pop_lru();
                    self.dropped.expired += 1;
                }
                _ => break,
            }
        }
        while self.map.len() >= self.cap {
            let mut victim: Option<(K, u64)> = None;
            for (key, value) in self.map.iter().rev().take(SAMPLE) {
                let expires = value.expires_us();
                if expires <= now_us {
                    victim = Some((key.clone(), 0));
                    break;
                }
                if value.protected_until_us() > now_us {
                    continue;
                }
                if victim.as_ref().is_none_or(|(_, best)| expires < *best) {
                    victim = Some((key.clone(), expires));
                }
            }
            let Some((key, expires)) = victim else {
                return Err(Full);
            };
            self.map.pop(&key);
            if expires == 0 {
                self.dropped.expired += 1;
            } else {
                self.dropped.evicted += 1;
            }
        }
        Ok(())
    }

    /// What was dropped since the last call.
    pub fn take_stats(&mut self) -> Dropped {
        std::mem::take(&mut self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    struct E {
        expires: u64,
        protected: u64,
    }

    impl Expiring for E {
        fn expires_us(&self) -> u64 {
            self.expires
        }
        fn protected_until_us(&self) -> u64 {
            self.protected
        }
    }

    fn e(expires: u64) -> E {
        E { expires, protected: 0 }
    }

    fn insert(m: &mut Bounded<u32, E>, k: u32, v: E, now: u64) -> Result<(), Full> {
        if !m.contains(&k) {
            m.make_room(now)?;
        }
        m.put(k, v);
        Ok(())
    }

    #[test]
    fn expired_entries_go_first_and_are_absent() {
        let mut m = Bounded::new(3);
        insert(&mut m, 1, e(500), 0).unwrap();
        insert(&mut m, 2, e(50), 0).unwrap();
        insert(&mut m, 3, e(500), 0).unwrap();
        assert_eq!(m.peek(&2, 100), None, "expired reads as absent");
        insert(&mut m, 4, e(500), 100).unwrap();
        assert_eq!(m.len(), 3);
        assert!(!m.contains(&2));
        assert_eq!(m.take_stats(), Dropped { expired: 1, evicted: 0 });
        assert!(m.get_mut(&1, 600).is_none());
    }

    #[test]
    fn evicts_the_entry_closest_to_expiry_not_the_least_recent() {
        let mut m = Bounded::new(3);
        insert(&mut m, 1, e(10_000), 0).unwrap(); // least recently used, but far from drained
        insert(&mut m, 2, e(200), 0).unwrap();
        insert(&mut m, 3, e(300), 0).unwrap();
        insert(&mut m, 4, e(400), 100).unwrap();
        assert!(m.contains(&1) && !m.contains(&2) && m.contains(&3) && m.contains(&4));
        assert_eq!(m.take_stats(), Dropped { expired: 0, evicted: 1 });
    }

    #[test]
    fn protected_entries_are_never_evicted_and_a_full_map_refuses() {
        let mut m = Bounded::new(2);
        insert(&mut m, 1, E { expires: 200, protected: 1_000 }, 0).unwrap();
        insert(&mut m, 2, E { expires: 900, protected: 1_000 }, 0).unwrap();
        assert_eq!(insert(&mut m, 3, e(300), 100), Err(Full));
        assert_eq!(m.len(), 2);
        // Once the protection lapses, the one closest to expiry goes.
        let mut m = Bounded::new(2);
        insert(&mut m, 1, E { expires: 5_000, protected: 1_000 }, 0).unwrap();
        insert(&mut m, 2, E { expires: 9_000, protected: 1_000 }, 0).unwrap();
        insert(&mut m, 3, e(3_000), 1_000).unwrap();
        assert!(!m.contains(&1) && m.contains(&2) && m.contains(&3));
    }

    #[test]
    fn a_recently_used_key_moves_away_from_the_eviction_end() {
        let mut m = Bounded::new(SAMPLE + 1);
        insert(&mut m, 0, e(1_000), 0).unwrap();
        for k in 1..=SAMPLE as u32 {
            insert(&mut m, k, e(2_000), 0).unwrap();
        }
        // Key 0 is least recent and closest to expiry; using it moves it out of the sample.
        assert!(m.get_mut(&0, 10).is_some());
        insert(&mut m, 100, e(2_000), 10).unwrap();
        assert!(m.contains(&0), "used keys leave the sampled end");
        assert_eq!(m.len(), SAMPLE + 1);
    }
}
