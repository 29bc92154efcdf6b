//! What the Lua-vs-model differential tests share: the seed of their random traces and the store
//! they drive (the real script on a real Redis, on the test's own clock, with whole outcomes).

use std::sync::Arc;
use std::time::Duration;

use weir::limit::ManualClock;
use weir::store::{RedisClock, RedisStore, RedisStoreConfig};

use super::redis_server::RedisServer;

/// `WEIR_DIFF_SEED` (hex with `0x`, or decimal) to replay a failing run, else `default`.
pub fn seed(default: u64) -> u64 {
    match std::env::var("WEIR_DIFF_SEED") {
        Ok(s) => {
            let s = s.trim();
            match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            }
            .expect("WEIR_DIFF_SEED must be an integer")
        }
        Err(_) => default,
    }
}

/// A Redis store on `server` whose decisions use `clock` (not Redis's) and carry each zone's whole
/// outcome, so they compare field by field with the model's.
pub fn model_store(server: &RedisServer, prefix: &str, clock: Arc<ManualClock>) -> RedisStore {
    let config = RedisStoreConfig {
        url: server.url(),
        timeout: Duration::from_secs(5),
        clock: RedisClock::Local,
        key_prefix: prefix.to_string(),
        tls: None,
    };
    RedisStore::new(config, clock).expect("a Redis store on the test server").with_full_outcomes(true)
}
