//! A fast, non-keyed hasher for replay's own maps of client keys (the Fx hash of rustc). The
//! keys come from the user's own log, so hash flooding is not a concern; SipHash was a tenth of
//! the replay's time.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_keys_stay_distinct() {
        let mut m: FastMap<Vec<u8>, u32> = FastMap::default();
        for i in 0..10_000u32 {
            m.insert(format!("192.0.{}.{}", i / 256, i % 256).into_bytes(), i);
        }
        assert_eq!(m.len(), 10_000);
        assert_eq!(m.get(b"192.0.1.2".as_slice()), Some(&258));
        // Zero padding of the last word is told apart by the length a slice hashes first.
        let mut m: FastMap<Vec<u8>, ()> = FastMap::default();
        m.insert(b"a".to_vec(), ());
        m.insert(b"a\0".to_vec(), ());
        assert_eq!(m.len(), 2, "the map hashes the length prefix of a slice");
    }
}
