//! One call's decision through the engine, with envoyproxy/ratelimit's soft limits
//! (`quota_mode`): a call is over its limits only when a hard limit is over, or every soft limit
//! it matched is. Over-limit calls still charge nothing (all or nothing, like a route's zones).
//!
//! The engine decides all of a call's zones in one atomic store call. When that call is refused
//! by soft limits alone, and not by all of them, the call is decided again without the soft
//! limits that were over: those are answered OVER_LIMIT and charged nothing, the others are
//! charged if the second decision admits them. Between the two decisions other calls may change
//! the counters; the second decision is atomic on its own and is the one that counts.

use super::answer::{self, ZoneAnswer};
use super::plan::Plan;
use crate::config::Route;
use crate::engine::Groups;
use crate::engine::Ticket;
use crate::engine::{Action, Enforcement, Stores};

/// The plan (zones in `Groups` order), the enforcement that decided the call, and every zone's
/// answer in the plan's order.
pub struct Decided<'a> {
    pub plan: Plan<'a>,
    pub enforcement: Enforcement<'a>,
    pub zones: Vec<ZoneAnswer>,
}

/// Decides the call on `ticket` (the words of the decision that counts stay on it).
pub async fn decide<'a>(ticket: &mut Ticket, route: &'a Route, plan: Plan<'a>, stores: &Stores) -> Decided<'a> {
    let Plan { keyed, slots } = plan;
    let groups = Groups::new(keyed);
    let first = ticket.rule_zones(route, &groups, stores).await;
    let plan = Plan { keyed: groups.into_all(), slots };
    let mut zones = answer::zone_answers(&plan, &first);
    let Some(over) = soft_limits_over(&plan, &first) else {
        return Decided { plan, enforcement: first, zones };
    };
    // Again without the soft limits that were over (and without dry-run zones: decided above).
    let kept: Vec<usize> = (0..plan.keyed.len()).filter(|i| !plan.keyed[*i].dry_run && !over.contains(i)).collect();
    let retry = Groups::new(kept.iter().map(|&i| plan.keyed[i].clone()).collect());
    let second = ticket.rule_zones(route, &retry, stores).await;
    let retried = Plan { keyed: retry.into_all(), slots: Vec::new() };
    for (answer, &i) in answer::zone_answers(&retried, &second).into_iter().zip(&kept) {
        zones[i] = answer;
    }
    Decided { plan, enforcement: second, zones }
}

/// The soft limits that refused a call refused only by soft limits, when some soft limit of the
/// call admitted it; `None` when the first decision stands.
fn soft_limits_over(plan: &Plan<'_>, e: &Enforcement<'_>) -> Option<Vec<usize>> {
    if !matches!(e.action, Action::Reject { .. }) || e.fallback.is_some() {
        return None;
    }
    let verdict = e.enforced.as_ref()?;
    let enforced = plan.keyed.iter().take_while(|z| !z.dry_run).count();
    let refusing: Vec<usize> = (0..enforced).filter(|&i| verdict.zones.get(i).is_some_and(|z| !z.admitted)).collect();
    let soft = (0..enforced).filter(|&i| plan.is_quota(i)).count();
    let only_soft = !refusing.is_empty() && refusing.iter().all(|&i| plan.is_quota(i));
    (only_soft && refusing.len() < soft).then_some(refusing)
}
