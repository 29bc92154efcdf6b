//! The TOML front-end: serde structs that mirror `conf/routes.toml` field for field. Values that
//! later checks may reject are `Spanned`, so errors can name their line. Nothing here is used at
//! request time: `compile` turns it into the runtime model.

use super::spanned::Spanned;
use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// How a request picks its route: "specific" (exact > longest prefix > regexes in file order)
    /// or "nginx" (host group, then exact > `skip_regex` prefix > regexes in file order > longest
    /// prefix).
    #[schemars(extend("enum" = ["specific", "nginx"], "default" = "specific"))]
    pub route_order: Option<Spanned<String>>,
    /// The proxy's listeners, threads, admin API and client limits. Optional only for a process that
    /// serves the rate limit service alone (`[rls]`).
    pub server: Option<Spanned<Server>>,
    /// Where limit state lives: this process (`memory`, the default) or a Redis shared by the fleet.
    #[serde(default)]
    pub store: Option<Spanned<Store>>,
    /// Proxies in front of Weir whose forwarding header gives the client address (nginx real_ip).
    #[serde(default)]
    pub real_ip: Option<Spanned<RealIp>>,
    /// Named groups of servers that routes forward to.
    #[serde(default)]
    pub upstream: Vec<Spanned<Upstream>>,
    /// Rate-limit zones (nginx limit_req_zone): a key and a rate.
    #[serde(default)]
    pub limit_req_zone: Vec<Spanned<LimitReqZone>>,
    /// Concurrency zones (nginx limit_conn_zone): requests in flight per key.
    #[serde(default)]
    pub limit_conn_zone: Vec<Spanned<LimitConnZone>>,
    /// Routes, matched in file order: the first that matches a request handles it.
    #[serde(default)]
    pub route: Vec<Spanned<Route>>,
    /// Limits, statuses and access rules every route inherits when it sets none of that field
    /// (nginx's `http` level).
    pub defaults: Option<Spanned<Defaults>>,
    /// The same for the routes whose every host is one of `hosts` (nginx's `server` level).
    #[serde(default)]
    pub host_defaults: Vec<Spanned<HostDefaults>>,
    /// Log level, format and the access log.
    #[serde(default)]
    pub log: Option<Spanned<Log>>,
    #[serde(default)]
    pub jwt: Option<Spanned<Jwt>>,
    /// OpenTelemetry traces over OTLP/HTTP (docs/production.md#traces); off when absent.
    #[serde(default)]
    pub tracing: Option<Spanned<Tracing>>,
    /// Live view of the keys being limited (admin /top, `weir top`, the status page); on by default.
    #[serde(default)]
    pub top: Option<Spanned<Top>>,
    /// Envoy's rate limit service over gRPC (docs/rls.md): descriptors decided on the same zones.
    #[serde(default)]
    pub rls: Option<Spanned<Rls>>,
}

/// `[top]`: the hottest keys per zone (admin `/top`, `weir top`, the status page).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Top {
    /// Track the keys being limited; false: no tracking and no cost.
    #[schemars(extend("default" = true))]
    pub enabled: Option<bool>,
    /// Keys listed per zone (1-10000).
    #[schemars(extend("default" = 64))]
    pub keys: Option<Spanned<i64>>,
    /// Counts halve every half_life ("100ms" to "1h").
    #[schemars(extend("default" = "30s"))]
    pub half_life: Option<Spanned<String>>,
    /// A passed request is recorded only when its limit is at least this full (0.0-1.0).
    #[schemars(extend("default" = 0.5))]
    pub near: Option<Spanned<f64>>,
    /// Show keys of header:, query:, cookie: and jwt: parts as they are instead of hashed.
    #[schemars(extend("default" = false))]
    pub reveal_keys: Option<bool>,
    /// Cells per row of the admission sketch (64-16777216).
    #[schemars(extend("default" = 16384))]
    pub sketch_width: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tracing {
    /// The OTLP/HTTP traces URL of a collector, e.g. "http://otel-collector:4318/v1/traces".
    #[schemars(extend("examples" = ["http://127.0.0.1:4318/v1/traces"]))]
    pub endpoint: Spanned<String>,
    /// Share of the traces started here that are recorded (0.0-1.0); a sampled incoming traceparent
    /// is always followed.
    #[schemars(extend("default" = 1.0))]
    pub sample_ratio: Option<Spanned<f64>>,
    /// The service.name of the spans.
    #[schemars(extend("default" = "weir"))]
    pub service_name: Option<Spanned<String>>,
    /// Time one export may take (1ms-60s).
    #[schemars(extend("default" = "10s"))]
    pub timeout: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Log {
    /// Log level (RUST_LOG overrides it); read at start.
    #[schemars(extend("enum" = ["error", "warn", "info", "debug", "trace"], "default" = "info"))]
    pub level: Option<Spanned<String>>,
    /// Log lines as text or one JSON object per line; read at start.
    #[schemars(extend("enum" = ["text", "json"], "default" = "text"))]
    pub format: Option<Spanned<String>>,
    /// One line per request; a reload can switch it.
    #[schemars(extend("default" = true))]
    pub access_log: Option<bool>,
    /// Bytes of access lines each thread gathers before one write (nginx's `buffer=`); 0 or
    /// absent: each line is written at once. Read at start.
    #[schemars(range(min = 0, max = 1048576), extend("default" = 0))]
    pub access_log_buffer: Option<Spanned<i64>>,
    /// The longest a buffered access line waits (nginx's `flush=`). Read at start.
    #[schemars(extend("default" = "1s"))]
    pub access_log_flush: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Server {
    /// Addresses the proxy listens on (cleartext), each "IP:port"; this or listen_tls non-empty. A change
    /// needs a restart.
    #[schemars(extend("examples" = [["127.0.0.1:8080"]]))]
    pub listen: Option<Spanned<Vec<Spanned<String>>>>,
    /// Addresses that speak TLS (HTTPS), with the certificates of `tls`.
    pub listen_tls: Option<Spanned<Vec<Spanned<String>>>>,
    /// Certificates for listen_tls: a PEM chain (leaf first) and its key, paths relative to the config file.
    #[serde(default)]
    pub tls: Vec<Spanned<TlsCert>>,
    /// Oldest TLS version accepted.
    #[schemars(extend("enum" = ["1.2", "1.3"], "default" = "1.2"))]
    pub min_tls: Option<Spanned<String>>,
    /// Offer HTTP/2 through ALPN on the TLS listeners (default true).
    pub http2: Option<bool>,
    /// Cleartext HTTP/2 with prior knowledge on the `listen` addresses (default false).
    pub h2c: Option<bool>,
    /// Pingora worker threads, 1-1024 (default: the number of CPUs). A change needs a restart.
    pub threads: Option<Spanned<i64>>,
    /// Pingora's work stealing between the threads (default true; false: each thread runs its own
    /// runtime, and its Redis decisions stay on its own connection).
    pub work_stealing: Option<bool>,
    /// Admin listener "IP:port" (/healthz /readyz /metrics /config /reload /limits /upstreams /top, and
    /// the status page at /); off when absent.
    pub admin: Option<Spanned<String>>,
    /// Bearer token for every admin endpoint but /healthz and /readyz: at least 16 printable characters.
    /// Better: admin_token_file or "${NAME}".
    pub admin_token: Option<Spanned<String>>,
    /// A file holding the admin token (a mounted Secret), instead of `admin_token`.
    pub admin_token_file: Option<Spanned<String>>,
    /// Allows a non-loopback admin address without a token.
    pub admin_insecure: Option<bool>,
    /// Time to read a whole request head (nginx client_header_timeout).
    #[schemars(extend("default" = "10s"))]
    pub header_timeout: Option<Spanned<String>>,
    /// Time between two reads of a request body (nginx client_body_timeout).
    #[schemars(extend("default" = "60s"))]
    pub body_timeout: Option<Spanned<String>>,
    /// Time between two writes to the client.
    #[schemars(extend("default" = "60s"))]
    pub send_timeout: Option<Spanned<String>>,
    /// Idle keep-alive client connections are closed after this.
    #[schemars(extend("default" = "75s"))]
    pub keepalive_timeout: Option<Spanned<String>>,
    /// Bytes of request line and headers, at least 1024.
    #[schemars(extend("default" = 65536))]
    pub max_header_size: Option<Spanned<i64>>,
    /// Open client connections per instance (default: from the file-descriptor limit).
    pub max_connections: Option<Spanned<i64>>,
    /// Open client connections per peer address (default: no cap).
    pub max_connections_per_ip: Option<Spanned<i64>>,
    /// Concurrent streams one HTTP/2 connection may open (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    #[schemars(extend("default" = 100))]
    pub h2_max_streams: Option<Spanned<i64>>,
    /// %2F, %5C and a raw backslash in paths: reject (400), keep (matched escaped) or decode.
    #[schemars(extend("enum" = ["reject", "keep", "decode"], "default" = "reject"))]
    pub encoded_slashes: Option<Spanned<String>>,
    /// Request header names with an underscore: drop (nginx) or reject (400).
    #[schemars(extend("enum" = ["drop", "reject"], "default" = "drop"))]
    pub underscores_in_headers: Option<Spanned<String>>,
    /// X-HTTP-Method-Override and its kin: strip, honour (route on it) or reject (400).
    #[schemars(extend("enum" = ["strip", "honour", "honor", "reject"], "default" = "strip"))]
    pub method_override: Option<Spanned<String>>,
    /// Set X-Forwarded-For and X-Real-IP for the upstream.
    #[schemars(extend("default" = true))]
    pub forwarded_headers: Option<bool>,
    /// `[server.response_buffering]`: responses taken ahead of slow clients (nginx proxy_buffering).
    pub response_buffering: Option<Spanned<ResponseBuffering>>,
}

/// `[server.response_buffering]`: each HTTP/1 client connection takes the response into a bounded
/// buffer (memory, then an unlinked temp file) when the client reads slower than the upstream
/// answers, so the upstream is free once its answer is read. Sizes take nginx's k/m/g suffixes.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseBuffering {
    /// Off: every write waits for the client (nginx `proxy_buffering off`).
    #[schemars(extend("default" = true))]
    pub enabled: Option<bool>,
    /// Memory one connection may hold (nginx proxy_buffers).
    #[schemars(extend("default" = "64k"))]
    pub memory_per_connection: Option<Spanned<String>>,
    /// Temp file one connection may hold beyond its memory; "0": memory only (nginx proxy_max_temp_file_size).
    #[schemars(extend("default" = "1g"))]
    pub max_temp_file_size: Option<Spanned<String>>,
    /// Directory of the temp files (nginx proxy_temp_path); default: the system's temp directory.
    pub temp_path: Option<Spanned<String>>,
    /// Memory of every connection's buffers together; when spent, connections stream with back-pressure.
    #[schemars(extend("default" = "64m"))]
    pub memory: Option<Spanned<String>>,
    /// Disk of every connection's temp files together.
    #[schemars(extend("default" = "4g"))]
    pub temp_files: Option<Spanned<String>>,
}

/// One `[[server.tls]]` certificate: a PEM chain (leaf first) and its key.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsCert {
    /// PEM certificate chain file, leaf first.
    pub cert: Spanned<String>,
    /// PEM private key file of the certificate.
    pub key: Spanned<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Store {
    /// memory: limits of this process only; redis: limits shared by every instance. A change needs a restart.
    #[schemars(extend("enum" = ["memory", "redis"], "default" = "memory"))]
    pub kind: Spanned<String>,
    /// redis://[user:password@]host:port/db, rediss://, redis+cluster://h1:7000,h2:7001 or
    /// redis+sentinel://s1:26379/master. Put the password in password_file or "${NAME}", not here.
    #[schemars(extend("examples" = ["redis://127.0.0.1:6379/0"]))]
    pub url: Option<Spanned<String>>,
    /// A file holding the whole `url` (with its password), instead of `url`.
    pub url_file: Option<Spanned<String>>,
    /// The Redis password, put into the url (which then must hold none).
    pub password: Option<Spanned<String>>,
    /// A file holding the Redis password, instead of `password`.
    pub password_file: Option<Spanned<String>>,
    /// Budget of one decision, round trip included.
    #[schemars(extend("default" = "25ms"))]
    pub timeout: Option<Spanned<String>>,
    /// redis: Redis TIME, one clock for the fleet; local: each proxy's clock.
    #[schemars(extend("enum" = ["redis", "local"], "default" = "redis"))]
    pub clock: Option<Spanned<String>>,
    /// Prefix of every Redis key.
    #[schemars(extend("default" = "weir:"))]
    pub key_prefix: Option<Spanned<String>>,
    /// What requests get when Redis fails: allow (fail open), deny (fail closed), local (this instance's
    /// share of each limit).
    #[schemars(extend("enum" = ["allow", "deny", "local"], "default" = "local"))]
    pub on_error: Option<Spanned<String>>,
    /// Instances sharing the limits: on_error = "local" gives each 1/fleet_size of every limit (1-10000).
    #[schemars(extend("default" = 1))]
    pub fleet_size: Option<Spanned<i64>>,
    /// Rejected keys remembered until their retry time; 0 turns it off.
    #[schemars(extend("default" = 10000))]
    pub deny_cache_size: Option<Spanned<i64>>,
    /// Consecutive failures before decisions stop waiting on Redis (1-1000).
    #[schemars(extend("default" = 3))]
    pub circuit_breaker_failures: Option<Spanned<i64>>,
    /// A crashed instance's limit_conn slots come back after this (1s-60m).
    #[schemars(extend("default" = "30s"))]
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

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RealIp {
    /// CIDRs or addresses of the proxies in front of Weir.
    #[schemars(extend("examples" = [["10.0.0.0/8"]]))]
    pub trusted: Vec<Spanned<String>>,
    /// The forwarding header.
    #[schemars(extend("default" = "X-Forwarded-For"))]
    pub header: Option<Spanned<String>>,
    /// nginx real_ip_recursive: walk the header right to left past trusted hops (true), or take
    /// its last address, trusted or not (false).
    #[schemars(extend("default" = true))]
    pub recursive: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// The name routes refer to: 1-128 of A-Z a-z 0-9 _ - .
    pub name: Spanned<String>,
    /// `"host:port"`, optionally followed by `weight=N max_fails=N fail_timeout=T max_conns=N`.
    pub servers: Spanned<Vec<Spanned<String>>>,
    /// Requests in flight per server and instance.
    pub max_conns: Option<Spanned<i64>>,
    /// Passive health: failures within fail_timeout that take a server out for fail_timeout; 0 turns it off.
    #[schemars(extend("default" = 1))]
    pub max_fails: Option<Spanned<i64>>,
    /// Passive health window and time out.
    #[schemars(extend("default" = "10s"))]
    pub fail_timeout: Option<Spanned<String>>,
    /// nginx proxy_connect_timeout.
    #[schemars(extend("default" = "5s"))]
    pub connect_timeout: Option<Spanned<String>>,
    /// nginx proxy_read_timeout.
    #[schemars(extend("default" = "60s"))]
    pub read_timeout: Option<Spanned<String>>,
    /// nginx proxy_send_timeout.
    #[schemars(extend("default" = "60s"))]
    pub send_timeout: Option<Spanned<String>>,
    /// Idle kept-alive connections to the servers are closed after this.
    #[schemars(extend("default" = "60s"))]
    pub idle_timeout: Option<Spanned<String>>,
    /// Idle connections kept per server; 0: no reuse.
    pub keepalive: Option<Spanned<i64>>,
    /// Servers tried per request, the first included (1-16; default: each server once).
    pub tries: Option<Spanned<i64>>,
    /// When to try the next server (nginx proxy_next_upstream): error, timeout, http_500, http_502, http_503,
    /// http_504, http_429, non_idempotent, off.
    #[schemars(extend("default" = ["error", "timeout"]))]
    pub next_upstream: Option<Spanned<Vec<Spanned<String>>>>,
    /// No new try after this long ("0": no limit).
    #[schemars(extend("default" = "0"))]
    pub next_upstream_timeout: Option<Spanned<String>>,
    /// Host names are resolved again this often (at least 100ms).
    #[schemars(extend("default" = "30s"))]
    pub resolve_interval: Option<Spanned<String>>,
    /// DNS server "IP" or "IP:port" for the names (default: the system resolver).
    pub resolver: Option<Spanned<String>>,
    /// Active health check of each server.
    pub health_check: Option<Spanned<HealthCheck>>,
    /// HTTPS to the servers, and its settings.
    pub tls: Option<Spanned<bool>>,
    /// Server name sent in TLS (default: the host of each server).
    pub sni: Option<Spanned<String>>,
    /// Check the servers' certificates.
    #[schemars(extend("default" = true))]
    pub verify: Option<Spanned<bool>>,
    /// PEM file of the CAs that sign the servers' certificates (default: the system's roots).
    pub ca_file: Option<Spanned<String>>,
    /// PEM client certificate for mutual TLS, with client_key.
    pub client_cert: Option<Spanned<String>>,
    /// PEM key of client_cert.
    pub client_key: Option<Spanned<String>>,
    /// `"h1"`, `"h2"` (over TLS) or `"h2c"`.
    pub protocol: Option<Spanned<String>>,
    /// A limit on requests in flight to this upstream that Weir learns from its latency (docs/adaptive.md).
    pub adaptive: Option<Spanned<Adaptive>>,
}

/// `[upstream.adaptive]`: adaptive concurrency (docs/adaptive.md). `adaptive = {}` takes every default.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Adaptive {
    /// The limit never goes below this (1-100000).
    #[schemars(extend("default" = 2))]
    pub min_limit: Option<Spanned<i64>>,
    /// The limit never goes above this (1-100000).
    #[schemars(extend("default" = 1000))]
    pub max_limit: Option<Spanned<i64>>,
    /// The limit at start, before anything was learned.
    #[schemars(extend("default" = 20))]
    pub initial_limit: Option<Spanned<i64>>,
    /// How much slower than its latency without a queue the upstream may answer before the limit shrinks (1.05-10).
    #[schemars(extend("default" = 1.25))]
    pub tolerance: Option<Spanned<f64>>,
    /// Shortest measurement window (10ms-60s); a window also needs 64 answers.
    #[schemars(extend("default" = "250ms"))]
    pub window: Option<Spanned<String>>,
    /// Requests that may wait for a place, most important first (0: refuse at once; up to 100000).
    #[schemars(extend("default" = 0))]
    pub queue: Option<Spanned<i64>>,
    /// Longest wait in the queue.
    #[schemars(extend("default" = "50ms"))]
    pub queue_timeout: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    /// tcp: a connect; http: a request (the default when path is set).
    #[serde(rename = "type")]
    #[schemars(extend("enum" = ["http", "tcp"]))]
    pub kind: Option<Spanned<String>>,
    /// Path of the HTTP check.
    pub path: Option<Spanned<String>>,
    /// Host header of the check (default: the upstream's name).
    pub host: Option<Spanned<String>>,
    /// Healthy statuses: "200", "200,204", "200-299".
    #[schemars(extend("default" = "200-399"))]
    pub status: Option<Spanned<String>>,
    /// Time between checks (at least 100ms).
    #[schemars(extend("default" = "5s"))]
    pub interval: Option<Spanned<String>>,
    /// Time one check may take.
    #[schemars(extend("default" = "1s"))]
    pub timeout: Option<Spanned<String>>,
    /// Consecutive passes to come back (1-100).
    #[schemars(extend("default" = 2))]
    pub rise: Option<Spanned<i64>>,
    /// Consecutive failures to go out (1-100).
    #[schemars(extend("default" = 3))]
    pub fall: Option<Spanned<i64>>,
    /// Check this port instead of the server's.
    pub port: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitReqZone {
    /// The zone's name; state is keyed by it: unique, 1-128 of A-Z a-z 0-9 _ - .
    pub name: Spanned<String>,
    /// What the zone counts per: "ip", "header:NAME", "query:NAME", "cookie:NAME", or a list of these.
    /// Optional only for zones that `[rls]` descriptors alone use (their key is the descriptor's).
    #[schemars(extend("examples" = ["ip", ["header:X-Tenant", "ip"]]))]
    pub key: Option<Spanned<OneOrMany>>,
    /// The zone's algorithm (docs/algorithms.md); window algorithms take no burst or delay.
    #[schemars(extend("enum" = ["leaky_bucket", "token_bucket", "fixed_window", "sliding_log", "sliding_window"], "default" = "leaky_bucket"))]
    pub algorithm: Option<Spanned<String>>,
    /// The sustained rate: "N r/s", "N r/m" or "N r/h".
    #[schemars(extend("examples" = ["10r/s", "600r/m"]))]
    pub rate: Option<Spanned<String>>,
    /// Window algorithms: the window of `limit` (1ms-365d, aligned to the Unix epoch).
    pub window: Option<Spanned<String>>,
    /// Window algorithms: requests per window (0-1000000; 0 blocks, sliding_log needs 1).
    pub limit: Option<Spanned<i64>>,
    /// Keys the memory store keeps for the zone (1-100000000), like the size of nginx's zone.
    #[schemars(extend("default" = 1000000))]
    pub max_keys: Option<Spanned<i64>>,
    /// The key of requests whose bearer token cannot be verified (zones keyed on `jwt:` claims);
    /// without it they are refused with 401.
    pub bad_token_key: Option<Spanned<OneOrMany>>,
    /// Count by response: only responses with one of these statuses are charged, after the
    /// response (requests are checked, uncharged, before forwarding).
    pub count_statuses: Option<Spanned<Vec<i64>>>,
    /// Charge from the response: the cost is a number the upstream reports in a response header,
    /// charged after the response (requests are checked, uncharged, before forwarding; the bucket
    /// may go into debt up to `max_debt`). leaky_bucket zones only.
    pub cost_from_response: Option<Spanned<ResponseCost>>,
    /// Leased decisions (docs/leases.md): each instance takes up to `tokens` of a key's budget from
    /// Redis at a time, usable for `lifetime`, and decides locally while it holds them; the fleet's
    /// overshoot is bounded by `min(instances·tokens, rate·lifetime)` (`weir check` prints it).
    /// Leaky buckets with `nodelay`, token buckets and fixed windows; Redis store only.
    pub lease: Option<Spanned<Lease>>,
    /// Other limits for some keys; the first match wins.
    #[serde(default, rename = "override")]
    pub overrides: Vec<Spanned<ZoneOverride>>,
}

/// `lease = { tokens = 100, lifetime = "1s" }`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    /// The most tokens one instance holds for one key at a time (1-1000000).
    pub tokens: Spanned<i64>,
    /// How long a lease may be used, counted from when the instance sent its request for it
    /// (1ms-1h).
    #[schemars(extend("examples" = ["1s", "250ms"]))]
    pub lifetime: Spanned<String>,
}

/// `cost_from_response = { header = "x-tokens-used", default = 1, max = 100000, max_debt = 20000 }`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseCost {
    /// The upstream response header that carries the cost (a non-negative integer); or
    /// `body_bytes = true`.
    pub header: Option<Spanned<String>>,
    /// Charge the response body bytes actually sent to the client, at the end of the response
    /// (a byte quota), instead of a header's value.
    #[schemars(extend("default" = false))]
    pub body_bytes: Option<bool>,
    /// The cost when the header is missing or not a non-negative integer (0-1000000).
    #[schemars(extend("default" = 1))]
    pub default: Option<Spanned<i64>>,
    /// Larger reported costs are clamped to this (1-1000000).
    #[schemars(extend("default" = 1000000))]
    pub max: Option<Spanned<i64>>,
    /// How far past its burst a charge may push a bucket (0-1000000): later requests are refused
    /// or delayed until it drains. Default: one bucket (the reference's burst + 1).
    pub max_debt: Option<Spanned<i64>>,
    /// Charge at the end of the response, from a trailer of that name when the upstream sends
    /// one (HTTP/2 and gRPC upstreams), else from the header.
    #[schemars(extend("default" = false))]
    pub trailer: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ZoneOverride {
    /// An IP or CIDR (key "ip"), or "header:X-Api-Key=partner-123".
    #[serde(rename = "match")]
    pub matches: Spanned<String>,
    /// The key's rate, or "unlimited" to exempt it.
    pub rate: Option<Spanned<String>>,
    /// Replaces the routes' burst for this key.
    pub burst: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
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

/// `[defaults]`: what routes inherit when they set none of a field.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// Rate limits of routes that set no `limit_req` (`[]`: none).
    pub limit_req: Option<Vec<Spanned<LimitReqRef>>>,
    /// Status of a rate-limited request (400-599; 444 closes the connection).
    pub limit_req_status: Option<Spanned<i64>>,
    /// Concurrency limits of routes that set no `limit_conn` (`[]`: none).
    pub limit_conn: Option<Vec<Spanned<LimitConnRef>>>,
    /// Status of a request over a concurrency cap (400-599; 444 closes the connection).
    pub limit_conn_status: Option<Spanned<i64>>,
    /// allow rules of routes that set neither allow nor deny (inherited with deny).
    pub allow: Option<Vec<Spanned<String>>>,
    /// deny rules of routes that set neither allow nor deny (inherited with allow).
    pub deny: Option<Vec<Spanned<String>>>,
    /// The body of this level's limit_req and limit_conn rejections instead of Weir's JSON (at most 64 KiB).
    pub rejection_body: Option<Spanned<String>>,
    /// The Content-Type of rejection_body (default "text/plain; charset=utf-8").
    pub rejection_content_type: Option<Spanned<String>>,
}

/// `[[host_defaults]]`: what the routes of some hosts inherit; itself inherits `[defaults]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HostDefaults {
    /// Host patterns as routes write them; a route whose every host is listed here inherits this.
    pub hosts: Spanned<Vec<Spanned<String>>>,
    /// Rate limits of routes that set no `limit_req` (`[]`: none).
    pub limit_req: Option<Vec<Spanned<LimitReqRef>>>,
    /// Status of a rate-limited request (400-599; 444 closes the connection).
    pub limit_req_status: Option<Spanned<i64>>,
    /// Concurrency limits of routes that set no `limit_conn` (`[]`: none).
    pub limit_conn: Option<Vec<Spanned<LimitConnRef>>>,
    /// Status of a request over a concurrency cap (400-599; 444 closes the connection).
    pub limit_conn_status: Option<Spanned<i64>>,
    /// allow rules of routes that set neither allow nor deny (inherited with deny).
    pub allow: Option<Vec<Spanned<String>>>,
    /// deny rules of routes that set neither allow nor deny (inherited with allow).
    pub deny: Option<Vec<Spanned<String>>>,
    /// The body of this level's limit_req and limit_conn rejections instead of Weir's JSON (at most 64 KiB).
    pub rejection_body: Option<Spanned<String>>,
    /// The Content-Type of rejection_body (default "text/plain; charset=utf-8").
    pub rejection_content_type: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The route's name (metrics, logs, headers): 1-128 of A-Z a-z 0-9 _ - .
    pub name: Spanned<String>,
    /// Matches this exact path (one of path, path_prefix, path_regex).
    pub path: Option<Spanned<String>>,
    /// Matches paths starting with this (one of path, path_prefix, path_regex).
    pub path_prefix: Option<Spanned<String>>,
    /// Matches paths this regular expression matches (one of path, path_prefix, path_regex).
    pub path_regex: Option<Spanned<String>>,
    /// Matches this Host, or any of a list ("*.example.com" matches subdomains, "www.example.*"
    /// any name after the dot); the port is ignored.
    pub host: Option<Spanned<OneOrMany>>,
    /// Matches these methods (default: any).
    pub methods: Option<Spanned<Vec<Spanned<String>>>>,
    /// With path_prefix under route_order = "nginx": when this is the longest matching prefix,
    /// regexes are not tried (nginx `location ^~`).
    #[schemars(extend("default" = false))]
    pub skip_regex: Option<Spanned<bool>>,
    /// The upstream requests are forwarded to.
    pub upstream: Spanned<String>,
    /// Rate limits: zone, burst, delay or nodelay, dry_run (absent: inherited from
    /// host_defaults/defaults; `[]`: none).
    pub limit_req: Option<Vec<Spanned<LimitReqRef>>>,
    /// Status of a rate-limited request (400-599; 444 closes the connection).
    #[schemars(extend("default" = 429))]
    pub limit_req_status: Option<Spanned<i64>>,
    /// Decide and report, never delay or reject (every limit of the route).
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub dry_run: bool,
    /// draft: RateLimit-Policy and RateLimit; legacy: X-RateLimit-*; none.
    #[schemars(extend("enum" = ["draft", "legacy", "none"], "default" = "draft"))]
    pub rate_limit_headers: Option<Spanned<String>>,
    /// Overrides store.on_error for this route.
    #[schemars(extend("enum" = ["allow", "deny", "local"]))]
    pub on_error: Option<Spanned<String>>,
    /// Concurrency limits: zone, max, dry_run (absent: inherited; `[]`: none).
    pub limit_conn: Option<Vec<Spanned<LimitConnRef>>>,
    /// Status of a request over a concurrency cap (400-599; 444 closes the connection).
    #[schemars(extend("default" = 503))]
    pub limit_conn_status: Option<Spanned<i64>>,
    /// What one request counts as (0-1000000).
    #[schemars(extend("default" = 1))]
    pub cost: Option<Spanned<i64>>,
    /// The request gives its cost in this header (a bad value is a 400).
    pub cost_header: Option<Spanned<String>>,
    /// With cost_header: larger values are clamped to this.
    pub max_cost: Option<Spanned<i64>>,
    /// With cost_header: smaller values are raised to this.
    #[schemars(extend("default" = 1))]
    pub min_cost: Option<Spanned<i64>>,
    /// CIDRs, addresses or "all" allowed (nginx allow); first match of allow and deny in file order wins.
    /// Without allow and deny: inherited.
    pub allow: Option<Vec<Spanned<String>>>,
    /// CIDRs, addresses or "all" denied (nginx deny).
    pub deny: Option<Vec<Spanned<String>>>,
    /// The body of the route's limit_req and limit_conn rejections instead of Weir's JSON (at most 64 KiB).
    pub rejection_body: Option<Spanned<String>>,
    /// The Content-Type of rejection_body (default "text/plain; charset=utf-8").
    pub rejection_content_type: Option<Spanned<String>>,
    /// Rejections of `application/grpc*` requests as gRPC statuses (default true).
    pub grpc_rejections: Option<bool>,
    /// The gRPC status of those rejections (default 8, RESOURCE_EXHAUSTED).
    pub grpc_status: Option<Spanned<i64>>,
    /// Under the upstream's adaptive limit, lower priorities are refused first.
    #[schemars(extend("enum" = ["low", "normal", "high"], "default" = "normal"))]
    pub priority: Option<Spanned<String>>,
    /// The request's priority from a header (which may only lower it unless `max` is given) or a
    /// claim of the verified bearer token; otherwise the route's `priority`.
    pub priority_from: Option<Spanned<PriorityFromSpec>>,
    /// nginx's limit_rate: each response body is sent no faster than this many bytes a second
    /// ("512k", "1m", "2g": k = 1024; or a plain number).
    #[schemars(extend("examples" = ["1m"]))]
    pub limit_rate: Option<Spanned<String>>,
    /// nginx's limit_rate_after: the first bytes of each body go at full speed ("1m"; default 0).
    pub limit_rate_after: Option<Spanned<String>>,
    /// Per-key limit_rate: the first whose match fits the request applies.
    #[serde(default)]
    pub limit_rate_override: Vec<Spanned<RateOverride>>,
}

/// `priority_from = { header = "X-Priority" }` or `{ claim = "tier", map = { gold = "high" } }`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PriorityFromSpec {
    /// A request header whose value is the priority (set by a trusted layer in front).
    pub header: Option<Spanned<String>>,
    /// A claim (name or /json/pointer) of the verified bearer token; needs [jwt].
    pub claim: Option<Spanned<String>>,
    /// Value -> "low", "normal" or "high"; without it the values are those names.
    #[serde(default)]
    pub map: std::collections::BTreeMap<String, Spanned<String>>,
    /// The most a value may give (default: the route's priority for a header, "high" for a claim).
    #[schemars(extend("enum" = ["low", "normal", "high"]))]
    pub max: Option<Spanned<String>>,
}

/// `limit_rate_override = [ { match = "header:X-Api-Key=partner-1", rate = "10m" } ]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateOverride {
    /// An IP or CIDR of the client, or "header:NAME=value" (also query:, cookie:).
    #[serde(rename = "match")]
    pub matches: Spanned<String>,
    /// The key's limit_rate ("10m"), or "unlimited" for full speed.
    pub rate: Spanned<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitConnRef {
    /// A limit_conn_zone.
    pub zone: Spanned<String>,
    /// Requests in flight per key (1-65535).
    pub max: Spanned<i64>,
    /// Shadow mode for this limit only.
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub dry_run: bool,
    /// The limit applies only when every one of these conditions holds (nginx's `map` to an
    /// empty key).
    pub when: Option<Spanned<Vec<Spanned<Condition>>>>,
    /// The limit does not apply when any of these holds (a bypass token, a whitelist).
    pub unless: Option<Spanned<Vec<Spanned<Condition>>>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitConnZone {
    /// The zone's name: unique across both kinds of zones.
    pub name: Spanned<String>,
    /// What the zone counts per, as for limit_req_zone.
    pub key: Spanned<OneOrMany>,
    /// Keys with requests in flight the memory store keeps.
    #[schemars(extend("default" = 1000000))]
    pub max_keys: Option<Spanned<i64>>,
    pub bad_token_key: Option<Spanned<OneOrMany>>,
    /// Not for limit_conn zones: `weir check` refuses it with the reason (docs/leases.md).
    pub lease: Option<Spanned<Lease>>,
}

/// `[jwt]`: how bearer tokens are verified for `jwt:` key parts.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Jwt {
    /// A JWKS document (RFC 7517), read at every config load.
    pub jwks_file: Option<Spanned<String>>,
    /// One key: an HMAC secret (the file's bytes, trailing newline removed) or a PEM public key.
    pub key_file: Option<Spanned<String>>,
    /// The algorithm of `key_file` (RS256, ES256, EdDSA, HS256, …).
    pub algorithm: Option<Spanned<String>>,
    pub issuer: Option<Spanned<OneOrMany>>,
    pub audience: Option<Spanned<OneOrMany>>,
    /// Clock skew allowed on `exp` and `nbf` (default 30s, at most 5m).
    pub leeway: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitReqRef {
    /// A limit_req_zone.
    pub zone: Spanned<String>,
    /// Requests allowed above the rate (0-1000000).
    #[schemars(extend("default" = 0))]
    pub burst: Option<Spanned<i64>>,
    /// Excess requests forwarded without waiting (0-burst); not with nodelay.
    pub delay: Option<Spanned<i64>>,
    /// Forward everything within the burst at once.
    #[schemars(extend("default" = false))]
    pub nodelay: Option<Spanned<bool>>,
    /// Shadow mode for this limit only.
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub dry_run: bool,
    /// The limit applies only when every one of these conditions holds (nginx's `map` to an
    /// empty key).
    pub when: Option<Spanned<Vec<Spanned<Condition>>>>,
    /// The limit does not apply when any of these holds (a bypass token, a whitelist).
    pub unless: Option<Spanned<Vec<Spanned<Condition>>>>,
}

/// One condition of `when` / `unless`: exactly one of `header`, `cookie`, `query` (with exactly
/// one of `present`, `equals`, `matches`), `method` or `ip`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// A request header's value.
    pub header: Option<Spanned<String>>,
    /// A cookie's value.
    pub cookie: Option<Spanned<String>>,
    /// A query argument's value.
    pub query: Option<Spanned<String>>,
    /// true: the value is there and not empty; false: it is not.
    pub present: Option<bool>,
    /// The value is exactly this (compared in constant time; "${NAME}" keeps a secret out of the file).
    pub equals: Option<Spanned<String>>,
    /// A regular expression finds a match in the value.
    pub matches: Option<Spanned<String>>,
    /// The request's method is one of these.
    pub method: Option<Spanned<Vec<Spanned<String>>>>,
    /// The client address is in one of these CIDRs or addresses.
    pub ip: Option<Spanned<Vec<Spanned<String>>>>,
}

/// `[rls]`: Envoy's rate limit service (`envoy.service.ratelimit.v3`) on the same zones.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rls {
    /// Addresses the gRPC service listens on (cleartext HTTP/2), each "IP:port". A change needs a restart.
    #[schemars(extend("examples" = [["127.0.0.1:8081"]]))]
    pub listen: Option<Spanned<Vec<Spanned<String>>>>,
    /// gRPC over TLS, with the certificates of `[[server.tls]]`.
    pub listen_tls: Option<Spanned<Vec<Spanned<String>>>>,
    /// Descriptors one request may carry (1-1024).
    #[schemars(extend("default" = 64))]
    pub max_descriptors: Option<Spanned<i64>>,
    /// Envoy's rate limit quota service (RLQS, docs/rlqs.md): how often the Envoys report each
    /// bucket ("1s" to "60s"; Envoy's filter reports every 5 s whatever its config says).
    #[schemars(extend("default" = "5s"))]
    pub quota_report_interval: Option<Spanned<String>>,
    /// RLQS streams open at once on this instance (1-4096); more are refused RESOURCE_EXHAUSTED.
    #[schemars(extend("default" = 256))]
    pub max_quota_streams: Option<Spanned<i64>>,
    /// Buckets one RLQS stream may hold (1-100000); a report that would pass it is refused.
    #[schemars(extend("default" = 1000))]
    pub max_quota_buckets: Option<Spanned<i64>>,
    #[serde(default)]
    pub domain: Vec<Spanned<RlsDomain>>,
}

/// `[[rls.domain]]`: what one `domain` of the requests limits; compiled into a route.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RlsDomain {
    /// The `domain` of Envoy's requests (the ratelimit filter's `domain`).
    pub name: Spanned<String>,
    /// Shadow mode for every limit of the domain: decide and report, never answer OVER_LIMIT.
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub dry_run: bool,
    /// Which rate-limit fields the answer asks Envoy to add.
    #[schemars(extend("enum" = ["draft", "legacy", "none"], "default" = "draft"))]
    pub rate_limit_headers: Option<Spanned<String>>,
    /// Overrides store.on_error for this domain.
    #[schemars(extend("enum" = ["allow", "deny", "local"]))]
    pub on_error: Option<Spanned<String>>,
    /// Which of two `*` values that both match wins at one level: "specific" (the more literal
    /// characters) or "file" (the first in file order, as envoyproxy/ratelimit picks).
    #[schemars(extend("enum" = ["specific", "file"], "default" = "specific"))]
    pub pattern_order: Option<Spanned<String>>,
    /// Every rule with a zone is a soft limit (`quota_mode`), as envoyproxy/ratelimit's
    /// `QUOTA_MODE` setting makes them all.
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub quota_mode: bool,
    /// Honour the `limit` a descriptor may carry (Envoy's `RateLimitOverride`, from its route
    /// config or dynamic metadata): such descriptors are decided by this zone (fixed_window or
    /// sliding_window) at the caller's rate. Off without it: the caller then never sets a limit.
    pub limit_override_zone: Option<Spanned<String>>,
    /// Rules for the descriptors' entries, matched by key (and value).
    #[serde(default)]
    pub descriptor: Vec<Spanned<RlsDescriptor>>,
    /// RLQS: rules for the Envoys' quota buckets (docs/rlqs.md), each dividing a zone's rate
    /// among the Envoys that report the bucket.
    #[serde(default)]
    pub bucket: Vec<Spanned<RlsBucket>>,
}

/// `[[rls.domain.bucket]]`: which RLQS buckets a zone divides among the Envoys reporting them.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RlsBucket {
    /// The bucket id this rule matches: every key of the id, none missing and none more; each
    /// value exact, with `*`s (each matching any run of characters), or "*" alone for any value.
    /// The values matched by patterns and "*" become the zone's key.
    pub id: Spanned<std::collections::BTreeMap<String, Spanned<String>>>,
    /// The limit_req_zone (leaky_bucket or token_bucket) whose rate and burst are divided.
    pub zone: Option<Spanned<String>>,
    /// Requests allowed above the rate (0-1000000): the Envoys' max_tokens sum to burst + 1.
    #[schemars(extend("default" = 0))]
    pub burst: Option<Spanned<i64>>,
    /// Allow every request of the bucket (ALLOW_ALL).
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub unlimited: bool,
    /// Deny every request of the bucket (DENY_ALL): a limit of 0.
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub deny: bool,
}

/// `[[rls.domain.descriptor]]` (nested as `descriptor` inside one another): a rule for one entry.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RlsDescriptor {
    /// The entry's key, e.g. "remote_address" or "generic_key".
    pub key: Spanned<String>,
    /// Only entries with this value (without it: any value, which becomes the zone's key); each
    /// `*` matches any run of characters ("/api/*", "/api/*/action", "svc*ep*rpc").
    pub value: Option<Spanned<String>>,
    /// The limit_req_zone deciding a descriptor that ends at this rule.
    pub zone: Option<Spanned<String>>,
    /// Requests allowed above the rate (0-1000000).
    #[schemars(extend("default" = 0))]
    pub burst: Option<Spanned<i64>>,
    /// Excess requests admitted without a wait (0-burst); not with nodelay.
    pub delay: Option<Spanned<i64>>,
    /// Admit everything within the burst at once.
    #[schemars(extend("default" = false))]
    pub nodelay: Option<Spanned<bool>>,
    /// Shadow mode for this rule only.
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub dry_run: bool,
    /// Matches and limits nothing (a value exempt from a key's default rule); answered with
    /// `limit_remaining` 4294967295, as envoyproxy/ratelimit does.
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub unlimited: bool,
    /// Matches and limits nothing, answered like an unmatched descriptor (`OK`, no limit,
    /// remaining 0): envoyproxy/ratelimit's descriptor without a `rate_limit`.
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub exempt: bool,
    /// Several zones for a descriptor that ends at this rule, decided all or nothing like a
    /// route's `limit_req` (instead of `zone`).
    pub limit_req: Option<Spanned<Vec<LimitReqRef>>>,
    /// The rule's name: `current_limit.name` in answers, and what `replaces` names.
    pub name: Option<Spanned<String>>,
    /// When a call's descriptors match this rule, the rules with these names are not decided
    /// (neither checked nor charged) in that call.
    pub replaces: Option<Spanned<Vec<Spanned<String>>>>,
    /// With a `*` value: every matching value shares one counter (the pattern is the key part).
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub share_threshold: bool,
    /// A soft limit: the call is over only when every quota rule it matched is over (and no
    /// other rule is).
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub quota_mode: bool,
    /// Rules for the next entry of the descriptor.
    #[serde(default)]
    pub descriptor: Vec<Spanned<RlsDescriptor>>,
}
