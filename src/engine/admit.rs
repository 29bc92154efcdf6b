//! The decision before any limit, for every front door: from a request's facts and the compiled
//! config, either a refusal (400, 401, 403, 404) or a plan — the route, the client, the cost, each
//! zone's key, and what the forwarded request must look like so that the upstream reads what
//! was decided on. Pure: no I/O, and no clock but one: a bearer token's `exp`/`nbf` are checked
//! against the wall clock (only for routes whose zones read a `jwt:` claim).
//!
//! Steps, in order: the target (origin or absolute form, canonical path) → the host (absolute-form
//! authority, else `:authority`, else `Host`) → header names with `_` → the method and its
//! overrides → the route → allow/deny on the client → keys given twice → cost → keyed zones (a
//! zone keyed on a claim without a valid token: 401, or its `bad_token_key`).

use std::borrow::Cow;
use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HOST};
use http::Method;

use super::access::allowed;
use super::dry_run::Groups;
use super::keyed::{keyed_conns, keyed_zones, request_cost, Unauthorized};
use super::outcome::Outcome;
use super::refusal::{Answer, Refusal};
use crate::config::{OverrideMatch, Route, Runtime, UnderscoreHeaders};
use crate::keys::jwt::TokenError;
use crate::keys::{AmbiguousKey, RequestFacts};
use crate::request::host::{Host, HostError};
use crate::request::method::{self, MethodError};
use crate::request::target;
use crate::request::{normalize_path, PathError};
use crate::routes::{self, PathMatch};
use crate::store::{KeyedConn, KeyedZone};

/// A request as a front door knows it.
pub struct Head<'a> {
    pub method: &'a Method,
    /// The request-target as sent (origin or absolute form).
    pub target: &'a [u8],
    /// HTTP/2's `:authority` (checked against `Host` by the front door).
    pub authority: Option<&'a str>,
    pub headers: &'a HeaderMap,
    /// The client address, already resolved through the trusted proxies (`engine::client_ip`).
    pub client_ip: Option<IpAddr>,
    /// A route the front door already knows (a replayed line of Weir's own log names it).
    pub route: Option<usize>,
    /// When the request came (seconds since the Unix epoch), for a token's `exp`/`nbf`; `None`:
    /// now. A replayed line gives its logged time.
    pub unix_secs: Option<u64>,
}

/// A request answered before any limit: the route it matched (once one did), its word in the
/// one outcome vocabulary, and Weir's answer.
#[derive(Debug)]
pub struct Refused<'rt> {
    pub route: Option<usize>,
    pub outcome: Outcome,
    pub answer: Answer<'rt>,
}

/// The checks that answer 400, each with the code written in the body and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadRequest {
    Target,
    Path,
    Host,
    Method,
    UnderscoreHeader,
    MethodOverride,
    AmbiguousKey,
    Cost,
}

impl BadRequest {
    pub fn code(self) -> &'static str {
        match self {
            BadRequest::Target => "bad_target",
            BadRequest::Path => "bad_path",
            BadRequest::Host => "bad_host",
            BadRequest::Method => "bad_method",
            BadRequest::UnderscoreHeader => "underscore_header",
            BadRequest::MethodOverride => "method_override",
            BadRequest::AmbiguousKey => "ambiguous_key",
            BadRequest::Cost => "bad_cost",
        }
    }
}

/// 400: `error` names the check (the body's `error`), `detail` what was wrong.
fn bad<'rt>(rt: &'rt Runtime, error: BadRequest, detail: impl ToString, route: Option<usize>) -> Refused<'rt> {
    let refusal =
        Refusal::BadRequest { error: error.code(), detail: detail.to_string(), route: route.map(|r| name(rt, r)) };
    Refused { route, outcome: Outcome::BadRequest, answer: Answer::new(400, refusal) }
}

fn name(rt: &Runtime, route: usize) -> &str {
    rt.routes.get(route).map_or("-", |r| r.name.as_str())
}

/// 401: a zone keyed on a verified JWT claim, without `bad_token_key`, and the request has no
/// valid token (or its token lacks the claim).
fn unauthorized<'rt>(rt: &'rt Runtime, route: usize, u: Unauthorized<'_>) -> Refused<'rt> {
    // RFC 6750 §3.1: no error code when the request carried no token at all.
    let challenge = if u.bad.0 == TokenError::Absent { "Bearer" } else { "Bearer error=\"invalid_token\"" };
    let refusal = Refusal::InvalidToken { route: name(rt, route), zone: u.zone.to_string(), detail: u.bad.to_string() };
    let answer = Answer::new(401, refusal).with_header("WWW-Authenticate", challenge);
    Refused { route: Some(route), outcome: Outcome::Unauthorized, answer }
}

/// What the request forwarded upstream must say instead of what was sent, so that the upstream
/// reads what was decided on. Empty (and allocation-free) for a request already in that form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Forward {
    /// A new origin-form target: the canonical path and the query as sent.
    pub target: Option<String>,
    /// A new `Host` value: the host decided on, with the port as sent.
    pub host: Option<String>,
    /// Header names to remove (underscores, method overrides).
    pub strip: Vec<HeaderName>,
}

/// What a request is limited by, and how it is forwarded.
pub struct Plan<'rt> {
    pub route: usize,
    /// limit_req's zones with their keys, enforced ones first.
    pub zones: Groups<KeyedZone<'rt>>,
    /// limit_conn's zones with their keys, enforced ones first.
    pub conns: Groups<KeyedConn<'rt>>,
    pub forward: Forward,
    /// `limit_rate`: the response body's rate and free head start in bytes (`pacing.rs`);
    /// `None`: full speed.
    pub pace: Option<(u64, u64)>,
    /// Zones whose key was empty for this request (not limited; observers count them).
    pub empty_keys: Vec<&'rt str>,
    /// Under the upstream's adaptive limit: the route's priority, or the request's own within the
    /// route's `priority_from`.
    pub priority: crate::adaptive::Priority,
}

/// The engine's first step (see the module docs).
pub fn admit<'rt>(rt: &'rt Runtime, head: &Head<'_>) -> Result<Plan<'rt>, Refused<'rt>> {
    let clients = &rt.server.clients;
    let mut forward = Forward::default();

    let target = target::parse(head.target).map_err(|e| bad(rt, BadRequest::Target, e, None))?;
    let path = normalize_path(target.path, clients.encoded_slashes).map_err(|e: PathError| {
        bad(rt, if e == PathError::NotAbsolute { BadRequest::Target } else { BadRequest::Path }, e, None)
    })?;
    if !target.origin_form || matches!(path, Cow::Owned(_)) {
        forward.target = Some(match target.query {
            Some(q) => format!("{path}?{q}"),
            None => path.to_string(),
        });
    }

    let host = decided_host(head, target.authority, &mut forward).map_err(|e| bad(rt, BadRequest::Host, e, None))?;

    // One pass over the header names: underscores, and whether any method override is present.
    let mut overrides = false;
    for name in head.headers.keys() {
        if name.as_str().bytes().any(|b| b == b'_') {
            match clients.underscores_in_headers {
                UnderscoreHeaders::Drop => forward.strip.push(name.clone()),
                UnderscoreHeaders::Reject => {
                    let detail = format!("header names with an underscore are refused: {name}");
                    return Err(bad(rt, BadRequest::UnderscoreHeader, detail, None));
                }
            }
        } else {
            overrides |= method::is_override_header(name.as_str());
        }
    }

    if !method::is_valid(head.method) {
        return Err(bad(rt, BadRequest::Method, MethodError::Invalid, None));
    }
    let overridden = match overrides {
        false => method::Override::default(),
        true => method::resolve(clients.method_override, head.method, head.headers)
            .map_err(|e| bad(rt, BadRequest::MethodOverride, e, None))?,
    };
    if overridden.strip {
        forward.strip.extend(method::OVERRIDE_HEADERS.iter().filter(|n| head.headers.contains_key(*n)).cloned());
    }
    let method = overridden.method.as_ref().unwrap_or(head.method);

    let route_index = match head.route {
        Some(known) => known,
        None => routes::find(&rt.matchers, rt.route_order, host.as_ref().map(|h| h.name.as_ref()), method, &path)
            .ok_or_else(|| Refused {
                route: None,
                outcome: Outcome::NoRoute,
                answer: Answer::new(404, Refusal::NoRoute),
            })?,
    };
    let route = &rt.routes[route_index];
    // Like nginx's allow/deny, on the real client address; before any key, so refused clients
    // never touch limit state.
    if head.client_ip.is_some_and(|ip| !allowed(&route.access, ip)) {
        let answer = Answer::new(403, Refusal::Forbidden { route: name(rt, route_index) });
        return Err(Refused { route: Some(route_index), outcome: Outcome::Denied, answer });
    }

    let mut facts = RequestFacts::new(head.client_ip, head.headers, target.query);
    facts.route = &route.name;
    facts.path = &path;
    facts.path_regex = match &rt.matchers[route_index].path {
        PathMatch::Regex(regex) => Some(regex),
        _ => None,
    };
    facts.jwt = rt.jwt.as_ref();
    facts.now_secs = head.unix_secs;
    facts.method = Some(method);
    if let Some(ambiguous) = ambiguous_key(rt, route, &facts) {
        return Err(bad(rt, BadRequest::AmbiguousKey, ambiguous, Some(route_index)));
    }
    let cost = request_cost(&route.cost, head.headers).map_err(|e| bad(rt, BadRequest::Cost, e, Some(route_index)))?;
    let unauthorized = |u: Unauthorized<'_>| unauthorized(rt, route_index, u);
    let mut empty_keys = Vec::new();
    let zones = keyed_zones(rt, route, &facts, cost, &mut empty_keys).map_err(unauthorized)?;
    let conns = keyed_conns(rt, route, &facts, &mut empty_keys).map_err(unauthorized)?;
    let pace = route.limit_rate.as_ref().and_then(|l| super::pacing::rate_for(l, &facts));
    let priority = route.priority_from.as_ref().map_or(route.priority, |p| p.resolve(&facts, route.priority));
    Ok(Plan { route: route_index, zones, conns, forward, pace, empty_keys, priority })
}

/// The host routes are matched on: an absolute-form target's authority wins over `Host` (RFC 9112
/// §3.2.2, nginx), HTTP/2's `:authority` names it, else `Host`. A spelling other than the decided
/// one is forwarded as the decided one.
fn decided_host<'h>(
    head: &Head<'h>,
    target_authority: Option<&'h str>,
    forward: &mut Forward,
) -> Result<Option<Host<'h>>, HostError> {
    let header = head.headers.get(HOST).map(|h| h.to_str().map_err(|_| HostError::BadName)).transpose()?;
    let Some(raw) = target_authority.or(head.authority).or(header) else { return Ok(None) };
    let host = Host::parse(raw)?;
    if !header.is_some_and(|h| host.spelled_as(h)) {
        forward.host = Some(host.header_value());
    }
    Ok(Some(host))
}

/// The first key of the route's zones, or part an override of them or of the route's pace
/// matches on, that the request gives twice with different values: an override read from the
/// first of two header lines (`partner`, then `free`) would pace or limit by a value the upstream
/// may not read.
fn ambiguous_key(rt: &Runtime, route: &Route, facts: &RequestFacts<'_>) -> Option<AmbiguousKey> {
    let rate_keys = route.limits.iter().map(|zl| &rt.zones[zl.zone].key);
    let conn_keys = route.conn_limits.iter().map(|cl| &rt.conn_zones[cl.zone].key);
    let zone_matches = route.limits.iter().flat_map(|zl| rt.zones[zl.zone].overrides.iter().map(|o| &o.matcher));
    let pace_matches = route.limit_rate.iter().flat_map(|l| l.overrides.iter().map(|(m, _)| m));
    let mut override_parts = zone_matches.chain(pace_matches).filter_map(|m| match m {
        OverrideMatch::Part(part, _) => Some(part),
        OverrideMatch::ClientIp(_) => None,
    });
    rate_keys
        .chain(conn_keys)
        .find_map(|spec| spec.ambiguity(facts))
        .or_else(|| override_parts.find_map(|part| part.ambiguity(facts)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn runtime(server_extra: &str) -> Runtime {
        let text = format!(
            "[server]\nlisten = [\"127.0.0.1:1\"]\n{server_extra}\n[store]\nkind = \"memory\"\n\
             [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:2\"]\n\
             [[limit_req_zone]]\nname = \"k\"\nkey = \"header:X-Api-Key\"\nrate = \"1r/s\"\n\
             [[route]]\nname = \"api\"\nhost = \"api.example.com\"\npath_prefix = \"/\"\nupstream = \"app\"\n\
             [[route]]\nname = \"put\"\npath = \"/items\"\nmethods = [\"PUT\"]\nupstream = \"app\"\n\
             [[route]]\nname = \"keyed\"\npath = \"/keyed\"\nupstream = \"app\"\nlimit_req = [ {{ zone = \"k\" }} ]\n\
             [[route]]\nname = \"any\"\npath_prefix = \"/\"\nupstream = \"app\"\n"
        );
        crate::config::from_text(&text, "test.toml").unwrap()
    }

    /// method, target, Host, extra headers, and what `decide` says of them.
    type Case<'a> = (&'a str, &'a str, Option<&'a str>, &'a [(&'a str, &'a str)], &'a str);

    /// (method, target, Host, extra headers) → the route's name and what is forwarded, or the
    /// 400's code.
    fn decide(rt: &Runtime, method: &str, target: &str, host: Option<&str>, extra: &[(&str, &str)]) -> String {
        let mut headers = HeaderMap::new();
        if let Some(h) = host {
            headers.insert(HOST, HeaderValue::from_str(h).unwrap());
        }
        for (k, v) in extra {
            headers.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let head = Head {
            method: &method,
            target: target.as_bytes(),
            authority: None,
            headers: &headers,
            client_ip: None,
            route: None,
            unix_secs: None,
        };
        match admit(rt, &head) {
            Ok(plan) => {
                let f = &plan.forward;
                let strip: Vec<&str> = f.strip.iter().map(|h| h.as_str()).collect();
                format!("{} {:?} {:?} {strip:?}", rt.routes[plan.route].name, f.target, f.host)
            }
            Err(Refused { answer: Answer { refusal: Refusal::BadRequest { error, .. }, .. }, .. }) => error.to_string(),
            Err(other) => format!("{:?}", other.answer.refusal),
        }
    }

    #[test]
    fn request_shapes_route_and_forward_as_upstreams_read_them() {
        let rt = runtime("");
        let cases: &[Case<'_>] = &[
            ("GET", "/a", Some("api.example.com"), &[], "api None None []"),
            ("GET", "/a", Some("API.Example.COM.:81"), &[], "api None Some(\"api.example.com:81\") []"),
            ("GET", "http://api.example.com/a?q", None, &[], "api Some(\"/a?q\") Some(\"api.example.com\") []"),
            ("GET", "//a/./b", Some("x"), &[], "any Some(\"/a/b\") None []"),
            ("GET", "/caf\u{e9}", Some("x"), &[], "any Some(\"/caf%C3%A9\") None []"),
            ("GET", "login", Some("x"), &[], "bad_target"),
            ("GET", "/x\\y", Some("x"), &[], "bad_path"),
            ("GET", "/a", Some("api.example.com:1:1"), &[], "bad_host"),
            ("put", "/items", Some("x"), &[], "bad_method"),
            ("PUT", "/items", Some("x"), &[], "put None None []"),
            (
                "POST",
                "/items",
                Some("x"),
                &[("x-http-method-override", "PUT")],
                "any None None [\"x-http-method-override\"]",
            ),
            ("GET", "/keyed", Some("x"), &[("x_api_key", "k")], "keyed None None [\"x_api_key\"]"),
            ("GET", "/keyed", Some("x"), &[("x-api-key", "a"), ("x-api-key", "b")], "ambiguous_key"),
        ];
        for (method, target, host, extra, want) in cases {
            assert_eq!(decide(&rt, method, target, *host, extra), *want, "{method} {target} {host:?} {extra:?}");
        }
    }

    #[test]
    fn override_and_underscore_policies() {
        let honour = runtime("method_override = \"honour\"\nunderscores_in_headers = \"reject\"");
        let put = [("x-http-method-override", "put")];
        assert_eq!(decide(&honour, "POST", "/items", Some("x"), &put), "put None None []");
        assert_eq!(decide(&honour, "GET", "/items", Some("x"), &put), "any None None [\"x-http-method-override\"]");
        assert_eq!(decide(&honour, "GET", "/", Some("x"), &[("a_b", "1")]), "underscore_header");
        let reject = runtime("method_override = \"reject\"");
        assert_eq!(decide(&reject, "POST", "/items", Some("x"), &put), "method_override");
    }
}
