//! One logged request through the engine the proxy uses (`crate::engine`): `admit` (target,
//! host, method, route, client IP with the trusted proxies, access rules, keys, cost, overrides)
//! and `limit_req::enforce`, on the proxy's own `Ticket`) on the embedded memory store on a
//! simulated clock, so every decision
//! is the live one. limit_conn is estimated from the logged durations (a log has no leases).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use http::header::{HeaderName, AUTHORIZATION, COOKIE};

use super::hash::FastMap;
use super::parse::{Client, Record, Wanted};
use crate::config::{OverrideMatch, Route, Runtime};
use crate::engine::LimitStatus;
use crate::engine::Stores;
use crate::engine::{self, BadRequest, Ending, Groups, Head, Outcome, Refusal, Ruling, Ticket, ZoneResult};
use crate::keys::{KeyPart, KeySpec, TokenPolicy};
use crate::limit::ManualClock;
use crate::request::method::{MethodOverride, OVERRIDE_HEADERS};
use crate::store::decided_at_once;
use crate::store::{KeyedConn, LeasedStore, MemoryStore, ModelLedger};

#[derive(Debug, Clone)]
pub struct Decision {
    pub route: Option<usize>,
    /// What happened to it, in the one vocabulary of every front door.
    pub outcome: Outcome,
    /// A bad cost header refused it (400), before any limit.
    pub bad_cost: bool,
    /// The request's `$limit_req_status`; `None` when no zone limited it.
    pub status: Option<LimitStatus>,
    /// How long the proxy would have held it (enforced zones).
    pub delay_us: u64,
    /// Each keyed limit_req zone, in the route's order.
    pub zones: Vec<ZoneResult>,
    /// `limit_conn`, estimated from the logged durations; empty when the log has none.
    pub conns: Vec<ConnDecision>,
}

/// One keyed `limit_conn` zone of a request, estimated: the requests of the same key in flight
/// (from their logged start and `$request_time`) when this one passed `limit_req`.
#[derive(Debug, Clone)]
pub struct ConnDecision {
    /// Index into the route's `conn_limits`.
    pub limit: usize,
    pub key: Vec<u8>,
    /// In flight before this request (its own lease not counted).
    pub in_flight: u32,
    /// This zone was full (the request, or with dry run the zone, rejects).
    pub rejected: bool,
}

impl Decision {
    fn before_limits(route: Option<usize>, outcome: Outcome, bad_cost: bool) -> Self {
        Decision { route, outcome, bad_cost, status: None, delay_us: 0, zones: Vec::new(), conns: Vec::new() }
    }

    /// It went through the limit step (which may have had no zone with a key): not refused
    /// before any limit (404, 403, 401, 400).
    pub fn limited(&self) -> bool {
        !matches!(self.outcome, Outcome::NoRoute | Outcome::Denied | Outcome::Unauthorized | Outcome::BadRequest)
    }

    /// The word written to `--decisions`: nginx's `$limit_req_status`, `-` when unset.
    pub fn word(&self) -> &'static str {
        self.status.map_or("-", LimitStatus::as_str)
    }
}

pub struct Replayer<'rt> {
    rt: &'rt Runtime,
    clock: Arc<ManualClock>,
    /// One instance's stores, or (`--instances N`) N instances' leasing layers over one model
    /// ledger and one exact store: each request is decided by the next instance in turn.
    fleet: Vec<Stores>,
    next: usize,
    route_names: HashMap<&'rt str, usize>,
    /// Per (conn zone, key): when its requests in flight end (µs).
    in_flight: FastMap<(usize, Vec<u8>), BinaryHeap<Reverse<u64>>>,
    /// Sweep `in_flight` of drained keys when it reaches this size.
    sweep_at: usize,
}

impl<'rt> Replayer<'rt> {
    pub fn new(rt: &'rt Runtime) -> Self {
        Self::with_instances(rt, None)
    }

    /// `instances`: simulate a fleet of that many instances leasing the leased zones (docs/leases.md)
    /// from one ledger, requests spread over them in turn (a round-robin balancer); the exact
    /// zones are one store for the fleet, as Redis is. `None`: one instance, every zone exact (a
    /// lease on one process changes nothing).
    pub fn with_instances(rt: &'rt Runtime, instances: Option<u64>) -> Self {
        let clock = Arc::new(ManualClock::new(0));
        let exact = Arc::new(MemoryStore::new(clock.clone()));
        let fleet = match instances {
            None => vec![Stores::new(exact, MemoryStore::default())],
            Some(n) => {
                let ledger = Arc::new(ModelLedger::new(clock.clone()));
                (0..n.max(1))
                    .map(|_| {
                        let leased = LeasedStore::new(exact.clone(), ledger.clone(), ledger.clone(), clock.clone());
                        Stores::new(Arc::new(leased), MemoryStore::default())
                    })
                    .collect()
            }
        };
        let route_names = rt.routes.iter().enumerate().map(|(i, r)| (r.name.as_str(), i)).collect();
        Self { rt, clock, fleet, next: 0, route_names, in_flight: FastMap::default(), sweep_at: 1024 }
    }

    pub fn runtime(&self) -> &'rt Runtime {
        self.rt
    }

    /// Decides `rec` as the proxy would have at `now_us`.
    pub fn decide(&mut self, rec: &Record, now_us: u64) -> Decision {
        let rt = self.rt;
        let client_ip = match rec.client {
            Client::Peer(ip) => engine::client_ip(rt, Some(ip), &rec.headers),
            Client::Resolved(ip) => Some(ip),
            Client::Unknown => None,
        };
        let head = Head {
            method: &rec.method,
            target: rec.target.as_bytes(),
            // A log names the host apart from the headers: it is the one the request was read for.
            authority: rec.host.as_deref(),
            headers: &rec.headers,
            client_ip,
            // Weir's own log names the route it took; other logs are routed like live requests.
            route: rec.route.as_deref().and_then(|name| self.route_names.get(name).copied()),
            // A token is judged at the logged time: yesterday's valid token is not expired today.
            unix_secs: Some(now_us / 1_000_000),
        };
        // The proxy's own ticket, on the simulated clock: the same rule, the same charges.
        self.clock.set_us(now_us);
        let stores = &self.fleet[self.next % self.fleet.len()];
        self.next = self.next.wrapping_add(1);
        let mut ticket = Ticket::unobserved(rt, client_ip);
        let (forwarded, bad_cost) = match decided_at_once(ticket.rule(&head, stores)) {
            Ruling::Refuse(answer) => {
                (false, matches!(answer.refusal, Refusal::BadRequest { error, .. } if error == BadRequest::Cost.code()))
            }
            Ruling::Forward { .. } => (true, false),
        };
        let ruled = ticket.report();
        let mut decision = Decision::before_limits(ruled.route, ruled.outcome, bad_cost);
        let Some(route_index) = ruled.route.filter(|_| decision.limited()) else { return decision };
        let route = &rt.routes[route_index];
        // Zones charged after the response are charged at once with the logged response status
        // and headers (the proxy charges them when the response arrives: the same order for one
        // client's requests).
        if let (true, Some(status)) = (forwarded, rec.response_status) {
            ticket.forwarded();
            // Status 0: no answer was written (the client left before its head).
            if status != 0 {
                let headers = logged_response_headers(rt, route, &rec.response_fields);
                decided_at_once(ticket.at_head(status, &headers, stores));
            }
        }
        // No trailers in a log: zones charged at the end take the head's cost, or the most the
        // answer could have cost when the client left before it was complete.
        let ending = if rec.client_left { Ending::ClientLeft } else { Ending::Over };
        decided_at_once(ticket.finish(ending, rec.body_bytes, stores));
        let report = ticket.report();
        decision.outcome = report.outcome;
        decision.status = report.limit_req;
        decision.delay_us = report.delay.as_micros() as u64;
        decision.zones = report.zones.to_vec();
        // In the route's order, as the zones are listed (the groups put enforced ones first).
        decision.zones.sort_by_key(|z| z.reference);
        // limit_conn after limit_req, like the proxy: only when the log says how long requests
        // took, and not for a request limit_req rejected.
        if let Some(took) = rec.duration_us {
            let conns = ticket.pending_conns();
            if !conns.is_empty() && decision.status != Some(LimitStatus::Rejected) {
                let from = now_us + decision.delay_us;
                let until = rec.start_us.saturating_add(took).max(from);
                decision.conns = self.decide_conns(route, &conns, from, until);
            }
        }
        decision
    }

    /// The `limit_conn` step, estimated: each group (enforced, dry run) takes a place in all its
    /// zones or none, from `from` to `until`.
    fn decide_conns(
        &mut self,
        route: &Route,
        keyed: &Groups<KeyedConn<'_>>,
        from: u64,
        until: u64,
    ) -> Vec<ConnDecision> {
        let mut out = Vec::with_capacity(keyed.all().len());
        for (group, _) in keyed.each() {
            let mut full = false;
            let first = out.len();
            for k in group {
                let zone = route.conn_limits[k.reference].zone;
                let ends = self.in_flight.entry((zone, k.key.clone())).or_default();
                while ends.peek().is_some_and(|Reverse(end)| *end <= from) {
                    ends.pop();
                }
                let in_flight = ends.len() as u32;
                let rejected = in_flight >= k.max;
                full |= rejected;
                out.push(ConnDecision { limit: k.reference, key: k.key.clone(), in_flight, rejected });
            }
            if !full {
                for d in &out[first..] {
                    let zone = route.conn_limits[d.limit].zone;
                    self.in_flight.entry((zone, d.key.clone())).or_default().push(Reverse(until));
                }
            }
        }
        if self.in_flight.len() >= self.sweep_at {
            self.in_flight.retain(|_, ends| ends.peek().is_some_and(|Reverse(end)| *end > from));
            self.sweep_at = (self.in_flight.len() * 2).max(1024);
        }
        out
    }
}

/// A key's parts for requests without a verified token.
fn fallback(spec: &KeySpec) -> &[KeyPart] {
    match &spec.on_bad_token {
        TokenPolicy::Reject => &[],
        TokenPolicy::Fallback(parts) => parts,
    }
}

/// The request headers the config reads: zone keys and overrides, the cost header, the real-IP
/// header. Parsers keep only these.
pub fn wanted_headers(rt: &Runtime) -> Wanted {
    let mut names: Vec<HeaderName> = Vec::new();
    let mut add = |part: &KeyPart| match part {
        KeyPart::Header(h) => names.push(h.clone()),
        KeyPart::Cookie(_) => names.push(COOKIE),
        KeyPart::Claim(_) => names.push(AUTHORIZATION),
        KeyPart::ClientIp
        | KeyPart::IpPrefix(_)
        | KeyPart::Query(_)
        | KeyPart::Route
        | KeyPart::Const(_)
        | KeyPart::PathPart(_) => {}
    };
    for zone in &rt.zones {
        zone.key.parts.iter().chain(fallback(&zone.key)).for_each(&mut add);
        for o in &zone.overrides {
            if let OverrideMatch::Part(part, _) = &o.matcher {
                add(part);
            }
        }
    }
    for zone in &rt.conn_zones {
        zone.key.parts.iter().chain(fallback(&zone.key)).for_each(&mut add);
    }
    names.extend(rt.routes.iter().filter_map(|r| r.cost.header.clone()));
    // Overrides route (or refuse) requests unless they are only stripped.
    if rt.server.clients.method_override != MethodOverride::Strip {
        names.extend(OVERRIDE_HEADERS.iter().cloned());
    }
    names.extend(rt.real_ip.as_ref().map(|r| r.header.clone()));
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup();
    Wanted(names)
}

/// The response headers the route's `cost_from_response` zones read, from the log's
/// `upstream_http_*` fields; empty (no allocation) for a route without such zones.
fn logged_response_headers(rt: &Runtime, route: &Route, fields: &[(String, String)]) -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    for zl in &route.limits {
        let Some((rc, header)) =
            rt.zones[zl.zone].response_cost.as_ref().and_then(|rc| Some((rc, rc.header.as_ref()?)))
        else {
            continue;
        };
        let logged = fields
            .iter()
            .find(|(name, _)| rc.log_field.strip_prefix(crate::config::RESPONSE_FIELD_PREFIX) == Some(name));
        if let Some(value) = logged.and_then(|(_, v)| http::HeaderValue::from_str(v).ok()) {
            headers.insert(header.clone(), value);
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue, Method};

    const T0: u64 = 1_700_000_000_000_000;

    pub(crate) fn runtime(zones: &str, routes: &str) -> Runtime {
        let text = format!(
            "[server]\nlisten = [\"127.0.0.1:1\"]\n[store]\nkind = \"memory\"\n\
             [real_ip]\ntrusted = [\"10.0.0.0/8\"]\nheader = \"X-Forwarded-For\"\n\
             [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:2\"]\n{zones}\n{routes}"
        );
        crate::config::from_text(&text, "test.toml").unwrap()
    }

    fn rec(ip: &str, path: &str) -> Record {
        Record {
            start_us: 0,
            duration_us: None,
            whole_second: false,
            client: Client::Peer(ip.parse().unwrap()),
            method: Method::GET,
            target: path.to_string(),
            host: None,
            headers: HeaderMap::new(),
            route: None,
            logged_status: None,
            response_status: None,
            client_left: false,
            body_bytes: 0,
            response_fields: Vec::new(),
            order: None,
        }
    }

    const ONE_ZONE: &str = "[[limit_req_zone]]\nname = \"z\"\nkey = \"ip\"\nrate = \"1r/s\"\n";

    /// A token that was valid when its request was logged (T0) but has expired since is judged at
    /// the logged time: replay decides what the proxy decided then, not 401.
    #[test]
    fn a_token_is_judged_at_the_logged_time() {
        let secret = b"a-shared-secret-of-32-bytes-long";
        let text = "[server]\nlisten = [\"127.0.0.1:1\"]\n[store]\nkind = \"memory\"\n\
                    [jwt]\nkey_file = \"jwt.key\"\nalgorithm = \"HS256\"\n\
                    [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:2\"]\n\
                    [[limit_req_zone]]\nname = \"u\"\nkey = \"jwt:sub\"\nrate = \"1r/s\"\n\
                    [[route]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_req = [ { zone = \"u\" } ]\n";
        let mut outside = crate::config::Fixed::default();
        outside.files.insert("/cfg/jwt.key".into(), secret.to_vec());
        let rt = crate::config::from_text_with(text, "/cfg/weir.toml", &outside).unwrap();
        let claims = serde_json::json!({ "sub": "u1", "exp": T0 / 1_000_000 + 60 });
        let key = jsonwebtoken::EncodingKey::from_secret(secret);
        let jwt = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap();
        let mut r = rec("192.0.2.1", "/x");
        r.headers.insert(http::header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {jwt}")).unwrap());
        let mut e = Replayer::new(&rt);
        assert!(e.decide(&r, T0).limited(), "valid at the logged time");
        assert_eq!(e.decide(&r, T0 + 200_000_000).outcome, Outcome::Unauthorized, "expired 140 s later");
    }

    #[test]
    fn one_per_second_burst_zero() {
        let rt = runtime(
            ONE_ZONE,
            "[[route]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_req = [ { zone = \"z\" } ]\n",
        );
        let mut e = Replayer::new(&rt);
        let r = rec("192.0.2.1", "/");
        let words: Vec<&str> = [0, 500_000, 1_000_000].iter().map(|t| e.decide(&r, T0 + t).word()).collect();
        assert_eq!(words, ["PASSED", "REJECTED", "PASSED"]);
    }

    #[test]
    fn burst_with_delay_threshold() {
        // rate 1r/s, burst 5, delay 2: at one instant 3 pass, 3 wait 1 s, 2 s, 3 s, the 7th is rejected.
        let rt = runtime(
            ONE_ZONE,
            "[[route]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_req = [ { zone = \"z\", burst = 5, delay = 2 } ]\n",
        );
        let mut e = Replayer::new(&rt);
        let r = rec("192.0.2.1", "/");
        let got: Vec<(&str, u64)> = (0..7).map(|_| e.decide(&r, T0)).map(|d| (d.word(), d.delay_us)).collect();
        assert_eq!(
            got,
            [
                ("PASSED", 0),
                ("PASSED", 0),
                ("PASSED", 0),
                ("DELAYED", 1_000_000),
                ("DELAYED", 2_000_000),
                ("DELAYED", 3_000_000),
                ("REJECTED", 0)
            ]
        );
    }

    #[test]
    fn real_ip_overrides_routes_and_all_or_nothing() {
        let zones = "[[limit_req_zone]]\nname = \"ip\"\nkey = \"ip\"\nrate = \"1r/s\"\n\
                     [[limit_req_zone.override]]\nmatch = \"203.0.113.0/24\"\nrate = \"unlimited\"\n\
                     [[limit_req_zone]]\nname = \"k\"\nkey = \"header:X-Api-Key\"\nrate = \"1r/m\"\n";
        let routes = "[[route]]\nname = \"api\"\npath_prefix = \"/api/\"\nupstream = \"app\"\n\
                      limit_req = [ { zone = \"ip\", burst = 1, nodelay = true }, { zone = \"k\" } ]\n";
        let rt = runtime(zones, routes);
        let mut e = Replayer::new(&rt);
        assert_eq!(e.decide(&rec("192.0.2.1", "/other"), T0).outcome, Outcome::NoRoute);
        // Behind a trusted proxy, the forwarded address is the client: the override exempts it.
        let mut exempt = rec("10.0.0.1", "/api/x");
        exempt.headers.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.5"));
        for _ in 0..5 {
            let d = e.decide(&exempt, T0);
            assert_eq!((d.word(), d.zones.len()), ("-", 0));
        }
        // Two zones: the key zone (1r/m, burst 0) rejects the second request, and the ip zone is
        // not charged for it, so a third request from the same ip with no key still passes twice.
        let mut keyed = rec("192.0.2.1", "/api/x");
        keyed.headers.insert("x-api-key", HeaderValue::from_static("k1"));
        assert_eq!(e.decide(&keyed, T0).word(), "PASSED");
        let d = e.decide(&keyed, T0);
        assert_eq!(d.word(), "REJECTED");
        assert_eq!(d.zones.iter().map(|z| z.status).collect::<Vec<_>>(), [None, Some(LimitStatus::Rejected)]);
        let unkeyed = rec("192.0.2.1", "/api/x");
        assert_eq!(e.decide(&unkeyed, T0).word(), "PASSED");
        assert_eq!(e.decide(&unkeyed, T0).word(), "REJECTED");
    }

    /// Replay decides through the same key step as the proxy: a bypass token exempts, a POST-only
    /// limit leaves GETs alone, and `route_order = "nginx"` picks the regex route.
    #[test]
    fn conditions_and_nginx_route_order_hold_in_replay() {
        let routes = "[[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n\
                      limit_req = [ { zone = \"z\", unless = [ { header = \"X-Bypass\", equals = \"t0ken\" } ] } ]\n\
                      [[route]]\nname = \"forms\"\npath_regex = \"^/forms/\"\nupstream = \"app\"\n\
                      limit_req = [ { zone = \"z\", when = [ { method = [\"POST\"] } ] } ]\n";
        let text = format!(
            "route_order = \"nginx\"\n[server]\nlisten = [\"127.0.0.1:1\"]\n[store]\nkind = \"memory\"\n\
             [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:2\"]\n{ONE_ZONE}\n{routes}"
        );
        let rt = crate::config::from_text(&text, "test.toml").unwrap();
        let mut e = Replayer::new(&rt);
        let mut bypass = rec("192.0.2.1", "/x");
        bypass.headers.insert("x-bypass", HeaderValue::from_static("t0ken"));
        for _ in 0..3 {
            let d = e.decide(&bypass, T0);
            assert_eq!((d.word(), d.zones.len()), ("-", 0), "exempt: no zone consulted");
        }
        for _ in 0..3 {
            assert_eq!(e.decide(&rec("192.0.2.1", "/forms/a"), T0).word(), "-", "GETs of /forms/ are not limited");
        }
        let mut post = rec("192.0.2.1", "/forms/a");
        post.method = Method::POST;
        assert_eq!(e.decide(&post, T0).word(), "PASSED");
        assert_eq!(e.decide(&post, T0).word(), "REJECTED");
        let mut guess = rec("192.0.2.1", "/x");
        guess.headers.insert("x-bypass", HeaderValue::from_static("guess"));
        assert_eq!(e.decide(&guess, T0).word(), "REJECTED", "a made-up token shares the client's bucket");
    }

    #[test]
    fn dry_run_zones_never_reject() {
        let rt = runtime(
            ONE_ZONE,
            "[[route]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\ndry_run = true\nlimit_req = [ { zone = \"z\" } ]\n",
        );
        let mut e = Replayer::new(&rt);
        let r = rec("192.0.2.1", "/");
        assert_eq!(e.decide(&r, T0).word(), "PASSED");
        assert_eq!(e.decide(&r, T0).word(), "REJECTED_DRY_RUN");
    }

    #[test]
    fn limit_conn_is_estimated_from_durations() {
        let zones = "[[limit_conn_zone]]\nname = \"c\"\nkey = \"ip\"\n";
        let rt = runtime(
            zones,
            "[[route]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_conn = [ { zone = \"c\", max = 1 } ]\n",
        );
        let mut e = Replayer::new(&rt);
        let at =
            |start: u64, took: u64| Record { start_us: T0 + start, duration_us: Some(took), ..rec("192.0.2.1", "/") };
        // [0, 1 s) holds the place; a request at 0.5 s finds it full (and holds nothing); at 1 s it is free.
        let got: Vec<(u32, bool)> = [(0, 1_000_000), (500_000, 1_000_000), (1_000_000, 10)]
            .iter()
            .map(|&(s, t)| {
                let d = e.decide(&at(s, t), T0 + s);
                (d.conns[0].in_flight, d.conns[0].rejected)
            })
            .collect();
        assert_eq!(got, [(0, false), (1, true), (0, false)]);
        // Without durations there is no estimate.
        assert!(e.decide(&rec("192.0.2.1", "/"), T0 + 2_000_000).conns.is_empty());
    }

    #[test]
    fn wanted_headers_follow_the_config() {
        let zones = "[[limit_req_zone]]\nname = \"k\"\nkey = [\"header:X-Api-Key\", \"cookie:s\"]\nrate = \"1r/s\"\n";
        let rt = runtime(zones, "[[route]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\n");
        let wanted = wanted_headers(&rt);
        let names: Vec<&str> = wanted.0.iter().map(|h| h.as_str()).collect();
        assert_eq!(names, ["cookie", "x-api-key", "x-forwarded-for"]);
    }

    /// `--instances N`: N leasing instances on one ledger admit within the stated bound of the
    /// exact limiter (here at most `burst + 1 + r·τ + min(N·T, r·L)`), and far more than one
    /// instance's share; without it the zone is exact.
    #[test]
    fn a_simulated_fleet_leases_within_the_bound() {
        let zones = "[[limit_req_zone]]\nname = \"z\"\nkey = \"ip\"\nrate = \"100r/s\"\n\
                     lease = { tokens = 10, lifetime = \"500ms\" }\n";
        let routes = "[[route]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\n\
                      limit_req = [ { zone = \"z\", burst = 20, nodelay = true } ]\n";
        let rt = runtime(zones, routes);
        let admitted = |instances: Option<u64>| {
            let mut e = Replayer::with_instances(&rt, instances);
            let mut times = vec![];
            // 2,000 requests a second for 2 s, one client.
            for i in 0..4000u64 {
                let now = T0 + i * 500;
                if e.decide(&rec("192.0.2.1", "/x"), now).status != Some(LimitStatus::Rejected) {
                    times.push(now);
                }
            }
            times
        };
        let exact = admitted(None);
        let fleet = admitted(Some(4));
        // The exact limiter: 21 at once, then 100 a second.
        assert_eq!(exact.len(), 21 + 199);
        // Every interval: at most 21 + 100/s·τ + min(4·10, 100/s·0.5s) = 21 + 100/s·τ + 40.
        for (i, a) in fleet.iter().enumerate() {
            for (j, b) in fleet.iter().enumerate().skip(i) {
                let tau = (b - a) as f64 / 1e6;
                assert!((j - i + 1) as f64 <= 21.0 + 100.0 * tau + 40.0, "{} in {tau}s", j - i + 1);
            }
        }
        assert!(fleet.len() >= exact.len() - 10, "the fleet admits about what the exact limiter does: {}", fleet.len());
    }
}
