//! The embedded store: the limit model over sharded in-process maps. Exact for one instance;
//! expired state is swept as the maps grow, so memory stays proportional to active keys.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use super::{LimitStore, StoreError, ZoneCheck};
use crate::limit::{decide_all, Clock, State, SystemClock, Verdict, ZoneInput};

const SHARDS: usize = 64;
/// A shard is swept for expired state once it has grown to this size, then again at twice the
/// size it had after the previous sweep.
const MIN_SWEEP_LEN: usize = 1024;

type StateKey = (Box<str>, Box<[u8]>);

struct Entry {
    state: State,
    expires_us: u64,
}

#[derive(Default)]
struct Shard {
    entries: HashMap<StateKey, Entry>,
    sweep_at_len: usize,
}

pub struct MemoryStore {
    shards: Vec<Mutex<Shard>>,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

impl MemoryStore {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        let shards =
            (0..SHARDS).map(|_| Mutex::new(Shard { entries: HashMap::new(), sweep_at_len: MIN_SWEEP_LEN })).collect();
        Self { shards, clock }
    }

    /// Decides synchronously; `decide` is this behind the store trait.
    pub fn decide_now(&self, checks: &[ZoneCheck<'_>]) -> Verdict {
        let now_us = self.clock.now_us();
        let shard_ids: Vec<usize> = checks.iter().map(|c| shard_of(c.zone, c.key)).collect();
        // Lock each involved shard once, in ascending order, so concurrent requests never deadlock.
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, lock(&self.shards[i]))).collect();
        let guard_index = |shard: usize| order.binary_search(&shard).unwrap_or(0);

        let inputs: Vec<ZoneInput<'_>> = checks
            .iter()
            .zip(&shard_ids)
            .map(|(c, &s)| {
                let shard = &guards[guard_index(s)].1;
                let state = shard
                    .entries
                    .get(&(Box::from(c.zone), Box::from(c.key)))
                    .filter(|e| e.expires_us > now_us)
                    .map(|e| e.state.clone());
                ZoneInput { limit: &c.limit, state, cost: c.cost }
            })
            .collect();
        let verdict = decide_all(&inputs, now_us);
        if verdict.admitted {
            for ((check, &s), zone) in checks.iter().zip(&shard_ids).zip(&verdict.zones) {
                let shard = &mut guards[guard_index(s)].1;
                let entry = Entry { state: zone.next.clone(), expires_us: zone.expires_us };
                shard.entries.insert((Box::from(check.zone), Box::from(check.key)), entry);
                shard.sweep_if_grown(now_us);
            }
        }
        verdict
    }

    /// The live state of one key, for tests and the admin API.
    pub fn state(&self, zone: &str, key: &[u8]) -> Option<State> {
        let now_us = self.clock.now_us();
        let shard = lock(&self.shards[shard_of(zone, key)]);
        shard.entries.get(&(Box::from(zone), Box::from(key))).filter(|e| e.expires_us > now_us).map(|e| e.state.clone())
    }

    /// Number of keys held, expired or not (memory accounting).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Shard {
    fn sweep_if_grown(&mut self, now_us: u64) {
        if self.entries.len() < self.sweep_at_len {
            return;
        }
        self.entries.retain(|_, e| e.expires_us > now_us);
        self.sweep_at_len = (self.entries.len() * 2).max(MIN_SWEEP_LEN);
    }
}

fn shard_of(zone: &str, key: &[u8]) -> usize {
    let mut h = DefaultHasher::new();
    zone.hash(&mut h);
    key.hash(&mut h);
    (h.finish() as usize) % SHARDS
}

/// A poisoned shard only means another request panicked mid-update of plain numbers: keep serving.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait]
impl LimitStore for MemoryStore {
    async fn decide(&self, checks: &[ZoneCheck<'_>]) -> Result<Verdict, StoreError> {
        Ok(self.decide_now(checks))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn inspect(&self, zone: &str, key: &[u8]) -> Result<Option<State>, StoreError> {
        Ok(self.state(zone, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, DelayPolicy, LimitReq, ManualClock, Rate};

    const T0: u64 = 1_700_000_000_000_000;

    fn check<'a>(zone: &'a str, key: &'a [u8], burst: u64) -> ZoneCheck<'a> {
        let limit = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("1r/s").unwrap(),
            burst,
            delay: DelayPolicy::NoDelay,
        };
        ZoneCheck { zone, key, limit, cost: 1 }
    }

    #[test]
    fn keys_and_zones_are_independent() {
        let store = MemoryStore::new(Arc::new(ManualClock::new(T0)));
        assert!(store.decide_now(&[check("a", b"k1", 0)]).admitted);
        assert!(!store.decide_now(&[check("a", b"k1", 0)]).admitted);
        assert!(store.decide_now(&[check("a", b"k2", 0)]).admitted);
        assert!(store.decide_now(&[check("b", b"k1", 0)]).admitted);
    }

    #[test]
    fn rejection_in_one_zone_leaves_the_other_uncharged() {
        let store = MemoryStore::new(Arc::new(ManualClock::new(T0)));
        assert!(store.decide_now(&[check("tight", b"k", 0)]).admitted);
        let v = store.decide_now(&[check("loose", b"k", 10), check("tight", b"k", 0)]);
        assert!(!v.admitted);
        assert_eq!(store.state("loose", b"k"), None);
    }

    #[test]
    fn state_expires_once_drained_and_is_swept() {
        let clock = Arc::new(ManualClock::new(T0));
        let store = MemoryStore::new(clock.clone());
        for i in 0..(SHARDS * MIN_SWEEP_LEN) as u32 {
            store.decide_now(&[check("z", &i.to_be_bytes(), 0)]);
        }
        assert!(store.len() >= SHARDS * MIN_SWEEP_LEN / 2);
        clock.advance_us(1_000_001);
        assert_eq!(store.state("z", &0u32.to_be_bytes()), None);
        for i in 0..(SHARDS * MIN_SWEEP_LEN) as u32 {
            store.decide_now(&[check("z2", &i.to_be_bytes(), 0)]);
        }
        // Every shard crossed its sweep threshold again and dropped the drained "z" keys.
        assert!(store.len() < 2 * SHARDS * MIN_SWEEP_LEN, "len {}", store.len());
    }
}
