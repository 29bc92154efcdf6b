//! The ledger of each divided zone and key: every holder's (an Envoy's bucket on one stream)
//! latest demand and live grant. On a Redis store it is `lua/rlqs_demand.lua`, shared by every
//! Weir instance on that Redis, so the fleet makes one division; on the memory store it is
//! [`MemoryLedger`], this file's twin of the script (one instance, one ledger).
//!
//! Two steps per report, each atomic: `report` records the holder's demand and reads every live
//! holder (the division is computed from that view, `assign.rs`), then `claim` grants what the
//! division asks for, but never more than the budget minus the other live holders' grants. So the
//! live grants never sum past the budget, whatever the instances' views or their timing; a holder
//! that stops reporting keeps its grant until its entry expires (its Envoy may use the assignment
//! that long), then the room is the others'.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::assign::{Budget, Grant, Holder};
use crate::limit::Clock;
use crate::store::{StoreAdmin, StoreError};

/// Where the ledgers live.
#[derive(Clone)]
pub enum Ledger {
    /// The shared store (Redis): `StoreAdmin::quota_ledger`.
    Shared(Arc<dyn StoreAdmin>),
    /// In process (the memory store).
    Local(Arc<MemoryLedger>),
}

impl Ledger {
    /// Records `holder`'s demand; every live holder, `holder` included, those that have not
    /// reported for `stale` with demand 0.
    pub async fn report(
        &self,
        zone: &str,
        key: &[u8],
        holder: &str,
        demand: f64,
        life: Duration,
        stale: Duration,
    ) -> Result<Vec<Holder>, StoreError> {
        match self {
            Ledger::Local(memory) => Ok(memory.report(zone, key, holder, demand, life, stale)),
            Ledger::Shared(store) => {
                let args = [
                    holder.to_string(),
                    life.as_millis().to_string(),
                    demand_text(demand),
                    stale.as_millis().to_string(),
                ];
                let reply = shared(store.quota_ledger(zone, key, "report", &args).await?)?;
                parse_holders(&reply)
            }
        }
    }

    /// Grants `want`, within what the other live holders leave of `budget`.
    #[allow(clippy::too_many_arguments)]
    pub async fn claim(
        &self,
        zone: &str,
        key: &[u8],
        holder: &str,
        demand: f64,
        want: Grant,
        budget: &Budget,
        life: Duration,
    ) -> Result<Grant, StoreError> {
        match self {
            Ledger::Local(memory) => Ok(memory.claim(zone, key, holder, demand, want, budget, life)),
            Ledger::Shared(store) => {
                let args = [
                    holder.to_string(),
                    life.as_millis().to_string(),
                    demand_text(demand),
                    want.tokens_per_fill.to_string(),
                    want.max_tokens.to_string(),
                    budget.rate_tokens.to_string(),
                    budget.max_tokens.to_string(),
                ];
                let reply = shared(store.quota_ledger(zone, key, "claim", &args).await?)?;
                match reply.as_slice() {
                    [rate, tokens] => Ok(Grant { tokens_per_fill: number(rate)?, max_tokens: number(tokens)? }),
                    other => Err(StoreError::Reply(format!("rlqs_demand claim: expected 2 numbers, got {other:?}"))),
                }
            }
        }
    }

    /// One report's whole division: records `holder`'s demand, computes its fair share from the
    /// live holders (`assign`), keeps `current` within the hysteresis, and claims it. What was
    /// asked, what was granted, and the holders the division saw.
    #[allow(clippy::too_many_arguments)]
    pub async fn share(
        &self,
        zone: &str,
        key: &[u8],
        holder: &str,
        demand: f64,
        current: Option<Grant>,
        budget: &Budget,
        interval: Duration,
    ) -> Result<Division, StoreError> {
        let life = super::assign::ledger_life(interval);
        let stale = interval * 3 / 2;
        let view = self.report(zone, key, holder, demand, life, stale).await?;
        let fair = super::assign::fair_share(budget, &view, holder);
        let want = super::assign::wanted(current, fair);
        let granted = self.claim(zone, key, holder, demand, want, budget, life).await?;
        Ok(Division { want, granted, view })
    }

    /// Forgets `holder` (its Envoy was told to abandon the bucket).
    pub async fn leave(&self, zone: &str, key: &[u8], holder: &str) -> Result<(), StoreError> {
        match self {
            Ledger::Local(memory) => {
                memory.leave(zone, key, holder);
                Ok(())
            }
            Ledger::Shared(store) => {
                let args = [holder.to_string(), "0".to_string()];
                shared(store.quota_ledger(zone, key, "leave", &args).await?).map(drop)
            }
        }
    }
}

/// What one report's division asked, got, and saw.
#[derive(Debug, Clone)]
pub struct Division {
    pub want: Grant,
    pub granted: Grant,
    /// Every live holder as the report read them (before this holder's claim).
    pub view: Vec<Holder>,
}

fn shared(reply: Option<Vec<String>>) -> Result<Vec<String>, StoreError> {
    reply.ok_or_else(|| StoreError::Reply("the store keeps no RLQS ledger (not shared)".into()))
}

/// Demand as the ledger keeps it: a decimal with milli-request precision, never "inf" or "NaN".
fn demand_text(demand: f64) -> String {
    let d = if demand.is_finite() { demand.clamp(0.0, 1e12) } else { 0.0 };
    format!("{d:.3}")
}

fn number(text: &str) -> Result<u64, StoreError> {
    // Lua may write an integral double as "12" or, past 1e14, in exponent form.
    text.parse::<u64>()
        .or_else(|_| text.parse::<f64>().map(|f| f.max(0.0) as u64))
        .map_err(|_| StoreError::Reply(format!("rlqs_demand: {text:?} is not a number")))
}

fn parse_holders(reply: &[String]) -> Result<Vec<Holder>, StoreError> {
    if !reply.len().is_multiple_of(4) {
        return Err(StoreError::Reply(format!("rlqs_demand report: {} values, not holders of 4", reply.len())));
    }
    reply
        .chunks(4)
        .map(|c| {
            Ok(Holder {
                id: c[0].clone(),
                demand: c[1].parse().map_err(|_| StoreError::Reply(format!("rlqs_demand: demand {:?}", c[1])))?,
                grant: Grant { tokens_per_fill: number(&c[2])?, max_tokens: number(&c[3])? },
            })
        })
        .collect()
}

/// One holder's entry.
#[derive(Debug, Clone, Copy)]
struct Entry {
    demand: f64,
    grant: Grant,
    expires_us: u64,
    reported_us: u64,
}

/// One ledger: its holders' entries by holder name.
type Holders = HashMap<String, Entry>;

/// Ledgers at most kept in process; past it, the oldest-touched ledger with no live holder goes
/// first (then any: its holders' Envoys see their next report re-create it).
const MAX_LEDGERS: usize = 100_000;

/// `lua/rlqs_demand.lua` in process, on an injected clock.
pub struct MemoryLedger {
    clock: Arc<dyn Clock>,
    ledgers: Mutex<HashMap<(String, Vec<u8>), Holders>>,
}

impl MemoryLedger {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryLedger { clock, ledgers: Mutex::new(HashMap::new()) }
    }

    /// The live entries of one ledger (expired ones dropped), under the lock.
    fn with<T>(&self, zone: &str, key: &[u8], f: impl FnOnce(&mut HashMap<String, Entry>, u64) -> T) -> T {
        let now = self.clock.now_us();
        let mut all = self.ledgers.lock().unwrap_or_else(|p| p.into_inner());
        if all.len() >= MAX_LEDGERS {
            all.retain(|_, holders| {
                holders.retain(|_, e| e.expires_us > now);
                !holders.is_empty()
            });
        }
        let holders = all.entry((zone.to_string(), key.to_vec())).or_default();
        holders.retain(|_, e| e.expires_us > now);
        let out = f(holders, now);
        if holders.is_empty() {
            all.remove(&(zone.to_string(), key.to_vec()));
        }
        out
    }

    pub fn report(
        &self,
        zone: &str,
        key: &[u8],
        holder: &str,
        demand: f64,
        life: Duration,
        stale: Duration,
    ) -> Vec<Holder> {
        self.with(zone, key, |holders, now| {
            let expires_us = now + life.as_micros() as u64;
            let grant = holders.get(holder).map(|e| e.grant).unwrap_or_default();
            holders.insert(holder.to_string(), Entry { demand, grant, expires_us, reported_us: now });
            let stale = stale.as_micros() as u64;
            holders
                .iter()
                .map(|(id, e)| Holder {
                    id: id.clone(),
                    demand: if now - e.reported_us > stale { 0.0 } else { e.demand },
                    grant: e.grant,
                })
                .collect()
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn claim(
        &self,
        zone: &str,
        key: &[u8],
        holder: &str,
        demand: f64,
        want: Grant,
        budget: &Budget,
        life: Duration,
    ) -> Grant {
        self.with(zone, key, |holders, now| {
            let (mut rate, mut tokens) = (0u64, 0u64);
            for (id, e) in holders.iter() {
                if id != holder {
                    rate += e.grant.tokens_per_fill;
                    tokens += e.grant.max_tokens;
                }
            }
            let grant = Grant {
                tokens_per_fill: want.tokens_per_fill.min(budget.rate_tokens.saturating_sub(rate)),
                max_tokens: want.max_tokens.min(budget.max_tokens.saturating_sub(tokens)),
            };
            let expires_us = now + life.as_micros() as u64;
            holders.insert(holder.to_string(), Entry { demand, grant, expires_us, reported_us: now });
            grant
        })
    }

    pub fn leave(&self, zone: &str, key: &[u8], holder: &str) {
        self.with(zone, key, |holders, _| {
            holders.remove(holder);
        });
    }

    /// The live grants of one ledger's holders (tests, the live view).
    pub fn grants(&self, zone: &str, key: &[u8]) -> Vec<(String, Grant)> {
        self.with(zone, key, |holders, _| holders.iter().map(|(id, e)| (id.clone(), e.grant)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::ManualClock;
    use crate::limit::Rate;

    const S: u64 = 1_000_000;

    #[test]
    fn claims_never_pass_the_budget_and_expired_holders_free_their_room() {
        let clock = Arc::new(ManualClock::new(10 * S));
        let ledger = MemoryLedger::new(clock.clone());
        let budget = Budget::of(Rate::parse("100r/s").unwrap(), 10);
        let life = Duration::from_secs(3);
        let big = Grant { tokens_per_fill: 80, max_tokens: 8 };
        ledger.report("z", b"k", "a", 80.0, life, life);
        assert_eq!(ledger.claim("z", b"k", "a", 80.0, big, &budget, life), big);
        let view = ledger.report("z", b"k", "b", 80.0, life, life);
        assert_eq!(view.len(), 2);
        // b asks for as much; only what a leaves is granted.
        assert_eq!(
            ledger.claim("z", b"k", "b", 80.0, big, &budget, life),
            Grant { tokens_per_fill: 20, max_tokens: 2 }
        );
        // a shrinks to its half; b's next claim gets the room.
        let half = Grant { tokens_per_fill: 50, max_tokens: 5 };
        assert_eq!(ledger.claim("z", b"k", "a", 80.0, half, &budget, life), half);
        assert_eq!(ledger.claim("z", b"k", "b", 80.0, half, &budget, life), half);
        // a stops reporting: its room is b's once its entry has expired, not before.
        clock.advance_us(2 * S);
        assert_eq!(ledger.claim("z", b"k", "b", 80.0, big, &budget, life).tokens_per_fill, 50);
        clock.advance_us(S + 1);
        assert_eq!(ledger.claim("z", b"k", "b", 80.0, big, &budget, life), big);
        assert_eq!(ledger.grants("z", b"k").len(), 1);
        ledger.leave("z", b"k", "b");
        assert!(ledger.grants("z", b"k").is_empty());
    }

    #[test]
    fn a_report_keeps_the_grant_and_shows_every_live_holder() {
        let clock = Arc::new(ManualClock::new(S));
        let ledger = MemoryLedger::new(clock.clone());
        let budget = Budget::of(Rate::parse("10r/s").unwrap(), 4);
        let life = Duration::from_secs(2);
        let g = Grant { tokens_per_fill: 30, max_tokens: 1 };
        ledger.claim("z", b"k", "a", 3.0, g, &budget, life);
        let view = ledger.report("z", b"k", "a", 5.0, life, life);
        assert_eq!(view, vec![Holder { id: "a".into(), demand: 5.0, grant: g }]);
        assert!(ledger.report("z", b"other", "a", 5.0, life, life)[0].grant.is_empty(), "ledgers are per key");
        // A holder that has not reported for `stale` shows no demand; its grant still counts.
        clock.advance_us(S + 1);
        let view = ledger.report("z", b"k", "b", 1.0, life, Duration::from_secs(1));
        let a = view.iter().find(|h| h.id == "a").unwrap();
        assert_eq!((a.demand, a.grant), (0.0, g));
    }

    #[test]
    fn replies_of_the_script_parse_and_garbage_is_an_error() {
        let reply: Vec<String> =
            ["a", "1.500", "10", "2", "b", "0.000", "0", "0"].iter().map(|s| s.to_string()).collect();
        let holders = parse_holders(&reply).unwrap();
        assert_eq!(
            holders[0],
            Holder { id: "a".into(), demand: 1.5, grant: Grant { tokens_per_fill: 10, max_tokens: 2 } }
        );
        assert!(parse_holders(&reply[..3]).is_err());
        assert!(number("1e+15").is_ok() && number("x").is_err());
        assert_eq!(demand_text(f64::NAN), "0.000");
        assert_eq!(demand_text(2.0 / 3.0), "0.667");
    }
}
