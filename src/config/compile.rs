//! Validation and compilation of the TOML front-end into the runtime model. Every reference is
//! resolved to an index, every address parsed and every regex compiled here, once.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use http::header::HeaderName;
use http::Method;
use ipnet::IpNet;
use regex::Regex;
use toml::Spanned;

use super::conn::{self, AccessRule, ConnLimit, ConnZone};
use super::error::{ConfigError, Source};
use super::schema;
use super::zones::{self, Zone};
use crate::keys::{KeyPart, KeySpec, RealIp};
use crate::limit::{Algorithm, DelayPolicy, LimitReq};
use crate::routes::{HostMatch, PathMatch, RouteMatcher};
use crate::store::{RedisClock, RedisStoreConfig};
use crate::upstream::Upstream;

/// Largest accepted `burst` and `delay`: far beyond any sane bucket, and small enough that the
/// bucket level stays an exact integer in a double (Lua) for every rate unit.
pub(super) const MAX_BURST: i64 = 1_000_000;
const MAX_THREADS: i64 = 1024;

/// The compiled, immutable configuration one request reads from start to end.
#[derive(Debug)]
pub struct Runtime {
    pub server: ServerSettings,
    pub store: StoreSettings,
    pub real_ip: Option<RealIp>,
    pub upstreams: Vec<Upstream>,
    pub zones: Vec<Zone>,
    pub conn_zones: Vec<ConnZone>,
    pub routes: Vec<Route>,
    /// `matchers[i]` matches `routes[i]`.
    pub matchers: Vec<RouteMatcher>,
    pub log: LogSettings,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    pub listen: Vec<SocketAddr>,
    pub threads: usize,
    /// The admin listener (`/config`, `/reload`, `/metrics`, …); off when absent.
    pub admin: Option<SocketAddr>,
    /// When set, admin requests other than `/healthz` and `/readyz` need `Authorization: Bearer <token>`.
    pub admin_token: Option<String>,
}

/// Logging: read at start-up (`RUST_LOG` overrides the level); the access log switch is live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    pub level: String,
    pub json: bool,
    pub access_log: bool,
}

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
pub enum StoreSettings {
    Memory,
    Redis(RedisStoreConfig, Resilience),
}

/// What happens when the shared store fails, and how to fail less often.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resilience {
    /// The default failure policy; routes may override it.
    pub on_error: FailurePolicy,
    /// Instances sharing the limits: the `local` policy gives each 1/N of every limit.
    pub fleet_size: u64,
    /// Entries of the deny cache; 0 turns it off.
    pub deny_cache_size: usize,
    /// Consecutive failures that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long a concurrency lease lives without renewal: a crashed proxy's slots come back
    /// after this. Leases are renewed every third of it while their request runs.
    pub lease_ttl: Duration,
}

pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// What a request gets when its limits cannot be decided by the shared store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Fail open: forward the request.
    Allow,
    /// Fail closed: reject with the route's status.
    Deny,
    /// Decide in-process with this instance's share (1/fleet_size) of each limit.
    Local,
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Allow => "allow",
            FailurePolicy::Deny => "deny",
            FailurePolicy::Local => "local",
        }
    }

    fn parse(text: &str) -> Option<FailurePolicy> {
        match text {
            "allow" => Some(FailurePolicy::Allow),
            "deny" => Some(FailurePolicy::Deny),
            "local" => Some(FailurePolicy::Local),
            _ => None,
        }
    }
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
}

/// The largest `cost` and `max_cost`.
const MAX_COST: i64 = 1_000_000;

/// One `limit_req` reference of a route: a zone plus this route's burst and delay.
#[derive(Debug, Clone, Copy)]
pub struct ZoneLimit {
    pub zone: usize,
    pub limit: LimitReq,
    /// Shadow mode (the route's `dry_run` or the reference's own): decided and reported, never
    /// enforced, and decided apart from enforced zones so it cannot affect them.
    pub dry_run: bool,
}

pub fn compile(text: &str, file: &str) -> Result<Runtime, ConfigError> {
    let src = Source { file, text };
    let parsed: schema::File = toml::from_str(text).map_err(|e| match e.span() {
        Some(span) => src.error_at(&span, e.message().trim_end()),
        None => src.error(e.message().trim_end()),
    })?;
    let schema::File { server, store, real_ip, upstream, limit_req_zone, limit_conn_zone, route, log } = parsed;

    let server = compile_server(&src, server)?;
    let store = compile_store(&src, store)?;
    let real_ip = real_ip.map(|r| compile_real_ip(&src, r)).transpose()?;
    let upstreams = compile_upstreams(&src, upstream)?;
    let zones = zones::compile_zones(&src, limit_req_zone)?;
    let conn_zones = conn::compile_conn_zones(&src, limit_conn_zone, &zones)?;
    let (routes, matchers) = compile_routes(&src, route, &upstreams, &zones, &conn_zones)?;
    Ok(Runtime { server, store, real_ip, upstreams, zones, conn_zones, routes, matchers, log: compile_log(&src, log)? })
}

fn compile_log(src: &Source<'_>, log: Option<Spanned<schema::Log>>) -> Result<LogSettings, ConfigError> {
    let defaults = LogSettings { level: "info".to_string(), json: false, access_log: true };
    let Some(log) = log else { return Ok(defaults) };
    let schema::Log { level, format, access_log } = log.into_inner();
    let level = match level {
        None => defaults.level,
        Some(l) if ["error", "warn", "info", "debug", "trace"].contains(&l.get_ref().as_str()) => l.into_inner(),
        Some(l) => {
            return Err(src.error_at(
                &l.span(),
                format!("log.level: expected error, warn, info, debug or trace, got {:?}", l.get_ref()),
            ))
        }
    };
    let json = match format.as_ref().map(|f| f.get_ref().as_str()) {
        None | Some("text") => false,
        Some("json") => true,
        Some(other) => {
            let span = format.as_ref().map(|f| f.span()).unwrap_or_default();
            return Err(src.error_at(&span, format!("log.format: expected \"text\" or \"json\", got {other:?}")));
        }
    };
    Ok(LogSettings { level, json, access_log: access_log.unwrap_or(defaults.access_log) })
}

fn compile_server(src: &Source<'_>, server: Spanned<schema::Server>) -> Result<ServerSettings, ConfigError> {
    let schema::Server { listen, threads, admin, admin_token } = server.into_inner();
    if listen.get_ref().is_empty() {
        return Err(src.error_at(&listen.span(), "server.listen: give at least one address, e.g. [\"127.0.0.1:8080\"]"));
    }
    let mut addrs = Vec::new();
    for addr in listen.into_inner() {
        let parsed: SocketAddr = addr.get_ref().parse().map_err(|_| {
            src.error_at(&addr.span(), format!("server.listen: {:?} is not an IP:port address", addr.get_ref()))
        })?;
        addrs.push(parsed);
    }
    let threads = match threads {
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        Some(t) if (1..=MAX_THREADS).contains(t.get_ref()) => *t.get_ref() as usize,
        Some(t) => {
            return Err(
                src.error_at(&t.span(), format!("server.threads: must be 1..={MAX_THREADS}, got {}", t.get_ref()))
            )
        }
    };
    let admin = admin
        .map(|a| {
            a.get_ref().parse::<SocketAddr>().map_err(|_| {
                src.error_at(&a.span(), format!("server.admin: {:?} is not an IP:port address", a.get_ref()))
            })
        })
        .transpose()?;
    let admin_token = match admin_token {
        Some(t) if t.get_ref().len() < 16 || t.get_ref().bytes().any(|b| !b.is_ascii_graphic()) => {
            return Err(
                src.error_at(&t.span(), "server.admin_token: use at least 16 printable characters without spaces")
            );
        }
        t => t.map(|t| t.into_inner()),
    };
    if admin_token.is_some() && admin.is_none() {
        return Err(src.error("server.admin_token: set server.admin too, or remove the token"));
    }
    Ok(ServerSettings { listen: addrs, threads, admin, admin_token })
}

fn compile_store(src: &Source<'_>, store: Option<Spanned<schema::Store>>) -> Result<StoreSettings, ConfigError> {
    let Some(store) = store else {
        return Ok(StoreSettings::Memory);
    };
    let schema::Store {
        kind,
        url,
        timeout,
        clock,
        key_prefix,
        on_error,
        fleet_size,
        deny_cache_size,
        circuit_breaker_failures,
        lease_ttl,
    } = store.into_inner();
    match kind.get_ref().as_str() {
        "memory" => {
            let redis_only = [
                ("url", url.map(|u| u.span())),
                ("timeout", timeout.map(|t| t.span())),
                ("clock", clock.map(|c| c.span())),
                ("key_prefix", key_prefix.map(|k| k.span())),
                ("on_error", on_error.map(|k| k.span())),
                ("fleet_size", fleet_size.map(|k| k.span())),
                ("deny_cache_size", deny_cache_size.map(|k| k.span())),
                ("circuit_breaker_failures", circuit_breaker_failures.map(|k| k.span())),
                ("lease_ttl", lease_ttl.map(|k| k.span())),
            ];
            if let Some((field, Some(span))) = redis_only.into_iter().find(|(_, s)| s.is_some()) {
                return Err(src.error_at(&span, format!("store.{field}: only applies to kind = \"redis\"")));
            }
            Ok(StoreSettings::Memory)
        }
        "redis" => {
            let url = url.ok_or_else(|| {
                src.error_at(
                    &kind.span(),
                    "store.url: required with kind = \"redis\", e.g. \"redis://127.0.0.1:6379/0\"",
                )
            })?;
            let valid_scheme = ["redis://", "rediss://"].iter().any(|s| url.get_ref().starts_with(s));
            if !valid_scheme || ::redis::Client::open(url.get_ref().as_str()).is_err() {
                return Err(src.error_at(
                    &url.span(),
                    format!("store.url: {:?} is not a redis:// or rediss:// URL", url.get_ref()),
                ));
            }
            let timeout = match timeout {
                None => Duration::from_millis(25),
                Some(t) => parse_duration(t.get_ref()).filter(|d| !d.is_zero()).ok_or_else(|| {
                    src.error_at(
                        &t.span(),
                        format!(
                            "store.timeout: expected a positive duration like \"25ms\" or \"1s\", got {:?}",
                            t.get_ref()
                        ),
                    )
                })?,
            };
            let clock = match clock.as_ref().map(|c| c.get_ref().as_str()) {
                None | Some("redis") => RedisClock::Redis,
                Some("local") => RedisClock::Local,
                Some(other) => {
                    let span = clock.as_ref().map(|c| c.span()).unwrap_or_default();
                    return Err(
                        src.error_at(&span, format!("store.clock: expected \"redis\" or \"local\", got {other:?}"))
                    );
                }
            };
            let key_prefix = key_prefix.map_or_else(|| "weir:".to_string(), |k| k.into_inner());
            let int_in =
                |v: &Option<Spanned<i64>>, field: &str, range: std::ops::RangeInclusive<i64>, default: i64| match v {
                    None => Ok(default),
                    Some(v) if range.contains(v.get_ref()) => Ok(*v.get_ref()),
                    Some(v) => Err(src.error_at(
                        &v.span(),
                        format!("store.{field}: must be {}..={}, got {}", range.start(), range.end(), v.get_ref()),
                    )),
                };
            let resilience = Resilience {
                on_error: match &on_error {
                    None => FailurePolicy::Local,
                    Some(p) => FailurePolicy::parse(p.get_ref()).ok_or_else(|| {
                        src.error_at(
                            &p.span(),
                            format!("store.on_error: expected \"allow\", \"deny\" or \"local\", got {:?}", p.get_ref()),
                        )
                    })?,
                },
                fleet_size: int_in(&fleet_size, "fleet_size", 1..=10_000, 1)? as u64,
                deny_cache_size: int_in(&deny_cache_size, "deny_cache_size", 0..=10_000_000, 10_000)? as usize,
                lease_ttl: match &lease_ttl {
                    None => DEFAULT_LEASE_TTL,
                    Some(t) => parse_duration(t.get_ref())
                        .filter(|d| *d >= Duration::from_secs(1) && *d <= Duration::from_secs(3600))
                        .ok_or_else(|| {
                            src.error_at(
                                &t.span(),
                                format!(
                                    "store.lease_ttl: expected a duration from \"1s\" to \"60m\", got {:?}",
                                    t.get_ref()
                                ),
                            )
                        })?,
                },
                breaker_failures: int_in(&circuit_breaker_failures, "circuit_breaker_failures", 1..=1_000, 3)? as u32,
            };
            Ok(StoreSettings::Redis(RedisStoreConfig { url: url.into_inner(), timeout, clock, key_prefix }, resilience))
        }
        other => {
            Err(src.error_at(&kind.span(), format!("store.kind: expected \"memory\" or \"redis\", got {other:?}")))
        }
    }
}

fn compile_real_ip(src: &Source<'_>, real_ip: Spanned<schema::RealIp>) -> Result<RealIp, ConfigError> {
    let schema::RealIp { trusted, header } = real_ip.into_inner();
    let trusted = trusted
        .iter()
        .map(|t| {
            parse_cidr(t.get_ref()).ok_or_else(|| {
                src.error_at(
                    &t.span(),
                    format!("real_ip.trusted: {:?} is not an IP address or CIDR like \"10.0.0.0/8\"", t.get_ref()),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let header = match header {
        None => HeaderName::from_static("x-forwarded-for"),
        Some(h) => HeaderName::from_bytes(h.get_ref().as_bytes())
            .map_err(|_| src.error_at(&h.span(), format!("real_ip.header: {:?} is not a header name", h.get_ref())))?,
    };
    Ok(RealIp { trusted, header })
}

fn parse_cidr(text: &str) -> Option<IpNet> {
    text.parse::<IpNet>().ok().or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from))
}

fn compile_upstreams(src: &Source<'_>, list: Vec<Spanned<schema::Upstream>>) -> Result<Vec<Upstream>, ConfigError> {
    let mut seen = HashMap::new();
    let mut out = Vec::new();
    for up in list {
        let schema::Upstream { name, servers, max_conns } = up.into_inner();
        check_name(src, &name, "upstream.name")?;
        unique(src, &mut seen, &name, "upstream")?;
        if servers.get_ref().is_empty() {
            return Err(src.error_at(
                &servers.span(),
                format!("upstream {:?}: servers must list at least one address", name.get_ref()),
            ));
        }
        let mut addrs = Vec::new();
        for server in servers.get_ref() {
            // Resolved once here: per-request resolution would block the proxy's workers.
            let resolved = server.get_ref().to_socket_addrs().ok().and_then(|mut a| a.next());
            let addr = resolved.ok_or_else(|| {
                src.error_at(
                    &server.span(),
                    format!(
                        "upstream {:?}: cannot resolve server {:?} (expected host:port)",
                        name.get_ref(),
                        server.get_ref()
                    ),
                )
            })?;
            addrs.push(addr);
        }
        let max_conns = match max_conns {
            None => None,
            Some(m) if (1..=1_000_000).contains(m.get_ref()) => Some(*m.get_ref() as usize),
            Some(m) => {
                return Err(src.error_at(
                    &m.span(),
                    format!("upstream {:?}: max_conns must be 1..=1000000, got {}", name.get_ref(), m.get_ref()),
                ))
            }
        };
        out.push(Upstream::new(name.into_inner(), addrs, max_conns));
    }
    Ok(out)
}

/// A zone's `key`: one part or a list (composite).
pub(super) fn key_spec(
    src: &Source<'_>,
    key: &Spanned<schema::OneOrMany>,
    what: &str,
    zone: &str,
) -> Result<KeySpec, ConfigError> {
    let items = key.get_ref().items();
    if items.is_empty() {
        return Err(src.error_at(&key.span(), format!("{what} {zone:?}: key must not be empty")));
    }
    let parts = items
        .iter()
        .map(|k| KeyPart::parse(k).map_err(|e| src.error_at(&key.span(), format!("{what} {zone:?}: key: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(KeySpec(parts))
}

fn compile_routes(
    src: &Source<'_>,
    list: Vec<Spanned<schema::Route>>,
    upstreams: &[Upstream],
    zones: &[Zone],
    conn_zones: &[ConnZone],
) -> Result<(Vec<Route>, Vec<RouteMatcher>), ConfigError> {
    let mut seen = HashMap::new();
    let mut routes = Vec::new();
    let mut matchers = Vec::new();
    for route in list {
        let route_span = route.span();
        let schema::Route {
            name,
            path,
            path_prefix,
            path_regex,
            host,
            methods,
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
            allow,
            deny,
        } = route.into_inner();
        check_name(src, &name, "route.name")?;
        unique(src, &mut seen, &name, "route")?;
        let rname = name.get_ref().clone();
        let here = |span: &std::ops::Range<usize>, msg: String| src.error_at(span, format!("route {rname:?}: {msg}"));

        let path = match (path, path_prefix, path_regex) {
            (Some(p), None, None) => PathMatch::Exact(checked_path(p, &here)?),
            (None, Some(p), None) => PathMatch::Prefix(checked_path(p, &here)?),
            (None, None, Some(r)) => PathMatch::Regex(
                Regex::new(r.get_ref()).map_err(|e| here(&r.span(), format!("path_regex: invalid regex: {e}")))?,
            ),
            _ => return Err(here(&route_span, "give exactly one of path, path_prefix or path_regex".into())),
        };
        let host = host
            .map(|h| {
                let valid = !h.get_ref().is_empty()
                    && h.get_ref().bytes().all(|b| b.is_ascii_alphanumeric() || b"-.*:[]".contains(&b));
                if valid {
                    Ok(HostMatch::parse(h.get_ref()))
                } else {
                    Err(here(&h.span(), format!("host: {:?} is not a host name", h.get_ref())))
                }
            })
            .transpose()?;
        let methods = methods
            .map(|list| {
                list.iter()
                    .map(|m| {
                        Method::from_bytes(m.get_ref().to_ascii_uppercase().as_bytes())
                            .map_err(|_| here(&m.span(), format!("methods: {:?} is not an HTTP method", m.get_ref())))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        let upstream_index = upstreams.iter().position(|u| u.name == *upstream.get_ref()).ok_or_else(|| {
            let known: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
            here(
                &upstream.span(),
                format!("upstream: unknown upstream {:?} (defined: {})", upstream.get_ref(), list_or_none(&known)),
            )
        })?;

        let mut limits: Vec<ZoneLimit> = Vec::new();
        for reference in &limit_req {
            let mut zl = compile_limit_ref(reference.get_ref(), zones, &here)?;
            zl.dry_run |= dry_run;
            if limits.iter().any(|l| l.zone == zl.zone) {
                return Err(here(
                    &reference.get_ref().zone.span(),
                    format!("limit_req: zone {:?} is referenced twice", reference.get_ref().zone.get_ref()),
                ));
            }
            limits.push(zl);
        }
        let status = conn::status(limit_req_status.as_ref(), 429, "limit_req_status", &here)?;
        let headers = match rate_limit_headers.as_ref().map(|h| h.get_ref().as_str()) {
            None | Some("draft") => HeaderMode::Draft,
            Some("legacy") => HeaderMode::Legacy,
            Some("none") => HeaderMode::None,
            Some(other) => {
                let span = rate_limit_headers.as_ref().map(|h| h.span()).unwrap_or_default();
                return Err(here(
                    &span,
                    format!("rate_limit_headers: expected \"draft\", \"legacy\" or \"none\", got {other:?}"),
                ));
            }
        };
        let on_error = on_error
            .map(|p| {
                FailurePolicy::parse(p.get_ref()).ok_or_else(|| {
                    here(
                        &p.span(),
                        format!("on_error: expected \"allow\", \"deny\" or \"local\", got {:?}", p.get_ref()),
                    )
                })
            })
            .transpose()?;
        let conn_limits = conn::compile_conn_refs(&limit_conn, conn_zones, dry_run, &here)?;
        let conn_status = conn::status(limit_conn_status.as_ref(), 503, "limit_conn_status", &here)?;
        let access = conn::access_rules(&allow, &deny, &here)?;
        let cost = compile_cost(cost.as_ref(), cost_header.as_ref(), max_cost.as_ref(), &here)?;
        routes.push(Route {
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
        });
        matchers.push(RouteMatcher { path, host, methods });
    }
    Ok((routes, matchers))
}

fn compile_limit_ref(
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
    let in_range = |v: &Spanned<i64>, field: &str| {
        if (0..=MAX_BURST).contains(v.get_ref()) {
            Ok(*v.get_ref() as u64)
        } else {
            Err(here(&v.span(), format!("limit_req: {field} must be 0..={MAX_BURST}, got {}", v.get_ref())))
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
    Ok(ZoneLimit { zone, limit: LimitReq { algorithm, rate: zones[zone].rate, burst, delay }, dry_run: r.dry_run })
}

fn compile_cost(
    cost: Option<&Spanned<i64>>,
    header: Option<&Spanned<String>>,
    max: Option<&Spanned<i64>>,
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
    Ok(Cost { default, header, max })
}

fn checked_path(
    p: Spanned<String>,
    here: &dyn Fn(&std::ops::Range<usize>, String) -> ConfigError,
) -> Result<String, ConfigError> {
    if p.get_ref().starts_with('/') {
        Ok(p.into_inner())
    } else {
        Err(here(&p.span(), format!("path must start with '/', got {:?}", p.get_ref())))
    }
}

/// Names appear in headers, Redis keys, logs and metric labels: keep them plain.
pub(super) fn check_name(src: &Source<'_>, name: &Spanned<String>, field: &str) -> Result<(), ConfigError> {
    let n = name.get_ref();
    let ok = !n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(src.error_at(&name.span(), format!("{field}: {n:?} must be 1-64 characters of A-Z a-z 0-9 _ - .")))
    }
}

pub(super) fn unique(
    src: &Source<'_>,
    seen: &mut HashMap<String, usize>,
    name: &Spanned<String>,
    what: &str,
) -> Result<(), ConfigError> {
    let line = src.line_of(&name.span());
    match seen.insert(name.get_ref().clone(), line) {
        Some(first) => Err(src.error_at(
            &name.span(),
            format!("duplicate {what} name {:?} (first defined on line {first})", name.get_ref()),
        )),
        None => Ok(()),
    }
}

fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// `"25ms"`, `"1s"`, `"500us"`, `"2m"`, `"1h"`: a number and a unit.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    match unit {
        "us" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        "h" => Some(Duration::from_secs(n.checked_mul(3600)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
