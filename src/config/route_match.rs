//! A route's match (`path`/`path_prefix`/`path_regex`, `host`, `methods`) compiled into the form
//! requests are compared in, so that a route can match at all: paths in the canonical spelling
//! requests are normalised to (`request::path`), hosts lower case without port or trailing dot,
//! methods upper case. What is certainly a mistake is refused; a spelling Weir can repair is
//! repaired with a warning (`weir check` prints it, a reload logs it).

use super::spanned::Spanned;
use http::Method;
use regex::Regex;

use super::error::{ConfigError, Source};
use crate::request::host::{is_host_name, is_ipv6_literal};
use crate::request::{normalize_path, EncodedSlash, PathError};
use crate::routes::{HostMatch, PathMatch, RouteMatcher, RouteOrder};

type Here<'a> = &'a dyn Fn(&std::ops::Range<usize>, String) -> ConfigError;

/// A warning at `span`, in the `file:line: …` form of the config's other warnings.
fn warn(src: &Source<'_>, span: &std::ops::Range<usize>, route: &str, msg: String) -> String {
    format!("{}:{}: route {route:?}: {msg}", src.file, src.line_of(span))
}

pub(super) struct MatchInput {
    pub path: Option<Spanned<String>>,
    pub path_prefix: Option<Spanned<String>>,
    pub path_regex: Option<Spanned<String>>,
    pub host: Option<Spanned<super::schema::OneOrMany>>,
    pub methods: Option<Spanned<Vec<Spanned<String>>>>,
    pub skip_regex: Option<Spanned<bool>>,
}

pub(super) fn compile_match(
    src: &Source<'_>,
    route: &str,
    route_span: &std::ops::Range<usize>,
    input: MatchInput,
    here: Here<'_>,
    warnings: &mut Vec<String>,
) -> Result<RouteMatcher, ConfigError> {
    let MatchInput { path, path_prefix, path_regex, host, methods, skip_regex } = input;
    let skip = skip_regex.as_ref().is_some_and(|s| *s.get_ref());
    let path = match (path, path_prefix, path_regex) {
        (Some(p), None, None) => PathMatch::Exact(literal_path(src, route, p, "path", here, warnings)?),
        (None, Some(p), None) => PathMatch::Prefix(literal_path(src, route, p, "path_prefix", here, warnings)?),
        (None, None, Some(r)) => PathMatch::Regex(
            Regex::new(r.get_ref()).map_err(|e| here(&r.span(), format!("path_regex: invalid regex: {e}")))?,
        ),
        _ => return Err(here(route_span, "give exactly one of path, path_prefix or path_regex".into())),
    };
    if let (Some(s), false) = (&skip_regex, matches!(path, PathMatch::Prefix(_))) {
        return Err(here(&s.span(), "skip_regex: only a path_prefix route can skip regexes (nginx `^~`)".into()));
    }
    let hosts = match host {
        None => Vec::new(),
        Some(h) => {
            let span = h.span();
            let items = h.get_ref().items();
            if items.is_empty() {
                return Err(here(
                    &span,
                    "host: an empty list matches no request; remove `host` to match every host".into(),
                ));
            }
            let mut hosts: Vec<HostMatch> = Vec::new();
            for item in items {
                let pattern = host_pattern(src, route, Spanned::new(span.clone(), item.to_string()), here, warnings)?;
                if hosts.contains(&pattern) {
                    return Err(here(&span, format!("host: {item:?} is listed twice")));
                }
                hosts.push(pattern);
            }
            hosts
        }
    };
    let methods = methods
        .map(|list| {
            if list.get_ref().is_empty() {
                return Err(here(
                    &list.span(),
                    "methods: an empty list matches no request; remove `methods` to match every method".into(),
                ));
            }
            list.get_ref()
                .iter()
                .map(|m| {
                    // Requests' methods are case-sensitive upper case (nginx); the config's are
                    // read in upper case.
                    Method::from_bytes(m.get_ref().to_ascii_uppercase().as_bytes())
                        .ok()
                        .filter(crate::request::method::is_valid)
                        .ok_or_else(|| here(&m.span(), format!("methods: {:?} is not an HTTP method", m.get_ref())))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|listed| with_head_if_get(src, route, &list.span(), listed, warnings))
        })
        .transpose()?;
    Ok(RouteMatcher { path, hosts, methods, skip_regex: skip })
}

/// A route restricted to GET matches HEAD too, as nginx's `limit_except GET` does: Flask, Django,
/// Express and Rails answer HEAD with the GET handler, so a GET-only limit that let HEAD through
/// would limit nothing for a client that only needs the status and headers. The method is added
/// to the list (a route for HEAD alone after it is then shadowed, and refused as such), with a
/// warning that names it, so that the list the operator reads is the one requests meet.
fn with_head_if_get(
    src: &Source<'_>,
    route: &str,
    span: &std::ops::Range<usize>,
    mut methods: Vec<Method>,
    warnings: &mut Vec<String>,
) -> Vec<Method> {
    if methods.contains(&Method::GET) && !methods.contains(&Method::HEAD) {
        methods.push(Method::HEAD);
        warnings.push(warn(
            src,
            span,
            route,
            "methods lists GET without HEAD: HEAD requests match this route too (upstreams answer HEAD with their \
             GET handler); write [\"GET\", \"HEAD\", …] to say so"
                .into(),
        ));
    }
    methods
}

/// An exact or prefix path, in the canonical spelling requests are compared in.
fn literal_path(
    src: &Source<'_>,
    route: &str,
    p: Spanned<String>,
    field: &str,
    here: Here<'_>,
    warnings: &mut Vec<String>,
) -> Result<String, ConfigError> {
    let text = p.get_ref();
    if !text.starts_with('/') {
        return Err(here(&p.span(), format!("{field} must start with '/', got {text:?}")));
    }
    if text.contains(['?', '#']) {
        return Err(here(
            &p.span(),
            format!("{field}: {text:?} holds a query or fragment, which is never part of a request's path"),
        ));
    }
    if text.contains(['*', '^', '$', '[', ']', '|', '(', ')', '{', '}', '+']) {
        warnings.push(warn(
            src,
            &p.span(),
            route,
            format!("{field} = {text:?} is matched literally, character by character; for a pattern use path_regex"),
        ));
    }
    let canonical = match field {
        "path_prefix" => canonical_prefix(text).map(std::borrow::Cow::Owned),
        _ => normalize_path(text, EncodedSlash::Keep),
    }
    .map_err(|e| here(&p.span(), format!("{field}: {text:?} can never match a request: {e}")))?;
    if canonical != text.as_str() {
        warnings.push(warn(
            src,
            &p.span(),
            route,
            format!("{field} = {text:?} is matched as {canonical:?}, the spelling requests are normalised to"),
        ));
    }
    Ok(canonical.into_owned())
}

/// A prefix in the spelling requests are compared in: its directory part (up to the last `/`)
/// canonical like a request path, its last, partial segment as written but for unreserved escapes.
/// The partial segment is never resolved as a whole segment: `/.` is the start of `/.git`, not the
/// root, so a prefix is never rewritten into another prefix that matches other requests.
pub(super) fn canonical_prefix(text: &str) -> Result<String, PathError> {
    let cut = text.rfind('/').map_or(0, |i| i + 1);
    let (dir, partial) = text.split_at(cut);
    let dir = normalize_path(dir, EncodedSlash::Keep)?;
    if partial.is_empty() {
        return Ok(dir.into_owned());
    }
    // A sentinel after the partial segment keeps `.` and `..` from being read as segments.
    let probe = format!("/{partial}x");
    let tail = normalize_path(&probe, EncodedSlash::Keep)?;
    Ok(format!("{dir}{}", &tail[1..tail.len() - 1]))
}

/// `api.example.com`, `*.example.com` or `www.example.*`, lower case, without a trailing dot; a
/// port never matches (requests are matched on the host without it).
fn host_pattern(
    src: &Source<'_>,
    route: &str,
    h: Spanned<String>,
    here: Here<'_>,
    warnings: &mut Vec<String>,
) -> Result<HostMatch, ConfigError> {
    let text = h.get_ref();
    let (lead, bare, trail) = match (text.strip_prefix("*."), text.strip_suffix(".*")) {
        (Some(_), Some(_)) => {
            return Err(here(&h.span(), format!("host: {text:?}: a wildcard goes at one end only")));
        }
        (Some(rest), None) => ("*.", rest, ""),
        (None, Some(rest)) => ("", rest, ".*"),
        (None, None) => ("", text.as_str(), ""),
    };
    if bare.contains(':') && !bare.starts_with('[') {
        return Err(here(
            &h.span(),
            format!("host: {text:?} has a port; requests are matched on the host alone, so remove the port"),
        ));
    }
    let name = if trail.is_empty() { bare.strip_suffix('.').unwrap_or(bare) } else { bare };
    if !is_ipv6_literal(name) && !is_host_name(name) {
        return Err(here(&h.span(), format!("host: {text:?} is not a host name")));
    }
    let pattern = format!("{lead}{}{trail}", name.to_ascii_lowercase());
    if pattern != *text {
        warnings.push(warn(
            src,
            &h.span(),
            route,
            format!("host = {text:?} is matched as {pattern:?} (hosts compare lower case, without a trailing dot)"),
        ));
    }
    Ok(HostMatch::parse(&pattern))
}

/// Whether `wide` holds every method `narrow` does (`None`: every method).
fn covers_methods(wide: &Option<Vec<http::Method>>, narrow: &Option<Vec<http::Method>>) -> bool {
    match (wide, narrow) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(w), Some(n)) => n.iter().all(|m| w.contains(m)),
    }
}

/// Whether every host `narrow` is for is one of `wide`'s patterns, or both are for every host.
fn same_or_more_hosts(wide: &[HostMatch], narrow: &[HostMatch]) -> bool {
    match (wide.is_empty(), narrow.is_empty()) {
        (true, true) => true,
        (false, false) => narrow.iter().all(|h| wide.contains(h)),
        _ => false,
    }
}

/// A route that can never be chosen: an earlier route has the same path, the same hosts and
/// every one of its methods, so it wins every tie (`routes::find`, in either order).
pub(super) fn shadowing(matchers: &[RouteMatcher], index: usize) -> Option<usize> {
    let later = &matchers[index];
    matchers[..index].iter().position(|earlier| {
        same_path(&earlier.path, &later.path)
            && same_or_more_hosts(&earlier.hosts, &later.hosts)
            && covers_methods(&earlier.methods, &later.methods)
    })
}

/// Why a route for HEAD is shadowed by one that lists GET alone, when it is: said beside the
/// refusal, since the earlier route never names HEAD.
pub(super) fn head_hint(matchers: &[RouteMatcher], earlier: usize, later: usize) -> &'static str {
    let lists = |i: usize, m: &Method| matchers[i].methods.as_ref().is_some_and(|ms| ms.contains(m));
    if lists(later, &Method::HEAD) && lists(earlier, &Method::GET) {
        " (a route that lists GET matches HEAD too; put a route for HEAD alone before it)"
    } else {
        ""
    }
}

fn same_path(a: &PathMatch, b: &PathMatch) -> bool {
    match (a, b) {
        (PathMatch::Exact(x), PathMatch::Exact(y)) | (PathMatch::Prefix(x), PathMatch::Prefix(y)) => x == y,
        (PathMatch::Regex(x), PathMatch::Regex(y)) => x.as_str() == y.as_str(),
        _ => false,
    }
}

/// What is known of the paths a regex matches: only paths that start with `prefix` (when it is
/// anchored with `^` and a literal), and whether it matches every one of them.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct RegexReach {
    pub prefix: String,
    pub all_under: bool,
}

/// The reach of a regex over request paths (which always start with `/` and hold no raw newline),
/// for the shapes it can be read from; `None` for the others.
pub(super) fn regex_reach(re: &Regex) -> Option<RegexReach> {
    use regex_syntax::hir::{HirKind, Look};
    let hir = regex_syntax::parse(re.as_str()).ok()?;
    let parts: Vec<&regex_syntax::hir::Hir> = match hir.kind() {
        HirKind::Empty => return Some(RegexReach { prefix: "/".into(), all_under: true }),
        HirKind::Concat(parts) => parts.iter().collect(),
        _ => vec![&hir],
    };
    let literal = |h: &regex_syntax::hir::Hir| match h.kind() {
        HirKind::Literal(l) => std::str::from_utf8(&l.0).ok().map(str::to_string),
        _ => None,
    };
    // `.*` (or `(?s).*`), which matches the rest of any path.
    let any_rest = |h: &regex_syntax::hir::Hir| match h.kind() {
        HirKind::Repetition(r) => r.min == 0 && r.max.is_none() && any_char_but_newline(&r.sub),
        _ => false,
    };
    let anchored = matches!(parts.first().map(|p| p.kind()), Some(HirKind::Look(Look::Start)));
    let rest = if anchored { &parts[1..] } else { &parts[..] };
    let (prefix, after) = match rest.first().and_then(|p| literal(p)) {
        Some(l) => (l, &rest[1..]),
        None => (String::new(), rest),
    };
    let all_under = after.iter().all(|h| any_rest(h));
    if anchored {
        return Some(RegexReach { prefix, all_under });
    }
    // Unanchored: `/` and `.*` appear in every path; anything else may match anywhere.
    match (prefix.as_str(), all_under) {
        ("/" | "", true) => Some(RegexReach { prefix: "/".into(), all_under: true }),
        _ => None,
    }
}

/// `.` or `(?s).`: every character (a request path holds no raw newline).
fn any_char_but_newline(h: &regex_syntax::hir::Hir) -> bool {
    use regex_syntax::hir::{Class, HirKind};
    let HirKind::Class(class) = h.kind() else { return false };
    let ranges: Vec<(u32, u32)> = match class {
        Class::Unicode(c) => c.ranges().iter().map(|r| (r.start() as u32, r.end() as u32)).collect(),
        Class::Bytes(c) => c.ranges().iter().map(|r| (u32::from(r.start()), u32::from(r.end()))).collect(),
    };
    let top = match class {
        Class::Unicode(_) => 0x10FFFF,
        Class::Bytes(_) => 0xFF,
    };
    ranges == [(0, top)] || ranges == [(0, 9), (11, top)]
}

/// A route that can never be chosen in `order`, because `winner` always is.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Unreachable {
    pub route: usize,
    pub winner: usize,
    pub why: &'static str,
}

/// Routes that a broader route always beats in `order` (beyond `shadowing`'s identical paths).
/// Only the shapes `regex_reach` reads are found; a miss proves nothing.
pub(super) fn unreachable(matchers: &[RouteMatcher], order: RouteOrder) -> Vec<Unreachable> {
    let mut found = Vec::new();
    let reach: Vec<Option<RegexReach>> = matchers
        .iter()
        .map(|m| match &m.path {
            PathMatch::Regex(r) => regex_reach(r),
            _ => None,
        })
        .collect();
    for (i, m) in matchers.iter().enumerate() {
        let winner = match order {
            RouteOrder::Specific => {
                if !matches!(m.path, PathMatch::Regex(_)) {
                    continue;
                }
                // Any prefix that matches beats every regex, whatever its host.
                matchers.iter().position(|p| {
                    let PathMatch::Prefix(prefix) = &p.path else { return false };
                    (p.hosts.is_empty() || same_or_more_hosts(&p.hosts, &m.hosts))
                        && covers_methods(&p.methods, &m.methods)
                        && (prefix == "/" || reach[i].as_ref().is_some_and(|r| r.prefix.starts_with(prefix.as_str())))
                })
            }
            RouteOrder::Nginx => {
                let under = match &m.path {
                    PathMatch::Prefix(p) if !m.skip_regex => p.as_str(),
                    PathMatch::Regex(_) => match &reach[i] {
                        Some(r) => r.prefix.as_str(),
                        None => continue,
                    },
                    _ => continue,
                };
                // A regex of the same group that matches everything under this route; a regex
                // only loses to one before it.
                let before = if matches!(m.path, PathMatch::Regex(_)) { i } else { matchers.len() };
                (0..before).find(|&j| {
                    j != i
                        && reach[j].as_ref().is_some_and(|r| r.all_under && under.starts_with(r.prefix.as_str()))
                        && same_or_more_hosts(&matchers[j].hosts, &m.hosts)
                        && covers_methods(&matchers[j].methods, &m.methods)
                })
            }
        };
        if let Some(winner) = winner {
            let why = match order {
                RouteOrder::Specific => "a path_prefix beats every path_regex under route_order = \"specific\"",
                RouteOrder::Nginx => "its path_regex matches every path this route does, and regexes are tried first",
            };
            found.push(Unreachable { route: i, winner, why });
        }
    }
    found
}
