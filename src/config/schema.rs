//! The TOML front-end: serde structs that mirror `conf/routes.toml` field for field. Values that
//! later checks may reject are `Spanned`, so errors can name their line. Nothing here is used at
//! request time: `compile` turns it into the runtime model.

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// Optional only for a process that serves the rate limit service alone (`[rls]`).
    pub server: Option<Spanned<Server>>,
    #[serde(default)]
    pub store: Option<Spanned<Store>>,
    #[serde(default)]
    pub real_ip: Option<Spanned<RealIp>>,
    #[serde(default)]
    pub upstream: Vec<Spanned<Upstream>>,
    #[serde(default)]
    pub limit_req_zone: Vec<Spanned<LimitReqZone>>,
    #[serde(default)]
    pub limit_conn_zone: Vec<Spanned<LimitConnZone>>,
    #[serde(default)]
    pub route: Vec<Spanned<Route>>,
    #[serde(default)]
    pub log: Option<Spanned<Log>>,
    /// Envoy's rate limit service (src/rls/).
    pub rls: Option<Spanned<Rls>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Log {
    pub level: Option<Spanned<String>>,
    pub format: Option<Spanned<String>>,
    pub access_log: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    pub listen: Option<Spanned<Vec<Spanned<String>>>>,
    /// Addresses that speak TLS (HTTPS), with the certificates of `tls`.
    pub listen_tls: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub tls: Vec<Spanned<TlsCert>>,
    pub min_tls: Option<Spanned<String>>,
    /// Offer HTTP/2 through ALPN on the TLS listeners (default true).
    pub http2: Option<bool>,
    /// Cleartext HTTP/2 with prior knowledge on the `listen` addresses (default false).
    pub h2c: Option<bool>,
    pub threads: Option<Spanned<i64>>,
    /// Pingora's work stealing between the threads (default true; false: each thread runs its own
    /// runtime, and its Redis decisions stay on its own connection).
    pub work_stealing: Option<bool>,
    pub admin: Option<Spanned<String>>,
    pub admin_token: Option<Spanned<String>>,
    /// Allows a non-loopback admin address without a token.
    pub admin_insecure: Option<bool>,
    pub header_timeout: Option<Spanned<String>>,
    pub body_timeout: Option<Spanned<String>>,
    pub send_timeout: Option<Spanned<String>>,
    pub keepalive_timeout: Option<Spanned<String>>,
    pub max_header_size: Option<Spanned<i64>>,
    pub max_connections: Option<Spanned<i64>>,
    pub max_connections_per_ip: Option<Spanned<i64>>,
    pub encoded_slashes: Option<Spanned<String>>,
    pub forwarded_headers: Option<bool>,
}

/// One `[[server.tls]]` certificate: a PEM chain (leaf first) and its key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsCert {
    pub cert: Spanned<String>,
    pub key: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Store {
    pub kind: Spanned<String>,
    pub url: Option<Spanned<String>>,
    pub timeout: Option<Spanned<String>>,
    pub clock: Option<Spanned<String>>,
    pub key_prefix: Option<Spanned<String>>,
    pub on_error: Option<Spanned<String>>,
    pub fleet_size: Option<Spanned<i64>>,
    pub deny_cache_size: Option<Spanned<i64>>,
    pub circuit_breaker_failures: Option<Spanned<i64>>,
    pub lease_ttl: Option<Spanned<String>>,
    /// Decisions ready together share one script call on a connection per proxy thread.
    pub coalesce: Option<Spanned<bool>>,
    /// Redis Cluster nodes as a list, instead of one `redis+cluster://` URL.
    pub cluster: Option<Spanned<Vec<Spanned<String>>>>,
    /// `rediss://`: the CA that signed the servers' certificates (default: the system's and
    /// Mozilla's roots), and an optional client certificate and key (mutual TLS).
    pub tls_ca: Option<Spanned<String>>,
    pub tls_cert: Option<Spanned<String>>,
    pub tls_key: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RealIp {
    pub trusted: Vec<Spanned<String>>,
    pub header: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    pub name: Spanned<String>,
    /// `"host:port"`, optionally followed by `weight=N max_fails=N fail_timeout=T max_conns=N`.
    pub servers: Spanned<Vec<Spanned<String>>>,
    pub max_conns: Option<Spanned<i64>>,
    pub max_fails: Option<Spanned<i64>>,
    pub fail_timeout: Option<Spanned<String>>,
    pub connect_timeout: Option<Spanned<String>>,
    pub read_timeout: Option<Spanned<String>>,
    pub send_timeout: Option<Spanned<String>>,
    pub idle_timeout: Option<Spanned<String>>,
    pub keepalive: Option<Spanned<i64>>,
    pub tries: Option<Spanned<i64>>,
    pub next_upstream: Option<Spanned<Vec<Spanned<String>>>>,
    pub next_upstream_timeout: Option<Spanned<String>>,
    pub resolve_interval: Option<Spanned<String>>,
    pub resolver: Option<Spanned<String>>,
    pub health_check: Option<Spanned<HealthCheck>>,
    /// HTTPS to the servers, and its settings.
    pub tls: Option<Spanned<bool>>,
    pub sni: Option<Spanned<String>>,
    pub verify: Option<Spanned<bool>>,
    pub ca_file: Option<Spanned<String>>,
    pub client_cert: Option<Spanned<String>>,
    pub client_key: Option<Spanned<String>>,
    /// `"h1"`, `"h2"` (over TLS) or `"h2c"`.
    pub protocol: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    #[serde(rename = "type")]
    pub kind: Option<Spanned<String>>,
    pub path: Option<Spanned<String>>,
    pub host: Option<Spanned<String>>,
    pub status: Option<Spanned<String>>,
    pub interval: Option<Spanned<String>>,
    pub timeout: Option<Spanned<String>>,
    pub rise: Option<Spanned<i64>>,
    pub fall: Option<Spanned<i64>>,
    pub port: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitReqZone {
    pub name: Spanned<String>,
    /// Optional only for zones that `[rls]` descriptors alone use (their key is the descriptor's).
    pub key: Option<Spanned<OneOrMany>>,
    pub algorithm: Option<Spanned<String>>,
    pub rate: Option<Spanned<String>>,
    pub window: Option<Spanned<String>>,
    pub limit: Option<Spanned<i64>>,
    /// Keys the in-process store keeps for the zone (like the size of nginx's zone).
    pub max_keys: Option<Spanned<i64>>,
    #[serde(default, rename = "override")]
    pub overrides: Vec<Spanned<ZoneOverride>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneOverride {
    #[serde(rename = "match")]
    pub matches: Spanned<String>,
    pub rate: Option<Spanned<String>>,
    pub burst: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn items(&self) -> Vec<&str> {
        match self {
            OneOrMany::One(s) => vec![s.as_str()],
            OneOrMany::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub name: Spanned<String>,
    pub path: Option<Spanned<String>>,
    pub path_prefix: Option<Spanned<String>>,
    pub path_regex: Option<Spanned<String>>,
    pub host: Option<Spanned<String>>,
    pub methods: Option<Vec<Spanned<String>>>,
    pub upstream: Spanned<String>,
    #[serde(default)]
    pub limit_req: Vec<Spanned<LimitReqRef>>,
    pub limit_req_status: Option<Spanned<i64>>,
    #[serde(default)]
    pub dry_run: bool,
    pub rate_limit_headers: Option<Spanned<String>>,
    pub on_error: Option<Spanned<String>>,
    #[serde(default)]
    pub limit_conn: Vec<Spanned<LimitConnRef>>,
    pub limit_conn_status: Option<Spanned<i64>>,
    pub cost: Option<Spanned<i64>>,
    pub cost_header: Option<Spanned<String>>,
    pub max_cost: Option<Spanned<i64>>,
    pub min_cost: Option<Spanned<i64>>,
    #[serde(default)]
    pub allow: Vec<Spanned<String>>,
    #[serde(default)]
    pub deny: Vec<Spanned<String>>,
    /// Rejections of `application/grpc*` requests as gRPC statuses (default true).
    pub grpc_rejections: Option<bool>,
    /// The gRPC status of those rejections (default 8, RESOURCE_EXHAUSTED).
    pub grpc_status: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitConnRef {
    pub zone: Spanned<String>,
    pub max: Spanned<i64>,
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitConnZone {
    pub name: Spanned<String>,
    pub key: Spanned<OneOrMany>,
    pub max_keys: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitReqRef {
    pub zone: Spanned<String>,
    pub burst: Option<Spanned<i64>>,
    pub delay: Option<Spanned<i64>>,
    pub nodelay: Option<Spanned<bool>>,
    #[serde(default)]
    pub dry_run: bool,
}

/// `[rls]`: Envoy's rate limit service (`envoy.service.ratelimit.v3`) on the same zones.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rls {
    pub listen: Option<Spanned<Vec<Spanned<String>>>>,
    /// gRPC over TLS, with the certificates of `[[server.tls]]`.
    pub listen_tls: Option<Spanned<Vec<Spanned<String>>>>,
    /// Descriptors one request may carry.
    pub max_descriptors: Option<Spanned<i64>>,
    #[serde(default)]
    pub domain: Vec<Spanned<RlsDomain>>,
}

/// `[[rls.domain]]`: what one `domain` of the requests limits; compiled into a route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlsDomain {
    pub name: Spanned<String>,
    #[serde(default)]
    pub dry_run: bool,
    pub rate_limit_headers: Option<Spanned<String>>,
    pub on_error: Option<Spanned<String>>,
    #[serde(default)]
    pub descriptor: Vec<Spanned<RlsDescriptor>>,
}

/// `[[rls.domain.descriptor]]` (nested as `descriptor` inside one another): a rule for one entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlsDescriptor {
    pub key: Spanned<String>,
    pub value: Option<Spanned<String>>,
    pub zone: Option<Spanned<String>>,
    pub burst: Option<Spanned<i64>>,
    pub delay: Option<Spanned<i64>>,
    pub nodelay: Option<Spanned<bool>>,
    #[serde(default)]
    pub dry_run: bool,
    /// Matches and limits nothing (a value exempt from a key's default rule).
    #[serde(default)]
    pub unlimited: bool,
    #[serde(default)]
    pub descriptor: Vec<Spanned<RlsDescriptor>>,
}
