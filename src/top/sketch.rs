//! A count-min sketch with conservative update whose counts halve every half-life: the admission
//! filter of a zone's top table. It answers "about how often was this key seen lately" for keys
//! the table does not hold, so a flood of one-shot keys cannot push out a key that keeps coming
//! back (plain space-saving evicts it: every new key replaces the smallest entry).
//!
//! An estimate is never below the key's own (halved) count and exceeds it by the collisions of its
//! cells: on average (events per half-life) / width, less with conservative update.

/// Independent rows; the estimate is the smallest of a key's cells.
const ROWS: usize = 4;

pub struct Sketch {
    width: usize,
    cells: Vec<u32>,
    half_life_us: u64,
    /// When the cells were last halved.
    halved_us: u64,
}

impl Sketch {
    /// `width` cells per row (rounded up to a power of two); memory: 16 × width bytes.
    pub fn new(width: usize, half_life_us: u64, now_us: u64) -> Self {
        let width = width.max(64).next_power_of_two();
        Self { width, cells: vec![0; width * ROWS], half_life_us: half_life_us.max(1), halved_us: now_us }
    }

    pub fn bytes(&self) -> usize {
        self.cells.len() * std::mem::size_of::<u32>()
    }

    /// Counts one event of the key whose hash is `hash`; returns its estimate, this event included.
    pub fn add(&mut self, hash: u64, now_us: u64) -> u32 {
        self.decay(now_us);
        let cells = self.cells_of(hash);
        let estimate = cells.iter().map(|&i| self.cells[i]).min().unwrap_or(0).saturating_add(1);
        // Conservative update: raise only the cells below the new estimate.
        for i in cells {
            self.cells[i] = self.cells[i].max(estimate);
        }
        estimate
    }

    /// Halves every cell once per elapsed half-life (a step approximation of exponential decay).
    fn decay(&mut self, now_us: u64) {
        let periods = now_us.saturating_sub(self.halved_us) / self.half_life_us;
        if periods == 0 {
            return;
        }
        let shift = periods.min(32) as u32;
        for cell in &mut self.cells {
            *cell = cell.checked_shr(shift).unwrap_or(0);
        }
        self.halved_us += periods * self.half_life_us;
    }

    /// One cell per row, from two halves of one hash (Kirsch–Mitzenmacher).
    fn cells_of(&self, hash: u64) -> [usize; ROWS] {
        let (h1, h2) = (hash as u32 as usize, ((hash >> 32) as usize) | 1);
        let mask = self.width - 1;
        std::array::from_fn(|row| row * self.width + (h1.wrapping_add(row.wrapping_mul(h2)) & mask))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_never_undercount_and_halve_each_half_life() {
        let mut s = Sketch::new(1024, 1_000_000, 0);
        for n in 1..=10 {
            assert!(s.add(42, 0) >= n);
        }
        assert_eq!(s.add(42, 999_999), 11);
        // One half-life later: 11 halved to 5, plus this event.
        assert_eq!(s.add(42, 1_000_000), 6);
        // 40 half-lives later everything has decayed away.
        assert_eq!(s.add(42, 41_000_000), 1);
    }

    #[test]
    fn one_shot_keys_stay_low_while_a_repeated_key_climbs() {
        let mut s = Sketch::new(4096, 10_000_000, 0);
        let mut hasher_state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            hasher_state ^= hasher_state << 13;
            hasher_state ^= hasher_state >> 7;
            hasher_state ^= hasher_state << 17;
            hasher_state
        };
        let mut repeated = 0;
        for i in 0..20_000 {
            let est = s.add(next(), 0);
            assert!(est < 20, "a one-shot key estimated at {est}");
            if i % 100 == 0 {
                repeated = s.add(7, 0);
            }
        }
        assert!(repeated >= 200, "{repeated}");
    }
}
