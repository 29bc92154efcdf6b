//! One zone's hottest keys, in bounded memory whatever the number of distinct keys: a
//! space-saving table of `capacity` entries with exponentially decaying counts, behind a
//! count-min sketch that decides whether a key the table does not hold may replace its smallest
//! entry (see `sketch.rs` for why plain space-saving is not enough against a flood of one-shot
//! keys). Pure: the caller passes the time.
//!
//! Counts decay with a half-life ("forward decay": an event at `t` weighs `2^((t - L)/h)` for a
//! landmark `L`, so entries compare without touching the others; the landmark moves forward before
//! the weights overflow). A rate is the decayed count since the key entered the table over the
//! decayed time it has been watched (at most `h / ln 2`): a key that just arrived at 10 r/s reads
//! 10 r/s after a second instead of waiting for a minute of history, and a steady rate reads as
//! itself.
//!
//! A newcomer replacing the smallest entry starts with the sketch's estimate as its count and as
//! its error (space-saving's overestimate): it ranks by its history at once, and its listed rate
//! counts only what the table saw. Plain space-saving (newcomer = smallest + 1) fails the flood
//! test below: every one-shot key evicts the attacker in turn.
//!
//! Memory: `capacity × (≈ 120 bytes + key length ≤ 128)` for the entries and their index, plus the
//! sketch, `16 × sketch_width` bytes, allocated only once the table is full.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;

use super::sketch::Sketch;
use crate::engine::LimitStatus;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TableSettings {
    /// Entries kept (the rows one can list).
    pub capacity: usize,
    pub half_life_us: u64,
    /// Cells per row of the admission sketch.
    pub sketch_width: usize,
}

/// One key as listed: rates per second over about the last `h / ln 2`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Row {
    /// The client key, raw (the caller decides how to show it).
    #[serde(with = "raw_key")]
    pub key: Vec<u8>,
    /// Requests per second seen at or near the limit (every recorded event).
    pub rate: f64,
    pub rejected_rate: f64,
    pub delayed_rate: f64,
    /// How full the key's limit was at its latest request: 0 empty, 1 at the limit.
    pub fill: f64,
    /// Seconds since its latest request.
    pub idle_s: f64,
}

/// Keys are bytes; JSON carries them percent-encoded (printable ASCII stays as is).
mod raw_key {
    use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
    use serde::{Deserialize, Deserializer, Serializer};

    const ESCAPED: &AsciiSet = &CONTROLS.add(b'%').add(b' ').add(b'"');

    pub fn serialize<S: Serializer>(key: &[u8], s: S) -> Result<S::Ok, S::Error> {
        // Not UTF-8 bytes: each escaped on its own.
        let text: String = match std::str::from_utf8(key) {
            Ok(text) => utf8_percent_encode(text, ESCAPED).collect(),
            Err(_) => key.iter().map(|b| format!("%{b:02X}")).collect(),
        };
        s.serialize_str(&text)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        Ok(percent_decode_str(&text).collect())
    }
}

struct Entry {
    key: Box<[u8]>,
    /// Forward-decayed sums (see the module docs).
    hits: f64,
    rejected: f64,
    delayed: f64,
    /// Of `hits`, how much the entry may owe to the keys it replaced (space-saving's error).
    error: f64,
    fill: f64,
    first_us: u64,
    last_us: u64,
}

pub struct Table {
    settings: TableSettings,
    entries: Vec<Entry>,
    index: HashMap<Box<[u8]>, usize>,
    sketch: Option<Sketch>,
    hasher: RandomState,
    /// The landmark `L` of the forward decay.
    landmark_us: u64,
}

/// Half-lives after which the landmark moves (2^200 is far from f64's limit, and still exact
/// enough at the small end).
const RENORMALIZE_AFTER: f64 = 200.0;

impl Table {
    pub fn new(settings: TableSettings, now_us: u64) -> Self {
        Self {
            settings,
            entries: Vec::new(),
            index: HashMap::new(),
            sketch: None,
            hasher: RandomState::new(),
            landmark_us: now_us,
        }
    }

    pub fn settings(&self) -> TableSettings {
        self.settings
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes held (entries, index, keys, sketch): the documented bound is what this stays under.
    pub fn bytes(&self) -> usize {
        let keys: usize = self.entries.iter().map(|e| e.key.len() * 2).sum();
        self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.index.capacity() * (std::mem::size_of::<(Box<[u8]>, usize)>() + 8)
            + keys
            + self.sketch.as_ref().map_or(0, Sketch::bytes)
    }

    /// What [`Table::bytes`] never exceeds for these settings: the entries' vector and index at up
    /// to twice their length (growth), two copies of each key at the longest (keys over
    /// `keys::MAX_KEY_LEN` bytes are hashed before they get here), and the sketch.
    pub fn bound_bytes(settings: &TableSettings) -> usize {
        let c = settings.capacity;
        2 * c * std::mem::size_of::<Entry>()
            + 2 * c * (std::mem::size_of::<(Box<[u8]>, usize)>() + 8)
            + 2 * c * crate::keys::MAX_KEY_LEN
            + 16 * settings.sketch_width.max(64).next_power_of_two()
    }

    /// The weight of an event at `now_us`.
    fn weight(&mut self, now_us: u64) -> f64 {
        let mut exponent = self.half_lives(now_us);
        if exponent > RENORMALIZE_AFTER {
            let scale = exponent.exp2().recip();
            for e in &mut self.entries {
                for value in [&mut e.hits, &mut e.rejected, &mut e.delayed, &mut e.error] {
                    *value *= scale;
                }
            }
            self.landmark_us = now_us;
            exponent = 0.0;
        }
        exponent.exp2()
    }

    fn half_lives(&self, now_us: u64) -> f64 {
        now_us.saturating_sub(self.landmark_us) as f64 / self.settings.half_life_us.max(1) as f64
    }

    /// Records one request of `key` (`fill`: how full its limit was, 0..=1).
    pub fn record(&mut self, key: &[u8], event: LimitStatus, fill: f64, now_us: u64) {
        let w = self.weight(now_us);
        let slot = match self.index.get(key) {
            Some(&i) => i,
            None => match self.admit(key, w, now_us) {
                Some(i) => i,
                None => return,
            },
        };
        let e = &mut self.entries[slot];
        e.hits += w;
        match event {
            LimitStatus::Rejected | LimitStatus::RejectedDryRun => e.rejected += w,
            LimitStatus::Delayed | LimitStatus::DelayedDryRun => e.delayed += w,
            LimitStatus::Passed => {}
        }
        e.fill = fill.clamp(0.0, 1.0);
        e.last_us = now_us.max(e.last_us);
    }

    /// A slot for a key the table does not hold, or `None` when the sketch says it is rarer than
    /// the smallest entry. The new entry's counts start at zero; a replaced entry's count becomes
    /// its error (space-saving).
    fn admit(&mut self, key: &[u8], w: f64, now_us: u64) -> Option<usize> {
        let fresh = Entry {
            key: key.into(),
            hits: 0.0,
            rejected: 0.0,
            delayed: 0.0,
            error: 0.0,
            fill: 0.0,
            first_us: now_us,
            last_us: now_us,
        };
        if self.entries.len() < self.settings.capacity {
            self.entries.push(fresh);
            let slot = self.entries.len() - 1;
            self.index.insert(key.into(), slot);
            return Some(slot);
        }
        let (half_life, width) = (self.settings.half_life_us, self.settings.sketch_width);
        let sketch = self.sketch.get_or_insert_with(|| Sketch::new(width, half_life, now_us));
        let estimate = f64::from(sketch.add(self.hasher.hash_one(key), now_us));
        let (slot, smallest) =
            self.entries.iter().enumerate().map(|(i, e)| (i, e.hits)).min_by(|a, b| a.1.total_cmp(&b.1))?;
        // In events of now: the smallest entry's decayed count.
        if estimate * w <= smallest {
            return None;
        }
        let old = std::mem::replace(&mut self.entries[slot], fresh);
        self.index.remove(&old.key);
        self.index.insert(key.into(), slot);
        // The new key was seen about `estimate` times, this one included (added by the caller).
        let e = &mut self.entries[slot];
        e.hits = (estimate - 1.0) * w;
        e.error = e.hits;
        Some(slot)
    }

    /// Every entry seen within `max_idle_us`, with its rates at `now_us`.
    pub fn rows(&self, now_us: u64, max_idle_us: u64) -> Vec<Row> {
        let scale = self.half_lives(now_us).exp2().recip();
        let half_life_s = self.settings.half_life_us.max(1) as f64 / 1e6;
        // The decayed time an entry was watched: ∫ 2^(-t/h) dt over its age (h / ln 2 at most),
        // so that a steady rate reads as itself whatever the entry's age.
        let exposure = |age_s: f64| half_life_s / std::f64::consts::LN_2 * (1.0 - (-age_s / half_life_s).exp2());
        self.entries
            .iter()
            .filter(|e| now_us.saturating_sub(e.last_us) <= max_idle_us)
            .map(|e| {
                let watched_s = exposure((now_us.saturating_sub(e.first_us) as f64 / 1e6).max(1.0));
                let per_s = |v: f64| (v * scale / watched_s * 1000.0).round() / 1000.0;
                Row {
                    key: e.key.to_vec(),
                    rate: per_s(e.hits - e.error),
                    rejected_rate: per_s(e.rejected),
                    delayed_rate: per_s(e.delayed),
                    fill: (e.fill * 1000.0).round() / 1000.0,
                    idle_s: now_us.saturating_sub(e.last_us) as f64 / 1e6,
                }
            })
            .collect()
    }

    /// Forgets a key (after a reset).
    pub fn remove(&mut self, key: &[u8]) {
        let Some(slot) = self.index.remove(key) else { return };
        self.entries.swap_remove(slot);
        if let Some(moved) = self.entries.get(slot) {
            self.index.insert(moved.key.clone(), slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn settings() -> TableSettings {
        TableSettings { capacity: 64, half_life_us: 30 * S, sketch_width: 1 << 16 }
    }

    fn first(rows: &mut [Row], by: impl Fn(&Row) -> f64) -> Vec<u8> {
        rows.sort_by(|a, b| by(b).total_cmp(&by(a)));
        rows[0].key.clone()
    }

    #[test]
    fn counts_rates_and_decays() {
        let mut t = Table::new(settings(), 0);
        for i in 0..100 {
            t.record(b"a", LimitStatus::Rejected, 1.0, i * S / 10); // 10/s for 10 s
            t.record(b"b", if i % 2 == 0 { LimitStatus::Delayed } else { LimitStatus::Passed }, 0.5, i * S / 10);
        }
        let rows = t.rows(10 * S, 60 * S);
        let a = rows.iter().find(|r| r.key == b"a").unwrap();
        assert!((9.0..=10.5).contains(&a.rate), "{a:?}");
        assert!((a.rejected_rate - a.rate).abs() < 1e-9);
        let b = rows.iter().find(|r| r.key == b"b").unwrap();
        assert!((4.0..=5.5).contains(&b.delayed_rate) && b.rejected_rate == 0.0, "{b:?}");
        assert_eq!(b.fill, 0.5);
        // Two half-lives later, a quarter of the count is left; idle keys drop off the listing.
        let later = t.rows(70 * S, 600 * S);
        let a_later = later.iter().find(|r| r.key == b"a").unwrap();
        assert!(a_later.rate < a.rate / 3.0, "{a_later:?}");
        assert!(t.rows(70 * S, 30 * S).is_empty());
    }

    #[test]
    fn landmark_moves_without_losing_counts() {
        let mut t = Table::new(TableSettings { half_life_us: S, ..settings() }, 0);
        for i in 0..1000 {
            t.record(b"k", LimitStatus::Passed, 1.0, i * S);
        }
        let rows = t.rows(999 * S, S);
        // Steady 1/s: about 1/s (the decayed sum over its mean age).
        assert!((0.9..=1.5).contains(&rows[0].rate), "{rows:?}");
    }

    #[test]
    fn removed_keys_are_gone_and_the_index_stays_right() {
        let mut t = Table::new(settings(), 0);
        for k in [&b"a"[..], b"b", b"c"] {
            t.record(k, LimitStatus::Rejected, 1.0, 0);
        }
        t.remove(b"a");
        t.record(b"c", LimitStatus::Rejected, 1.0, 0);
        let mut keys: Vec<_> = t.rows(0, S).into_iter().map(|r| r.key).collect();
        keys.sort();
        assert_eq!(keys, vec![b"b".to_vec(), b"c".to_vec()]);
    }

    /// The case on a simulated clock: a flood of 1M distinct one-shot keys (50k/s for
    /// 20 s) over 1,000 steady clients at 1/s, and an attacker at 10/s who starts at 10 s. Memory
    /// stays within the bound throughout and the attacker is the first row 2 s after it starts.
    #[test]
    fn a_million_key_flood_stays_bounded_and_the_attacker_leads_within_two_seconds() {
        let settings = settings();
        let mut t = Table::new(settings, 0);
        let bound = Table::bound_bytes(&settings);
        let mut flood = 0u64;
        let step = S / 50_000;
        let mut peak = 0;
        for tick in 0..(20 * S / step) {
            let now = tick * step;
            flood += 1;
            t.record(format!("flood-{flood}").as_bytes(), LimitStatus::Passed, 1.0, now);
            if now.is_multiple_of(S / 1000) {
                // Each steady client once a second: 1,000 over the second.
                let client = (now / (S / 1000)) % 1000;
                t.record(format!("client-{client}").as_bytes(), LimitStatus::Passed, 1.0, now);
            }
            if now >= 10 * S && now.is_multiple_of(S / 10) {
                t.record(b"attacker", LimitStatus::Rejected, 1.0, now);
            }
            if tick % 100_000 == 0 {
                peak = peak.max(t.bytes());
            }
            if now == 12 * S {
                let mut rows = t.rows(now, 60 * S);
                assert_eq!(first(&mut rows, |r| r.rate), b"attacker", "{:?}", &rows[..3]);
                assert_eq!(first(&mut rows, |r| r.rejected_rate), b"attacker");
            }
        }
        assert_eq!(flood, 1_000_000);
        assert!(t.len() <= settings.capacity);
        assert!(peak.max(t.bytes()) <= bound, "{} > {bound}", peak.max(t.bytes()));
        let mut rows = t.rows(20 * S, 60 * S);
        assert_eq!(first(&mut rows, |r| r.rate), b"attacker");
    }
}
