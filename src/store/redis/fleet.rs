//! What the instances of a fleet share besides limit state, on the admin side's own connection:
//! key resets and the top-keys views (`src/top/fleet.rs`).
//!
//! * `<prefix>{top}:views`, a hash: each instance's latest view (JSON) under its id, rewritten
//!   every half second while it has rows (deleted when it has none, so an idle fleet leaves no
//!   hash); the hash expires 10 s after the last write, and a reader drops the fields of instances
//!   gone quiet.
//! * `<prefix>{top}:resets`, a stream capped at about 1,000 entries that expires a minute after the
//!   last reset: one entry per reset (`zone`, `key`). Every instance reads the entries after the
//!   last one it saw at each sync and drops those keys from its deny cache, so a reset lets the key
//!   through fleet-wide within one sync period (plus the store's timeout).
//!
//! Both names carry the `{top}` hash tag: on a Redis Cluster they live in one slot.

use ::redis::Value;

use super::RedisStore;
use crate::store::{FleetSync, StoreError};

/// The stream id before any: a new instance reads the stream's (at most ~1,000) past resets once,
/// which only forgets deny-cache entries it does not have.
pub(super) const FIRST_RESET: &str = "-";
/// The views' hash lives this long after the last write (more than `top::fleet::STALE_AFTER_MS`).
const VIEWS_TTL_MS: u64 = 10_000;
/// The resets' stream lives this long after the last reset (instances read it every 0.5 s).
const RESETS_TTL_MS: u64 = 60_000;
const MAX_RESETS: u64 = 1_000;

/// A stream entry as XRANGE returns it: its id and its field-value pairs.
type StreamEntry = (String, Vec<(Vec<u8>, Vec<u8>)>);

impl RedisStore {
    fn fleet_key(&self, what: &str) -> String {
        format!("{}{{top}}:{what}", self.config.key_prefix)
    }

    /// Deletes the key's state (every algorithm keeps one Redis key per zone and client key), then
    /// announces the reset to the fleet.
    pub(super) async fn reset_key(&self, zone: &str, key: &[u8]) -> Result<(), StoreError> {
        let mut conn = self.side.get().await?;
        let state = self.key_for(zone, key);
        // The key's lease holders too (docs/leases.md): a reset key starts with no lease counted.
        let holders = super::lease::holders_key(&state);
        let _: i64 = ::redis::cmd("DEL").arg(&state).arg(&holders).query_async(&mut conn).await?;
        let _: Value = ::redis::cmd("XADD")
            .arg(self.fleet_key("resets"))
            .arg("MAXLEN")
            .arg("~")
            .arg(MAX_RESETS)
            .arg("*")
            .arg("zone")
            .arg(zone)
            .arg("key")
            .arg(key)
            .query_async(&mut conn)
            .await?;
        let _: Value =
            ::redis::cmd("PEXPIRE").arg(self.fleet_key("resets")).arg(RESETS_TTL_MS).query_async(&mut conn).await?;
        Ok(())
    }

    /// Publishes `view` as `instance`'s, drops `forget`'s, and reads every view and the resets
    /// since the previous call.
    pub(super) async fn exchange_views(
        &self,
        instance: &str,
        view: Option<Vec<u8>>,
        forget: &[String],
    ) -> Result<FleetSync, StoreError> {
        let mut conn = self.side.get().await?;
        let views_key = self.fleet_key("views");
        match view {
            Some(view) => {
                let _: Value =
                    ::redis::cmd("HSET").arg(&views_key).arg(instance).arg(view).query_async(&mut conn).await?;
                let _: Value = ::redis::cmd("PEXPIRE").arg(&views_key).arg(VIEWS_TTL_MS).query_async(&mut conn).await?;
            }
            None => {
                let _: Value = ::redis::cmd("HDEL").arg(&views_key).arg(instance).query_async(&mut conn).await?;
            }
        }
        if !forget.is_empty() {
            let _: Value = ::redis::cmd("HDEL").arg(&views_key).arg(forget).query_async(&mut conn).await?;
        }
        let fields: Vec<(Vec<u8>, Vec<u8>)> = ::redis::cmd("HGETALL").arg(&views_key).query_async(&mut conn).await?;
        let cursor = self.reset_cursor.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // After the first read, "(id": strictly after the last entry seen.
        let start = if cursor == FIRST_RESET { cursor } else { format!("({cursor}") };
        let entries: Vec<StreamEntry> = ::redis::cmd("XRANGE")
            .arg(self.fleet_key("resets"))
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(MAX_RESETS)
            .query_async(&mut conn)
            .await?;
        let mut resets = Vec::with_capacity(entries.len());
        for (id, pairs) in &entries {
            let field = |name: &[u8]| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
            if let (Some(zone), Some(key)) = (field(b"zone"), field(b"key")) {
                resets.push((String::from_utf8_lossy(&zone).into_owned(), key));
            }
            *self.reset_cursor.lock().unwrap_or_else(|p| p.into_inner()) = id.clone();
        }
        Ok(FleetSync { views: fields.into_iter().map(|(_, v)| v).collect(), resets })
    }
}
