//! The model as one Weir TOML under `route_order = "nginx"`, so Weir picks routes as nginx picks
//! locations: each `server` becomes a group of routes with its `server_name`s as one host list
//! (`.example.com` as `example.com` + `*.example.com`, `www.*` as written; the default server's
//! routes once more without a host), each `location` a route (`=` as `path`, `^~` as a
//! `path_prefix` with `skip_regex`, regexes as `path_regex` in file order, regexes nested in a
//! prefix first). What nginx inherits from `http` and `server` is written once, as `[defaults]`
//! and one `[[host_defaults]]` entry per server, and a route writes only what differs from the
//! level it inherits from (nested locations, dry run). Requests nginx answers itself (`return`,
//! files) get a stand-in route that denies without charging any limit. Every zone and route
//! carries the nginx file:line it came from.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use super::keys::{self, KeyPlan, Part};
use super::lexer::At;
use super::model::{AccessRule, Handler, Http, Limits, Location, Modifier, ReqZone, Server};
use crate::import::toml_text::{list, quote};

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Leave out (stand-in routes, named in notes) what Weir cannot express, instead of refusing.
    pub allow_unexpressed: bool,
    /// The nginx listen port to import when servers listen on several.
    pub port: Option<u16>,
    /// `[server] listen` of the output (default `0.0.0.0:PORT`).
    pub listen: Option<String>,
}

#[derive(Debug)]
pub struct Imported {
    pub toml: String,
    pub notes: Vec<String>,
}

/// How a route matches the path (nginx's location modifiers).
enum PathOut {
    Exact(String),
    Prefix { uri: String, skip_regex: bool },
    Regex(String),
}

/// A route in the making.
struct RouteOut {
    comment: String,
    path: PathOut,
    /// The server's names; `None` for the default server's copy.
    hosts: Option<Vec<String>>,
    /// The `[[host_defaults]]` entry the route inherits from (an index into `levels`).
    level: Option<usize>,
    body: Body,
}

enum Body {
    Proxy {
        upstream: String,
        limits: Box<Limits>,
        server_name: String,
    },
    /// nginx answers these itself, or Weir cannot express them: deny, charge nothing.
    StandIn(String),
}

/// A server as a `[[host_defaults]]` entry: its hosts and what it inherits from `http`.
struct HostLevel {
    hosts: Vec<String>,
    limits: Limits,
    server_name: String,
    at: At,
}

/// The fields Weir inherits, as the TOML lines they are written as (compared as text).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fields {
    limit_req: Option<String>,
    limit_req_status: String,
    limit_conn: Option<String>,
    limit_conn_status: String,
    access: Option<String>,
}

struct Tr<'a> {
    http: &'a Http,
    opts: &'a Options,
    refusals: Vec<String>,
    notes: Vec<String>,
    upstreams: BTreeMap<String, String>,
    /// (nginx zone, server name or "") → Weir zone name, in first-use order.
    zones_used: Vec<(String, Option<String>, String)>,
    conn_zones_used: Vec<(String, String)>,
    names: HashSet<String>,
    real_ip: Option<(Vec<String>, String, bool, String)>,
    /// A proxied location without `set_real_ip_from` (nginx keys it by the peer's address).
    without_real_ip: bool,
}

pub fn translate(http: &Http, sources: &[String], opts: &Options) -> Result<Imported, String> {
    let mut tr = Tr {
        http,
        opts,
        refusals: Vec::new(),
        notes: Vec::new(),
        upstreams: BTreeMap::new(),
        zones_used: Vec::new(),
        conn_zones_used: Vec::new(),
        names: HashSet::new(),
        real_ip: None,
        without_real_ip: false,
    };
    for (at, why) in &http.unexpressed {
        tr.unexpressed(at, why);
    }
    let port = tr.pick_port()?;
    let servers: Vec<&Server> =
        http.servers.iter().filter(|s| s.listen.iter().any(|l| l.port == port && !l.ssl)).collect();
    let default = servers.iter().position(|s| s.listen.iter().any(|l| l.port == port && l.default_server)).unwrap_or(0);
    let mut routes: Vec<RouteOut> = Vec::new();
    let mut fallback = Vec::new();
    let mut levels: Vec<HostLevel> = Vec::new();
    let mut taken: BTreeMap<String, At> = BTreeMap::new();
    for (i, s) in servers.iter().enumerate() {
        let mut hosts = Vec::new();
        for (name, at) in &s.names {
            match host_patterns(name) {
                Ok(patterns) => {
                    for p in patterns {
                        if let Some(first) = taken.get(&p) {
                            // nginx: "conflicting server name", the first server keeps it.
                            tr.notes.push(format!("{at}: server_name {p} is already the name of the server at {first}: nginx ignores it here"));
                        } else {
                            taken.insert(p.clone(), at.clone());
                            hosts.push(p);
                        }
                    }
                }
                Err(why) => tr.unexpressed(at, &format!("server_name {name}: {why}")),
            }
        }
        let server_name = s.names.first().map(|(n, _)| n.clone()).unwrap_or_default();
        if !hosts.is_empty() {
            levels.push(HostLevel {
                hosts: hosts.clone(),
                limits: s.limits.inherit(&http.limits),
                server_name: server_name.clone(),
                at: s.at.clone(),
            });
            routes.extend(tr.server_routes(s, Some(hosts), Some(levels.len() - 1)));
        }
        if i == default {
            fallback = tr.server_routes(s, None, None);
        }
    }
    routes.extend(fallback);
    if let (Some((_, _, _, at)), true) = (&tr.real_ip, tr.without_real_ip) {
        let line =
            format!("{at}: set_real_ip_from applies to some locations only: Weir has one [real_ip] for every route");
        if tr.opts.allow_unexpressed {
            tr.notes.push(format!("NOT the same: {line}"));
        } else {
            tr.refusals.push(line);
        }
    }
    // The levels' own zones (a level whose limits every location replaces still names them).
    tr.register_zones(&http.limits, None);
    for l in &levels {
        let (limits, name) = (l.limits.clone(), l.server_name.clone());
        tr.register_zones(&limits, Some(&name));
    }
    if !tr.refusals.is_empty() {
        return Err(format!(
            "{}\n(Weir cannot express these as nginx decides them; --allow-unexpressed imports the rest with \
             stand-in routes that deny these requests without charging a limit)",
            tr.refusals.join("\n")
        ));
    }
    let defaults = tr.fields(&http.limits, None);
    let level_fields: Vec<Fields> = levels.iter().map(|l| tr.fields(&l.limits, Some(&l.server_name))).collect();
    let route_text = tr.routes_text(&routes, &defaults, &level_fields)?;
    let mut toml = String::new();
    let _ =
        writeln!(toml, "# Imported from nginx by `weir import-nginx` ({}), listen port {port}.", sources.join(", "));
    let _ = writeln!(
        toml,
        "# One route group per server, routes in nginx's location order; docs/migrating-from-nginx.md explains the output."
    );
    let mut seen_notes = HashSet::new();
    tr.notes.retain(|n| seen_notes.insert(n.clone()));
    for note in &tr.notes {
        let _ = writeln!(toml, "# NOTE: {}", note.replace('\n', " "));
    }
    if !http.ignored.is_empty() {
        let ignored: Vec<String> = http.ignored.iter().map(|(n, at)| format!("{n} ({at})")).collect();
        let _ = writeln!(toml, "# Not translated (they change nothing Weir decides): {}", ignored.join(", "));
    }
    let _ = writeln!(toml, "route_order = \"nginx\"   # regexes before a plain prefix, `^~` as skip_regex");
    let listen = opts.listen.clone().unwrap_or_else(|| format!("0.0.0.0:{port}"));
    let _ = writeln!(toml, "\n[server]\nlisten = [{}]\n", quote(&listen));
    let _ = writeln!(
        toml,
        "[store]\nkind = \"memory\"   # one instance; for limits shared by a fleet: kind = \"redis\", url = \"redis://…\"\n"
    );
    if let Some((trusted, header, recursive, at)) = &tr.real_ip {
        let _ = writeln!(toml, "[real_ip]   # nginx: set_real_ip_from / real_ip_header ({at})");
        let _ = writeln!(toml, "trusted = {}\nheader = {}", list(trusted), quote(header));
        if !recursive {
            let _ = writeln!(toml, "recursive = false   # nginx's real_ip_recursive off (its default)");
        }
        toml.push('\n');
    }
    for text in tr.upstreams.values() {
        let _ = writeln!(toml, "{text}");
    }
    toml.push_str(&tr.zones_text()?);
    let _ = writeln!(toml, "[defaults]   # nginx's http level: inherited by every route that sets none of a field");
    write_fields(&defaults, None, &mut toml);
    toml.push('\n');
    for (l, f) in levels.iter().zip(&level_fields) {
        if *f == defaults {
            continue;
        }
        let _ = writeln!(toml, "[[host_defaults]]   # nginx: server ({})", l.at);
        let _ = writeln!(toml, "hosts = {}", list(&l.hosts));
        write_fields(f, Some(&defaults), &mut toml);
        toml.push('\n');
    }
    toml.push_str(&route_text);
    let notes = tr.notes;
    Ok(Imported { toml, notes })
}

/// Writes the fields of `own` that differ from `inherited` (all of them without a parent).
fn write_fields(own: &Fields, inherited: Option<&Fields>, out: &mut String) {
    let parent = |f: fn(&Fields) -> Option<&String>| inherited.and_then(f);
    let own_parent = [
        (own.limit_req.as_ref(), parent(|f| f.limit_req.as_ref()), "limit_req = []"),
        (Some(&own.limit_req_status), parent(|f| Some(&f.limit_req_status)), ""),
        (own.limit_conn.as_ref(), parent(|f| f.limit_conn.as_ref()), "limit_conn = []"),
        (Some(&own.limit_conn_status), parent(|f| Some(&f.limit_conn_status)), ""),
        (own.access.as_ref(), parent(|f| f.access.as_ref()), "allow = []\ndeny = []"),
    ];
    for (mine, theirs, none) in own_parent {
        if mine == theirs {
            continue;
        }
        match mine {
            Some(text) => {
                let _ = writeln!(out, "{text}");
            }
            None if !none.is_empty() => {
                let _ = writeln!(out, "{none}   # nginx: none here (the inherited ones do not apply)");
            }
            None => {}
        }
    }
}

/// A `server_name` as Weir host patterns; `Ok(empty)` for the names that match no host.
fn host_patterns(name: &str) -> Result<Vec<String>, &'static str> {
    Ok(if name.is_empty() || name == "_" || name == "\"\"" {
        Vec::new()
    } else if name.starts_with('~') {
        return Err("a regex server name (Weir matches host names exactly, as *.suffix or as prefix.*)");
    } else if let Some(rest) = name.strip_prefix('.') {
        // nginx's `.example.com`: the name and every subdomain.
        vec![rest.to_string(), format!("*.{rest}")]
    } else if name.contains('*') && !name.starts_with("*.") && !name.ends_with(".*") {
        return Err("a wildcard in the middle of a name (nginx allows `*.` first or `.*` last only)");
    } else {
        vec![name.to_string()]
    })
}

impl Tr<'_> {
    fn unexpressed(&mut self, at: &At, why: &str) {
        let line = format!("{at}: {why}");
        if self.opts.allow_unexpressed {
            self.notes.push(format!("left out: {line}"));
        } else if !self.refusals.contains(&line) {
            self.refusals.push(line);
        }
    }

    fn pick_port(&mut self) -> Result<u16, String> {
        let mut ports: Vec<u16> =
            self.http.servers.iter().flat_map(|s| s.listen.iter().filter(|l| !l.ssl).map(|l| l.port)).collect();
        ports.sort_unstable();
        ports.dedup();
        for s in &self.http.servers {
            for l in s.listen.iter().filter(|l| l.ssl) {
                self.notes.push(format!(
                    "{}: listen {} ssl: TLS listeners are not imported (see [server] listen_tls)",
                    l.at, l.port
                ));
            }
        }
        match (self.opts.port, ports.as_slice()) {
            (Some(p), _) if ports.contains(&p) => Ok(p),
            (Some(p), _) => Err(format!("no server listens on port {p} without ssl (ports: {ports:?})")),
            (None, [p]) => Ok(*p),
            (None, []) => Err("no `server` block listens on a plain HTTP port".into()),
            (None, _) => Err(format!("servers listen on several ports {ports:?}: import one at a time with --port")),
        }
    }

    /// One server's routes for its hosts (or, for the default server's copy, none).
    fn server_routes(&mut self, s: &Server, hosts: Option<Vec<String>>, level: Option<usize>) -> Vec<RouteOut> {
        let base = s.limits.inherit(&self.http.limits);
        let server_name = s.names.first().map(|(n, _)| n.clone()).unwrap_or_default();
        let mut out = Vec::new();
        let stand_in_all = |why: String| {
            vec![RouteOut {
                comment: why.clone(),
                path: PathOut::Prefix { uri: "/".into(), skip_regex: false },
                hosts: hosts.clone(),
                level,
                body: Body::StandIn(why),
            }]
        };
        if let Some((at, what)) = &s.answered {
            // nginx's rewrite phase answers before any limit: the stand-in must not charge.
            self.unexpressed(
                at,
                &format!("`{what}`: nginx answers every request of this server itself (before any limit)"),
            );
            return stand_in_all(format!("{at}: nginx answers `{what}` itself (before any limit)"));
        }
        if let Some((at, why)) = s.unexpressed.first() {
            self.unexpressed(at, why);
            return stand_in_all(format!("{at}: {why}"));
        }
        let mut flat = Flat::default();
        for l in &s.locations {
            self.flatten(l, &base, None, &mut flat);
        }
        let has_root = flat.prefixes.iter().chain(&flat.noregex).any(|(l, _)| l.uri == "/");
        // Weir tries path_regex routes in file order: the regexes nested in a prefix first.
        let ordered: Vec<(&Location, Limits, PathOut)> = flat
            .exact
            .iter()
            .map(|(l, e)| (*l, e.clone(), PathOut::Exact(l.uri.clone())))
            .chain(flat.nested_regex.iter().map(|(l, e)| (*l, e.clone(), PathOut::Regex(regex_of(l)))))
            .chain(flat.regex.iter().map(|(l, e)| (*l, e.clone(), PathOut::Regex(regex_of(l)))))
            .chain(
                flat.noregex
                    .iter()
                    .map(|(l, e)| (*l, e.clone(), PathOut::Prefix { uri: l.uri.clone(), skip_regex: true })),
            )
            .chain(
                flat.prefixes
                    .iter()
                    .map(|(l, e)| (*l, e.clone(), PathOut::Prefix { uri: l.uri.clone(), skip_regex: false })),
            )
            .collect();
        let mut seen: Vec<(String, At)> = Vec::new();
        for (l, eff, path) in ordered {
            let comment = format!("{}: location {}{}", l.at, modifier_text(l.modifier), l.uri);
            // A plain prefix `/api/` behind the regex `^/api/` (or a regex written twice): nginx
            // never picks it either.
            let same_as = match &path {
                PathOut::Prefix { uri, skip_regex: false } => Some(format!("^{}", regex::escape(uri))),
                PathOut::Regex(re) => Some(re.clone()),
                _ => None,
            };
            if let Some(re) = same_as {
                if let Some((_, first)) = seen.iter().find(|(r, _)| *r == re) {
                    self.notes.push(format!(
                        "{}: location {} can never match (the location at {first} always wins): not imported",
                        l.at, l.uri
                    ));
                    continue;
                }
                if let PathOut::Regex(re) = &path {
                    if let Err(e) = regex::Regex::new(re) {
                        self.unexpressed(
                            &l.at,
                            &format!("location regex {:?}: {e} (a PCRE feature Rust's regex lacks)", l.uri),
                        );
                        continue;
                    }
                    seen.push((re.clone(), l.at.clone()));
                }
            }
            let body = self.location_body(l, &eff, &server_name);
            out.push(RouteOut { comment, path, hosts: hosts.clone(), level, body });
        }
        if !has_root {
            let why = format!("{}: no location matches: nginx serves files from its root", s.at);
            self.unexpressed(
                &s.at,
                "the paths no location of this server matches: nginx serves files from its root (add `location /`)",
            );
            out.push(RouteOut {
                comment: why.clone(),
                path: PathOut::Prefix { uri: "/".into(), skip_regex: false },
                hosts: hosts.clone(),
                level,
                body: Body::StandIn(why),
            });
        }
        out
    }

    fn flatten<'l>(&mut self, l: &'l Location, parent: &Limits, outer: Option<&'l Location>, flat: &mut Flat<'l>) {
        let eff = l.limits.inherit(parent);
        match l.modifier {
            Modifier::Named => {
                self.notes.push(format!(
                    "{}: named location {} is reached only by internal redirects: not imported",
                    l.at, l.uri
                ));
                return;
            }
            Modifier::Exact => flat.exact.push((l, eff.clone())),
            Modifier::NoRegex => flat.noregex.push((l, eff.clone())),
            Modifier::Prefix => flat.prefixes.push((l, eff.clone())),
            Modifier::Regex | Modifier::RegexCaseless => match outer {
                None => flat.regex.push((l, eff.clone())),
                Some(o)
                    if o.modifier != Modifier::Regex
                        && o.modifier != Modifier::RegexCaseless
                        && anchored_within(l, &o.uri) =>
                {
                    flat.nested_regex.push((l, eff.clone()))
                }
                Some(o) => self.unexpressed(
                    &l.at,
                    &format!(
                        "regex location {:?} nested in {} ({}): only a regex anchored with `^` and the outer prefix \
                         is imported",
                        l.uri, o.uri, o.at
                    ),
                ),
            },
        }
        for n in &l.nested {
            if matches!(l.modifier, Modifier::Regex | Modifier::RegexCaseless) {
                self.unexpressed(&n.at, "a location nested in a regex location");
                continue;
            }
            self.flatten(n, &eff, Some(l), flat);
        }
    }

    fn location_body(&mut self, l: &Location, eff: &Limits, server_name: &str) -> Body {
        if let Some((at, what)) = &l.answered {
            self.unexpressed(at, &format!("`{what}`: nginx answers this location itself (before any limit)"));
            return Body::StandIn(format!("{at}: nginx answers `{what}` itself (before any limit)"));
        }
        if let Some((at, why)) = l.unexpressed.first() {
            self.unexpressed(at, why);
            return Body::StandIn(format!("{at}: {why}"));
        }
        let Handler::Proxy(url, at) = &l.handler else {
            let why = format!("{}: location {} serves files (no proxy_pass)", l.at, l.uri);
            self.unexpressed(
                &l.at,
                &format!(
                    "location {}: nginx serves files here (no proxy_pass); Weir forwards to upstreams only",
                    l.uri
                ),
            );
            return Body::StandIn(why);
        };
        match self.upstream_of(url, at, l) {
            Ok(upstream) => {
                self.check_limits(eff, server_name);
                Body::Proxy { upstream, limits: Box::new(eff.clone()), server_name: server_name.to_string() }
            }
            Err(why) => {
                self.unexpressed(at, &why);
                Body::StandIn(format!("{at}: {why}"))
            }
        }
    }

    /// Registers the Weir zones a level's limits name (a per-server zone only with a server).
    fn register_zones(&mut self, eff: &Limits, server_name: Option<&str>) {
        for lr in eff.limit_req.iter().flatten() {
            let Some(z) = self.http.req_zones.iter().find(|z| z.name == lr.zone) else {
                self.unexpressed(&lr.at, &format!("limit_req: unknown zone {:?} (nginx refuses it too)", lr.zone));
                continue;
            };
            match keys::plan(&z.key, self.http) {
                Ok(plan) => {
                    let server = match (plan.per_server, server_name) {
                        (false, _) => None,
                        (true, Some(s)) => Some(s.to_string()),
                        (true, None) => continue,
                    };
                    if !self.zones_used.iter().any(|(n, s, _)| *n == z.name && *s == server) {
                        let weir = self.zone_name(&z.name, server.as_deref());
                        self.zones_used.push((z.name.clone(), server, weir));
                    }
                }
                Err(e) => self.unexpressed(&z.at, &format!("limit_req_zone {}: key {}: {e}", z.name, z.key)),
            }
        }
        for lc in eff.limit_conn.iter().flatten() {
            let Some(z) = self.http.conn_zones.iter().find(|z| z.name == lc.zone) else {
                self.unexpressed(&lc.at, &format!("limit_conn: unknown zone {:?} (nginx refuses it too)", lc.zone));
                continue;
            };
            match keys::plan(&z.key, self.http) {
                Ok(p) if !p.overrides.is_empty() => self.unexpressed(
                    &z.at,
                    &format!(
                        "limit_conn_zone {}: key {}: nested networks with different answers on a limit_conn zone \
                         have no Weir form",
                        z.name, z.key
                    ),
                ),
                Ok(p) if p.per_server => {
                    self.unexpressed(&z.at, &format!("limit_conn_zone {}: `$server_name` in a limit_conn key", z.name))
                }
                Ok(_) => {
                    if !self.conn_zones_used.iter().any(|(n, _)| *n == z.name) {
                        let weir = self.zone_name(&z.name, None);
                        self.conn_zones_used.push((z.name.clone(), weir));
                    }
                }
                Err(e) => self.unexpressed(&z.at, &format!("limit_conn_zone {}: key {}: {e}", z.name, z.key)),
            }
        }
    }

    /// Checks what routes_text will need: zones exist, keys translate, statuses, real IP.
    fn check_limits(&mut self, eff: &Limits, server_name: &str) {
        self.register_zones(eff, Some(server_name));
        if let Some(rules) = &eff.access {
            let kinds: Vec<bool> = rules.iter().map(|r| r.allow).collect();
            let changes = kinds.windows(2).filter(|w| w[0] != w[1]).count();
            if changes > 1 {
                self.unexpressed(
                    &rules[0].at,
                    "allow/deny interleaved more than once: Weir keeps one allow list and one deny list, in order",
                );
            }
        }
        for (v, at, what) in [
            (eff.limit_rate.as_ref().map(|(v, a)| (v.clone(), a.clone())), "limit_rate"),
            (eff.limit_rate_after.as_ref().map(|(v, a)| (v.clone(), a.clone())), "limit_rate_after"),
        ]
        .into_iter()
        .filter_map(|(x, w)| x.map(|(v, a)| (v, a, w)))
        {
            if size(&v).is_none() {
                self.unexpressed(&at, &format!("{what} {v}: not a size Weir reads (a variable?)"));
            }
        }
        // One [real_ip] for the whole config.
        self.without_real_ip |= eff.real_ip_from.is_none();
        if let Some(from) = &eff.real_ip_from {
            let trusted: Vec<String> =
                from.iter().filter(|(f, _)| !f.starts_with("unix:")).map(|(f, _)| f.clone()).collect();
            let header = eff.real_ip_header.as_ref().map_or("X-Real-IP".to_string(), |(h, _)| h.clone());
            if header == "proxy_protocol" {
                self.unexpressed(&from[0].1, "real_ip_header proxy_protocol: Weir does not speak the PROXY protocol");
                return;
            }
            let recursive = eff.real_ip_recursive.as_ref().is_some_and(|(r, _)| *r);
            let at = from[0].1.to_string();
            match &self.real_ip {
                None => self.real_ip = Some((trusted, header, recursive, at)),
                Some((t, h, r, _)) if *t == trusted && *h == header && *r == recursive => {}
                Some((_, _, _, first)) => {
                    let first = first.clone();
                    self.unexpressed(
                        &from[0].1,
                        &format!(
                            "real IP settings differ from those at {first}: Weir has one [real_ip] for every route"
                        ),
                    )
                }
            }
        }
    }

    fn zone_name(&mut self, nginx: &str, server: Option<&str>) -> String {
        let raw = match server {
            Some(s) => format!("{nginx}.{s}"),
            None => nginx.to_string(),
        };
        let mut name: String = raw
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || "_.-".contains(c) { c } else { '_' })
            .take(60)
            .collect();
        let base = name.clone();
        let mut n = 2;
        while !self.names.insert(name.clone()) {
            name = format!("{base}{n}");
            n += 1;
        }
        name
    }

    /// `proxy_pass` as the name of a Weir upstream (written once).
    fn upstream_of(&mut self, url: &str, at: &At, l: &Location) -> Result<String, String> {
        if url.contains('$') {
            return Err(format!("proxy_pass {url}: variables in proxy_pass have no Weir form"));
        }
        let (tls, rest) = if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else {
            return Err(format!("proxy_pass {url}: not an http:// or https:// URL"));
        };
        // `http://unix:/run/app.sock:/uri`: the socket path ends at the next `:`.
        let (authority, path) = match rest.strip_prefix("unix:") {
            Some(unix) => {
                let (sock, uri) = unix.split_once(':').unwrap_or((unix, ""));
                (&rest[..5 + sock.len()], uri)
            }
            None => rest.find('/').map_or((rest, ""), |i| (&rest[..i], &rest[i..])),
        };
        let path_kept =
            path.is_empty() || (l.modifier == Modifier::Prefix || l.modifier == Modifier::NoRegex) && path == l.uri;
        if !path_kept {
            return Err(format!(
                "proxy_pass {url}: the URI part {path:?} makes nginx replace the location's prefix; Weir forwards the path unchanged"
            ));
        }
        if let Some(u) = self.http.upstreams.iter().find(|u| u.name == authority) {
            let name = sanitize(&u.name);
            if !self.upstreams.contains_key(&name) {
                for (uat, why) in &u.unexpressed {
                    self.unexpressed(uat, why);
                }
                let mut servers = Vec::new();
                for s in &u.servers {
                    match upstream_server(&s.address, &s.params) {
                        Ok(Some(text)) => servers.push(text),
                        Ok(None) => self.notes.push(format!("{}: server {} is `down`: left out", s.at, s.address)),
                        Err(e) => self.unexpressed(&s.at, &format!("upstream {} server {}: {e}", u.name, s.address)),
                    }
                }
                if servers.is_empty() {
                    return Err(format!("upstream {} ({}): no server Weir can use", u.name, u.at));
                }
                let text = format!(
                    "[[upstream]]   # nginx: upstream {} ({})\nname = {}\nservers = {}\n{}",
                    u.name,
                    u.at,
                    quote(&name),
                    list(&servers),
                    if tls {
                        "tls = true\nverify = false   # nginx's proxy_ssl_verify is off by default\n"
                    } else {
                        ""
                    }
                );
                self.upstreams.insert(name.clone(), text);
            }
            return Ok(name);
        }
        // `host:port` and `unix:/path` as written; a bare host gets the scheme's port.
        let server = if authority.contains(':') {
            authority.to_string()
        } else {
            format!("{authority}:{}", if tls { 443 } else { 80 })
        };
        let name = sanitize(&server);
        self.upstreams.entry(name.clone()).or_insert_with(|| {
            format!(
                "[[upstream]]   # nginx: proxy_pass {url} ({at})\nname = {}\nservers = [{}]\n{}",
                quote(&name),
                quote(&server),
                if tls { "tls = true\nverify = false   # nginx's proxy_ssl_verify is off by default\n" } else { "" }
            )
        });
        Ok(name)
    }

    fn zones_text(&mut self) -> Result<String, String> {
        let mut out = String::new();
        for (nginx, server, weir) in self.zones_used.clone() {
            let z: &ReqZone = self.http.req_zones.iter().find(|z| z.name == nginx).ok_or("zone vanished")?;
            let plan = keys::plan(&z.key, self.http)?;
            for n in &plan.notes {
                self.notes.push(format!("{}: {n}", z.at));
            }
            let unit = if z.per_minute { "r/m" } else { "r/s" };
            let _ = writeln!(
                out,
                "[[limit_req_zone]]   # nginx: limit_req_zone {} zone={} rate={}{unit} ({})",
                z.key, z.name, z.rate, z.at
            );
            if z.per_minute && !(z.rate * 1000).is_multiple_of(60) {
                let _ = writeln!(
                    out,
                    "# NOTE: nginx truncates {}r/m to {} milli-requests a second; Weir keeps the exact rate",
                    z.rate,
                    z.rate * 1000 / 60
                );
            }
            let _ = writeln!(out, "name = {}", quote(&weir));
            let _ = writeln!(out, "key = {}", key_text(&plan, server.as_deref()));
            let _ = writeln!(out, "rate = \"{}{unit}\"", z.rate);
            for o in &plan.overrides {
                let rate = if o.exempt { "unlimited".to_string() } else { format!("{}{unit}", z.rate) };
                let _ = writeln!(
                    out,
                    "[[limit_req_zone.override]]   # {}\nmatch = {}\nrate = {}",
                    if o.exempt {
                        "the map/geo gives these an empty key: not limited"
                    } else {
                        "a more specific entry that keeps the limit"
                    },
                    quote(&o.matches),
                    quote(&rate)
                );
            }
            out.push('\n');
        }
        for (nginx, weir) in self.conn_zones_used.clone() {
            let z = self.http.conn_zones.iter().find(|z| z.name == nginx).ok_or("zone vanished")?;
            let plan = keys::plan(&z.key, self.http)?;
            let _ =
                writeln!(out, "[[limit_conn_zone]]   # nginx: limit_conn_zone {} zone={} ({})", z.key, z.name, z.at);
            let _ = writeln!(out, "name = {}\nkey = {}\n", quote(&weir), key_text(&plan, None));
        }
        Ok(out)
    }

    fn routes_text(&mut self, routes: &[RouteOut], defaults: &Fields, levels: &[Fields]) -> Result<String, String> {
        let mut out = String::new();
        for (i, r) in routes.iter().enumerate() {
            let _ = writeln!(out, "[[route]]   # nginx: {}", r.comment);
            let _ = writeln!(out, "name = {}", quote(&format!("r{}", i + 1)));
            match &r.hosts {
                Some(h) if h.len() == 1 => {
                    let _ = writeln!(out, "host = {}", quote(&h[0]));
                }
                Some(h) => {
                    let _ = writeln!(out, "host = {}", list(h));
                }
                None => {}
            }
            match &r.path {
                PathOut::Exact(p) => {
                    let _ = writeln!(out, "path = {}", quote(p));
                }
                PathOut::Prefix { uri, skip_regex } => {
                    let _ = writeln!(out, "path_prefix = {}", quote(uri));
                    if *skip_regex {
                        let _ = writeln!(out, "skip_regex = true");
                    }
                }
                PathOut::Regex(re) => {
                    let _ = writeln!(out, "path_regex = {}", quote(re));
                }
            }
            let inherited = r.level.and_then(|l| levels.get(l)).unwrap_or(defaults);
            match &r.body {
                Body::StandIn(why) => {
                    let _ = writeln!(out, "# stand-in: {}", why.replace('\n', " "));
                    let _ = writeln!(out, "upstream = {}", quote(&self.stand_in_upstream()));
                    let _ = writeln!(
                        out,
                        "deny = [\"all\"]   # nginx does not forward these: Weir refuses them without charging a limit"
                    );
                    if inherited.limit_req.is_some() {
                        let _ = writeln!(out, "limit_req = []");
                    }
                    if inherited.limit_conn.is_some() {
                        let _ = writeln!(out, "limit_conn = []");
                    }
                }
                Body::Proxy { upstream, limits, server_name } => {
                    let _ = writeln!(out, "upstream = {}", quote(upstream));
                    let own = self.fields(limits, Some(server_name));
                    if own.limit_req.is_none() {
                        let _ = writeln!(out, "# no limit_req in nginx for this location");
                    }
                    write_fields(&own, Some(inherited), &mut out);
                    self.rate_text(limits, &mut out);
                }
            }
            out.push('\n');
        }
        Ok(out)
    }

    /// Stand-in routes deny everything; they still need an upstream to name.
    fn stand_in_upstream(&mut self) -> String {
        if let Some(first) = self.upstreams.keys().next() {
            return first.clone();
        }
        self.upstreams.insert(
            "unused".into(),
            "[[upstream]]   # only for the stand-in routes (they deny every request)\nname = \"unused\"\nservers = [\"127.0.0.1:9\"]\n".into(),
        );
        "unused".into()
    }

    /// A level's inherited fields as TOML lines. `server`: the server whose name a per-server
    /// zone is keyed by (`None` at the http level, where such a zone has no one name).
    fn fields(&mut self, eff: &Limits, server: Option<&str>) -> Fields {
        let req_dry = eff.limit_req_dry_run.as_ref().is_some_and(|(d, _)| *d);
        let limit_req = eff.limit_req.as_ref().and_then(|list| {
            let mut entries = Vec::new();
            for lr in list {
                let z = self.http.req_zones.iter().find(|z| z.name == lr.zone)?;
                let plan = keys::plan(&z.key, self.http).ok()?;
                let server = if plan.per_server { Some(server?.to_string()) } else { None };
                let (_, _, weir) = self.zones_used.iter().find(|(n, s, _)| *n == lr.zone && *s == server)?;
                let mut e = format!("{{ zone = {}, burst = {}", quote(weir), lr.burst);
                match lr.delay {
                    Some(d) if d >= lr.burst => e.push_str(", nodelay = true"),
                    Some(d) => {
                        let _ = write!(e, ", delay = {d}");
                    }
                    None => {}
                }
                if req_dry {
                    e.push_str(", dry_run = true");
                }
                e.push_str(&conditions_text(&plan));
                let _ = write!(e, " }},   # {}", lr.at);
                entries.push(e);
            }
            Some(format!("limit_req = [\n  {}\n]", entries.join("\n  ")))
        });
        let conn_dry = eff.limit_conn_dry_run.as_ref().is_some_and(|(d, _)| *d);
        let limit_conn = eff.limit_conn.as_ref().and_then(|list| {
            let mut conns = Vec::new();
            for lc in list {
                let (_, weir) = self.conn_zones_used.iter().find(|(n, _)| *n == lc.zone)?;
                let z = self.http.conn_zones.iter().find(|z| z.name == lc.zone)?;
                let plan = keys::plan(&z.key, self.http).ok()?;
                conns.push(format!(
                    "{{ zone = {}, max = {}{}{} }},   # {}",
                    quote(weir),
                    lc.max,
                    if conn_dry { ", dry_run = true" } else { "" },
                    conditions_text(&plan),
                    lc.at
                ));
            }
            Some(format!("limit_conn = [\n  {}\n]", conns.join("\n  ")))
        });
        let status = |what: &str, s: &Option<(u16, At)>| match s {
            Some((444, at)) => format!("{what} = 444   # {at}: close the connection without a response"),
            Some((s, at)) => format!("{what} = {s}   # {at}"),
            None => format!("{what} = 503   # nginx's default (Weir's own is 429)"),
        };
        let access = eff.access.as_ref().map(|rules| access_text(rules, &mut self.notes));
        Fields {
            limit_req,
            limit_req_status: status("limit_req_status", &eff.limit_req_status),
            limit_conn,
            limit_conn_status: status("limit_conn_status", &eff.limit_conn_status),
            access,
        }
    }

    /// `limit_rate`: a route's own (Weir does not inherit it).
    fn rate_text(&mut self, eff: &Limits, out: &mut String) {
        if let Some((rate, at)) = &eff.limit_rate {
            if size(rate).is_some_and(|s| s > 0) {
                let _ = writeln!(out, "limit_rate = {}   # {at}", quote(&rate.to_ascii_lowercase()));
                if let Some((after, at)) = &eff.limit_rate_after {
                    let _ = writeln!(out, "limit_rate_after = {}   # {at}", quote(&after.to_ascii_lowercase()));
                }
            }
        }
    }
}

/// `, when = [ … ], unless = [ … ]`: when nginx's key is empty, from the zone's map/geo.
fn conditions_text(plan: &KeyPlan) -> String {
    let mut out = String::new();
    if !plan.when.is_empty() {
        let _ = write!(out, ", when = [ {} ]", plan.when.join(", "));
    }
    if !plan.unless.is_empty() {
        let _ = write!(out, ", unless = [ {} ]", plan.unless.join(", "));
    }
    out
}

/// allow/deny in nginx's order: Weir keeps the order of the entries in the text.
fn access_text(rules: &[AccessRule], notes: &mut Vec<String>) -> String {
    let usable: Vec<&AccessRule> = rules
        .iter()
        .filter(|r| {
            let unix = r.what.starts_with("unix:");
            if unix {
                notes.push(format!(
                    "{}: {} unix: has no meaning for Weir's TCP clients",
                    r.at,
                    if r.allow { "allow" } else { "deny" }
                ));
            }
            !unix
        })
        .collect();
    let mut lines = Vec::new();
    let mut i = 0;
    while i < usable.len() {
        let allow = usable[i].allow;
        let run: Vec<&str> = usable[i..].iter().take_while(|r| r.allow == allow).map(|r| r.what.as_str()).collect();
        lines.push(format!("{} = {}   # {}", if allow { "allow" } else { "deny" }, list(&run), usable[i].at));
        i += run.len();
    }
    lines.join("\n")
}

#[derive(Default)]
struct Flat<'l> {
    exact: Vec<(&'l Location, Limits)>,
    nested_regex: Vec<(&'l Location, Limits)>,
    noregex: Vec<(&'l Location, Limits)>,
    regex: Vec<(&'l Location, Limits)>,
    prefixes: Vec<(&'l Location, Limits)>,
}

fn regex_of(l: &Location) -> String {
    if l.modifier == Modifier::RegexCaseless {
        format!("(?i){}", l.uri)
    } else {
        l.uri.clone()
    }
}

/// `^/api/v[0-9]+` nested in `/api/`: every match starts with the outer prefix.
fn anchored_within(l: &Location, outer: &str) -> bool {
    let Some(body) = l.uri.strip_prefix('^') else { return false };
    let literal: String = body.chars().take_while(|c| !"\\.[](){}*+?|^$".contains(*c)).collect();
    literal.starts_with(outer) && l.modifier == Modifier::Regex
}

fn modifier_text(m: Modifier) -> &'static str {
    match m {
        Modifier::Prefix | Modifier::Named => "",
        Modifier::NoRegex => "^~ ",
        Modifier::Exact => "= ",
        Modifier::Regex => "~ ",
        Modifier::RegexCaseless => "~* ",
    }
}

fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || "_.-".contains(c) { c } else { '_' }).collect()
}

fn key_text(plan: &KeyPlan, server: Option<&str>) -> String {
    let mut parts: Vec<String> = plan.parts.iter().map(Part::weir).collect();
    if let Some(s) = server {
        parts.push(format!("const:{s}"));
    }
    match parts.as_slice() {
        [one] => quote(one),
        _ => list(&parts),
    }
}

/// `10k`, `1m`, `500`: bytes (nginx sizes are 1024-based, as Weir's).
fn size(text: &str) -> Option<u64> {
    let t = text.to_ascii_lowercase();
    let (num, mult) = match t.chars().last()? {
        'k' => (&t[..t.len() - 1], 1024),
        'm' => (&t[..t.len() - 1], 1024 * 1024),
        'g' => (&t[..t.len() - 1], 1024 * 1024 * 1024),
        _ => (&t[..], 1),
    };
    num.parse::<u64>().ok().map(|n| n * mult)
}

/// nginx `server` line parameters in Weir's `servers` syntax; `None` for a `down` server.
fn upstream_server(address: &str, params: &[String]) -> Result<Option<String>, String> {
    let mut out = if address.contains(':') { address.to_string() } else { format!("{address}:80") };
    for p in params {
        if p == "down" {
            return Ok(None);
        }
        if p == "backup" {
            return Err("`backup`: Weir has no backup servers".into());
        }
        let (k, v) = p.split_once('=').ok_or_else(|| format!("parameter {p:?}"))?;
        match k {
            "weight" | "max_fails" | "max_conns" => {
                let _ = write!(out, " {k}={v}");
            }
            // nginx: a zero window never keeps the server out (gunicorn's documented shape).
            "fail_timeout" if v.trim_end_matches('s') == "0" => out.push_str(" max_fails=0"),
            "fail_timeout" => {
                let v = if v.bytes().all(|b| b.is_ascii_digit()) { format!("{v}s") } else { v.to_string() };
                let _ = write!(out, " fail_timeout={v}");
            }
            _ => return Err(format!("parameter {p:?} (NGINX Plus or unknown)")),
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::super::{lexer, model};
    use super::*;

    fn import(text: &str, allow_unexpressed: bool) -> Result<String, String> {
        let http = model::read(&lexer::parse("t.conf", text)?)?;
        let opts = Options { allow_unexpressed, ..Options::default() };
        translate(&http, &["t.conf".into()], &opts).map(|i| i.toml)
    }

    /// The nginx comment of the route Weir picks for (host, path).
    fn chosen(toml: &str, host: &str, path: &str) -> String {
        let rt = crate::config::from_text(toml, "imported.toml").unwrap_or_else(|e| panic!("{e}\n{toml}"));
        let i =
            crate::routes::find(&rt.matchers, rt.route_order, Some(host), &http::Method::GET, path).expect("a route");
        let name = &rt.routes[i].name;
        let at = toml.find(&format!("name = \"{name}\"\n")).unwrap();
        let head = toml[..at].rfind("[[route]]").unwrap();
        toml[head..at].lines().next().unwrap().trim_start_matches("[[route]]   # nginx: ").to_string()
    }

    const ORDER: &str = "http {\n\
        server {\n listen 80;\n\
        location / { proxy_pass http://127.0.0.1:9000; }\n\
        location /img/ { proxy_pass http://127.0.0.1:9000; }\n\
        location ^~ /static/ { proxy_pass http://127.0.0.1:9000; }\n\
        location ~* \\.(png|gif)$ { proxy_pass http://127.0.0.1:9000; }\n\
        location ~ ^/api/ { proxy_pass http://127.0.0.1:9000; }\n\
        location = /api/x { proxy_pass http://127.0.0.1:9000; }\n\
        location /api/ { location ~ ^/api/v2/ { proxy_pass http://127.0.0.1:9000; } proxy_pass http://127.0.0.1:9000; }\n\
        }\n}\n";

    #[test]
    fn locations_are_chosen_in_nginx_order() {
        let toml = import(ORDER, false).unwrap();
        for (path, want) in [
            ("/", "t.conf:4: location /"),
            ("/img/a.txt", "t.conf:5: location /img/"),
            ("/img/a.PNG", "t.conf:7: location ~* \\.(png|gif)$"),
            ("/static/a.png", "t.conf:6: location ^~ /static/"),
            ("/api/x", "t.conf:9: location = /api/x"),
            ("/api/y", "t.conf:8: location ~ ^/api/"),
            ("/api/v2/z", "t.conf:10: location ~ ^/api/v2/"),
            // `location /api/` can never match (the regex `^/api/` always wins): left out, noted.
            ("/other.gif", "t.conf:7: location ~* \\.(png|gif)$"),
        ] {
            assert_eq!(chosen(&toml, "h", path), want, "{path}");
        }
    }

    const SERVERS: &str = "http {\n\
        limit_req_zone $binary_remote_addr zone=z:1m rate=1r/s;\n\
        server { listen 80; server_name a.example; location / { proxy_pass http://127.0.0.1:9000; } }\n\
        server { listen 80 default_server; location / { proxy_pass http://127.0.0.1:9000; } }\n\
        server { listen 80; server_name *.example .b.example; limit_req zone=z;\n location /x/ { proxy_pass http://127.0.0.1:9000; } }\n\
        }\n";

    #[test]
    fn servers_by_name_then_wildcard_then_default_and_no_fall_through() {
        let toml = import(SERVERS, true).unwrap();
        assert_eq!(chosen(&toml, "a.example", "/x/1"), "t.conf:3: location /");
        assert_eq!(chosen(&toml, "q.example", "/x/1"), "t.conf:6: location /x/");
        assert_eq!(chosen(&toml, "b.example", "/x/1"), "t.conf:6: location /x/");
        assert_eq!(chosen(&toml, "unknown.test", "/x/1"), "t.conf:4: location /");
        // The wildcard server has no `location /`: its other paths do not reach the default server.
        let rest = chosen(&toml, "q.example", "/y");
        assert!(rest.starts_with("t.conf:5: no location matches"), "{rest}");
        // The server's limit_req is inherited, and nginx's default status written out.
        assert!(toml.contains("{ zone = \"z\", burst = 0 },   # t.conf:5"), "{toml}");
        assert!(toml.contains("limit_req_status = 503   # nginx's default"), "{toml}");
        // Without --allow-unexpressed the file-serving remainder is refused at its line.
        let e = import(SERVERS, false).unwrap_err();
        assert!(e.starts_with("t.conf:5: the paths no location of this server matches"), "{e}");
    }

    #[test]
    fn what_weir_cannot_do_is_refused_or_left_out_and_named() {
        let text = "http {\n server { listen 80;\n  location /a { return 301 /b; }\n  location / { proxy_pass http://127.0.0.1:9000; }\n }\n}\n";
        let e = import(text, false).unwrap_err();
        assert!(e.starts_with("t.conf:3: `return 301 /b`: nginx answers"), "{e}");
        let toml = import(text, true).unwrap();
        assert!(toml.contains("# NOTE: left out: t.conf:3: `return 301 /b`"), "{toml}");
        assert_eq!(chosen(&toml, "h", "/a"), "t.conf:3: location /a");
        assert!(toml.contains("deny = [\"all\"]"));
        let text = "http {\n server { listen 80; server_name ~^www\\d+$;\n  location / { proxy_pass http://127.0.0.1:9000; }\n }\n}\n";
        assert!(import(text, false).unwrap_err().contains("t.conf:2: server_name ~^www\\d+$: a regex server name"));
        let text =
            "http {\n upstream u { server 10.0.0.1:80 weight=3 max_fails=2 fail_timeout=5; server 10.0.0.2 backup; }\n\
                    server { listen 80; location / { proxy_pass http://u; } }\n}\n";
        assert!(import(text, false).unwrap_err().contains("t.conf:2: upstream u server 10.0.0.2: `backup`"));
        let text = "http {\n upstream u { server 10.0.0.1:80 weight=3 max_fails=2 fail_timeout=5; }\n\
                    server { listen 80; location / { proxy_pass http://u; } }\n}\n";
        assert!(import(text, false)
            .unwrap()
            .contains("servers = [\"10.0.0.1:80 weight=3 max_fails=2 fail_timeout=5s\"]"));
        // Unix sockets: in proxy_pass (the path ends at `:`) and as upstream servers.
        let text = "http {\n upstream u { server unix:/run/a.sock weight=2; }\n\
                    server { listen 80; location /a/ { proxy_pass http://unix:/run/b.sock:/a/; }\n\
                    location / { proxy_pass http://u; } }\n}\n";
        let toml = import(text, false).unwrap();
        assert!(toml.contains("servers = [\"unix:/run/a.sock weight=2\"]"), "{toml}");
        assert!(toml.contains("servers = [\"unix:/run/b.sock\"]"), "{toml}");
        let text = "http {\n server { listen 80; location / { proxy_pass http://unix:/run/b.sock:/v2/; } }\n}\n";
        assert!(import(text, false)
            .unwrap_err()
            .contains("t.conf:2: proxy_pass http://unix:/run/b.sock:/v2/: the URI part"));
    }

    #[test]
    fn real_ip_and_access_rules_keep_nginx_order() {
        let text = "http {\n set_real_ip_from 10.0.0.0/8;\n server { listen 80;\n  location / { deny 10.1.1.1; allow 10.0.0.0/8; proxy_pass http://127.0.0.1:9000; }\n }\n}\n";
        let toml = import(text, false).unwrap();
        assert!(toml.contains("trusted = [\"10.0.0.0/8\"]\nheader = \"X-Real-IP\""), "{toml}");
        assert!(toml.contains("real_ip_recursive off"), "{toml}");
        let deny = toml.find("deny = [\"10.1.1.1\"]").unwrap();
        let allow = toml.find("allow = [\"10.0.0.0/8\"]").unwrap();
        assert!(deny < allow, "{toml}");
        let rt = crate::config::from_text(&toml, "i.toml").unwrap();
        assert!(!crate::engine::allowed(&rt.routes[0].access, "10.1.1.1".parse().unwrap()));
        assert!(crate::engine::allowed(&rt.routes[0].access, "10.2.0.1".parse().unwrap()));
    }

    const LEVELS: &str = "http {\n\
        limit_req_zone $binary_remote_addr zone=ip:1m rate=1r/s;\n\
        map $http_x_bypass $post_key { default \"\"; }\n\
        map $request_method $post_only { default \"\"; POST $binary_remote_addr; }\n\
        limit_req_zone $post_only zone=posts:1m rate=1r/m;\n\
        limit_req zone=ip burst=5 nodelay;\n\
        server { listen 80; server_name example.com .example.org www.example.*;\n\
          limit_req_status 444;\n\
          location / { proxy_pass http://127.0.0.1:9000; }\n\
          location /login { limit_req zone=posts; proxy_pass http://127.0.0.1:9000; }\n\
          location /free { limit_req_dry_run on; proxy_pass http://127.0.0.1:9000; }\n\
        }\n\
        server { listen 80 default_server; location / { proxy_pass http://127.0.0.1:9000; } }\n\
        }\n";

    #[test]
    fn http_and_server_levels_become_defaults_and_host_defaults() {
        let toml = import(LEVELS, false).unwrap();
        assert!(toml.starts_with("# Imported") && toml.contains("\nroute_order = \"nginx\""), "{toml}");
        // http level: [defaults], with nginx's default status.
        let defaults = &toml[toml.find("[defaults]").unwrap()..toml.find("[[host_defaults]]").unwrap()];
        assert!(defaults.contains("{ zone = \"ip\", burst = 5, nodelay = true },   # t.conf:6"), "{defaults}");
        assert!(defaults.contains("limit_req_status = 503"), "{defaults}");
        // The server's 444 once, for its names as one host list.
        let host = &toml[toml.find("[[host_defaults]]").unwrap()..toml.find("[[route]]").unwrap()];
        assert!(
            host.contains("hosts = [\"example.com\", \"example.org\", \"*.example.org\", \"www.example.*\"]"),
            "{host}"
        );
        assert!(host.contains("limit_req_status = 444"), "{host}");
        assert_eq!(toml.matches("limit_req_status = 444").count(), 1, "{toml}");
        // A POST-only limit is a `when` on the reference; the dry run rewrites the inherited list.
        assert!(toml.contains("{ zone = \"posts\", burst = 0, when = [ { method = [\"POST\"] } ] }"), "{toml}");
        assert!(toml.contains("{ zone = \"ip\", burst = 5, nodelay = true, dry_run = true }"), "{toml}");
        assert_eq!(chosen(&toml, "www.example.net", "/login"), "t.conf:10: location /login");
        assert_eq!(chosen(&toml, "a.example.org", "/free/x"), "t.conf:11: location /free");
        assert_eq!(chosen(&toml, "other.test", "/login"), "t.conf:13: location /");
        let rt = crate::config::from_text(&toml, "i.toml").unwrap();
        let i =
            crate::routes::find(&rt.matchers, rt.route_order, Some("example.com"), &http::Method::GET, "/").unwrap();
        assert_eq!(rt.routes[i].status, 444);
    }
}
