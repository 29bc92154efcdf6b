//! `[[route]]`: matching, limit references (`limit_req`, `limit_conn`), statuses, access rules,
//! cost and headers, compiled against the zones and upstreams already compiled.

use std::collections::HashMap;

use super::spanned::Spanned;
use http::header::HeaderName;

use super::access::{access_rules, AccessRule};
use super::checks::{check_name, list_or_none, unique, MAX_BURST};
use super::conditions::Conditions;
use super::each::{Each, Failed};
use super::error::{ConfigError, Source};
use super::limit_conn::{self, ConnLimit, ConnZone};
use super::limit_rate::LimitRate;
use super::limit_req::Zone;
use super::route_match::{compile_match, shadowing, unreachable, MatchInput};
use super::schema;
use super::store::FailurePolicy;
use crate::limit::{Algorithm, DelayPolicy, LimitReq};
use crate::routes::{RouteMatcher, RouteOrder};
use crate::upstream::Upstream;

/// Which rate-limit fields responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderMode {
    /// IETF draft-10 `RateLimit-Policy` and `RateLimit`.
    Draft,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` of the tightest zone.
    Legacy,
    /// Neither (`Retry-After` is still sent on rejections).
    None,
}

#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    pub upstream: usize,
    pub limits: Vec<ZoneLimit>,
    pub status: u16,
    pub headers: HeaderMode,
    /// Overrides the store's failure policy.
    pub on_error: Option<FailurePolicy>,
    /// `limit_conn` references, decided after `limit_req` like nginx.
    pub conn_limits: Vec<ConnLimit>,
    pub conn_status: u16,
    /// allow/deny rules in file order; the first match wins; no match allows.
    pub access: Vec<AccessRule>,
    pub cost: Cost,
    /// The gRPC status a rejection of an `application/grpc*` request carries (HTTP 200 +
    /// `grpc-status`); `None`: gRPC requests get the HTTP statuses like any other.
    pub grpc_status: Option<u8>,
    /// nginx's `limit_rate` on response bodies (`limit_rate.rs`); `None`: full speed.
    pub limit_rate: Option<LimitRate>,
    /// Under the upstream's adaptive limit, lower priorities are refused first.
    pub priority: crate::adaptive::Priority,
    /// The request's own priority (a header or a verified claim), within `priority_from`'s rules.
    pub priority_from: Option<crate::adaptive::PriorityFrom>,
    /// `rejection_body`: the body of the limits' rejections instead of Weir's JSON.
    pub rejection: Option<OwnBody>,
}

/// A route's own rejection body and its content type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnBody {
    pub content_type: String,
    pub body: String,
}

/// The largest `rejection_body`.
const MAX_REJECTION_BODY: usize = 64 * 1024;

fn own_body(
    body: Option<&Spanned<String>>,
    content_type: Option<&Spanned<String>>,
    here: &dyn Fn(&std::ops::Range<usize>, String) -> ConfigError,
) -> Result<Option<OwnBody>, ConfigError> {
    let Some(body) = body else {
        return match content_type {
            Some(t) => Err(here(&t.span(), "rejection_content_type: only applies with rejection_body".into())),
            None => Ok(None),
        };
    };
    if body.get_ref().len() > MAX_REJECTION_BODY {
        return Err(here(
            &body.span(),
            format!("rejection_body: {} bytes; at most {MAX_REJECTION_BODY}", body.get_ref().len()),
        ));
    }
    let content_type = match content_type {
        None => "text/plain; charset=utf-8".to_string(),
        Some(t) if http::HeaderValue::from_str(t.get_ref()).is_ok() && !t.get_ref().trim().is_empty() => {
            t.get_ref().clone()
        }
        Some(t) => {
            return Err(here(&t.span(), format!("rejection_content_type: {:?} is not a header value", t.get_ref())))
        }
    };
    Ok(Some(OwnBody { content_type, body: body.get_ref().clone() }))
}

/// What one request of a route counts as in its rate limits.
#[derive(Debug, Clone)]
pub struct Cost {
    /// `cost = N` (default 1); also the cost when `header` is absent from a request.
    pub default: u64,
    /// `cost_header = "X-Cost"`: the request says its own cost (a non-integer is a 400).
    pub header: Option<HeaderName>,
    /// `max_cost`: a larger header value is clamped to it.
    pub max: u64,
    /// `min_cost` (default 1): a smaller header value is raised to it, so `X-Cost: 0` is not a
    /// free pass.
    pub min: u64,
}

/// gRPC's RESOURCE_EXHAUSTED, the default status of a gRPC request's rejection.
const GRPC_RESOURCE_EXHAUSTED: u8 = 8;

/// The largest `cost` and `max_cost`.
const MAX_COST: i64 = 1_000_000;

/// One `limit_req` reference of a route: a zone plus this route's burst and delay.
#[derive(Debug, Clone)]
pub struct ZoneLimit {
    pub zone: usize,
    pub limit: LimitReq,
    /// Shadow mode (the route's `dry_run` or the reference's own): decided and reported, never
    /// enforced, and decided apart from enforced zones so it cannot affect them.
    pub dry_run: bool,
    /// The reference's `RateLimit-Policy` item for `limit`, written once here rather than per
    /// request (a key's override changes the limit, and the item is then written per request).
    pub policy: String,
    /// `when` / `unless`: the reference applies to a request only when they say so.
    pub conditions: Conditions,
}

/// Every route that compiles (with its matcher), and an error for each that does not (see
/// `each`). A route that names an upstream or zone whose own definition failed gets no error of
/// its own: "unknown upstream" would only repeat that one.
pub(super) fn compile_routes(
    src: &Source<'_>,
    list: Vec<Spanned<schema::Route>>,
    upstreams: &Each<Upstream>,
    zones: &Each<Zone>,
    conn_zones: &Each<ConnZone>,
    order: RouteOrder,
    warnings: &mut Vec<String>,
) -> Each<(Route, RouteMatcher)> {
    let mut seen = HashMap::new();
    let mut spans = Vec::new();
    let mut routes = Vec::new();
    let mut matchers = Vec::new();
    let mut out = Each::default();
    let refs = Refs { upstreams, zones, conn_zones };
    for route in list {
        let name = route.get_ref().name.get_ref().clone();
        let span = route.span();
        match compile_route(src, route, &mut seen, (&routes, &mut matchers), refs, order, warnings) {
            Ok(compiled) => {
                routes.push(compiled);
                spans.push(span);
            }
            Err(failed) => {
                // Its matcher, if it got that far, goes with it: `matchers[i]` matches `routes[i]`.
                matchers.truncate(routes.len());
                if let Failed::Error(e) = failed {
                    out.push(&name, Err(e));
                }
            }
        }
    }
    for u in unreachable(&matchers, order) {
        warnings.push(format!(
            "{}:{}: route {:?}: can never match: route {:?} (line {}) always wins: {}",
            src.file,
            src.line_of(&spans[u.route]),
            routes[u.route].name,
            routes[u.winner].name,
            src.line_of(&spans[u.winner]),
            u.why
        ));
    }
    out.items = routes.into_iter().zip(matchers).collect();
    out
}

/// What a route may name, each with the names whose definition failed.
#[derive(Clone, Copy)]
struct Refs<'a> {
    upstreams: &'a Each<Upstream>,
    zones: &'a Each<Zone>,
    conn_zones: &'a Each<ConnZone>,
}

/// One route. Its matcher is pushed onto `matchers` (the routes before it are checked for
/// shadowing it); the caller takes it off again if the route fails.
fn compile_route(
    src: &Source<'_>,
    route: Spanned<schema::Route>,
    seen: &mut HashMap<String, usize>,
    (routes, matchers): (&[Route], &mut Vec<RouteMatcher>),
    Refs { upstreams, zones, conn_zones }: Refs<'_>,
    order: RouteOrder,
    warnings: &mut Vec<String>,
) -> Result<Route, Failed> {
    let route_span = route.span();
    let schema::Route {
        name,
        path,
        path_prefix,
        path_regex,
        host,
        methods,
        skip_regex,
        upstream,
        limit_req,
        limit_req_status,
        dry_run,
        rate_limit_headers,
        on_error,
        limit_conn,
        limit_conn_status,
        cost,
        cost_header,
        max_cost,
        min_cost,
        allow,
        deny,
        rejection_body,
        rejection_content_type,
        grpc_rejections,
        grpc_status,
        limit_rate,
        limit_rate_after,
        limit_rate_override,
        priority,
        priority_from,
    } = route.into_inner();
    check_name(src, &name, "route.name")?;
    unique(src, seen, &name, "route")?;
    let rname = name.get_ref().clone();
    let here = |span: &std::ops::Range<usize>, msg: String| src.error_at(span, format!("route {rname:?}: {msg}"));

    if let (Some(s), RouteOrder::Specific) = (&skip_regex, order) {
        return Err(here(
            &s.span(),
            "skip_regex: only with route_order = \"nginx\" (under \"specific\" a prefix already beats every regex)"
                .into(),
        )
        .into());
    }
    let input = MatchInput { path, path_prefix, path_regex, host, methods, skip_regex };
    let matcher = compile_match(src, &rname, &route_span, input, &here, warnings)?;
    matchers.push(matcher);
    if let Some(earlier) = shadowing(matchers, matchers.len() - 1) {
        return Err(here(
            &route_span,
            format!(
                "can never match: route {:?} comes first with the same path and host and all of its methods{}",
                routes_so_far_name(routes, earlier),
                super::route_match::head_hint(matchers, earlier, matchers.len() - 1)
            ),
        )
        .into());
    }
    if upstreams.is_broken(upstream.get_ref()) {
        return Err(Failed::Broken);
    }
    let upstream_index = upstreams.items.iter().position(|u| u.name == *upstream.get_ref()).ok_or_else(|| {
        let known: Vec<&str> = upstreams.items.iter().map(|u| u.name.as_str()).collect();
        here(
            &upstream.span(),
            format!("upstream: unknown upstream {:?} (defined: {})", upstream.get_ref(), list_or_none(&known)),
        )
    })?;

    let mut limits: Vec<ZoneLimit> = Vec::new();
    for reference in limit_req.iter().flatten() {
        if zones.is_broken(reference.get_ref().zone.get_ref()) {
            return Err(Failed::Broken);
        }
        let mut zl = compile_limit_ref(reference.get_ref(), &zones.items, &here)?;
        zl.dry_run |= dry_run;
        if limits.iter().any(|l| l.zone == zl.zone) {
            return Err(here(
                &reference.get_ref().zone.span(),
                format!("limit_req: zone {:?} is referenced twice", reference.get_ref().zone.get_ref()),
            )
            .into());
        }
        limits.push(zl);
    }
    let status = rejection_status(limit_req_status.as_ref(), 429, "limit_req_status", &here)?;
    let headers = header_mode(rate_limit_headers.as_ref(), &here)?;
    let on_error = failure_policy(on_error.as_ref(), &here)?;
    let conn_refs = limit_conn.as_deref().unwrap_or_default();
    if conn_refs.iter().any(|r| conn_zones.is_broken(r.get_ref().zone.get_ref())) {
        return Err(Failed::Broken);
    }
    let conn_limits = limit_conn::compile_conn_refs(conn_refs, &conn_zones.items, dry_run, &here)?;
    let conn_status = rejection_status(limit_conn_status.as_ref(), 503, "limit_conn_status", &here)?;
    let access = access_rules(allow.as_deref().unwrap_or_default(), deny.as_deref().unwrap_or_default(), &here)?;
    let cost = compile_cost(cost.as_ref(), cost_header.as_ref(), (min_cost.as_ref(), max_cost.as_ref()), &here)?;
    let grpc_status = match (grpc_rejections, grpc_status) {
        (Some(false), Some(s)) => {
            return Err(
                here(&s.span(), "grpc_status: grpc_rejections = false sends HTTP statuses; remove one".into()).into()
            )
        }
        (Some(false), None) => None,
        (_, None) => Some(GRPC_RESOURCE_EXHAUSTED),
        (_, Some(s)) if (1..=16).contains(s.get_ref()) => Some(*s.get_ref() as u8),
        (_, Some(s)) => {
            return Err(here(
                &s.span(),
                format!("grpc_status: must be a gRPC error code 1..=16 (8 is RESOURCE_EXHAUSTED), got {}", s.get_ref()),
            )
            .into())
        }
    };
    let limit_rate =
        super::limit_rate::compile(limit_rate.as_ref(), limit_rate_after.as_ref(), &limit_rate_override, &here)?;
    let priority = match &priority {
        None => crate::adaptive::Priority::default(),
        Some(p) => crate::adaptive::Priority::parse(p.get_ref()).ok_or_else(|| {
            here(&p.span(), format!("priority: expected \"low\", \"normal\" or \"high\", got {:?}", p.get_ref()))
        })?,
    };
    if let (Some(p), None) = (&priority_from, &upstreams.items[upstream_index].spec.adaptive) {
        // Not an error: the upstream may be made adaptive later; but a claim costs a token
        // verification per request for nothing meanwhile.
        warnings.push(format!(
            "{}:{}: route {rname:?}: priority_from has no effect: upstream {:?} has no adaptive limit",
            src.file,
            src.line_of(&p.span()),
            upstreams.items[upstream_index].spec.name
        ));
    }
    let priority_from = priority_from.as_ref().map(|p| compile_priority_from(p, &here)).transpose()?;
    let rejection = own_body(rejection_body.as_ref(), rejection_content_type.as_ref(), &here)?;
    Ok(Route {
        name: name.into_inner(),
        upstream: upstream_index,
        limits,
        status,
        headers,
        on_error,
        conn_limits,
        conn_status,
        access,
        cost,
        grpc_status,
        limit_rate,
        priority,
        priority_from,
        rejection,
    })
}

/// The most entries a `priority_from.map` may have (each request scans it).
const MAX_PRIORITY_VALUES: usize = 64;

fn compile_priority_from(
    spec: &Spanned<super::schema::PriorityFromSpec>,
    here: &impl Fn(&std::ops::Range<usize>, String) -> ConfigError,
) -> Result<crate::adaptive::PriorityFrom, ConfigError> {
    use crate::adaptive::{Priority, PrioritySource};
    let name = |p: &Spanned<String>, what: &str| {
        Priority::parse(p.get_ref()).ok_or_else(|| {
            here(&p.span(), format!("{what}: expected \"low\", \"normal\" or \"high\", got {:?}", p.get_ref()))
        })
    };
    let s = spec.get_ref();
    let source = match (&s.header, &s.claim) {
        (Some(h), None) => PrioritySource::Header(
            http::HeaderName::from_bytes(h.get_ref().as_bytes())
                .map_err(|_| here(&h.span(), format!("priority_from.header: not a header name: {:?}", h.get_ref())))?,
        ),
        (None, Some(c)) if !c.get_ref().is_empty() => PrioritySource::Claim(c.get_ref().clone()),
        (None, Some(c)) => return Err(here(&c.span(), "priority_from.claim: empty".into())),
        _ => {
            return Err(here(
                &spec.span(),
                "priority_from: give exactly one of header = \"NAME\" or claim = \"CLAIM\"".into(),
            ))
        }
    };
    if s.map.len() > MAX_PRIORITY_VALUES {
        return Err(here(&spec.span(), format!("priority_from.map: at most {MAX_PRIORITY_VALUES} values")));
    }
    let map = s
        .map
        .iter()
        .map(|(value, p)| Ok((value.as_bytes().into(), name(p, &format!("priority_from.map.{value}"))?)))
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let max = s.max.as_ref().map(|m| name(m, "priority_from.max")).transpose()?;
    Ok(crate::adaptive::PriorityFrom { source, map, max })
}

/// The largest burst of a byte quota (`cost_from_response = { body_bytes = true }`): 1 TiB.
const MAX_BYTES_BURST: i64 = 1 << 40;

fn routes_so_far_name(routes: &[Route], index: usize) -> &str {
    routes.get(index).map_or("?", |r| r.name.as_str())
}

pub(super) fn compile_limit_ref(
    r: &schema::LimitReqRef,
    zones: &[Zone],
    here: &dyn Fn(&std::ops::Range<usize>, String) -> ConfigError,
) -> Result<ZoneLimit, ConfigError> {
    let zone = zones.iter().position(|z| z.name == *r.zone.get_ref()).ok_or_else(|| {
        let known: Vec<&str> = zones.iter().map(|z| z.name.as_str()).collect();
        here(
            &r.zone.span(),
            format!("limit_req: unknown zone {:?} (defined: {})", r.zone.get_ref(), list_or_none(&known)),
        )
    })?;
    // A byte quota's bucket holds bytes: its burst goes up to 1 TiB, a request count's to 1,000,000.
    let counts_bytes = zones[zone].response_cost.as_ref().is_some_and(|rc| rc.header.is_none());
    let top = if counts_bytes { MAX_BYTES_BURST } else { MAX_BURST };
    let in_range = |v: &Spanned<i64>, field: &str| {
        if (0..=top).contains(v.get_ref()) {
            Ok(*v.get_ref() as u64)
        } else {
            Err(here(&v.span(), format!("limit_req: {field} must be 0..={top}, got {}", v.get_ref())))
        }
    };
    let algorithm = zones[zone].algorithm;
    // Window algorithms count per window: a burst or delay there would silently mean nothing.
    if algorithm.is_window() {
        let bucket_only = [
            r.burst.as_ref().map(|b| b.span()),
            r.delay.as_ref().map(|d| d.span()),
            r.nodelay.as_ref().map(|n| n.span()),
        ];
        if let Some(span) = bucket_only.into_iter().flatten().next() {
            return Err(here(&span, format!(
                "limit_req: zone {:?} uses {}, which has no burst, delay or nodelay (its limit is the count per window)",
                r.zone.get_ref(), algorithm.as_str())));
        }
    }
    if algorithm == Algorithm::TokenBucket {
        if let Some(d) = &r.delay {
            return Err(here(
                &d.span(),
                format!(
                    "limit_req: zone {:?} uses token_bucket, which never delays; use leaky_bucket for delay",
                    r.zone.get_ref()
                ),
            ));
        }
    }
    let burst = r.burst.as_ref().map(|b| in_range(b, "burst")).transpose()?.unwrap_or(0);
    let nodelay = r.nodelay.as_ref().is_some_and(|n| *n.get_ref()) || algorithm != Algorithm::LeakyBucket;
    let delay = match (&r.delay, nodelay) {
        (Some(d), true) => {
            return Err(here(&d.span(), "limit_req: give either delay or nodelay = true, not both".into()));
        }
        (Some(d), false) => {
            let value = in_range(d, "delay")?;
            if value > burst {
                return Err(here(&d.span(), format!(
                    "limit_req: delay = {value} exceeds burst = {burst}; requests beyond the burst are rejected, so use nodelay = true")));
            }
            DelayPolicy::After(value)
        }
        (None, true) => DelayPolicy::NoDelay,
        (None, false) => DelayPolicy::After(0),
    };
    let limit = LimitReq { algorithm, rate: zones[zone].rate, burst, delay };
    let mut policy = String::new();
    crate::limit::fields::policy_item(&mut policy, &zones[zone].name, &limit);
    let conditions = super::conditions::compile(r.when.as_ref(), r.unless.as_ref(), here)?;
    Ok(ZoneLimit { zone, limit, dry_run: r.dry_run, policy, conditions })
}

fn compile_cost(
    cost: Option<&Spanned<i64>>,
    header: Option<&Spanned<String>>,
    (min, max): (Option<&Spanned<i64>>, Option<&Spanned<i64>>),
    here: &dyn Fn(&std::ops::Range<usize>, String) -> ConfigError,
) -> Result<Cost, ConfigError> {
    let in_range = |v: &Spanned<i64>, field: &str, min: i64| {
        if (min..=MAX_COST).contains(v.get_ref()) {
            Ok(*v.get_ref() as u64)
        } else {
            Err(here(&v.span(), format!("{field} must be {min}..={MAX_COST}, got {}", v.get_ref())))
        }
    };
    let default = cost.map(|c| in_range(c, "cost", 0)).transpose()?.unwrap_or(1);
    let header = header
        .map(|h| {
            HeaderName::from_bytes(h.get_ref().as_bytes())
                .map_err(|_| here(&h.span(), format!("cost_header: {:?} is not a header name", h.get_ref())))
        })
        .transpose()?;
    let max = match (max, &header) {
        (Some(m), Some(_)) => in_range(m, "max_cost", 1)?,
        (Some(m), None) => return Err(here(&m.span(), "max_cost: only applies with cost_header".into())),
        (None, _) => 100,
    };
    let min_field = min;
    let min = match (min, &header) {
        (Some(m), Some(_)) => in_range(m, "min_cost", 0)?,
        (Some(m), None) => return Err(here(&m.span(), "min_cost: only applies with cost_header".into())),
        (None, _) => 1,
    };
    if let (Some(m), true) = (min_field, min > max) {
        return Err(here(&m.span(), format!("min_cost ({min}) must not exceed max_cost ({max})")));
    }
    Ok(Cost { default, header, max, min })
}

/// A rejection status: 400..=599, like nginx's `limit_req_status` / `limit_conn_status`.
fn rejection_status(
    value: Option<&Spanned<i64>>,
    default: u16,
    field: &str,
    here: &dyn Fn(&std::ops::Range<usize>, String) -> ConfigError,
) -> Result<u16, ConfigError> {
    match value {
        None => Ok(default),
        Some(s) if (400..=599).contains(s.get_ref()) => Ok(*s.get_ref() as u16),
        Some(s) => Err(here(&s.span(), format!("{field}: must be 400..=599, got {}", s.get_ref()))),
    }
}

/// `rate_limit_headers` (a route's, an RLS domain's): "draft" (the default), "legacy" or "none".
pub(super) fn header_mode(
    value: Option<&Spanned<String>>,
    here: &dyn Fn(&std::ops::Range<usize>, String) -> ConfigError,
) -> Result<HeaderMode, ConfigError> {
    match value.map(|h| h.get_ref().as_str()) {
        None | Some("draft") => Ok(HeaderMode::Draft),
        Some("legacy") => Ok(HeaderMode::Legacy),
        Some("none") => Ok(HeaderMode::None),
        Some(other) => Err(here(
            &value.map(|h| h.span()).unwrap_or_default(),
            format!("rate_limit_headers: expected \"draft\", \"legacy\" or \"none\", got {other:?}"),
        )),
    }
}

/// `on_error` (a route's, an RLS domain's): the store's failure policy for it, when given.
pub(super) fn failure_policy(
    value: Option<&Spanned<String>>,
    here: &dyn Fn(&std::ops::Range<usize>, String) -> ConfigError,
) -> Result<Option<FailurePolicy>, ConfigError> {
    value
        .map(|p| {
            FailurePolicy::parse(p.get_ref()).ok_or_else(|| {
                here(&p.span(), format!("on_error: expected \"allow\", \"deny\" or \"local\", got {:?}", p.get_ref()))
            })
        })
        .transpose()
}
