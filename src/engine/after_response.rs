//! Charges decided by the response (`count_statuses`, `cost_from_response`): the zones of an
//! admitted request that were checked before forwarding and are charged once the upstream's
//! answer says how much.
//!
//! A charge is owed from the moment the request is forwarded, whatever the client does next
//! (docs/charges.md, "A client that leaves"):
//! - at the response head: zones counted by status, and zones charged from a header;
//! - at the end of the answer: zones charged from a trailer (`trailer = true`), from the trailer
//!   when the upstream sent one, else from the head;
//! - when the request is over: byte quotas (`body_bytes = true`), the body bytes actually sent to
//!   the client, however it ended;
//! - when the client leaves before the answer it owes for was complete, the most that answer
//!   could have charged: a counted zone as if its status counted, a response cost at its `max`.
//!   The upstream may have done the work either way, so leaving never costs less than staying.
//!
//! An answer the upstream never gave (connect refused, a timeout before the head: Weir answers
//! 502/504 itself) charges nothing, as before.

use std::time::Instant;

use super::dry_run::Groups;
use super::stores::Stores;
use crate::config::{ResponseCost, Route, Runtime};
use crate::limit::DelayPolicy;
use crate::store::KeyedZone;

/// The response-decided charges of one request, driven by its front door: [`Self::forwarded`]
/// when the request goes upstream, [`Self::at_head`], [`Self::body_ended`], [`Self::at_trailers`]
/// as the answer arrives, and [`Self::finish`] exactly once when the request is over.
#[derive(Debug, Default)]
pub struct ResponseCharges {
    zones: Vec<Owed>,
    stage: Stage,
}

/// How far the upstream's answer got.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Not (yet) sent upstream: nothing is owed if it never is.
    #[default]
    Admitted,
    /// Sent upstream: from here the upstream may act on it.
    Forwarded,
    /// The response head arrived; zones charged at the end remain, with the head's cost.
    Head,
    /// The upstream's body ended (no trailer followed, or not yet).
    BodyEnded,
}

/// How a request ended, for the charges still owed when it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The answer went out (or the upstream failed: nothing more will come from it).
    Over,
    /// The client closed its connection or stream before the answer was complete.
    ClientLeft,
}

/// A zone charged after the response, owned so that it outlives the request's config borrow.
#[derive(Debug, Clone)]
struct Owed {
    zone: String,
    key: Vec<u8>,
    limit: crate::limit::LimitReq,
    cost: u64,
    dry_run: bool,
    /// `count_statuses`; `None`: any status.
    statuses: Option<Vec<u16>>,
    response_cost: Option<ResponseCost>,
    /// Zones charged at the end (`trailer`): the head's status and the cost it reported.
    head: Option<(u16, u64)>,
}

impl Owed {
    /// Charged at the end of the answer rather than at its head.
    fn at_end(&self) -> bool {
        self.response_cost.as_ref().is_some_and(|rc| rc.trailer || rc.header.is_none())
    }

    /// A byte quota: charged the body bytes sent, when the request is over.
    fn counts_bytes(&self) -> bool {
        self.response_cost.as_ref().is_some_and(|rc| rc.header.is_none())
    }

    /// The most an answer could have charged: what a client that leaves early is charged.
    fn most(&self) -> u64 {
        self.response_cost.as_ref().map_or(self.cost, |rc| rc.max)
    }
}

/// Whether a keyed zone is charged after the response rather than before forwarding.
pub(super) fn charged_after_response(rt: &Runtime, route: &Route, zone: &KeyedZone<'_>) -> bool {
    let zone = &rt.zones[route.limits[zone.reference].zone];
    zone.count_statuses.is_some() || zone.response_cost.is_some()
}

impl ResponseCharges {
    /// The zones of an admitted request to charge once its response is known; empty (no
    /// allocation) when the route has none.
    pub fn new(rt: &Runtime, route: &Route, keyed: &Groups<KeyedZone<'_>>) -> Self {
        let zones = keyed
            .all()
            .iter()
            .filter(|z| charged_after_response(rt, route, z))
            .map(|z| {
                let zone = &rt.zones[route.limits[z.reference].zone];
                Owed {
                    zone: z.zone.to_owned(),
                    key: z.key.clone(),
                    limit: z.limit,
                    cost: z.cost,
                    dry_run: z.dry_run,
                    statuses: zone.count_statuses.clone(),
                    response_cost: zone.response_cost.clone(),
                    head: None,
                }
            })
            .collect();
        Self { zones, stage: Stage::Admitted }
    }

    pub fn is_empty(&self) -> bool {
        self.zones.is_empty()
    }

    /// The request is on its way to the upstream: its charges are owed from now on.
    pub fn forwarded(&mut self) {
        if self.stage == Stage::Admitted {
            self.stage = Stage::Forwarded;
        }
    }

    /// At the response head (`status`, the upstream's `headers`; 1xx heads are not answers):
    /// charges the zones due now, keeps those charged at the end, drops those whose
    /// `count_statuses` exclude the status. Returns how many zones were charged; a store error
    /// is logged and charges nothing.
    pub async fn at_head(&mut self, status: u16, headers: &http::HeaderMap, stores: &Stores) -> usize {
        if self.zones.is_empty() || status < 200 {
            return 0;
        }
        self.stage = Stage::Head;
        let (mut at_end, now): (Vec<Owed>, Vec<Owed>) = std::mem::take(&mut self.zones)
            .into_iter()
            .filter(|d| d.statuses.as_ref().is_none_or(|s| s.contains(&status)))
            .partition(Owed::at_end);
        for d in &mut at_end {
            d.head = d.response_cost.as_ref().map(|rc| (status, response_cost(rc, headers)));
        }
        self.zones = at_end;
        let due: Vec<(&Owed, u64)> =
            now.iter().map(|d| (d, d.response_cost.as_ref().map_or(d.cost, |rc| response_cost(rc, headers)))).collect();
        charge_due(&due, status, stores).await
    }

    /// The upstream's body ended: what is still owed is the head's cost (or a trailer's, if one
    /// follows), never the early-leaver's.
    pub fn body_ended(&mut self) {
        if self.stage == Stage::Head {
            self.stage = Stage::BodyEnded;
        }
    }

    /// The upstream's trailers (HTTP/2): charges the zones kept for the end from the trailer of
    /// their header's name when present, else from the head's cost.
    pub async fn at_trailers(&mut self, trailers: &http::HeaderMap, stores: &Stores) -> usize {
        self.body_ended();
        self.charge_at_end(Some(trailers), false, stores).await
    }

    /// Charges the byte quotas the body bytes sent (`bytes`), once the request is over.
    async fn charge_bytes(&mut self, bytes: u64, stores: &Stores) -> usize {
        let (quotas, rest): (Vec<Owed>, Vec<Owed>) =
            std::mem::take(&mut self.zones).into_iter().partition(Owed::counts_bytes);
        self.zones = rest;
        let forwarded = self.stage != Stage::Admitted;
        let due: Vec<(&Owed, u64)> = quotas
            .iter()
            .filter(|_| forwarded && bytes > 0)
            .map(|d| (d, d.response_cost.as_ref().map_or(bytes, |rc| bytes.min(rc.max))))
            .collect();
        let status = quotas.first().and_then(|d| d.head).map_or(0, |(status, _)| status);
        charge_due(&due, status, stores).await
    }

    /// The request is over, with `body_bytes` of the response's body sent to the client: charges
    /// what is still owed (see the module's rules) and empties the charges, so a second call
    /// charges nothing. Returns how many zones were charged.
    pub async fn finish(&mut self, ending: Ending, body_bytes: u64, stores: &Stores) -> usize {
        if self.zones.is_empty() {
            return 0;
        }
        let bytes_charged = self.charge_bytes(body_bytes, stores).await;
        let left_early = ending == Ending::ClientLeft;
        bytes_charged
            + match self.stage {
                Stage::Admitted => {
                    self.zones.clear();
                    0
                }
                Stage::Forwarded if !left_early => {
                    // The upstream never answered: Weir did (502/504), and nothing is charged.
                    self.zones.clear();
                    0
                }
                Stage::Forwarded => {
                    // No status is known (0 in the log): every zone is charged as if its status counted.
                    let taken = std::mem::take(&mut self.zones);
                    let due: Vec<(&Owed, u64)> = taken.iter().map(|d| (d, d.most())).collect();
                    charge_due(&due, 0, stores).await
                }
                Stage::Head => self.charge_at_end(None, left_early, stores).await,
                Stage::BodyEnded => self.charge_at_end(None, false, stores).await,
            }
    }

    /// Whether a client that leaves now owes more than a finished answer would charge: the
    /// request went upstream and its answer is not complete. For the access log, which replay
    /// reads to charge the same.
    pub fn unfinished(&self) -> bool {
        self.zones.iter().any(|d| !d.counts_bytes()) && matches!(self.stage, Stage::Forwarded | Stage::Head)
    }

    /// Charges the zones kept for the end: from `trailers` when they carry the zone's header,
    /// else the head's cost — or the most the answer could have reported, for a client that left
    /// before it was complete (`left_early`).
    async fn charge_at_end(&mut self, trailers: Option<&http::HeaderMap>, left_early: bool, stores: &Stores) -> usize {
        // Byte quotas stay for `finish`, which knows the bytes sent.
        let (quotas, taken): (Vec<Owed>, Vec<Owed>) =
            std::mem::take(&mut self.zones).into_iter().partition(Owed::counts_bytes);
        self.zones = quotas;
        let mut status = 0;
        let due: Vec<(&Owed, u64)> = taken
            .iter()
            .filter_map(|d| {
                let ((head_status, head_cost), rc) = (d.head?, d.response_cost.as_ref()?);
                status = head_status;
                let cost = match trailers {
                    Some(t) if rc.header.as_ref().is_some_and(|h| t.contains_key(h)) => response_cost(rc, t),
                    _ if left_early => d.most().max(head_cost),
                    _ => head_cost,
                };
                Some((d, cost))
            })
            .collect();
        charge_due(&due, status, stores).await
    }
}

/// Charges zones with their costs, one atomic store call per group (enforced, dry run) and kind:
/// - counted by response (`count_statuses` alone): a normal decision, so a bucket that
///   concurrent requests filled meanwhile refuses it and stays full (docs/charges.md, the race);
/// - charged from the response (`cost_from_response`): the reported cost, charged whatever the
///   bucket holds, into debt up to the zone's cap (`LimitStore::charge`).
async fn charge_due(due: &[(&Owed, u64)], status: u16, stores: &Stores) -> usize {
    fn keyed(d: &Owed, limit: crate::limit::LimitReq, cost: u64) -> KeyedZone<'_> {
        KeyedZone { zone: &d.zone, key: d.key.clone(), limit, cost, dry_run: d.dry_run, reference: 0, lease: None }
    }
    let counted: Vec<KeyedZone<'_>> =
        due.iter().filter(|(d, _)| d.response_cost.is_none()).map(|&(d, cost)| keyed(d, d.limit, cost)).collect();
    let from_response: Vec<KeyedZone<'_>> = due
        .iter()
        .filter_map(|&(d, cost)| Some(keyed(d, ceiling(&d.limit, d.response_cost.as_ref()?), cost)))
        .collect();
    let store = stores.primary.as_ref();
    let mut charged = 0;
    for (group, _) in Groups::new(counted).each() {
        if group.is_empty() {
            continue;
        }
        let started = Instant::now();
        let result = store.decide(group).await;
        stores.observer.store_call(started.elapsed());
        match result {
            Ok(v) => charged += v.admitted as usize * group.len(),
            Err(e) => tracing::warn!(error = %e, status, "count by response: the charge after the response failed"),
        }
    }
    for (group, _) in Groups::new(from_response).each() {
        if group.is_empty() {
            continue;
        }
        let started = Instant::now();
        let result = store.charge(group).await;
        stores.observer.store_call(started.elapsed());
        match result {
            Ok(v) => charged += v.admitted as usize * group.len(),
            Err(e) => tracing::warn!(error = %e, status, "charge from the response: the charge failed"),
        }
    }
    charged
}

/// For the access log: each `cost_from_response` header of the route's zones that the response
/// carries, as its log field (`upstream_http_x_tokens_used`) and value, which `weir replay`
/// charges from. Nothing for routes without such zones.
pub fn response_cost_fields(rt: &Runtime, route: usize, headers: &http::HeaderMap, mut field: impl FnMut(&str, &str)) {
    let Some(route) = rt.routes.get(route) else { return };
    for zl in &route.limits {
        let Some((rc, header)) =
            rt.zones[zl.zone].response_cost.as_ref().and_then(|rc| Some((rc, rc.header.as_ref()?)))
        else {
            continue;
        };
        if let Some(value) = headers.get(header).and_then(|v| v.to_str().ok()) {
            field(&rc.log_field, value);
        }
    }
}

/// The cost a response reports for a `cost_from_response` zone: its header as a non-negative
/// integer, clamped to `max`; missing, empty, negative or not an integer → `default`. Read from
/// the upstream's response only: nothing the client sends reaches it.
pub fn response_cost(rc: &ResponseCost, headers: &http::HeaderMap) -> u64 {
    let Some(text) = rc.header.as_ref().and_then(|h| headers.get(h)).and_then(|v| v.to_str().ok()).map(str::trim)
    else {
        return rc.default;
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return rc.default;
    }
    // All digits: only overflow can fail, and an overflowing cost is clamped like any large one.
    text.parse::<u64>().unwrap_or(u64::MAX).min(rc.max)
}

/// The limit a response's charge is capped at: the reference's burst plus the debt cap (default:
/// one more bucket, `burst + 1`), charged at once (a charge is never delayed).
pub fn ceiling(limit: &crate::limit::LimitReq, rc: &ResponseCost) -> crate::limit::LimitReq {
    let debt = rc.max_debt.unwrap_or(limit.burst.saturating_add(1));
    crate::limit::LimitReq { burst: limit.burst.saturating_add(debt), delay: DelayPolicy::NoDelay, ..*limit }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::limit::{ManualClock, State};
    use crate::store::decided_at_once;
    use crate::store::MemoryStore;

    /// A route with a zone counted by 401s and a zone charged from a trailer (`max` 500).
    const CONF: &str = "[server]\nlisten = [\"127.0.0.1:1\"]\n[store]\nkind = \"memory\"\n\
        [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:2\"]\n\
        [[limit_req_zone]]\nname = \"fails\"\nkey = \"ip\"\nrate = \"1r/h\"\ncount_statuses = [401]\n\
        [[limit_req_zone]]\nname = \"tokens\"\nkey = \"ip\"\nrate = \"1r/h\"\n\
        cost_from_response = { header = \"x-tokens\", trailer = true, max = 500 }\n\
        [[route]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\n\
        limit_req = [ { zone = \"fails\", burst = 9, nodelay = true }, { zone = \"tokens\", burst = 9999, nodelay = true } ]\n";

    /// Drives one request's charges through `steps` and returns each zone's bucket level after.
    fn levels(steps: impl FnOnce(&mut ResponseCharges, &Stores)) -> (f64, f64) {
        let rt = crate::config::from_text(CONF, "t.toml").expect("valid");
        let route = &rt.routes[0];
        let keyed = Groups::new(
            route
                .limits
                .iter()
                .enumerate()
                .map(|(i, zl)| KeyedZone {
                    reference: i,
                    ..KeyedZone::new(&rt.zones[zl.zone].name, b"k".to_vec(), zl.limit, 1)
                })
                .collect(),
        );
        let clock = Arc::new(ManualClock::new(1_700_000_000_000_000));
        let primary = Arc::new(MemoryStore::new(clock.clone()));
        let stores = Stores::new(primary.clone(), MemoryStore::new(clock));
        let mut charges = ResponseCharges::new(&rt, route, &keyed);
        steps(&mut charges, &stores);
        let level = |zone: &str| match primary.state(zone, b"k") {
            Some(State::Bucket(b)) => b.level,
            _ => 0.0,
        };
        (level("fails"), level("tokens"))
    }

    fn tokens(n: &'static str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert("x-tokens", http::HeaderValue::from_static(n));
        h
    }

    #[test]
    fn nothing_is_owed_until_the_request_is_forwarded_nor_when_the_upstream_never_answers() {
        let never_sent = levels(|c, s| assert_eq!(decided_at_once(c.finish(Ending::ClientLeft, 0, s)), 0));
        assert_eq!(never_sent, (0.0, 0.0));
        let no_answer = levels(|c, s| {
            c.forwarded();
            assert_eq!(decided_at_once(c.finish(Ending::Over, 0, s)), 0);
        });
        assert_eq!(no_answer, (0.0, 0.0));
    }

    #[test]
    fn a_client_that_leaves_before_the_head_is_charged_the_most_its_answer_could_cost() {
        let left = levels(|c, s| {
            c.forwarded();
            assert!(c.unfinished());
            assert_eq!(decided_at_once(c.finish(Ending::ClientLeft, 0, s)), 2);
            assert_eq!(decided_at_once(c.finish(Ending::ClientLeft, 0, s)), 0, "charged once");
        });
        assert_eq!(left, (1.0, 500.0), "counted as a 401; tokens at max");
    }

    #[test]
    fn leaving_before_the_trailer_costs_max_and_after_the_body_the_heads_cost() {
        let mid_body = levels(|c, s| {
            c.forwarded();
            assert_eq!(
                decided_at_once(c.at_head(200, &tokens("7"), s)),
                0,
                "200 is not counted; tokens wait for the end"
            );
            assert!(c.unfinished());
            assert_eq!(decided_at_once(c.finish(Ending::ClientLeft, 0, s)), 1);
        });
        assert_eq!(mid_body, (0.0, 500.0));
        let after_body = levels(|c, s| {
            c.forwarded();
            decided_at_once(c.at_head(200, &tokens("7"), s));
            c.body_ended();
            assert!(!c.unfinished(), "the upstream's answer is complete");
            assert_eq!(decided_at_once(c.finish(Ending::ClientLeft, 0, s)), 1);
        });
        assert_eq!(after_body, (0.0, 7.0));
        let trailer = levels(|c, s| {
            c.forwarded();
            decided_at_once(c.at_head(401, &tokens("7"), s));
            assert_eq!(decided_at_once(c.at_trailers(&tokens("42"), s)), 1);
            assert_eq!(decided_at_once(c.finish(Ending::ClientLeft, 0, s)), 0, "nothing left to charge");
        });
        assert_eq!(trailer, (1.0, 42.0));
    }
}
