//! Route matching: host + method + path, most specific wins.
//!
//! Specificity is an ordering, not a chain of ifs: exact path > longest prefix > regex (in file
//! order); among equal paths a route that names a host beats one that does not; then file order.

use http::Method;
use regex::Regex;

#[derive(Debug, Clone)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
    Regex(Regex),
}

#[derive(Debug, Clone)]
pub enum HostMatch {
    /// `api.example.com` (compared case-insensitively, port ignored).
    Exact(String),
    /// `*.example.com`: any subdomain, not the bare domain. Holds `.example.com`.
    Suffix(String),
}

#[derive(Debug, Clone)]
pub struct RouteMatcher {
    pub path: PathMatch,
    pub host: Option<HostMatch>,
    /// `None`: any method.
    pub methods: Option<Vec<Method>>,
}

/// How specific a match is; larger wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Specificity {
    Regex { has_host: bool, earlier: std::cmp::Reverse<usize> },
    Prefix { len: usize, has_host: bool, earlier: std::cmp::Reverse<usize> },
    Exact { has_host: bool, earlier: std::cmp::Reverse<usize> },
}

impl HostMatch {
    pub fn parse(pattern: &str) -> HostMatch {
        let lower = pattern.to_ascii_lowercase();
        match lower.strip_prefix('*') {
            Some(suffix) => HostMatch::Suffix(suffix.to_string()),
            None => HostMatch::Exact(lower),
        }
    }

    fn matches(&self, host: &str) -> bool {
        match self {
            HostMatch::Exact(h) => host.eq_ignore_ascii_case(h),
            HostMatch::Suffix(s) => host.len() > s.len() && host[host.len() - s.len()..].eq_ignore_ascii_case(s),
        }
    }
}

impl RouteMatcher {
    fn specificity(&self, index: usize, host: Option<&str>, method: &Method, path: &str) -> Option<Specificity> {
        if let Some(methods) = &self.methods {
            if !methods.contains(method) {
                return None;
            }
        }
        let has_host = match (&self.host, host) {
            (None, _) => false,
            (Some(want), Some(got)) if want.matches(got) => true,
            (Some(_), _) => return None,
        };
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

/// Index of the most specific route for this request, if any.
pub fn find(routes: &[RouteMatcher], host: Option<&str>, method: &Method, path: &str) -> Option<usize> {
    let host = host.map(normalize_host);
    routes
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.specificity(i, host, method, path).map(|s| (s, i)))
        .max_by_key(|(s, _)| *s)
        .map(|(_, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(path: PathMatch) -> RouteMatcher {
        RouteMatcher { path, host: None, methods: None }
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
        assert_eq!(find(&t, None, &get, "/api/login"), Some(4));
        assert_eq!(find(&t, None, &get, "/api/login/x"), Some(2));
        assert_eq!(find(&t, None, &get, "/api/admin/users"), Some(3));
        assert_eq!(find(&t, None, &get, "/other"), Some(0));
    }

    #[test]
    fn prefix_beats_regex_and_regexes_go_in_file_order() {
        let t = table();
        // "/" prefix and both regexes match: a prefix is more specific than any regex.
        assert_eq!(find(&t, None, &Method::GET, "/v1/x"), Some(0));
        let only_regex = vec![t[1].clone(), t[5].clone()];
        assert_eq!(find(&only_regex, None, &Method::GET, "/v1/x"), Some(0));
        assert_eq!(find(&only_regex, None, &Method::GET, "/x"), None);
    }

    #[test]
    fn host_and_method_filter_and_host_wins_ties() {
        let mut with_host = route(PathMatch::Prefix("/".into()));
        with_host.host = Some(HostMatch::parse("*.Example.com"));
        let mut post_only = route(PathMatch::Prefix("/".into()));
        post_only.methods = Some(vec![Method::POST]);
        let t = vec![route(PathMatch::Prefix("/".into())), with_host, post_only];
        assert_eq!(find(&t, Some("api.example.COM:8080"), &Method::GET, "/"), Some(1));
        assert_eq!(find(&t, Some("example.com"), &Method::GET, "/"), Some(0));
        assert_eq!(find(&t, None, &Method::GET, "/"), Some(0));
        assert_eq!(find(&t[2..], None, &Method::GET, "/"), None);
        assert_eq!(find(&t[2..], None, &Method::POST, "/"), Some(0));
    }

    #[test]
    fn normalizes_hosts() {
        assert_eq!(normalize_host("a.com:80"), "a.com");
        assert_eq!(normalize_host("a.com."), "a.com");
        assert_eq!(normalize_host("[::1]:8080"), "[::1]");
    }
}
