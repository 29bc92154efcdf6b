//! How many keys each zone holds on Redis (`GET /zones` on the admin API): one `SCAN` over the
//! keys under `key_prefix`, bounded by a number of keys examined, each key counted under the zone
//! its name holds (`<prefix><zone>:{…}` for rate state, `<prefix>conn:<zone>:{…}` for leases),
//! a leased key's holders (`<prefix><zone>:{…}:lease`, docs/leases.md) counted apart: they are
//! not keys of their own.
//! On demand only: a scan costs Redis time in proportion to its whole keyspace.

use std::collections::BTreeMap;

use serde::Serialize;

use super::connection::RedisConn;
use crate::store::StoreError;

/// Keys asked of Redis per `SCAN` call.
const SCAN_COUNT: u64 = 1000;

/// What one count found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ZoneKeys {
    /// Rate-limit keys per `limit_req` zone (names as in their keys).
    pub limit_req: BTreeMap<String, u64>,
    /// Lease keys per `limit_conn` zone.
    pub limit_conn: BTreeMap<String, u64>,
    /// Leased keys with live budget leases (their holders' hash) per `limit_req` zone: each is a
    /// key counted in `limit_req` too (while its state lasts), not another key.
    pub lease_holders: BTreeMap<String, u64>,
    /// Keys examined (every key under the prefix, Weir's health key included).
    pub scanned: u64,
    /// Whether the scan went through the whole keyspace; `false` when it stopped at its bound
    /// (the counts are then at least these).
    pub complete: bool,
}

impl ZoneKeys {
    /// Counts one key name, read under `prefix`.
    fn count(&mut self, prefix: &[u8], name: &[u8]) {
        self.scanned += 1;
        let Some(rest) = name.strip_prefix(prefix) else { return };
        // `conn:{…}` is a limit_req zone named "conn"; `conn:<zone>:{…}` a lease.
        // A state key ends with its '}', so only a holders' hash ends with "}:lease".
        let (table, rest) = match rest.strip_prefix(b"conn:") {
            Some(zone_and_key) if !zone_and_key.starts_with(b"{") => (&mut self.limit_conn, zone_and_key),
            _ if rest.ends_with(b"}:lease") => (&mut self.lease_holders, rest),
            _ => (&mut self.limit_req, rest),
        };
        // Zone names hold no ':' (config/checks.rs), so the first ":{" ends the zone.
        if let Some(at) = rest.windows(2).position(|w| w == b":{") {
            *table.entry(String::from_utf8_lossy(&rest[..at]).into_owned()).or_default() += 1;
        }
    }
}

/// `prefix` as a `SCAN MATCH` pattern that matches it literally, then anything.
fn match_pattern(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 2);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    pattern
}

/// Scans the keys under `prefix`, examining at most `budget` (a little more: whole `SCAN` pages).
pub(super) async fn count(conn: &mut RedisConn, prefix: &str, budget: u64) -> Result<ZoneKeys, StoreError> {
    let pattern = match_pattern(prefix);
    let mut found = ZoneKeys::default();
    let mut cursor: u64 = 0;
    loop {
        let (next, names): (u64, Vec<Vec<u8>>) = ::redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query_async(conn)
            .await?;
        for name in &names {
            found.count(prefix.as_bytes(), name);
        }
        cursor = next;
        if cursor == 0 {
            found.complete = true;
            return Ok(found);
        }
        if found.scanned >= budget {
            return Ok(found);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_counted_under_their_zone() {
        let mut found = ZoneKeys::default();
        for name in [
            &b"weir:per_ip:{203.0.113.7}"[..],
            b"weir:per_ip:{#0a1b}",
            b"weir:api.v2:{k:{x}}",
            b"weir:conn:per_ip:{203.0.113.7}",
            b"weir:conn:{k}",
            b"weir:per_ip:{203.0.113.7}:lease",
            b"weir:per_ip:{x:lease}",
            b"weir:health",
            b"other:per_ip:{x}",
        ] {
            found.count(b"weir:", name);
        }
        assert_eq!(found.limit_req.get("per_ip"), Some(&3), "a key named x:lease is a key");
        assert_eq!(found.lease_holders.get("per_ip"), Some(&1), "holders are not keys");
        assert_eq!(found.limit_req.get("api.v2"), Some(&1));
        assert_eq!(found.limit_req.get("conn"), Some(&1), "a limit_req zone named conn");
        assert_eq!(found.limit_conn.get("per_ip"), Some(&1));
        assert_eq!(found.scanned, 9);
    }

    #[test]
    fn the_prefix_is_matched_literally() {
        assert_eq!(match_pattern("weir:"), "weir:*");
        assert_eq!(match_pattern("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\*");
    }
}
