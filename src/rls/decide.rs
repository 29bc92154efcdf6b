//! One call's decision through the engine, with envoyproxy/ratelimit's soft limits
//! (`quota_mode`): a call is over its limits only when a hard limit is over, or every soft limit
//! it matched is. Over-limit calls still charge nothing (all or nothing, like a route's zones).
//!
//! The engine decides all of a call's zones in one atomic store call. When that call is refused
//! by soft limits alone, and not by all of them, the call is decided again without the soft
//! limits that were over: those are answered OVER_LIMIT and charged nothing, the others are
//! charged if the second decision admits them. Between the two decisions other calls may change
//! the counters; the second decision is atomic on its own and is the one that counts.

use std::time::Duration;

use super::answer::{self, Call, ZoneAnswer};
use super::plan::Plan;
use crate::config::Route;
use crate::engine::{Groups, Report, Ruling, Stores, Ticket};

/// The plan (zones in `Groups` order), how the call was decided, and every zone's answer in the
/// plan's order.
pub struct Decided<'a> {
    pub plan: Plan<'a>,
    pub call: Call,
    pub zones: Vec<ZoneAnswer>,
}

/// Decides the call on `ticket` (the words and results of the decision that counts stay on it).
pub async fn decide<'a>(ticket: &mut Ticket, route: &'a Route, plan: Plan<'a>, stores: &Stores) -> Decided<'a> {
    let Plan { keyed, slots } = plan;
    let groups = Groups::new(keyed);
    let first = ticket.rule_zones(route, &groups, stores).await;
    let plan = Plan { keyed: groups.into_all(), slots };
    let mut zones = answer::zone_answers(&ticket.report(), refused(&first));
    let Some(over) = soft_limits_over(&plan, &first, &ticket.report()) else {
        let call = call(ticket, first);
        return Decided { plan, call, zones };
    };
    // Again without the soft limits that were over (and without dry-run zones: decided above).
    let kept: Vec<usize> = (0..plan.keyed.len()).filter(|i| !plan.keyed[*i].dry_run && !over.contains(i)).collect();
    let retry = Groups::new(kept.iter().map(|&i| plan.keyed[i].clone()).collect());
    let second = ticket.rule_zones(route, &retry, stores).await;
    for (answer, &i) in answer::zone_answers(&ticket.report(), refused(&second)).into_iter().zip(&kept) {
        zones[i] = answer;
    }
    let call = call(ticket, second);
    Decided { plan, call, zones }
}

/// The ruling refused the call.
fn refused(ruling: &Ruling<'_>) -> bool {
    matches!(ruling, Ruling::Refuse(_))
}

/// The ruling that counts as the call's answer.
fn call(ticket: &mut Ticket, ruling: Ruling<'_>) -> Call {
    match ruling {
        Ruling::Refuse(answer) => Call { over_limit: true, fields: answer.headers, delay: Duration::ZERO },
        Ruling::Forward { delay, .. } => Call { over_limit: false, fields: ticket.head_fields(), delay },
    }
}

/// The soft limits that refused a call refused only by soft limits, when some soft limit of the
/// call admitted it; `None` when the first decision stands.
fn soft_limits_over(plan: &Plan<'_>, ruling: &Ruling<'_>, report: &Report<'_>) -> Option<Vec<usize>> {
    if !refused(ruling) || report.fallback.is_some() {
        return None;
    }
    let enforced = report.zones.iter().enumerate().filter(|(_, z)| !z.dry_run);
    let refusing: Vec<usize> = enforced.clone().filter(|(_, z)| z.refused()).map(|(i, _)| i).collect();
    let soft = enforced.filter(|&(i, _)| plan.is_quota(i)).count();
    let only_soft = !refusing.is_empty() && refusing.iter().all(|&i| plan.is_quota(i));
    (only_soft && refusing.len() < soft).then_some(refusing)
}
