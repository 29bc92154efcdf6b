//! Compensating calls of a request whose zones span several Redis Cluster slots: what to send if a
//! later slot rejects (restore `limit_req` state, release `limit_conn` leases), and a guard that
//! still sends them when the request is cancelled half way (its decision timed out, its client
//! went away): dropped with calls pending, it hands them to a background task on the current
//! runtime, bounded by the store's timeout.

use std::time::Duration;

use ::redis::Value;
use tracing::warn;

use super::connection::{RedisConn, ScriptCall};

pub(super) struct Rollback {
    conn: RedisConn,
    budget: Duration,
    /// Sent last first; a call leaves the list once Redis answered it.
    calls: Vec<ScriptCall>,
}

impl Rollback {
    pub(super) fn new(conn: RedisConn, budget: Duration) -> Self {
        Self { conn, budget, calls: Vec::new() }
    }

    pub(super) fn push(&mut self, call: ScriptCall) {
        self.calls.push(call);
    }

    /// The request stands: nothing to take back.
    pub(super) fn disarm(&mut self) {
        self.calls.clear();
    }

    /// Sends every pending call now, last first. A call that fails is logged and dropped: what it
    /// should have taken back stays charged (a stricter limit, never a looser one).
    pub(super) async fn run(&mut self) {
        send_all(&mut self.conn, &mut self.calls).await;
    }
}

async fn send_all(conn: &mut RedisConn, calls: &mut Vec<ScriptCall>) {
    while let Some(call) = calls.last() {
        if let Err(e) = call.invoke::<Value>(conn).await {
            warn!(error = %e, "redis: could not take back a charge of a rejected multi-slot request; it stays until it drains");
        }
        calls.pop();
    }
}

impl Drop for Rollback {
    fn drop(&mut self) {
        if self.calls.is_empty() {
            return;
        }
        let (mut conn, mut calls, budget) = (self.conn.clone(), std::mem::take(&mut self.calls), self.budget);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if tokio::time::timeout(budget, send_all(&mut conn, &mut calls)).await.is_err() {
                        warn!("redis: taking back the charges of a cancelled multi-slot request timed out");
                    }
                });
            }
            Err(_) => warn!("redis: a cancelled multi-slot request left charges behind (no runtime to take them back)"),
        }
    }
}
