//! ns/op of the structures the in-process stores can be built on, single-threaded under the same
//! conditions (one shard, as each of Weir's shard mutexes holds one), and of the deny cache as a
//! whole under 4 threads. See Cargo.toml.

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash, Hasher};
use std::hint::black_box;
use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::Instant;

#[path = "../../../src/store/bounded.rs"]
#[allow(dead_code)]
mod bounded;

use bounded::{Bounded, Expiring};

/// Entries a map may hold (one shard of a 1M-key zone holds 15625; a bigger map shows the same).
const CAP: usize = 50_000;
const OPS: usize = 600_000;
/// Each measurement is repeated; the minimum is reported (the least disturbed by other load),
/// with the median.
const REPS: usize = 5;

#[derive(Clone)]
struct State {
    level: f64,
    #[allow(dead_code)]
    last_us: u64,
}

struct Entry {
    state: State,
    expires_us: u64,
    protected_until_us: u64,
}

impl Expiring for Entry {
    fn expires_us(&self) -> u64 {
        self.expires_us
    }
    fn protected_until_us(&self) -> u64 {
        self.protected_until_us
    }
}

fn keys(n: usize, space: u64) -> Vec<Vec<u8>> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("203.0.{}.{}", (x % space) / 256, (x % space) % 256).into_bytes()
        })
        .collect()
}

fn report(name: &str, workload: &str, ops: usize, f: impl Fn()) {
    let mut ns: Vec<f64> = (0..REPS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64 / ops as f64
        })
        .collect();
    ns.sort_by(f64::total_cmp);
    println!("{workload:<28} {name:<44} {:>8.1} ns/op (median {:.1})", ns[0], ns[REPS / 2]);
}

// ---- the memory store's zone map: one decision = read the key's state, write the new one ----

/// Weir before: (zone, key) boxed strings in a HashMap, swept for expired state when it doubles.
fn old_memory(workload: &str, ks: &[Vec<u8>], ttl_us: u64) {
    report("old HashMap<(Box<str>,Box<[u8]>)> + sweeps", workload, ks.len(), || {
        let mut map: HashMap<(Box<str>, Box<[u8]>), Entry> = HashMap::new();
        let mut sweep_at = 1024usize;
        for (now, k) in ks.iter().enumerate() {
            let now = now as u64;
            let id = (Box::<str>::from("per_ip"), Box::<[u8]>::from(k.as_slice()));
            let state = map.get(&id).filter(|e| e.expires_us > now).map(|e| e.state.clone());
            let level = state.map_or(1.0, |s| s.level + 1.0);
            map.insert(id, Entry { state: State { level, last_us: now }, expires_us: now + ttl_us, protected_until_us: 0 });
            if map.len() >= sweep_at {
                map.retain(|_, e| e.expires_us > now);
                sweep_at = (map.len() * 2).max(1024);
            }
        }
        black_box(map.len());
    });
}

/// Weir now: Bounded (lru crate + expiry-aware eviction) over 64-bit key hashes.
fn bounded_memory(workload: &str, ks: &[Vec<u8>], ttl_us: u64) {
    report("lru::LruCache via store::bounded (Weir now)", workload, ks.len(), || {
        let hasher = RandomState::new();
        let mut map: Bounded<u64, Entry> = Bounded::new(CAP);
        for (now, k) in ks.iter().enumerate() {
            let now = now as u64;
            let h = hasher.hash_one(k.as_slice());
            let state = map.get_mut(&h, now).map(|e| e.state.clone());
            let fresh = state.is_none();
            let level = state.map_or(1.0, |s| s.level + 1.0);
            if fresh && map.make_room(now).is_err() {
                continue;
            }
            map.put(h, Entry { state: State { level, last_us: now }, expires_us: now + ttl_us, protected_until_us: 0 });
        }
        black_box(map.len());
    });
}

/// The lru crate on its own (plain LRU eviction by `push`), for the cost of Weir's policy on top.
fn plain_lru(workload: &str, ks: &[Vec<u8>], ttl_us: u64) {
    report("lru::LruCache, plain LRU push", workload, ks.len(), || {
        let hasher = RandomState::new();
        let mut map: lru::LruCache<u64, Entry> = lru::LruCache::new(NonZeroUsize::new(CAP).unwrap());
        for (now, k) in ks.iter().enumerate() {
            let now = now as u64;
            let h = hasher.hash_one(k.as_slice());
            let state = map.get(&h).filter(|e| e.expires_us > now).map(|e| e.state.clone());
            let level = state.map_or(1.0, |s| s.level + 1.0);
            map.push(h, Entry { state: State { level, last_us: now }, expires_us: now + ttl_us, protected_until_us: 0 });
        }
        black_box(map.len());
    });
}

/// quick_cache's single-threaded cache (S3-FIFO-like), same keys.
fn quick_unsync(workload: &str, ks: &[Vec<u8>], ttl_us: u64) {
    report("quick_cache::unsync::Cache", workload, ks.len(), || {
        let hasher = RandomState::new();
        let mut map: quick_cache::unsync::Cache<u64, (f64, u64, u64)> = quick_cache::unsync::Cache::new(CAP);
        for (now, k) in ks.iter().enumerate() {
            let now = now as u64;
            let h = hasher.hash_one(k.as_slice());
            let level = map.get(&h).filter(|e| e.2 > now).map_or(1.0, |e| e.0 + 1.0);
            map.insert(h, (level, now, now + ttl_us));
        }
        black_box(map.len());
    });
}

// ---- the deny cache: a lookup per request, an insert per rejection ----

#[derive(Clone, PartialEq, Eq, Hash)]
struct DenyKey {
    zone: Box<str>,
    key: Box<[u8]>,
    burst: u64,
    cost: u64,
}

fn deny_key(k: &[u8]) -> DenyKey {
    DenyKey { zone: "per_ip".into(), key: k.into(), burst: 5, cost: 1 }
}

#[derive(Default)]
struct OldInner {
    entries: HashMap<DenyKey, (u64, u64)>,
    by_recency: BTreeMap<u64, DenyKey>,
    next_stamp: u64,
}

impl OldInner {
    fn remove(&mut self, key: &DenyKey) -> bool {
        match self.entries.remove(key) {
            Some((_, stamp)) => {
                self.by_recency.remove(&stamp);
                true
            }
            None => false,
        }
    }
    fn insert(&mut self, key: DenyKey, until: u64, cap: usize) {
        self.remove(&key);
        while self.entries.len() >= cap {
            match self.by_recency.pop_first() {
                Some((_, oldest)) => {
                    self.entries.remove(&oldest);
                }
                None => break,
            }
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.by_recency.insert(stamp, key.clone());
        self.entries.insert(key, (until, stamp));
    }
    fn lookup(&mut self, key: &DenyKey, now: u64) -> Option<u64> {
        let until = self.entries.get(key)?.0;
        if until > now {
            return Some(until);
        }
        self.remove(key);
        None
    }
}

struct Until(u64);
impl Expiring for Until {
    fn expires_us(&self) -> u64 {
        self.0
    }
}

/// Every op: look the key up; on a miss, insert it (a rejection) — the flood case.
fn deny(workload: &str, ks: &[Vec<u8>]) {
    report("old HashMap + BTreeMap LRU", workload, ks.len(), || {
        let mut c = OldInner::default();
        for (now, k) in ks.iter().enumerate() {
            let key = deny_key(k);
            if c.lookup(&key, now as u64).is_none() {
                c.insert(key, now as u64 + 500_000, CAP);
            }
        }
        black_box(c.entries.len());
    });
    report("lru::LruCache via store::bounded (Weir now)", workload, ks.len(), || {
        let mut c: Bounded<DenyKey, Until> = Bounded::new(CAP);
        for (now, k) in ks.iter().enumerate() {
            let now = now as u64;
            let key = deny_key(k);
            if c.get_mut(&key, now).is_none() && c.make_room(now).is_ok() {
                c.put(key, Until(now + 500_000));
            }
        }
        black_box(c.len());
    });
    report("quick_cache::sync::Cache (its own sharding)", workload, ks.len(), || {
        let c: quick_cache::sync::Cache<DenyKey, u64> = quick_cache::sync::Cache::new(CAP);
        for (now, k) in ks.iter().enumerate() {
            let now = now as u64;
            let key = deny_key(k);
            if c.get(&key).is_none_or(|until| until <= now) {
                c.insert(key, now + 500_000);
            }
        }
        black_box(c.len());
    });
}

/// 4 threads, the deny cache as Weir shards it (16 mutexes) vs quick_cache's own concurrency.
fn deny_threads(ks: &[Vec<u8>]) {
    const THREADS: usize = 4;
    let shard_of = |k: &DenyKey| {
        let mut h = DefaultHasher::new();
        k.hash(&mut h);
        (h.finish() as usize) % 16
    };
    report("16 x Mutex<Bounded> (Weir now)", "deny cache, 4 threads", ks.len() * THREADS, || {
        let shards: Vec<Mutex<Bounded<DenyKey, Until>>> = (0..16).map(|_| Mutex::new(Bounded::new(CAP / 16))).collect();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let shards = &shards;
                s.spawn(move || {
                    for (now, k) in ks.iter().enumerate().skip(t) {
                        let now = now as u64;
                        let key = deny_key(k);
                        let mut shard = shards[shard_of(&key)].lock().unwrap();
                        if shard.get_mut(&key, now).is_none() && shard.make_room(now).is_ok() {
                            shard.put(key, Until(now + 500_000));
                        }
                    }
                });
            }
        });
    });
    report("quick_cache::sync::Cache", "deny cache, 4 threads", ks.len() * THREADS, || {
        let c: quick_cache::sync::Cache<DenyKey, u64> = quick_cache::sync::Cache::new(CAP);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let c = &c;
                s.spawn(move || {
                    for (now, k) in ks.iter().enumerate().skip(t) {
                        let now = now as u64;
                        let key = deny_key(k);
                        if c.get(&key).is_none_or(|until| until <= now) {
                            c.insert(key, now + 500_000);
                        }
                    }
                });
            }
        });
    });
}

fn main() {
    // A flood: 600k ops over ~16M possible keys (nearly all new), state living 300k ops: the maps fill.
    let flood = keys(OPS, 1 << 24);
    // Steady traffic: 600k ops over 20k clients, state living 100k ops: fits, mostly hits.
    let steady = keys(OPS, 20_000);
    for (workload, ks, ttl) in [("memory zone, flood", &flood, 300_000u64), ("memory zone, 20k clients", &steady, 100_000)] {
        old_memory(workload, ks, ttl);
        bounded_memory(workload, ks, ttl);
        plain_lru(workload, ks, ttl);
        quick_unsync(workload, ks, ttl);
    }
    deny("deny cache, flood", &flood);
    deny("deny cache, 20k clients", &steady);
    deny_threads(&flood);
}
