//! Redis commands tests use to look at what weir stored (keys, lease sets, script calls) and at
//! Redis' own clock. Each takes a synchronous connection, e.g. [`super::redis_server::RedisServer::connection`],
//! and panics when Redis does not answer.

/// Whether `key` exists.
pub fn exists(conn: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<u64>(conn).expect("EXISTS") == 1
}

/// The number of members of the sorted set `key` (0 when it does not exist).
pub fn zcard(conn: &mut redis::Connection, key: &str) -> u64 {
    redis::cmd("ZCARD").arg(key).query(conn).expect("ZCARD")
}

/// Every key matching `pattern`, by SCAN (which also drops the expired keys it meets).
pub fn scan_keys(conn: &mut redis::Connection, pattern: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) =
            redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000).query(conn).expect("SCAN");
        keys.extend(batch);
        cursor = next;
        if cursor == 0 {
            return keys;
        }
    }
}

/// The members of the sorted set `key` with their scores, lowest first.
pub fn zrange_scores(conn: &mut redis::Connection, key: &str) -> Vec<(String, f64)> {
    redis::cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES").query(conn).expect("ZRANGE")
}

/// Redis' clock (TIME) in µs since the epoch.
pub fn time_us(conn: &mut redis::Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
    secs * 1_000_000 + micros
}

/// Calls of EVALSHA and EVAL so far (`INFO commandstats`).
pub fn script_calls(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).expect("INFO commandstats");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split([':', ',']).find_map(|f| f.strip_prefix("calls=")))
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}
