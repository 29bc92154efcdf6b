//! Redis Cluster hash slots: which keys one script call may touch together.
//!
//! A key's slot is CRC16-XMODEM of its hash tag (the bytes between the first `{` and the next `}`,
//! when not empty) or of the whole key, modulo 16384, as Redis Cluster computes it. Weir's keys are
//! `<prefix><zone>:{<client key>}`, so one client's zones share a slot and different clients'
//! zones usually do not.

/// Slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The hash slot of `key` (`CLUSTER KEYSLOT`).
pub fn key_slot(key: &[u8]) -> u16 {
    crc16_xmodem(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// The bytes between the first `{` and the first `}` after it, if there are any.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// CRC-16/XMODEM: polynomial 0x1021, initial value 0, no reflection, no final XOR.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The indices of `keys` grouped by slot: groups in the order their first key appears, indices
/// ascending within a group. One group when every key shares a slot.
pub fn group_by_slot(keys: &[Vec<u8>]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let slot = key_slot(key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, members)) => members.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::redis::cluster_routing::Slot;

    #[test]
    fn known_values() {
        // The CRC-16/XMODEM check value, and the examples of the Redis Cluster specification.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"123456789"), 0x31C3 % SLOTS);
        assert_eq!(key_slot(b""), 0);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"{user1000}.followers"), key_slot(b"user1000"));
        // Only the first `{...}` counts; an empty tag means the whole key.
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16_xmodem(b"foo{}{bar}") % SLOTS);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar"), crc16_xmodem(b"foo{bar") % SLOTS);
        assert_eq!(key_slot(b"weir:per_ip:{203.0.113.7}"), key_slot(b"203.0.113.7"));
    }

    #[test]
    fn agrees_with_redis_rs() {
        let mut key = Vec::new();
        for i in 0u32..2000 {
            key.clear();
            key.extend_from_slice(format!("weir:z{}:", i % 7).as_bytes());
            if i % 3 == 0 {
                key.push(b'{');
            }
            key.extend_from_slice(&i.wrapping_mul(2_654_435_761).to_le_bytes());
            if i % 5 == 0 {
                key.push(b'}');
            }
            assert_eq!(Slot::new(key_slot(&key)), Some(Slot::for_key(&key)), "{key:?}");
        }
    }

    #[test]
    fn groups_keep_first_appearance_order() {
        let keys: Vec<Vec<u8>> = ["weir:a:{x}", "weir:b:{y}", "weir:c:{x}", "weir:d:{y}", "weir:e:{z}"]
            .iter()
            .map(|k| k.as_bytes().to_vec())
            .collect();
        assert_eq!(group_by_slot(&keys), vec![vec![0, 2], vec![1, 3], vec![4]]);
        assert_eq!(group_by_slot(&keys[..1]), vec![vec![0]]);
        assert!(group_by_slot(&[]).is_empty());
    }
}
