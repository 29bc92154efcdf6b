//! Route matching: host + method + path, in one of two orders (`route_order`).
//!
//! `Specific` (the default): specificity is an ordering, not a chain of ifs: exact path > longest
//! prefix > regex (in file order); among equal paths a route that names a host beats one that does
//! not; then file order.
//!
//! `Nginx`: nginx's `server` then `location` selection. The host picks a group (the routes of the
//! most specific matching host pattern); within it an exact path wins, else the longest prefix is
//! remembered and wins at once if it skips regexes (`^~`), else the first matching regex in file
//! order, else the remembered prefix.

use http::Method;
use regex::Regex;

#[derive(Debug, Clone)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
    Regex(Regex),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// `api.example.com` (compared case-insensitively, port ignored).
    Exact(String),
    /// `*.example.com`: any subdomain, not the bare domain. Holds `.example.com`.
    Suffix(String),
    /// `www.example.*`: nginx's trailing wildcard, any name that continues after the dot. Holds
    /// `www.example.`.
    Trailing(String),
}

/// How a request picks its route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RouteOrder {
    /// The most specific route (a prefix beats every regex).
    #[default]
    Specific,
    /// nginx's `server_name` + `location` order.
    Nginx,
}

#[derive(Debug, Clone)]
pub struct RouteMatcher {
    pub path: PathMatch,
    /// Empty: any host; else any of these.
    pub hosts: Vec<HostMatch>,
    /// `None`: any method.
    pub methods: Option<Vec<Method>>,
    /// nginx `location ^~`: when this is the longest matching prefix, regexes are not tried
    /// (`RouteOrder::Nginx` only).
    pub skip_regex: bool,
}

/// How specific a match is; larger wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Specificity {
    Regex { has_host: bool, earlier: std::cmp::Reverse<usize> },
    Prefix { len: usize, has_host: bool, earlier: std::cmp::Reverse<usize> },
    Exact { has_host: bool, earlier: std::cmp::Reverse<usize> },
}

/// How well a host pattern matches, nginx's `server_name` priority; larger wins. Two patterns of
/// one rank that both match one host are the same pattern, so a rank names one group of routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum HostRank {
    Any,
    Trailing(usize),
    Suffix(usize),
    Exact,
}

impl HostMatch {
    pub fn parse(pattern: &str) -> HostMatch {
        let lower = pattern.to_ascii_lowercase();
        if let Some(suffix) = lower.strip_prefix('*') {
            return HostMatch::Suffix(suffix.to_string());
        }
        match lower.strip_suffix('*') {
            Some(start) => HostMatch::Trailing(start.to_string()),
            None => HostMatch::Exact(lower),
        }
    }

    fn matches(&self, host: &str) -> bool {
        match self {
            HostMatch::Exact(h) => host.eq_ignore_ascii_case(h),
            HostMatch::Suffix(s) => host.len() > s.len() && host[host.len() - s.len()..].eq_ignore_ascii_case(s),
            HostMatch::Trailing(s) => {
                host.len() > s.len() && host.is_char_boundary(s.len()) && host[..s.len()].eq_ignore_ascii_case(s)
            }
        }
    }

    fn rank(&self) -> HostRank {
        match self {
            HostMatch::Exact(_) => HostRank::Exact,
            HostMatch::Suffix(s) => HostRank::Suffix(s.len()),
            HostMatch::Trailing(s) => HostRank::Trailing(s.len()),
        }
    }
}

impl RouteMatcher {
    fn allows(&self, method: &Method) -> bool {
        self.methods.as_ref().is_none_or(|m| m.contains(method))
    }

    /// The best rank among this route's host patterns that match; `None`: the route is not for
    /// this host.
    fn host_rank(&self, host: Option<&str>) -> Option<HostRank> {
        if self.hosts.is_empty() {
            return Some(HostRank::Any);
        }
        let host = host?;
        self.hosts.iter().filter(|h| h.matches(host)).map(HostMatch::rank).max()
    }

    fn specificity(&self, index: usize, host: Option<&str>, method: &Method, path: &str) -> Option<Specificity> {
        if !self.allows(method) {
            return None;
        }
        let has_host = self.host_rank(host)? != HostRank::Any;
        let earlier = std::cmp::Reverse(index);
        match &self.path {
            PathMatch::Exact(p) if p == path => Some(Specificity::Exact { has_host, earlier }),
            PathMatch::Prefix(p) if path.starts_with(p.as_str()) => {
                Some(Specificity::Prefix { len: p.len(), has_host, earlier })
            }
            PathMatch::Regex(r) if r.is_match(path) => Some(Specificity::Regex { has_host, earlier }),
            _ => None,
        }
    }
}

/// Strips the port and a trailing dot from a `Host` value.
pub fn normalize_host(raw: &str) -> &str {
    let host = if raw.starts_with('[') {
        // IPv6 literal: keep up to the closing bracket.
        raw.find(']').map_or(raw, |end| &raw[..=end])
    } else {
        raw.rsplit_once(':').map_or(raw, |(h, _port)| h)
    };
    host.strip_suffix('.').unwrap_or(host)
}

/// Index of the route for this request, in `order`, if any.
pub fn find(
    routes: &[RouteMatcher],
    order: RouteOrder,
    host: Option<&str>,
    method: &Method,
    path: &str,
) -> Option<usize> {
    let host = host.map(normalize_host);
    match order {
        RouteOrder::Specific => routes
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.specificity(i, host, method, path).map(|s| (s, i)))
            .max_by_key(|(s, _)| *s)
            .map(|(_, i)| i),
        RouteOrder::Nginx => find_nginx(routes, host, method, path),
    }
}

fn find_nginx(routes: &[RouteMatcher], host: Option<&str>, method: &Method, path: &str) -> Option<usize> {
    // The `server`: chosen by host alone, and never left (nginx answers 404 inside it).
    let group = routes.iter().filter_map(|r| r.host_rank(host)).max()?;
    let candidates =
        || routes.iter().enumerate().filter(move |(_, r)| r.host_rank(host) == Some(group) && r.allows(method));
    if let Some((i, _)) = candidates().find(|(_, r)| matches!(&r.path, PathMatch::Exact(p) if p == path)) {
        return Some(i);
    }
    // The longest prefix; the first in file order among equal ones.
    let mut longest: Option<(usize, usize, bool)> = None;
    for (i, r) in candidates() {
        if let PathMatch::Prefix(p) = &r.path {
            if path.starts_with(p.as_str()) && longest.is_none_or(|(_, len, _)| p.len() > len) {
                longest = Some((i, p.len(), r.skip_regex));
            }
        }
    }
    if let Some((i, _, true)) = longest {
        return Some(i);
    }
    candidates()
        .find(|(_, r)| matches!(&r.path, PathMatch::Regex(re) if re.is_match(path)))
        .map(|(i, _)| i)
        .or(longest.map(|(i, _, _)| i))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(path: PathMatch) -> RouteMatcher {
        RouteMatcher { path, hosts: Vec::new(), methods: None, skip_regex: false }
    }

    fn table() -> Vec<RouteMatcher> {
        vec![
            route(PathMatch::Prefix("/".into())),
            route(PathMatch::Regex(Regex::new("^/v[0-9]+/").unwrap())),
            route(PathMatch::Prefix("/api/".into())),
            route(PathMatch::Prefix("/api/admin/".into())),
            route(PathMatch::Exact("/api/login".into())),
            route(PathMatch::Regex(Regex::new("^/v1/").unwrap())),
        ]
    }

    #[test]
    fn exact_beats_prefix_and_longest_prefix_wins() {
        let t = table();
        let get = Method::GET;
        assert_eq!(find(&t, RouteOrder::Specific, None, &get, "/api/login"), Some(4));
        assert_eq!(find(&t, RouteOrder::Specific, None, &get, "/api/login/x"), Some(2));
        assert_eq!(find(&t, RouteOrder::Specific, None, &get, "/api/admin/users"), Some(3));
        assert_eq!(find(&t, RouteOrder::Specific, None, &get, "/other"), Some(0));
    }

    #[test]
    fn prefix_beats_regex_and_regexes_go_in_file_order() {
        let t = table();
        // "/" prefix and both regexes match: a prefix is more specific than any regex.
        assert_eq!(find(&t, RouteOrder::Specific, None, &Method::GET, "/v1/x"), Some(0));
        let only_regex = vec![t[1].clone(), t[5].clone()];
        assert_eq!(find(&only_regex, RouteOrder::Specific, None, &Method::GET, "/v1/x"), Some(0));
        assert_eq!(find(&only_regex, RouteOrder::Specific, None, &Method::GET, "/x"), None);
    }

    #[test]
    fn host_and_method_filter_and_host_wins_ties() {
        let mut with_host = route(PathMatch::Prefix("/".into()));
        with_host.hosts = vec![HostMatch::parse("*.Example.com")];
        let mut post_only = route(PathMatch::Prefix("/".into()));
        post_only.methods = Some(vec![Method::POST]);
        let t = vec![route(PathMatch::Prefix("/".into())), with_host, post_only];
        assert_eq!(find(&t, RouteOrder::Specific, Some("api.example.COM:8080"), &Method::GET, "/"), Some(1));
        assert_eq!(find(&t, RouteOrder::Specific, Some("example.com"), &Method::GET, "/"), Some(0));
        assert_eq!(find(&t, RouteOrder::Specific, None, &Method::GET, "/"), Some(0));
        assert_eq!(find(&t[2..], RouteOrder::Specific, None, &Method::GET, "/"), None);
        assert_eq!(find(&t[2..], RouteOrder::Specific, None, &Method::POST, "/"), Some(0));
    }

    /// nginx's own example (ngx_http_core_module, `location`): A to E.
    fn nginx_docs_table() -> Vec<RouteMatcher> {
        let mut images = route(PathMatch::Prefix("/images/".into()));
        images.skip_regex = true;
        vec![
            route(PathMatch::Exact("/".into())),
            route(PathMatch::Prefix("/".into())),
            route(PathMatch::Prefix("/documents/".into())),
            images,
            route(PathMatch::Regex(Regex::new(r"(?i)\.(gif|jpg|jpeg)$").unwrap())),
        ]
    }

    #[test]
    fn nginx_order_follows_nginxs_documented_example() {
        let t = nginx_docs_table();
        let at = |path| find(&t, RouteOrder::Nginx, None, &Method::GET, path);
        assert_eq!(at("/"), Some(0));
        assert_eq!(at("/index.html"), Some(1));
        assert_eq!(at("/documents/document.html"), Some(2));
        assert_eq!(at("/images/1.gif"), Some(3));
        assert_eq!(at("/documents/1.jpg"), Some(4));
        assert_eq!(at("/x.JPG"), Some(4));
        // The default order on the same table: a prefix beats the regex.
        assert_eq!(find(&t, RouteOrder::Specific, None, &Method::GET, "/documents/1.jpg"), Some(2));
    }

    #[test]
    fn nginx_order_tries_regexes_in_file_order_and_respects_methods() {
        let mut post_only = route(PathMatch::Regex(Regex::new("^/v1/").unwrap()));
        post_only.methods = Some(vec![Method::POST]);
        let t = vec![
            route(PathMatch::Prefix("/".into())),
            post_only,
            route(PathMatch::Regex(Regex::new("^/v[0-9]+/").unwrap())),
            route(PathMatch::Regex(Regex::new("^/v1/").unwrap())),
        ];
        assert_eq!(find(&t, RouteOrder::Nginx, None, &Method::POST, "/v1/x"), Some(1));
        assert_eq!(find(&t, RouteOrder::Nginx, None, &Method::GET, "/v1/x"), Some(2));
        assert_eq!(find(&t, RouteOrder::Nginx, None, &Method::GET, "/other"), Some(0));
    }

    #[test]
    fn nginx_order_picks_one_host_group_and_never_leaves_it() {
        let with = |hosts: &[&str], path: PathMatch| {
            let mut r = route(path);
            r.hosts = hosts.iter().map(|h| HostMatch::parse(h)).collect();
            r
        };
        let t = vec![
            route(PathMatch::Prefix("/".into())),
            with(&["api.example.com"], PathMatch::Prefix("/v1/".into())),
            with(&["*.example.com"], PathMatch::Prefix("/".into())),
            with(&["www.*"], PathMatch::Prefix("/".into())),
            with(&["example.org", "www.example.org"], PathMatch::Exact("/login".into())),
        ];
        let at = |host, path| find(&t, RouteOrder::Nginx, Some(host), &Method::GET, path);
        assert_eq!(at("api.example.com", "/v1/users"), Some(1));
        // api.example.com's group has no route for /other: 404, not the wildcard's or the default's.
        assert_eq!(at("api.example.com", "/other"), None);
        // A leading wildcard beats a trailing one (nginx's server_name priority).
        assert_eq!(at("www.example.com", "/"), Some(2));
        assert_eq!(at("www.example.net", "/"), Some(3));
        assert_eq!(at("WWW.example.org:8080", "/login"), Some(4));
        assert_eq!(at("www.example.org", "/"), None);
        assert_eq!(at("www", "/"), Some(0));
        assert_eq!(at("other.net", "/"), Some(0));
        assert_eq!(find(&t, RouteOrder::Nginx, None, &Method::GET, "/v1/x"), Some(0));
    }

    #[test]
    fn trailing_wildcards_need_a_name_after_the_dot() {
        let h = HostMatch::parse("www.example.*");
        assert!(h.matches("www.example.com"));
        assert!(h.matches("www.example.co.uk"));
        assert!(!h.matches("www.example."));
        assert!(!h.matches("www.example"));
        assert!(!h.matches("xwww.example.com"));
    }

    #[test]
    fn normalizes_hosts() {
        assert_eq!(normalize_host("a.com:80"), "a.com");
        assert_eq!(normalize_host("a.com."), "a.com");
        assert_eq!(normalize_host("[::1]:8080"), "[::1]");
    }
}
