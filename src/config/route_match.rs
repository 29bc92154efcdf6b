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
use crate::request::{normalize_path, EncodedSlash};
use crate::routes::{HostMatch, PathMatch, RouteMatcher};

type Here<'a> = &'a dyn Fn(&std::ops::Range<usize>, String) -> ConfigError;

/// A warning at `span`, in the `file:line: …` form of the config's other warnings.
fn warn(src: &Source<'_>, span: &std::ops::Range<usize>, route: &str, msg: String) -> String {
    format!("{}:{}: route {route:?}: {msg}", src.file, src.line_of(span))
}

pub(super) struct MatchInput {
    pub path: Option<Spanned<String>>,
    pub path_prefix: Option<Spanned<String>>,
    pub path_regex: Option<Spanned<String>>,
    pub host: Option<Spanned<String>>,
    pub methods: Option<Spanned<Vec<Spanned<String>>>>,
}

pub(super) fn compile_match(
    src: &Source<'_>,
    route: &str,
    route_span: &std::ops::Range<usize>,
    input: MatchInput,
    here: Here<'_>,
    warnings: &mut Vec<String>,
) -> Result<RouteMatcher, ConfigError> {
    let MatchInput { path, path_prefix, path_regex, host, methods } = input;
    let path = match (path, path_prefix, path_regex) {
        (Some(p), None, None) => PathMatch::Exact(literal_path(src, route, p, "path", here, warnings)?),
        (None, Some(p), None) => PathMatch::Prefix(literal_path(src, route, p, "path_prefix", here, warnings)?),
        (None, None, Some(r)) => PathMatch::Regex(
            Regex::new(r.get_ref()).map_err(|e| here(&r.span(), format!("path_regex: invalid regex: {e}")))?,
        ),
        _ => return Err(here(route_span, "give exactly one of path, path_prefix or path_regex".into())),
    };
    let host = host.map(|h| host_pattern(src, route, h, here, warnings)).transpose()?;
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
        })
        .transpose()?;
    Ok(RouteMatcher { path, host, methods })
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
    let canonical = normalize_path(text, EncodedSlash::Keep)
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

/// `api.example.com` or `*.example.com`, lower case, without a trailing dot; a port never matches
/// (requests are matched on the host without it).
fn host_pattern(
    src: &Source<'_>,
    route: &str,
    h: Spanned<String>,
    here: Here<'_>,
    warnings: &mut Vec<String>,
) -> Result<HostMatch, ConfigError> {
    let text = h.get_ref();
    let bare = text.strip_prefix("*.").unwrap_or(text);
    if bare.contains(':') && !bare.starts_with('[') {
        return Err(here(
            &h.span(),
            format!("host: {text:?} has a port; requests are matched on the host alone, so remove the port"),
        ));
    }
    let name = bare.strip_suffix('.').unwrap_or(bare);
    if !is_ipv6_literal(name) && !is_host_name(name) {
        return Err(here(&h.span(), format!("host: {text:?} is not a host name")));
    }
    let pattern = format!("{}{}", &text[..text.len() - bare.len()], name.to_ascii_lowercase());
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

/// A route that can never be chosen: an earlier route has the same path, the same host and
/// every one of its methods, so it wins every tie (`routes::find`).
pub(super) fn shadowing(matchers: &[RouteMatcher], index: usize) -> Option<usize> {
    let later = &matchers[index];
    matchers[..index].iter().position(|earlier| {
        same_path(&earlier.path, &later.path)
            && same_host(earlier.host.as_ref(), later.host.as_ref())
            && match (&earlier.methods, &later.methods) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(e), Some(l)) => l.iter().all(|m| e.contains(m)),
            }
    })
}

fn same_path(a: &PathMatch, b: &PathMatch) -> bool {
    match (a, b) {
        (PathMatch::Exact(x), PathMatch::Exact(y)) | (PathMatch::Prefix(x), PathMatch::Prefix(y)) => x == y,
        (PathMatch::Regex(x), PathMatch::Regex(y)) => x.as_str() == y.as_str(),
        _ => false,
    }
}

fn same_host(a: Option<&HostMatch>, b: Option<&HostMatch>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(HostMatch::Exact(x)), Some(HostMatch::Exact(y)))
        | (Some(HostMatch::Suffix(x)), Some(HostMatch::Suffix(y))) => x == y,
        _ => false,
    }
}
