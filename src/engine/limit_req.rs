//! The limit step of one request (nginx `limit_req`): its keyed zones go to the store, the verdict
//! becomes an action (forward, delay, reject), response headers and nginx-style statuses for logs
//! and metrics.
//!
//! Zones in dry run are decided in a separate atomic call from enforced ones, so a shadow limit
//! can never change what an enforced one decides (or charge it).

use std::time::{Duration, Instant};

use super::after_response::charged_after_response;
use super::dry_run::Groups;
use super::fleet_share::fleet_shares;
use super::headers;
use super::observe::Observer;
use super::refusal::{Answer, Refusal};
use super::result::{Counts, ZoneResult};
use super::status::LimitStatus;
use super::store_failure::{self, Resolved};
use super::stores::Stores;
use crate::config::{FailurePolicy, HeaderMode, Route, Runtime};
use crate::limit::{Verdict, ZoneOutcome};
use crate::store::{KeyedZone, LimitStore, MemoryStore, StoreError};

pub(super) enum Action<'a> {
    Forward,
    Delay(Duration),
    Reject(Answer<'a>),
}

/// limit_req's decision of one request, for the ticket to record (`Ticket::rule`).
pub(super) struct Enforcement<'a> {
    pub action: Action<'a>,
    /// Rate-limit fields for the upstream's response, per the route's header mode (a
    /// rejection carries its own in its answer).
    pub headers: Vec<(&'static str, String)>,
    /// The request's word: the most severe of its zones'.
    pub overall: Option<LimitStatus>,
    /// Every keyed zone's result, in the order of `Groups::all`, each with an empty key: the
    /// ticket gives each its key (moved, not copied, on the proxy's path).
    pub zones: Vec<ZoneResult>,
    /// The failure policy that decided, when the store could not.
    pub fallback: Option<FailurePolicy>,
    /// When the store decided (`Verdict::decided_us`); `None` when no store did.
    pub decided_us: Option<u64>,
}

impl Enforcement<'_> {
    /// Nothing decided: forward, no fields, no words.
    fn nothing() -> Self {
        Enforcement {
            action: Action::Forward,
            headers: Vec::new(),
            overall: None,
            zones: Vec::new(),
            fallback: None,
            decided_us: None,
        }
    }
}

pub(super) async fn enforce<'a>(
    rt: &Runtime,
    route: &'a Route,
    keyed: &Groups<KeyedZone<'a>>,
    stores: &Stores,
) -> Enforcement<'a> {
    let store = stores.primary.as_ref();
    let (enforced, shadow) = (keyed.enforced(), keyed.shadow());
    // Both groups at once when there is a dry-run one; the usual request has none and skips the
    // join's bookkeeping.
    let (enforced_result, shadow_result) = if shadow.is_empty() {
        (decide_group(rt, route, store, enforced, stores.observer).await, None)
    } else {
        tokio::join!(
            decide_group(rt, route, store, enforced, stores.observer),
            decide_group(rt, route, store, shadow, stores.observer)
        )
    };
    conclude(rt, route, keyed, stores, enforced_result, shadow_result)
}

/// [`enforce`] without a future, on `store`, the in-process store of `stores` (from
/// `LimitStore::in_process`), when no zone is charged after the response; `None`: await `enforce`.
pub(super) fn enforce_at_once<'a>(
    store: &MemoryStore,
    rt: &Runtime,
    route: &'a Route,
    keyed: &Groups<KeyedZone<'a>>,
    stores: &Stores,
) -> Option<Enforcement<'a>> {
    if keyed.all().iter().any(|z| charged_after_response(rt, route, z)) {
        return None;
    }
    let decide = |group: &[KeyedZone<'_>]| {
        if group.is_empty() {
            return None;
        }
        let started = Instant::now();
        let verdict = store.decide_now(group);
        stores.observer.store_call(started.elapsed());
        Some(Ok(verdict))
    };
    let enforced_result = decide(keyed.enforced());
    let shadow_result = decide(keyed.shadow());
    Some(conclude(rt, route, keyed, stores, enforced_result, shadow_result))
}

/// The groups' store results into the request's action, fields and words (the failure policy
/// where the store could not decide).
fn conclude<'a>(
    rt: &Runtime,
    route: &'a Route,
    keyed: &Groups<KeyedZone<'a>>,
    stores: &Stores,
    enforced_result: Option<Result<Verdict, StoreError>>,
    shadow_result: Option<Result<Verdict, StoreError>>,
) -> Enforcement<'a> {
    let store = stores.primary.as_ref();
    let enforced = keyed.enforced();
    let mut result = Enforcement::nothing();
    let observer = stores.observer;
    let mut resolve = |r, dry_run| {
        store_failure::resolve(r, rt, route, store.kind(), dry_run, route.status, &mut result.fallback, observer)
    };
    let shadow_verdict = match shadow_result.map(|r| resolve(r, true)) {
        Some(Resolved::Decided(v)) => Some(v),
        _ => None,
    };
    let enforced_verdict = match enforced_result.map(|r| resolve(r, false)) {
        None | Some(Resolved::Skipped) => None,
        Some(Resolved::Decided(v)) => Some(v),
        Some(Resolved::Local { fleet_size }) => Some(stores.local.decide_now(&fleet_shares(enforced, fleet_size))),
        Some(Resolved::Denied(answer)) => {
            // No store decided: no zone has a word, the request is refused.
            result.zones = zone_results(route, keyed, None, None).1;
            result.overall = Some(LimitStatus::Rejected);
            result.action = Action::Reject(answer);
            return result;
        }
    };
    result.decided_us = enforced_verdict.as_ref().or(shadow_verdict.as_ref()).map(|v| v.decided_us);
    if let Some(v) = &enforced_verdict {
        observer.decided(rt, enforced, v);
    }
    (result.overall, result.zones) = zone_results(route, keyed, enforced_verdict.as_ref(), shadow_verdict.as_ref());

    if let Some(verdict) = &enforced_verdict {
        result.headers = match route.headers {
            HeaderMode::Draft => vec![
                ("RateLimit-Policy", headers::policy(&route.limits, enforced)),
                ("RateLimit", headers::remaining(enforced, verdict)),
            ],
            HeaderMode::Legacy => headers::legacy(enforced, verdict),
            HeaderMode::None => Vec::new(),
        };
        result.action = if !verdict.admitted {
            let zone = headers::rejecting_zone(enforced, verdict).unwrap_or("");
            let retry = verdict.retry_after_us.map(headers::retry_after_secs);
            let mut headers = std::mem::take(&mut result.headers);
            if let Some(secs) = retry {
                headers.push(("Retry-After", secs.to_string()));
            }
            let own_body = route.rejection.as_ref();
            let refusal = Refusal::RateLimited { route: &route.name, zone, retry_after: retry, own_body };
            Action::Reject(Answer { status: route.status, headers, refusal, grpc_status: route.grpc_status })
        } else if verdict.delay_us > 0 {
            Action::Delay(Duration::from_micros(verdict.delay_us))
        } else {
            Action::Forward
        };
    }
    result
}

/// One group (enforced or dry run) of a request: its zones charged after the response (last in
/// the group) are checked without charge first; only if they admit are the others charged, so a
/// refused request is charged nowhere. The verdict lists the zones in the group's order.
async fn decide_group(
    rt: &Runtime,
    route: &Route,
    store: &dyn LimitStore,
    group: &[KeyedZone<'_>],
    observer: &dyn Observer,
) -> Option<Result<Verdict, StoreError>> {
    let split = group.iter().position(|z| charged_after_response(rt, route, z)).unwrap_or(group.len());
    if split == group.len() {
        return timed_decide(store, group, observer).await;
    }
    let (now, later) = group.split_at(split);
    let started = Instant::now();
    let peeked = store.peek(later).await;
    observer.store_call(started.elapsed());
    let peeked = match peeked {
        Ok(v) => v,
        Err(e) => return Some(Err(e)),
    };
    if !peeked.admitted {
        let not_charged = now.iter().map(|z| ZoneOutcome::not_charged(&z.limit, peeked.decided_us));
        return Some(Ok(Verdict::combine(not_charged.chain(peeked.zones).collect(), peeked.decided_us)));
    }
    match timed_decide(store, now, observer).await {
        None => Some(Ok(peeked)),
        Some(Err(e)) => Some(Err(e)),
        Some(Ok(charged)) => {
            let zones = charged.zones.into_iter().chain(peeked.zones).collect();
            Some(Ok(Verdict::combine(zones, charged.decided_us)))
        }
    }
}

/// One atomic store call for a group of zones, timed; `None` for an empty group (no round trip).
async fn timed_decide(
    store: &dyn LimitStore,
    group: &[KeyedZone<'_>],
    observer: &dyn Observer,
) -> Option<Result<Verdict, StoreError>> {
    if group.is_empty() {
        return None;
    }
    let started = Instant::now();
    let verdict = store.decide(group).await;
    observer.store_call(started.elapsed());
    Some(verdict)
}

/// Each keyed zone's result from its group's verdict (`None`: the group was not decided), keys
/// left empty, and the request's word (the most severe of the zones').
fn zone_results(
    route: &Route,
    keyed: &Groups<KeyedZone<'_>>,
    enforced: Option<&Verdict>,
    shadow: Option<&Verdict>,
) -> (Option<LimitStatus>, Vec<ZoneResult>) {
    let mut overall = None;
    let mut results = Vec::with_capacity(keyed.all().len());
    for ((group, dry_run), verdict) in keyed.each().into_iter().zip([enforced, shadow]) {
        for (n, z) in group.iter().enumerate() {
            let decided = verdict.and_then(|v| v.zones.get(n).map(|out| (v.admitted, out)));
            let status = decided.and_then(|(request_admitted, out)| {
                LimitStatus::of_zone(request_admitted, out.admitted, out.delay_us > 0, dry_run)
            });
            if let Some(status) = status {
                overall = Some(status.worst(overall));
            }
            let counts = decided.map(|(request_admitted, out)| {
                let (remaining, reset_secs) = headers::zone_remaining(z, request_admitted, out);
                Counts { remaining, reset_secs }
            });
            results.push(ZoneResult {
                reference: z.reference,
                zone: route.limits[z.reference].zone,
                key: Vec::new(),
                limit: z.limit,
                cost: z.cost,
                dry_run,
                status,
                delay_us: decided.filter(|(admitted, _)| *admitted).map_or(0, |(_, out)| out.delay_us),
                counts,
            });
        }
    }
    (overall, results)
}

#[cfg(test)]
mod tests {
    use super::super::after_response::{response_cost, ResponseCharges};
    use super::super::keyed::request_cost;
    use super::*;
    use crate::config::Cost;
    use crate::config::ResponseCost;
    use crate::store::decided_at_once;
    use std::sync::Arc;

    /// A forwarded request's response-decided zones, charged at the response head.
    fn charge_after(
        rt: &Runtime,
        route: &Route,
        keyed: &Groups<KeyedZone<'_>>,
        status: u16,
        headers: &http::HeaderMap,
        stores: &Stores,
    ) -> usize {
        let mut charges = ResponseCharges::new(rt, route, keyed);
        charges.forwarded();
        decided_at_once(charges.at_head(status, headers, stores))
    }

    const LOGIN: &str = "[server]\nlisten = [\"127.0.0.1:1\"]\n[store]\nkind = \"memory\"\n[[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:2\"]\n\
        [[limit_req_zone]]\nname = \"fails\"\nkey = \"ip\"\nrate = \"1r/h\"\nCOUNT\n\
        [[route]]\nname = \"login\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_req = [ { zone = \"fails\" } ]\n";

    #[test]
    fn a_counted_zone_is_checked_then_charged_only_for_its_statuses() {
        let rt = crate::config::from_text(&LOGIN.replace("COUNT", "count_statuses = [401]"), "t.toml").expect("valid");
        let route = &rt.routes[0];
        let limit = route.limits[0].limit;
        let keyed = Groups::new(vec![KeyedZone::new("fails", b"k".to_vec(), limit, 1)]);
        let clock = Arc::new(crate::limit::ManualClock::new(1_700_000_000_000_000));
        let stores = Stores::new(Arc::new(MemoryStore::new(clock.clone())), MemoryStore::new(clock));
        for _ in 0..3 {
            assert!(
                matches!(decided_at_once(enforce(&rt, route, &keyed, &stores)).action, Action::Forward),
                "never charged"
            );
            assert_eq!(
                charge_after(&rt, route, &keyed, 200, &http::HeaderMap::new(), &stores),
                0,
                "200 is not counted"
            );
        }
        assert_eq!(charge_after(&rt, route, &keyed, 401, &http::HeaderMap::new(), &stores), 1);
        assert!(
            matches!(decided_at_once(enforce(&rt, route, &keyed, &stores)).action, Action::Reject { .. }),
            "burst 0: one 401"
        );
    }

    #[test]
    fn a_response_cost_is_a_bounded_number_or_the_default() {
        let rc = ResponseCost {
            header: Some(http::HeaderName::from_static("x-tokens-used")),
            default: 3,
            max: 100_000,
            max_debt: None,
            trailer: false,
            log_field: String::new(),
        };
        let mut h = http::HeaderMap::new();
        assert_eq!(response_cost(&rc, &h), 3, "missing");
        for (value, cost) in [("5000", 5000), (" 42 ", 42), ("0", 0), ("99999999999999999999999", 100_000)] {
            h.insert("x-tokens-used", http::HeaderValue::from_static(value));
            assert_eq!(response_cost(&rc, &h), cost, "{value:?}");
        }
        for bad in ["-5", "1.5", "abc", "", "+7", "1e9", "0x10"] {
            h.insert("x-tokens-used", http::HeaderValue::from_static(bad));
            assert_eq!(response_cost(&rc, &h), 3, "{bad:?}");
        }
        h.insert("x-tokens-used", http::HeaderValue::from_bytes(b"\xff9").expect("opaque bytes"));
        assert_eq!(response_cost(&rc, &h), 3, "not text");
    }

    #[test]
    fn a_response_charge_goes_into_debt_and_later_responses_show_it() {
        let zone = "rate = \"20000r/h\"\ncost_from_response = { header = \"x-tokens-used\", max_debt = 5000 }";
        let text = LOGIN
            .replace("rate = \"1r/h\"\nCOUNT", zone)
            .replace("{ zone = \"fails\" }", "{ zone = \"fails\", burst = 19999, nodelay = true }");
        let rt = crate::config::from_text(&text, "t.toml").expect("valid");
        let route = &rt.routes[0];
        let keyed = Groups::new(vec![KeyedZone::new("fails", b"k".to_vec(), route.limits[0].limit, 1)]);
        let clock = Arc::new(crate::limit::ManualClock::new(1_700_000_000_000_000));
        let primary = Arc::new(MemoryStore::new(clock.clone()));
        let stores = Stores::new(primary.clone(), MemoryStore::new(clock));
        let mut tokens = http::HeaderMap::new();
        tokens.insert("x-tokens-used", http::HeaderValue::from_static("7000"));
        for _ in 0..3 {
            let e = decided_at_once(enforce(&rt, route, &keyed, &stores));
            assert!(matches!(e.action, Action::Forward), "checked, not charged");
            assert_eq!(charge_after(&rt, route, &keyed, 200, &tokens, &stores), 1);
        }
        // 21000 tokens: 1000 past the budget. The next request is refused until 1001 drain (180 ms each).
        let e = decided_at_once(enforce(&rt, route, &keyed, &stores));
        let Action::Reject(answer) = e.action else { panic!("not refused") };
        let header = |name: &str| answer.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
        assert_eq!(header("Retry-After").as_deref(), Some("181"), "1001 tokens at 20000/h");
        assert!(header("RateLimit").is_some_and(|v| v.contains("r=0")), "{:?}", answer.headers);
        // The debt is capped: a huge report fills to 20000 + 5000 and no further.
        tokens.insert("x-tokens-used", http::HeaderValue::from_static("999999"));
        charge_after(&rt, route, &keyed, 200, &tokens, &stores);
        let state = primary.state("fails", b"k");
        assert!(matches!(state, Some(crate::limit::State::Bucket(b)) if b.level == 25_000.0), "{state:?}");
    }

    #[test]
    fn cost_from_header_is_validated_and_clamped() {
        let cost = Cost { default: 2, header: Some(http::HeaderName::from_static("x-cost")), max: 10, min: 1 };
        let mut h = http::HeaderMap::new();
        assert_eq!(request_cost(&cost, &h), Ok(2));
        h.insert("x-cost", http::HeaderValue::from_static("7"));
        assert_eq!(request_cost(&cost, &h), Ok(7));
        h.insert("x-cost", http::HeaderValue::from_static("99999999999999999999999"));
        assert_eq!(request_cost(&cost, &h), Ok(10));
        h.insert("x-cost", http::HeaderValue::from_static("0"));
        assert_eq!(request_cost(&cost, &h), Ok(1), "min_cost: zero is not free");
        for bad in ["-1", "1.5", "abc", "", " "] {
            h.insert("x-cost", http::HeaderValue::from_static(bad));
            assert!(request_cost(&cost, &h).is_err(), "{bad:?}");
        }
        let fixed = Cost { default: 5, header: None, max: 100, min: 1 };
        assert_eq!(request_cost(&fixed, &h), Ok(5));
    }
}
