//! The parts of an nginx config that decide what a request gets: the `http` block's zones, maps,
//! geos and upstreams; each `server` (listen, server_name) and its `location`s (nested), each with
//! the limit directives it sets itself. Inheritance (a level that sets none of a directive takes
//! its parent's whole list, as nginx's merge functions do) is [`Limits::inherit`].
//! Directives that change what nginx answers but that Weir cannot do are kept as `unexpressed`
//! with their file:line and reason; directives that change nothing Weir decides are `ignored`.

use std::collections::BTreeMap;

use super::lexer::{At, Directive};

#[derive(Debug, Clone)]
pub struct ReqZone {
    pub name: String,
    pub key: String,
    /// Requests per second or per minute, as written.
    pub rate: u64,
    pub per_minute: bool,
    pub at: At,
}

#[derive(Debug, Clone)]
pub struct ConnZone {
    pub name: String,
    pub key: String,
    pub at: At,
}

/// `map $src $dst { … }` or `geo [$src] $dst { … }`.
#[derive(Debug, Clone)]
pub struct Table {
    pub geo: bool,
    pub source: String,
    /// (key, value) in file order; `default` separately.
    pub entries: Vec<(String, String)>,
    pub default: String,
    pub at: At,
    /// Something the importer cannot follow (`hostnames`, `ranges`, regex keys, …).
    pub unsupported: Option<String>,
}

#[derive(Debug, Clone)]
pub struct UpstreamServer {
    pub address: String,
    pub params: Vec<String>,
    pub at: At,
}

#[derive(Debug, Clone)]
pub struct Upstream {
    pub name: String,
    pub servers: Vec<UpstreamServer>,
    pub at: At,
    pub unexpressed: Vec<(At, String)>,
}

#[derive(Debug, Clone)]
pub struct LimitReq {
    pub zone: String,
    pub burst: u64,
    /// `None`: every excess request waits (nginx's default); `Some(u64::MAX)`: `nodelay`.
    pub delay: Option<u64>,
    pub at: At,
}

#[derive(Debug, Clone)]
pub struct LimitConn {
    pub zone: String,
    pub max: u64,
    pub at: At,
}

#[derive(Debug, Clone)]
pub struct AccessRule {
    pub allow: bool,
    pub what: String,
    pub at: At,
}

/// A setting and where it was written.
pub type Set<T> = Option<(T, At)>;

/// The directives nginx inherits level by level (`None`: not set at this level).
#[derive(Debug, Clone, Default)]
pub struct Limits {
    pub limit_req: Option<Vec<LimitReq>>,
    pub limit_req_status: Set<u16>,
    pub limit_req_dry_run: Set<bool>,
    pub limit_conn: Option<Vec<LimitConn>>,
    pub limit_conn_status: Set<u16>,
    pub limit_conn_dry_run: Set<bool>,
    pub access: Option<Vec<AccessRule>>,
    pub limit_rate: Set<String>,
    pub limit_rate_after: Set<String>,
    pub real_ip_from: Option<Vec<(String, At)>>,
    pub real_ip_header: Set<String>,
    pub real_ip_recursive: Set<bool>,
}

impl Limits {
    /// This level's settings over the parent's: what nginx's merge_loc_conf functions do.
    pub fn inherit(&self, parent: &Limits) -> Limits {
        fn pick<T: Clone>(own: &Option<T>, parent: &Option<T>) -> Option<T> {
            own.clone().or_else(|| parent.clone())
        }
        Limits {
            limit_req: pick(&self.limit_req, &parent.limit_req),
            limit_req_status: pick(&self.limit_req_status, &parent.limit_req_status),
            limit_req_dry_run: pick(&self.limit_req_dry_run, &parent.limit_req_dry_run),
            limit_conn: pick(&self.limit_conn, &parent.limit_conn),
            limit_conn_status: pick(&self.limit_conn_status, &parent.limit_conn_status),
            limit_conn_dry_run: pick(&self.limit_conn_dry_run, &parent.limit_conn_dry_run),
            access: pick(&self.access, &parent.access),
            limit_rate: pick(&self.limit_rate, &parent.limit_rate),
            limit_rate_after: pick(&self.limit_rate_after, &parent.limit_rate_after),
            real_ip_from: pick(&self.real_ip_from, &parent.real_ip_from),
            real_ip_header: pick(&self.real_ip_header, &parent.real_ip_header),
            real_ip_recursive: pick(&self.real_ip_recursive, &parent.real_ip_recursive),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Modifier {
    Prefix,
    /// `^~`: a prefix that stops the regex search.
    NoRegex,
    Exact,
    Regex,
    RegexCaseless,
    /// `@name`: reached only by internal redirects.
    Named,
}

/// What a location does with a request once the limits let it through.
#[derive(Debug, Clone)]
pub enum Handler {
    /// `proxy_pass URL`.
    Proxy(String, At),
    /// Nothing set: nginx serves files from `root`.
    Static,
}

#[derive(Debug, Clone)]
pub struct Location {
    pub modifier: Modifier,
    pub uri: String,
    pub at: At,
    pub limits: Limits,
    pub handler: Handler,
    pub nested: Vec<Location>,
    /// Answered by nginx itself in the rewrite phase (`return`): never limited.
    pub answered: Option<(At, String)>,
    pub unexpressed: Vec<(At, String)>,
}

#[derive(Debug, Clone)]
pub struct Listen {
    pub port: u16,
    pub default_server: bool,
    pub ssl: bool,
    pub at: At,
}

#[derive(Debug, Clone)]
pub struct Server {
    pub at: At,
    pub listen: Vec<Listen>,
    pub names: Vec<(String, At)>,
    pub limits: Limits,
    pub locations: Vec<Location>,
    /// A server-level `return`: nginx answers every request itself.
    pub answered: Option<(At, String)>,
    pub unexpressed: Vec<(At, String)>,
}

#[derive(Debug, Clone, Default)]
pub struct Http {
    pub req_zones: Vec<ReqZone>,
    pub conn_zones: Vec<ConnZone>,
    pub tables: BTreeMap<String, Table>,
    pub upstreams: Vec<Upstream>,
    pub servers: Vec<Server>,
    pub limits: Limits,
    /// Problems outside any server (bad zone definitions, …).
    pub unexpressed: Vec<(At, String)>,
    /// Directive names that change nothing Weir decides, with where they first appear.
    pub ignored: BTreeMap<String, At>,
}

/// Directives that decide nothing Weir decides (logging, buffers, headers to the upstream,
/// caching, TLS of the listener, compression): noted, not translated.
fn ignorable(name: &str) -> bool {
    const NAMES: &[&str] = &[
        "access_log",
        "error_log",
        "log_format",
        "log_not_found",
        "log_subrequest",
        "open_log_file_cache",
        "add_header",
        "add_trailer",
        "expires",
        "etag",
        "charset",
        "charset_types",
        "source_charset",
        "default_type",
        "types",
        "types_hash_max_size",
        "types_hash_bucket_size",
        "server_names_hash_bucket_size",
        "server_names_hash_max_size",
        "variables_hash_max_size",
        "variables_hash_bucket_size",
        "map_hash_bucket_size",
        "map_hash_max_size",
        "sendfile",
        "sendfile_max_chunk",
        "tcp_nopush",
        "tcp_nodelay",
        "keepalive_timeout",
        "keepalive_requests",
        "keepalive_time",
        "send_timeout",
        "client_body_timeout",
        "client_header_timeout",
        "client_max_body_size",
        "client_body_buffer_size",
        "client_header_buffer_size",
        "large_client_header_buffers",
        "client_body_temp_path",
        "server_tokens",
        "reset_timedout_connection",
        "resolver",
        "resolver_timeout",
        "open_file_cache",
        "open_file_cache_valid",
        "open_file_cache_min_uses",
        "open_file_cache_errors",
        "output_buffers",
        "postpone_output",
        "aio",
        "directio",
        "read_ahead",
        "lingering_close",
        "lingering_time",
        "lingering_timeout",
        "absolute_redirect",
        "port_in_redirect",
        "server_name_in_redirect",
        "msie_padding",
        "msie_refresh",
        "ignore_invalid_headers",
        "underscores_in_headers",
        "merge_slashes",
        "http2",
        "http3",
        "quic_retry",
        "limit_req_log_level",
        "limit_conn_log_level",
        "limit_rate_after_ignored",
        "chunked_transfer_encoding",
        "proxy_protocol_timeout",
        "subrequest_output_buffer_size",
        "uninitialized_variable_warn",
        "variables_hash",
        "keepalive_disable",
        "max_ranges",
        "disable_symlinks",
    ];
    NAMES.contains(&name)
        || name.starts_with("proxy_")
        || name.starts_with("ssl_")
        || name.starts_with("gzip")
        || name.starts_with("brotli")
        || name.starts_with("http2_")
        || name.starts_with("quic_")
        || name.starts_with("sub_filter")
}

/// Directives that make nginx answer, or change the request, in ways Weir does not reproduce.
fn unexpressed_reason(d: &Directive) -> Option<String> {
    let n = d.name.as_str();
    let why = if n.contains("_by_lua") || n.starts_with("lua_") || n == "content_by_lua" {
        "Lua (OpenResty) code runs here; Weir does not run Lua in the request path"
    } else if n.starts_with("js_") {
        "njs code runs here; Weir does not run JavaScript"
    } else if n.starts_with("perl") {
        "Perl code runs here"
    } else if matches!(n, "fastcgi_pass" | "uwsgi_pass" | "scgi_pass" | "memcached_pass" | "grpc_pass") {
        "nginx speaks FastCGI/uwsgi/SCGI/memcached/gRPC-pass to this backend; Weir proxies HTTP only (keep nginx behind Weir for it)"
    } else if n == "rewrite" {
        "`rewrite` changes the URI inside nginx; Weir forwards the path unchanged"
    } else if n == "if" {
        "`if` makes per-request decisions in nginx's rewrite phase that Weir has no form for"
    } else if matches!(n, "auth_basic" | "auth_request" | "auth_jwt" | "satisfy") {
        "authentication runs in nginx after the limits; Weir would forward without it (keep nginx behind Weir)"
    } else if matches!(n, "limit_except") {
        "`limit_except` is an access list by method; Weir's allow/deny do not depend on the method"
    } else if n == "internal" {
        "an `internal` location answers 404 to clients"
    } else if matches!(n, "try_files" | "alias" | "autoindex") {
        "nginx serves files here; Weir forwards to upstreams only (keep nginx behind Weir for the files)"
    } else if matches!(
        n,
        "mirror"
            | "sub_filter"
            | "secure_link"
            | "valid_referers"
            | "slice"
            | "dav_methods"
            | "empty_gif"
            | "stub_status"
            | "split_clients"
    ) {
        "nginx does this itself; Weir has no form for it"
    } else if n == "error_page" && d.args.iter().any(|a| a.starts_with('=') || a.starts_with('@')) {
        "`error_page` with `=code` or a named location changes the answer (status or control flow)"
    } else if n == "set" {
        "`set` computes a variable in the rewrite phase; Weir has no variables"
    } else {
        return None;
    };
    Some(why.to_string())
}

/// Reads the main context (the whole config with includes expanded).
pub fn read(top: &[Directive]) -> Result<Http, String> {
    let mut http = Http::default();
    let mut seen_http = false;
    // A whole nginx.conf (it has the `http` or `events` block): http's directives outside `http`
    // make nginx refuse the file, so they are not read as a conf.d site file's would be.
    let whole = top.iter().any(|d| d.name == "http" || d.name == "events");
    for d in top {
        match d.name.as_str() {
            "server" | "limit_req_zone" | "limit_conn_zone" | "upstream" | "map" | "geo" | "limit_req"
            | "limit_conn"
                if whole =>
            {
                return Err(format!(
                    "{}: `{}` is not allowed here, outside the `http` block (nginx -t: \"{}\" directive is not allowed here)",
                    d.at, d.name, d.name
                ));
            }
            "http" => {
                if seen_http {
                    return Err(format!("{}: a second `http` block (nginx refuses it)", d.at));
                }
                seen_http = true;
                read_http(d.block.as_deref().unwrap_or(&[]), &mut http)?;
            }
            // Also accepted: a file that is only the inside of `http` (a conf.d site file).
            "server" | "limit_req_zone" | "limit_conn_zone" | "upstream" | "map" | "geo" => {
                read_http(std::slice::from_ref(d), &mut http)?
            }
            _ => {}
        }
    }
    Ok(http)
}

fn read_http(list: &[Directive], http: &mut Http) -> Result<(), String> {
    for d in list {
        match d.name.as_str() {
            "limit_req_zone" => http.req_zones.push(req_zone(d)?),
            "limit_conn_zone" => http.conn_zones.push(conn_zone(d)?),
            "map" | "geo" => {
                let t = table(d)?;
                let var = if d.name == "map" { d.arg(1) } else { d.args.last().map_or("", String::as_str) };
                http.tables.insert(var.trim_start_matches('$').to_string(), t);
            }
            "upstream" => http.upstreams.push(upstream(d)),
            "server" => {
                let s = server(d, &mut http.ignored)?;
                http.servers.push(s);
            }
            _ => {
                if !limit_directive(d, &mut http.limits)? {
                    note_other(d, &mut http.unexpressed, &mut http.ignored);
                }
            }
        }
    }
    Ok(())
}

fn note_other(d: &Directive, unexpressed: &mut Vec<(At, String)>, ignored: &mut BTreeMap<String, At>) {
    if let Some(why) = unexpressed_reason(d) {
        unexpressed.push((d.at.clone(), format!("`{}`: {why}", d.name)));
    } else if ignorable(&d.name) {
        ignored.entry(d.name.clone()).or_insert_with(|| d.at.clone());
    } else {
        ignored.entry(format!("{} (unknown to the importer)", d.name)).or_insert_with(|| d.at.clone());
    }
}

fn bad(d: &Directive, msg: &str) -> String {
    format!("{}: {} {}: {msg}", d.at, d.name, d.args.join(" "))
}

fn req_zone(d: &Directive) -> Result<ReqZone, String> {
    let mut name = None;
    let mut rate = None;
    for a in &d.args[1..] {
        if let Some(z) = a.strip_prefix("zone=") {
            name = Some(z.split(':').next().unwrap_or("").to_string());
        } else if let Some(r) = a.strip_prefix("rate=") {
            let (n, per_minute) = if let Some(n) = r.strip_suffix("r/s") {
                (n, false)
            } else if let Some(n) = r.strip_suffix("r/m") {
                (n, true)
            } else {
                return Err(bad(d, "rate must be N r/s or N r/m"));
            };
            let n: u64 = n.parse().ok().filter(|n| *n > 0).ok_or_else(|| bad(d, "rate must be an integer above 0"))?;
            rate = Some((n, per_minute));
        } else if a == "sync" {
            return Err(bad(d, "`sync` (NGINX Plus zone_sync) is not nginx; Weir's Redis store shares every zone"));
        } else {
            return Err(bad(d, &format!("invalid parameter {a:?}")));
        }
    }
    let name = name.filter(|n| !n.is_empty()).ok_or_else(|| bad(d, "no zone=NAME:SIZE"))?;
    let (rate, per_minute) = rate.ok_or_else(|| bad(d, "no rate="))?;
    Ok(ReqZone { name, key: d.arg(0).to_string(), rate, per_minute, at: d.at.clone() })
}

fn conn_zone(d: &Directive) -> Result<ConnZone, String> {
    let name =
        d.args.iter().find_map(|a| a.strip_prefix("zone=")).map(|z| z.split(':').next().unwrap_or("").to_string());
    let name = name.filter(|n| !n.is_empty()).ok_or_else(|| bad(d, "no zone=NAME:SIZE"))?;
    Ok(ConnZone { name, key: d.arg(0).to_string(), at: d.at.clone() })
}

fn table(d: &Directive) -> Result<Table, String> {
    let geo = d.name == "geo";
    let source = match (geo, d.args.len()) {
        (true, 1) => "$remote_addr".to_string(),
        (_, 2) => d.arg(0).to_string(),
        _ => return Err(bad(d, "expects a source and a variable")),
    };
    let mut t = Table { geo, source, entries: Vec::new(), default: String::new(), at: d.at.clone(), unsupported: None };
    for e in d.block.as_deref().unwrap_or(&[]) {
        let value = e.args.first().cloned().unwrap_or_default();
        match e.name.as_str() {
            "default" => t.default = value,
            "hostnames" | "ranges" | "proxy" | "proxy_recursive" | "delete" | "include" | "volatile" => {
                t.unsupported.get_or_insert(format!("{}: `{}` in a {}", e.at, e.name, d.name));
            }
            key => {
                if !geo && (key.starts_with('~') || key.starts_with('*') || key.ends_with('*') || key.starts_with('.'))
                {
                    t.unsupported.get_or_insert(format!("{}: map key {key:?} (regex or wildcard)", e.at));
                }
                if e.args.len() != 1 {
                    return Err(format!("{}: {} entry {key:?}: expects one value", e.at, d.name));
                }
                let key = if !geo { key.strip_prefix('\\').unwrap_or(key) } else { key };
                t.entries.push((key.to_string(), value));
            }
        }
    }
    Ok(t)
}

fn upstream(d: &Directive) -> Upstream {
    let mut u = Upstream { name: d.arg(0).to_string(), servers: Vec::new(), at: d.at.clone(), unexpressed: Vec::new() };
    for s in d.block.as_deref().unwrap_or(&[]) {
        match s.name.as_str() {
            "server" => u.servers.push(UpstreamServer {
                address: s.arg(0).to_string(),
                params: s.args[1..].to_vec(),
                at: s.at.clone(),
            }),
            "keepalive" | "keepalive_timeout" | "keepalive_requests" | "keepalive_time" | "zone" => {}
            other => u.unexpressed.push((s.at.clone(), format!("upstream `{other}` (a balancing method Weir lacks)"))),
        }
    }
    u
}

/// Reads a limit or realip directive into `limits`; false if `d` is none of them.
fn limit_directive(d: &Directive, limits: &mut Limits) -> Result<bool, String> {
    let on_off = |d: &Directive| match d.arg(0) {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(bad(d, "expects on or off")),
    };
    let status = |d: &Directive| {
        d.arg(0)
            .parse::<u16>()
            .ok()
            .filter(|s| (400..=599).contains(s) || *s == 444)
            .ok_or_else(|| bad(d, "status must be 400-599"))
    };
    let at = d.at.clone();
    match d.name.as_str() {
        "limit_req" => {
            let mut lr = LimitReq { zone: String::new(), burst: 0, delay: None, at };
            for a in &d.args {
                if let Some(z) = a.strip_prefix("zone=") {
                    lr.zone = z.to_string();
                } else if let Some(b) = a.strip_prefix("burst=") {
                    lr.burst =
                        b.parse().ok().filter(|b| *b > 0).ok_or_else(|| bad(d, "burst must be an integer above 0"))?;
                } else if a == "nodelay" {
                    lr.delay = Some(u64::MAX);
                } else if let Some(n) = a.strip_prefix("delay=") {
                    lr.delay = Some(n.parse().ok().filter(|n| *n > 0).ok_or_else(|| bad(d, "delay must be above 0"))?);
                } else {
                    return Err(bad(d, &format!("invalid parameter {a:?}")));
                }
            }
            let list = limits.limit_req.get_or_insert_with(Vec::new);
            if list.iter().any(|l| l.zone == lr.zone) {
                return Err(bad(d, "is duplicate (nginx refuses the same zone twice in one context)"));
            }
            list.push(lr);
        }
        "limit_conn" => {
            let max = d
                .arg(1)
                .parse()
                .ok()
                .filter(|n| (1..=65535).contains(n))
                .ok_or_else(|| bad(d, "number must be 1-65535"))?;
            let list = limits.limit_conn.get_or_insert_with(Vec::new);
            if list.iter().any(|l| l.zone == d.arg(0)) {
                return Err(bad(d, "is duplicate"));
            }
            list.push(LimitConn { zone: d.arg(0).to_string(), max, at });
        }
        "limit_req_status" => limits.limit_req_status = Some((status(d)?, at)),
        "limit_conn_status" => limits.limit_conn_status = Some((status(d)?, at)),
        "limit_req_dry_run" => limits.limit_req_dry_run = Some((on_off(d)?, at)),
        "limit_conn_dry_run" => limits.limit_conn_dry_run = Some((on_off(d)?, at)),
        "limit_rate" => limits.limit_rate = Some((d.arg(0).to_string(), at)),
        "limit_rate_after" => limits.limit_rate_after = Some((d.arg(0).to_string(), at)),
        "allow" | "deny" => limits.access.get_or_insert_with(Vec::new).push(AccessRule {
            allow: d.name == "allow",
            what: d.arg(0).to_string(),
            at,
        }),
        "set_real_ip_from" => limits.real_ip_from.get_or_insert_with(Vec::new).push((d.arg(0).to_string(), at)),
        "real_ip_header" => limits.real_ip_header = Some((d.arg(0).to_string(), at)),
        "real_ip_recursive" => limits.real_ip_recursive = Some((on_off(d)?, at)),
        _ => return Ok(false),
    }
    Ok(true)
}

fn server(d: &Directive, ignored: &mut BTreeMap<String, At>) -> Result<Server, String> {
    let mut s = Server {
        at: d.at.clone(),
        listen: Vec::new(),
        names: Vec::new(),
        limits: Limits::default(),
        locations: Vec::new(),
        answered: None,
        unexpressed: Vec::new(),
    };
    for c in d.block.as_deref().unwrap_or(&[]) {
        match c.name.as_str() {
            "listen" => s.listen.push(listen(c)?),
            "server_name" => s.names.extend(c.args.iter().map(|n| (n.to_ascii_lowercase(), c.at.clone()))),
            "location" => s.locations.push(location(c, ignored)?),
            "return" => {
                s.answered.get_or_insert((c.at.clone(), format!("return {}", c.args.join(" "))));
            }
            _ => {
                if !limit_directive(c, &mut s.limits)? {
                    note_other(c, &mut s.unexpressed, ignored);
                }
            }
        }
    }
    if s.listen.is_empty() {
        // nginx: `listen *:80` when run as root, *:8000 otherwise.
        s.listen.push(Listen { port: 80, default_server: false, ssl: false, at: d.at.clone() });
    }
    Ok(s)
}

fn listen(d: &Directive) -> Result<Listen, String> {
    let addr = d.arg(0);
    if addr.starts_with("unix:") {
        return Err(bad(d, "a unix socket listener: Weir listens on TCP addresses"));
    }
    let port = if let Some(rest) = addr.strip_prefix('[') {
        rest.split_once("]:").map_or("80", |(_, p)| p)
    } else if addr.bytes().all(|b| b.is_ascii_digit()) {
        addr
    } else {
        addr.rsplit_once(':').map_or("80", |(_, p)| p)
    };
    let port = port.parse().map_err(|_| bad(d, "cannot read the port"))?;
    let flags = &d.args[1..];
    if flags.iter().any(|f| f == "proxy_protocol") {
        return Err(bad(d, "PROXY protocol: Weir's listeners speak plain HTTP (and TLS)"));
    }
    Ok(Listen {
        port,
        default_server: flags.iter().any(|f| f == "default_server" || f == "default"),
        ssl: flags.iter().any(|f| f == "ssl" || f == "quic"),
        at: d.at.clone(),
    })
}

fn location(d: &Directive, ignored: &mut BTreeMap<String, At>) -> Result<Location, String> {
    let (modifier, uri) = match (d.arg(0), d.args.len()) {
        ("=", 2) => (Modifier::Exact, d.arg(1)),
        ("^~", 2) => (Modifier::NoRegex, d.arg(1)),
        ("~", 2) => (Modifier::Regex, d.arg(1)),
        ("~*", 2) => (Modifier::RegexCaseless, d.arg(1)),
        (u, 1) if u.starts_with('@') => (Modifier::Named, u),
        (u, 1) if u.starts_with('=') => (Modifier::Exact, &u[1..]),
        (u, 1) if u.starts_with("^~") => (Modifier::NoRegex, &u[2..]),
        (u, 1) if u.starts_with("~*") => (Modifier::RegexCaseless, &u[2..]),
        (u, 1) if u.starts_with('~') => (Modifier::Regex, &u[1..]),
        (u, 1) => (Modifier::Prefix, u),
        _ => return Err(bad(d, "invalid location")),
    };
    let mut l = Location {
        modifier,
        uri: uri.to_string(),
        at: d.at.clone(),
        limits: Limits::default(),
        handler: Handler::Static,
        nested: Vec::new(),
        answered: None,
        unexpressed: Vec::new(),
    };
    for c in d.block.as_deref().unwrap_or(&[]) {
        match c.name.as_str() {
            "location" => l.nested.push(location(c, ignored)?),
            "proxy_pass" => l.handler = Handler::Proxy(c.arg(0).to_string(), c.at.clone()),
            "return" => {
                l.answered.get_or_insert((c.at.clone(), format!("return {}", c.args.join(" "))));
            }
            "root" => {
                ignored.entry("root".into()).or_insert_with(|| c.at.clone());
            }
            _ => {
                if !limit_directive(c, &mut l.limits)? {
                    note_other(c, &mut l.unexpressed, ignored);
                }
            }
        }
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::super::lexer::parse;
    use super::*;

    #[test]
    fn reads_zones_servers_locations_and_inheritance() {
        let text = "http {\n limit_req_zone $binary_remote_addr zone=one:10m rate=30r/m;\n limit_req zone=one burst=5;\n\
                    limit_req_status 429;\n server {\n  listen 127.0.0.1:8080 default_server;\n  server_name a.example *.b.example;\n\
                    location /api/ { limit_req zone=one nodelay; proxy_pass http://app; }\n  location / { proxy_pass http://app; }\n }\n}\n";
        let http = read(&parse("n.conf", text).unwrap()).unwrap();
        assert_eq!(http.req_zones[0].rate, 30);
        assert!(http.req_zones[0].per_minute);
        let s = &http.servers[0];
        assert_eq!(s.listen[0].port, 8080);
        assert!(s.listen[0].default_server);
        assert_eq!(s.names.len(), 2);
        let api = s.locations[0].limits.inherit(&s.limits.inherit(&http.limits));
        let lr = api.limit_req.unwrap();
        assert_eq!((lr[0].burst, lr[0].delay, lr[0].at.line), (0, Some(u64::MAX), 8));
        let root = s.locations[1].limits.inherit(&s.limits.inherit(&http.limits));
        assert_eq!(root.limit_req.unwrap()[0].burst, 5);
        assert_eq!(root.limit_req_status.unwrap().0, 429);
    }

    #[test]
    fn wrong_limit_directives_are_refused_with_their_line() {
        for (text, want) in [
            ("limit_req_zone $a zone=z:1m rate=0.5r/s;", "rate must be an integer"),
            ("limit_req_zone $a zone=z:1m rate=1r/s sync;", "NGINX Plus"),
            ("server { location / { limit_req zone=z burst=0; } }", "burst must be"),
            ("server { limit_req zone=z; limit_req zone=z; }", "duplicate"),
            ("server { limit_conn c 0; }", "1-65535"),
        ] {
            let e = read(&parse("w.conf", &format!("http {{\n{text}\n}}\n")).unwrap()).unwrap_err();
            assert!(e.starts_with("w.conf:2:") && e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn http_directives_outside_http_are_refused_as_nginx_does() {
        // AlbertDavletov/architecture-sprint-6 Exc6/README.md: limit_req_zone above `http {`.
        let text = "limit_req_zone $binary_remote_addr zone=z:1m rate=10r/m;\nhttp {\n    server { listen 80; }\n}\n";
        let e = read(&parse("o.conf", text).unwrap()).unwrap_err();
        assert!(e.starts_with("o.conf:1: `limit_req_zone` is not allowed here"), "{e}");
        // A conf.d site file (no `http` or `events` block) is the inside of `http`: read.
        let site = "limit_req_zone $binary_remote_addr zone=z:1m rate=10r/m;\nserver { listen 80; }\n";
        assert_eq!(read(&parse("s.conf", site).unwrap()).unwrap().req_zones.len(), 1);
    }
}
