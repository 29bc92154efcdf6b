//! Envoy RLQS ledgers (`lua/rlqs_demand.lua`; what they mean is `src/rls/quota/ledger.rs`): one
//! hash per divided zone and key, `<prefix>rlqs:<zone>:{<key>}`, on the admin side's connection
//! (a report is no request's decision, and must not queue behind them).

use std::sync::LazyLock;

use super::connection::LuaScript;
use super::{redis_key, RedisStore};
use crate::store::StoreError;

/// `lua/rlqs_demand.lua`, called by its SHA-1 (`connection.rs`).
static RLQS_DEMAND: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("../../../lua/rlqs_demand.lua")));

impl RedisStore {
    /// One call of the ledger script: `op`, the store's clock, then `args`.
    pub(super) async fn quota_call(
        &self,
        zone: &str,
        key: &[u8],
        op: &str,
        args: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let ledger = redis_key(&format!("{}rlqs:", self.config().key_prefix), zone, key);
        let mut call = RLQS_DEMAND.call();
        call.key(&ledger).arg(op);
        match self.now_arg(|c| c.now_us() / 1000) {
            Some(now_ms) => call.arg(now_ms),
            None => call.arg(""),
        };
        for arg in args {
            call.arg(arg);
        }
        self.bounded(async {
            let mut conn = self.side.get().await?;
            Ok(call.invoke::<Vec<String>>(&mut conn).await?)
        })
        .await
    }
}
