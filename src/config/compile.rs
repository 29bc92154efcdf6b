//! Validation and compilation of the TOML front-end into the runtime model. Every reference is
//! resolved to an index, every address parsed and every regex compiled here, once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::spanned::Spanned;
use http::header::HeaderName;

use super::checks::{parse_cidr, parse_duration};
use super::error::{ConfigError, Source};
use super::interpolate;
use super::limit_conn::{self, ConnZone};
use super::limit_req::OverrideMatch;
use super::limit_req::{self, Zone};
use super::outside::Outside;
use super::rls;
use super::route::{self, Route};
use super::schema;
use super::secrets::{Secret, Secrets};
use super::store::{self, StoreSettings};
use super::traces::TraceSettings;
use super::upstream;
use crate::buffering::ResponseBuffering;
use crate::keys::jwt::Verifier;
use crate::keys::{KeyPart, RealIp};
use crate::metrics::Meters;
use crate::request::method::MethodOverride;
use crate::request::EncodedSlash;
use crate::routes::{RouteMatcher, RouteOrder};
use crate::tls::{CertEntry, MinTls};
use crate::upstream::Upstream;

/// Largest accepted `burst` and `delay`: far beyond any sane bucket, and small enough that the
/// bucket level stays an exact integer in a double (Lua) for every rate unit.
const MAX_THREADS: i64 = 1024;
/// The longest client timeout (`header_timeout`, `body_timeout`, `send_timeout`,
/// `keepalive_timeout`): an hour without a byte is no longer a slow client.
const MAX_CLIENT_TIMEOUT: Duration = Duration::from_secs(3600);
/// The largest `max_header_size`: 1 MiB of request line and headers (nginx's default is 8 KiB
/// per line, 32 KiB in all).
const MAX_HEADER_SIZE: i64 = 1024 * 1024;
/// The largest `max_connections` and `max_connections_per_ip`: beyond any file-descriptor limit.
const MAX_CONNECTIONS: i64 = 10_000_000;
/// The largest `h2_max_streams` (nginx's `http2_max_concurrent_streams` defaults to 128).
const MAX_H2_STREAMS: i64 = 1000;
/// Pingora's default stream cap (`default_h2_options`), kept when the config sets none.
pub const DEFAULT_H2_MAX_STREAMS: u32 = 100;

/// The compiled, immutable configuration one request reads from start to end.
#[derive(Debug)]
pub struct Runtime {
    pub server: ServerSettings,
    pub store: StoreSettings,
    pub real_ip: Option<RealIp>,
    /// `[jwt]`: the keys bearer tokens are verified with, for `jwt:` key parts.
    pub jwt: Option<Verifier>,
    pub upstreams: Vec<Upstream>,
    pub zones: Vec<Zone>,
    pub conn_zones: Vec<ConnZone>,
    pub routes: Vec<Route>,
    /// `matchers[i]` matches `routes[i]`.
    pub matchers: Vec<RouteMatcher>,
    /// How `matchers` pick a request's route (`route_order`).
    pub route_order: RouteOrder,
    pub log: LogSettings,
    /// `[top]`: the per-zone tables of the hottest keys.
    pub top: super::top::TopSettings,
    /// The `[[server.tls]]` pairs, loaded and checked (empty without TLS listeners).
    pub tls_certs: Vec<CertEntry>,
    /// Things to fix that do not stop the config (certificates close to expiry), `file:line: …`.
    pub warnings: Vec<String>,
    /// The request path's metric handles for these routes and zones.
    pub meters: Meters,
    /// Where the secret settings came from (files, `${NAME}`), never their values.
    pub secrets: Secrets,
    /// `[tracing]`: OpenTelemetry traces; `None`: off.
    pub tracing: Option<TraceSettings>,
    /// Envoy's rate limit service (`[rls]`), when configured.
    pub rls: Option<super::rls::RlsSettings>,
}

impl Runtime {
    /// The `max_keys` of the limit_req or limit_conn zone `name` (the default for a zone the
    /// config does not have, e.g. one a reload removed while a request still uses it).
    pub fn zone_max_keys(&self, name: &str) -> usize {
        self.zones
            .iter()
            .find(|z| z.name == name)
            .map(|z| z.max_keys)
            .or_else(|| self.conn_zones.iter().find(|z| z.name == name).map(|z| z.max_keys))
            .unwrap_or(crate::store::DEFAULT_MAX_KEYS)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    pub listen: Vec<SocketAddr>,
    /// Listeners that speak TLS, with the certificates of `Runtime::tls_certs`.
    pub listen_tls: Vec<SocketAddr>,
    pub min_tls: MinTls,
    /// ALPN offers `h2` on the TLS listeners.
    pub http2: bool,
    /// Cleartext HTTP/2 (prior knowledge) on the `listen` addresses.
    pub h2c: bool,
    pub threads: usize,
    /// Tasks may move between threads (Pingora's `work_stealing`); on by default.
    pub work_stealing: bool,
    /// The admin listener (`/config`, `/reload`, `/metrics`, …); off when absent.
    pub admin: Option<SocketAddr>,
    /// When set, admin requests other than `/healthz` and `/readyz` need `Authorization: Bearer <token>`.
    pub admin_token: Option<Secret>,
    /// Limits on what one client connection may hold; read per connection and request, so a
    /// reload changes them for new connections.
    pub clients: ClientLimits,
}

/// Timeouts and caps on every client-facing resource (nginx's `client_header_timeout`,
/// `client_body_timeout`, `send_timeout`, `keepalive_timeout`, `large_client_header_buffers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientLimits {
    /// From a connection's start, or a request's first byte, until its whole head is read.
    pub header_timeout: Duration,
    /// Between two reads of a request body.
    pub body_timeout: Duration,
    /// Between two writes to the client.
    pub send_timeout: Duration,
    /// How long an idle keep-alive connection waits for its next request.
    pub keepalive_timeout: Duration,
    /// Bytes of request line and headers.
    pub max_header_size: usize,
    /// Open client connections per instance; `None`: derived from the file-descriptor limit.
    pub max_connections: Option<usize>,
    /// Open client connections per peer address; `None`: no per-address cap.
    pub max_connections_per_ip: Option<usize>,
    /// Concurrent streams per HTTP/2 connection, advertised as `SETTINGS_MAX_CONCURRENT_STREAMS`.
    /// Each stream in flight beyond a connection's first also takes a place under the two caps
    /// above (see `edge::streams`).
    pub h2_max_streams: u32,
    pub encoded_slashes: EncodedSlash,
    /// Header names with `_` (nginx's `underscores_in_headers off`: dropped).
    pub underscores_in_headers: UnderscoreHeaders,
    /// `X-HTTP-Method-Override` and its kin (see `request::method`).
    pub method_override: MethodOverride,
    /// Set `X-Forwarded-For` / `X-Real-IP` for the upstream (see `request::forwarded`).
    pub forwarded_headers: bool,
    /// `[server.response_buffering]`: what each HTTP/1 connection may take ahead of its client.
    pub response_buffering: Arc<ResponseBuffering>,
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(75),
            max_header_size: 64 * 1024,
            max_connections: None,
            max_connections_per_ip: None,
            h2_max_streams: DEFAULT_H2_MAX_STREAMS,
            encoded_slashes: EncodedSlash::Reject,
            underscores_in_headers: UnderscoreHeaders::Drop,
            method_override: MethodOverride::Strip,
            forwarded_headers: true,
            response_buffering: Arc::new(ResponseBuffering::default()),
        }
    }
}

/// What becomes of a request header whose name has an `_`: upstreams behind CGI/WSGI (Werkzeug,
/// PHP) read `X_Api_Key` as `X-Api-Key`, so passing it on would let a client send a key that Weir
/// never read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnderscoreHeaders {
    /// Removed before anything is decided or forwarded (nginx's default).
    Drop,
    /// 400.
    Reject,
}

/// Logging: read at start-up (`RUST_LOG` overrides the level); the access log switch is live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    pub level: String,
    pub json: bool,
    pub access_log: bool,
    /// `access_log_buffer` / `access_log_flush`; `None`: every access line written at once.
    pub access_buffer: Option<AccessBuffer>,
}

/// `[log] access_log_buffer` and `access_log_flush` (nginx's `access_log … buffer= flush=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessBuffer {
    /// Bytes of access lines a thread gathers before one write.
    pub size: usize,
    /// The longest a buffered line waits.
    pub flush: Duration,
}

/// The largest `log.access_log_buffer`: a thread's lines are held in memory until written.
const MAX_ACCESS_BUFFER: i64 = 1024 * 1024;
/// The smallest: below a few lines a buffer saves little and a long line goes out alone anyway.
const MIN_ACCESS_BUFFER: i64 = 512;
/// The default `log.access_log_flush`.
const DEFAULT_ACCESS_FLUSH: Duration = Duration::from_secs(1);
/// The longest `log.access_log_flush`.
const MAX_ACCESS_FLUSH: Duration = Duration::from_secs(3600);

/// Compiles `text` after replacing its `${NAME}`s; errors never show a secret's value. The first
/// error of [`compile_all`].
pub fn compile(text: &str, file: &str, outside: &dyn Outside) -> Result<Runtime, ConfigError> {
    compile_all(text, file, outside).map_err(|mut errors| errors.remove(0))
}

/// Like [`compile`], with every error it finds (never none): each section is compiled even when
/// another failed, each zone, upstream and route even when another one failed (`each`), and
/// every value of the wrong shape is reported (`report::schema_errors`). Only what depends on a
/// failed part is skipped: a route naming a broken zone or upstream (its error would repeat
/// theirs), routes after a failed `[defaults]` or `route_order`, `[rls]` after any failed zone.
pub fn compile_all(text: &str, file: &str, outside: &dyn Outside) -> Result<Runtime, Vec<ConfigError>> {
    let src = Source { file, text, outside };
    let interpolated = interpolate::expand(&src)?;
    let mut secrets = Secrets::new(interpolated.uses.clone());
    match compile_expanded(&interpolated.text, file, outside, &mut secrets) {
        Ok(mut runtime) => {
            // Warnings quote values too (a host, a path): hidden like in errors.
            for warning in &mut runtime.warnings {
                *warning = secrets.redact(&interpolated.redact(warning));
            }
            runtime.secrets = secrets;
            Ok(runtime)
        }
        Err(mut errors) => {
            for e in &mut errors {
                e.message = secrets.redact(&interpolated.redact(&e.message));
                let from_env: Vec<String> = interpolated
                    .origins
                    .iter()
                    .filter(|(span, _)| Some(src.line_of(span)) == e.line)
                    .flat_map(|(_, variables)| variables.iter().cloned())
                    .collect();
                e.message = super::report::name_variables(&e.message, &from_env);
            }
            errors.dedup();
            Err(errors)
        }
    }
}

/// The value of an `Ok`, or `fallback` with the error kept in `errors`.
fn or_keep<T>(errors: &mut Vec<ConfigError>, result: Result<T, ConfigError>, fallback: T) -> T {
    result.unwrap_or_else(|e| {
        errors.push(e);
        fallback
    })
}

/// `Some` of an `Ok`; an error is kept in `errors`.
fn keep<T>(errors: &mut Vec<ConfigError>, result: Result<T, ConfigError>) -> Option<T> {
    result.map_err(|e| errors.push(e)).ok()
}

fn compile_expanded(
    text: &str,
    file: &str,
    outside: &dyn Outside,
    secrets: &mut Secrets,
) -> Result<Runtime, Vec<ConfigError>> {
    let src = Source { file, text, outside };
    let parsed: schema::File = match toml::from_str(text) {
        Ok(parsed) => parsed,
        Err(e) => {
            // A value of the wrong shape: serde stops at the first, the schema finds them all.
            let schema = super::report::schema_errors(&src);
            if !schema.is_empty() {
                return Err(schema);
            }
            return Err(vec![match e.span() {
                Some(span) => src.error_at(&span, e.message().trim_end()),
                None => src.error(e.message().trim_end()),
            }]);
        }
    };
    let schema::File {
        server,
        store,
        real_ip,
        upstream,
        limit_req_zone,
        limit_conn_zone,
        route,
        log,
        jwt,
        tracing,
        top,
        rls,
        route_order,
        defaults,
        host_defaults,
    } = parsed;
    let mut route = route;

    let mut errors = Vec::new();
    // A process may serve the rate limit service alone: then `[server]` and its listeners are optional.
    let rls_only = rls.is_some() && route.is_empty();
    let rls_tls = rls.as_ref().is_some_and(|r| r.get_ref().listen_tls.is_some());
    let server = server.unwrap_or_else(|| Spanned::new(0..0, schema::Server::default()));
    let server = compile_server(&src, server, secrets, rls_only, rls_tls).map_err(|e| errors.extend(e)).ok();
    let mut warnings = Vec::new();
    let store = keep(&mut errors, store::compile_store(&src, store, secrets));
    let real_ip = keep(&mut errors, real_ip.map(|r| compile_real_ip(&src, r)).transpose());
    // The list sections are compiled item by item: an error in one zone, upstream or route
    // leaves the others to be checked (`each`), and the checks across sections read what compiled.
    let mut upstreams = upstream::compile_upstreams(&src, upstream, &mut warnings);
    errors.append(&mut upstreams.errors);
    let mut zones = limit_req::compile_zones(&src, limit_req_zone);
    let zones_whole = zones.errors.is_empty();
    errors.append(&mut zones.errors);
    let mut conn_zones = limit_conn::compile_conn_zones(&src, limit_conn_zone, &zones.items);
    errors.append(&mut conn_zones.errors);
    let route_order = keep(&mut errors, compile_route_order(&src, route_order.as_ref()));
    let inherited = keep(&mut errors, super::defaults::apply(&src, defaults, host_defaults, &mut route));
    let routes: Option<(Vec<Route>, Vec<RouteMatcher>)> = match (route_order, inherited) {
        (Some(o), Some(())) => {
            let mut each = route::compile_routes(&src, route, &upstreams, &zones, &conn_zones, o, &mut warnings);
            errors.append(&mut each.errors);
            Some(each.items.into_iter().unzip())
        }
        _ => None,
    };
    if let Some((routes, _)) = &routes {
        keep(&mut errors, keyless_zones_only_in_rls(&src, routes, &zones.items));
    }
    // `[rls]` names zones as routes do, but not item by item: it waits for every zone.
    let rls = if zones_whole { keep(&mut errors, rls::compile_rls(&src, rls, &zones.items)) } else { None };
    if let Some(open) =
        rls.as_ref().and_then(|r| r.as_ref()).and_then(|r| r.listen.iter().find(|a| !a.ip().is_loopback()))
    {
        warnings.push(format!(
            "{}: rls.listen: {open} is reachable from the network, and the rate limit service protocol has no \
             authentication: anyone who reaches it can spend (or probe) any key's budget. Listen on 127.0.0.1 behind a \
             sidecar (Envoy, a mesh) that checks client certificates, or use rls.listen_tls (encrypted; it does not \
             check clients) with a network policy that admits only the proxies that ask",
            src.file
        ));
    }
    let no_certs = server.as_ref().is_some_and(|(_, certs, _)| certs.is_empty());
    if rls.as_ref().is_some_and(|r| r.as_ref().is_some_and(|r| !r.listen_tls.is_empty())) && no_certs {
        errors.push(src.error("rls.listen_tls: give the certificates as [[server.tls]] cert and key"));
    }
    let log = keep(&mut errors, compile_log(&src, log));
    let jwt = keep(&mut errors, super::jwt::compile_jwt(&src, jwt, &mut warnings));
    if let (Some(jwt), Some((routes, matchers))) = (&jwt, &routes) {
        let (zones, conn_zones) = (&zones.items, &conn_zones.items);
        keep(&mut errors, super::jwt::key_parts_resolve(&src, jwt.as_ref(), zones, conn_zones, routes, matchers));
    }
    if let Some((routes, _)) = &routes {
        keep(&mut errors, no_underscored_header_is_read(&src, &zones.items, &conn_zones.items, routes));
    }
    let tracing = keep(&mut errors, super::traces::compile_tracing(&src, tracing));
    let top = keep(&mut errors, super::top::compile_top(&src, top));
    let (
        Some((server, tls_certs, server_warnings)),
        Some(store),
        Some(real_ip),
        Some((routes, matchers)),
        Some(rls),
        Some(log),
        Some(jwt),
        Some(tracing),
        Some(top),
        Some(route_order),
    ) = (server, store, real_ip, routes, rls, log, jwt, tracing, top, route_order)
    else {
        return Err(errors);
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut warnings: Vec<String> = server_warnings.into_iter().chain(warnings).collect();
    // Secret files anyone on the machine may read (found while reading them, above).
    warnings.append(&mut secrets.warnings);
    let (upstreams, zones, conn_zones) = (upstreams.items, zones.items, conn_zones.items);
    let meters = Meters::new(
        routes.iter().map(|r| r.name.as_str()),
        zones.iter().map(|z| z.name.as_str()),
        conn_zones.iter().map(|z| z.name.as_str()),
    );
    let runtime = Runtime {
        server,
        store,
        real_ip,
        jwt,
        upstreams,
        zones,
        conn_zones,
        routes,
        matchers,
        route_order,
        log,
        top,
        tls_certs,
        warnings,
        meters,
        secrets: Secrets::default(),
        tracing,
        rls,
    };
    super::lease::references_lease(&src, &runtime).map_err(|e| vec![e])?;
    Ok(runtime)
}

/// A zone without `key` is keyed by `[rls]` descriptors; an HTTP route has no key to give it.
fn keyless_zones_only_in_rls(src: &Source<'_>, routes: &[Route], zones: &[Zone]) -> Result<(), ConfigError> {
    for route in routes {
        if let Some(zl) = route.limits.iter().find(|zl| zones[zl.zone].key.parts.is_empty()) {
            return Err(src.error(format!(
                "route {:?}: limit_req zone {:?} has no key; give the zone a key (e.g. key = \"ip\") to use it in a route",
                route.name, zones[zl.zone].name
            )));
        }
    }
    Ok(())
}

/// Request headers whose names hold `_` never reach a decision (they are dropped or refused, see
/// `UnderscoreHeaders`), so a key, override or cost read from one would always be empty: refused.
fn no_underscored_header_is_read(
    src: &Source<'_>,
    zones: &[Zone],
    conn_zones: &[ConnZone],
    routes: &[Route],
) -> Result<(), ConfigError> {
    let header_of = |part: &KeyPart| match part {
        KeyPart::Header(name) => Some(name.clone()),
        _ => None,
    };
    let rate = zones.iter().flat_map(|z| {
        let overrides = z.overrides.iter().filter_map(|o| match &o.matcher {
            OverrideMatch::Part(part, _) => header_of(part),
            _ => None,
        });
        z.key.parts.iter().filter_map(header_of).chain(overrides).map(move |h| (format!("zone {:?}", z.name), h))
    });
    let conn = conn_zones.iter().flat_map(|z| {
        z.key.parts.iter().filter_map(header_of).map(move |h| (format!("limit_conn_zone {:?}", z.name), h))
    });
    let cost =
        routes.iter().filter_map(|r| r.cost.header.clone().map(|h| (format!("route {:?}: cost_header", r.name), h)));
    for (what, header) in rate.chain(conn).chain(cost) {
        if header.as_str().contains('_') {
            return Err(src.error(format!(
                "{what}: header {header} has an underscore in its name; such headers are dropped or refused \
                 (server.underscores_in_headers), so it would always be empty: write it with '-'"
            )));
        }
    }
    Ok(())
}

fn compile_log(src: &Source<'_>, log: Option<Spanned<schema::Log>>) -> Result<LogSettings, ConfigError> {
    let defaults = LogSettings { level: "info".to_string(), json: false, access_log: true, access_buffer: None };
    let Some(log) = log else { return Ok(defaults) };
    let schema::Log { level, format, access_log, access_log_buffer, access_log_flush } = log.into_inner();
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
    let access_buffer = compile_access_buffer(src, access_log_buffer, access_log_flush)?;
    Ok(LogSettings { level, json, access_log: access_log.unwrap_or(defaults.access_log), access_buffer })
}

/// `log.access_log_buffer` (bytes; 0: off) and `log.access_log_flush` (only with a buffer).
fn compile_access_buffer(
    src: &Source<'_>,
    size: Option<Spanned<i64>>,
    flush: Option<Spanned<String>>,
) -> Result<Option<AccessBuffer>, ConfigError> {
    let size = match size {
        None => None,
        Some(s) if *s.get_ref() == 0 => None,
        Some(s) if (MIN_ACCESS_BUFFER..=MAX_ACCESS_BUFFER).contains(s.get_ref()) => Some(*s.get_ref() as usize),
        Some(s) => {
            return Err(src.error_at(
                &s.span(),
                format!(
                    "log.access_log_buffer: bytes, 0 (off) or {MIN_ACCESS_BUFFER}..={MAX_ACCESS_BUFFER} \
                     (e.g. 65536), got {}",
                    s.get_ref()
                ),
            ))
        }
    };
    let flush = match flush {
        None => DEFAULT_ACCESS_FLUSH,
        Some(f) if size.is_none() => {
            return Err(src.error_at(
                &f.span(),
                "log.access_log_flush: only with log.access_log_buffer (lines are written at once without one)",
            ))
        }
        Some(f) => match parse_duration(f.get_ref()) {
            Some(d) if !d.is_zero() && d <= MAX_ACCESS_FLUSH => d,
            _ => {
                return Err(src.error_at(
                    &f.span(),
                    format!("log.access_log_flush: {:?} is not a duration from \"1ms\" to \"1h\"", f.get_ref()),
                ))
            }
        },
    };
    Ok(size.map(|size| AccessBuffer { size, flush }))
}

type ServerParts = (ServerSettings, Vec<CertEntry>, Vec<String>);

fn compile_server(
    src: &Source<'_>,
    server: Spanned<schema::Server>,
    secrets: &mut Secrets,
    rls_only: bool,
    rls_tls: bool,
) -> Result<ServerParts, Vec<ConfigError>> {
    // Each setting is checked even when another failed: `weir check` reports them all.
    let mut errors = Vec::new();
    let server_span = server.span();
    let schema::Server {
        listen,
        listen_tls,
        tls,
        min_tls,
        http2,
        h2c,
        threads,
        work_stealing,
        admin,
        admin_token,
        admin_token_file,
        admin_insecure,
        header_timeout,
        body_timeout,
        send_timeout,
        keepalive_timeout,
        max_header_size,
        max_connections,
        max_connections_per_ip,
        h2_max_streams,
        encoded_slashes,
        underscores_in_headers,
        method_override,
        forwarded_headers,
        response_buffering,
    } = server.into_inner();
    let tls = keep(&mut errors, super::tls::compile_tls(src, listen_tls, tls, min_tls, http2, rls_tls));
    let listen_span = listen.as_ref().map_or(server_span, |l| l.span());
    let listen = listen.map(Spanned::into_inner).unwrap_or_default();
    if listen.is_empty() && tls.as_ref().is_some_and(|t| t.listen_tls.is_empty()) && !rls_only {
        errors.push(src.error_at(
            &listen_span,
            "server.listen: give at least one address, e.g. [\"127.0.0.1:8080\"] (or server.listen_tls)",
        ));
    }
    let mut addrs = Vec::new();
    for addr in listen {
        match addr.get_ref().parse::<SocketAddr>() {
            Ok(parsed) => addrs.push(parsed),
            Err(_) => errors.push(
                src.error_at(&addr.span(), format!("server.listen: {:?} is not an IP:port address", addr.get_ref())),
            ),
        }
    }
    let threads = match threads {
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        Some(t) if (1..=MAX_THREADS).contains(t.get_ref()) => *t.get_ref() as usize,
        Some(t) => {
            errors.push(
                src.error_at(&t.span(), format!("server.threads: must be 1..={MAX_THREADS}, got {}", t.get_ref())),
            );
            1
        }
    };
    let admin_given = admin.is_some();
    let admin = admin.and_then(|a| match a.get_ref().parse::<SocketAddr>() {
        Ok(addr) => Some(addr),
        Err(_) => {
            errors.push(src.error_at(&a.span(), format!("server.admin: {:?} is not an IP:port address", a.get_ref())));
            None
        }
    });
    let token = secrets.value_or_file(src, "server.admin_token", admin_token, admin_token_file);
    // A token given but refused is not "no token": the checks below would only repeat it.
    let token_given = !matches!(token, Ok(None));
    let admin_token = match keep(&mut errors, token).flatten() {
        Some(t) if t.get_ref().len() < 16 || t.get_ref().bytes().any(|b| !b.is_ascii_graphic()) => {
            errors.push(
                src.error_at(&t.span(), "server.admin_token: use at least 16 printable characters without spaces"),
            );
            None
        }
        t => t.map(|t| Secret::new(t.into_inner())),
    };
    if token_given && !admin_given {
        errors.push(src.error("server.admin_token: set server.admin too, or remove the token"));
    }
    if let Some(addr) = admin {
        if !addr.ip().is_loopback() && !token_given && admin_insecure != Some(true) {
            errors.push(src.error(format!(
                "server.admin: {addr} is reachable from the network, and /reload, /limits and /metrics would be open \
                 to it: set server.admin_token, listen on 127.0.0.1, or set server.admin_insecure = true"
            )));
        }
    }
    let defaults = ClientLimits::default();
    let duration =
        |value: Option<Spanned<String>>, field: &str, default: Duration| match value {
            None => Ok(default),
            Some(v) => match parse_duration(v.get_ref()) {
                Some(d) if d > MAX_CLIENT_TIMEOUT => Err(src.error_at(
                    &v.span(),
                    format!("server.{field}: {:?} is too long: the most is 1h (\"3600s\")", v.get_ref()),
                )),
                Some(d) if !d.is_zero() => Ok(d),
                _ => Err(src
                    .error_at(&v.span(), format!("server.{field}: {:?} is not a duration like \"10s\"", v.get_ref()))),
            },
        };
    let count = |value: Option<Spanned<i64>>, field: &str, (min, max): (i64, i64)| match value {
        None => Ok(None),
        Some(v) if (min..=max).contains(v.get_ref()) => Ok(Some(*v.get_ref() as usize)),
        Some(v) => Err(src.error_at(&v.span(), format!("server.{field}: must be {min}..={max}, got {}", v.get_ref()))),
    };
    // A setting spelled as one of a few words.
    fn choice<T: Copy>(
        src: &Source<'_>,
        value: Option<Spanned<String>>,
        field: &str,
        default: T,
        words: &[(&str, T)],
    ) -> Result<T, ConfigError> {
        let Some(value) = value else { return Ok(default) };
        if let Some((_, chosen)) = words.iter().find(|(word, _)| word == value.get_ref()) {
            return Ok(*chosen);
        }
        let expected: Vec<String> = words.iter().map(|(word, _)| format!("{word:?}")).collect();
        let detail = format!("server.{field}: expected {}, got {:?}", expected.join(" or "), value.get_ref());
        Err(src.error_at(&value.span(), detail))
    }
    let slashes = [("reject", EncodedSlash::Reject), ("keep", EncodedSlash::Keep), ("decode", EncodedSlash::Decode)];
    let encoded_slashes = or_keep(
        &mut errors,
        choice(src, encoded_slashes, "encoded_slashes", defaults.encoded_slashes, &slashes),
        defaults.encoded_slashes,
    );
    let underscores = [("drop", UnderscoreHeaders::Drop), ("reject", UnderscoreHeaders::Reject)];
    let underscores_in_headers = or_keep(
        &mut errors,
        choice(src, underscores_in_headers, "underscores_in_headers", defaults.underscores_in_headers, &underscores),
        defaults.underscores_in_headers,
    );
    let overrides = [
        ("strip", MethodOverride::Strip),
        ("honour", MethodOverride::Honour),
        ("honor", MethodOverride::Honour),
        ("reject", MethodOverride::Reject),
    ];
    let method_override = or_keep(
        &mut errors,
        choice(src, method_override, "method_override", defaults.method_override, &overrides),
        defaults.method_override,
    );
    let clients = ClientLimits {
        header_timeout: or_keep(
            &mut errors,
            duration(header_timeout, "header_timeout", defaults.header_timeout),
            defaults.header_timeout,
        ),
        body_timeout: or_keep(
            &mut errors,
            duration(body_timeout, "body_timeout", defaults.body_timeout),
            defaults.body_timeout,
        ),
        send_timeout: or_keep(
            &mut errors,
            duration(send_timeout, "send_timeout", defaults.send_timeout),
            defaults.send_timeout,
        ),
        keepalive_timeout: or_keep(
            &mut errors,
            duration(keepalive_timeout, "keepalive_timeout", defaults.keepalive_timeout),
            defaults.keepalive_timeout,
        ),
        max_header_size: or_keep(&mut errors, count(max_header_size, "max_header_size", (1024, MAX_HEADER_SIZE)), None)
            .unwrap_or(defaults.max_header_size),
        max_connections: or_keep(&mut errors, count(max_connections, "max_connections", (1, MAX_CONNECTIONS)), None),
        max_connections_per_ip: or_keep(
            &mut errors,
            count(max_connections_per_ip, "max_connections_per_ip", (1, MAX_CONNECTIONS)),
            None,
        ),
        h2_max_streams: or_keep(&mut errors, count(h2_max_streams, "h2_max_streams", (1, MAX_H2_STREAMS)), None)
            .map_or(defaults.h2_max_streams, |n| n as u32),
        encoded_slashes,
        underscores_in_headers,
        method_override,
        forwarded_headers: forwarded_headers.unwrap_or(defaults.forwarded_headers),
        response_buffering: match super::buffering::compile_buffering(src, response_buffering) {
            Ok(settings) => Arc::new(settings),
            Err(e) => {
                errors.extend(e);
                defaults.response_buffering.clone()
            }
        },
    };
    let Some(tls) = tls else { return Err(errors) };
    if let Some(dup) = addrs.iter().find(|a| tls.listen_tls.contains(a)) {
        errors.push(
            src.error_at(
                &listen_span,
                format!("server.listen: {dup} is in listen_tls too; give each address one role"),
            ),
        );
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let settings = ServerSettings {
        listen: addrs,
        listen_tls: tls.listen_tls,
        min_tls: tls.min_tls,
        http2: tls.http2,
        h2c: h2c.unwrap_or(false),
        threads,
        work_stealing: work_stealing.unwrap_or(true),
        admin,
        admin_token,
        clients,
    };
    Ok((settings, tls.certs, tls.warnings))
}

fn compile_real_ip(src: &Source<'_>, real_ip: Spanned<schema::RealIp>) -> Result<RealIp, ConfigError> {
    let schema::RealIp { trusted, header, recursive } = real_ip.into_inner();
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
    Ok(RealIp { trusted, header, recursive: recursive.unwrap_or(true) })
}

#[cfg(test)]
mod tests;

/// `route_order`: "specific" (the default) or "nginx".
fn compile_route_order(src: &Source<'_>, value: Option<&Spanned<String>>) -> Result<RouteOrder, ConfigError> {
    match value.map(|v| v.get_ref().as_str()) {
        None | Some("specific") => Ok(RouteOrder::Specific),
        Some("nginx") => Ok(RouteOrder::Nginx),
        Some(other) => Err(src.error_at(
            &value.map(|v| v.span()).unwrap_or_default(),
            format!("route_order: expected \"specific\" or \"nginx\", got {other:?}"),
        )),
    }
}
