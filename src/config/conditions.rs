//! `when` / `unless` on a `limit_req` or `limit_conn` reference: the conditions nginx writes with
//! `map` and `geo` (a bypass token, a logged-in cookie, a POST-only limit, a whitelist of
//! networks), compiled here; the engine evaluates them (`engine::conditions`) before it reads a
//! zone's key, so a request a condition exempts never touches the zone, and a made-up token never
//! gets a bucket of its own.

use std::ops::Range;

use http::Method;
use ipnet::IpNet;

use super::checks::parse_cidr;
use super::error::ConfigError;
use super::schema;
use super::spanned::Spanned;
use crate::keys::KeyPart;

type Here<'a> = &'a dyn Fn(&Range<usize>, String) -> ConfigError;

/// The longest regex a `matches` may compile to, like the route regexes' default.
const MAX_REGEX_SIZE: usize = 1 << 20;

/// When a reference applies: every `when` holds and no `unless` does.
#[derive(Debug, Clone, Default)]
pub struct Conditions {
    pub when: Vec<Condition>,
    pub unless: Vec<Condition>,
}

impl Conditions {
    pub fn is_empty(&self) -> bool {
        self.when.is_empty() && self.unless.is_empty()
    }
}

#[derive(Clone)]
pub enum Condition {
    /// A header, cookie or query argument's value (the first, as keys read it).
    Part { part: KeyPart, test: Test },
    /// The method routes matched on.
    Method(Vec<Method>),
    /// The client address (after `[real_ip]`) is in one of these networks.
    Ip(Vec<IpNet>),
}

#[derive(Clone)]
pub enum Test {
    /// `present = true`: a non-empty value; `false`: none (nginx's `map` reads both alike).
    Present(bool),
    /// `equals`: the value is exactly this, compared in constant time (often a secret).
    Equals(Vec<u8>),
    /// `matches`: a regex finds a match in the value.
    Matches(regex::bytes::Regex),
}

/// The value of `equals` is often a bypass token: never printed.
impl std::fmt::Debug for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Condition::Part { part, test } => {
                let test = match test {
                    Test::Present(p) => format!("present = {p}"),
                    Test::Equals(_) => "equals = <redacted>".to_string(),
                    Test::Matches(r) => format!("matches = {:?}", r.as_str()),
                };
                write!(f, "{part} {test}")
            }
            Condition::Method(m) => write!(f, "method in {m:?}"),
            Condition::Ip(nets) => write!(f, "ip in {nets:?}"),
        }
    }
}

pub(super) fn compile(
    when: Option<&Spanned<Vec<Spanned<schema::Condition>>>>,
    unless: Option<&Spanned<Vec<Spanned<schema::Condition>>>>,
    here: Here<'_>,
) -> Result<Conditions, ConfigError> {
    let list = |l: Option<&Spanned<Vec<Spanned<schema::Condition>>>>, field: &str| {
        let Some(l) = l else { return Ok(Vec::new()) };
        if l.get_ref().is_empty() {
            return Err(here(&l.span(), format!("{field}: an empty list; remove it")));
        }
        l.get_ref().iter().map(|c| condition(c, field, here)).collect::<Result<Vec<_>, _>>()
    };
    Ok(Conditions { when: list(when, "when")?, unless: list(unless, "unless")? })
}

fn condition(c: &Spanned<schema::Condition>, field: &str, here: Here<'_>) -> Result<Condition, ConfigError> {
    let span = c.span();
    let schema::Condition { header, cookie, query, present, equals, matches, method, ip } = c.get_ref();
    let err = |msg: &str| Err(here(&span, format!("{field}: {msg}")));
    let subjects = [header.is_some(), cookie.is_some(), query.is_some(), method.is_some(), ip.is_some()];
    if subjects.iter().filter(|s| **s).count() != 1 {
        return err("give exactly one of header, cookie, query, method or ip in each condition");
    }
    let tests = [present.is_some(), equals.is_some(), matches.is_some()];
    if let Some(methods) = method {
        if tests.iter().any(|t| *t) {
            return err("method takes no present, equals or matches");
        }
        if methods.get_ref().is_empty() {
            return err("method: an empty list matches no request");
        }
        let methods = methods
            .get_ref()
            .iter()
            .map(|m| {
                Method::from_bytes(m.get_ref().to_ascii_uppercase().as_bytes())
                    .ok()
                    .filter(crate::request::method::is_valid)
                    .ok_or_else(|| here(&m.span(), format!("{field}: method: {:?} is not an HTTP method", m.get_ref())))
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Condition::Method(methods));
    }
    if let Some(nets) = ip {
        if tests.iter().any(|t| *t) {
            return err("ip takes no present, equals or matches");
        }
        if nets.get_ref().is_empty() {
            return err("ip: an empty list matches no request");
        }
        let nets = nets
            .get_ref()
            .iter()
            .map(|n| {
                parse_cidr(n.get_ref()).ok_or_else(|| {
                    here(
                        &n.span(),
                        format!("{field}: ip: {:?} is not an IP address or a CIDR like \"10.0.0.0/8\"", n.get_ref()),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Condition::Ip(nets));
    }
    let (kind, name) = match (header, cookie, query) {
        (Some(h), _, _) => ("header", h),
        (_, Some(c), _) => ("cookie", c),
        (_, _, Some(q)) => ("query", q),
        _ => unreachable!("exactly one subject was checked above"),
    };
    let part = KeyPart::parse(&format!("{kind}:{}", name.get_ref()))
        .map_err(|_| here(&name.span(), format!("{field}: {kind}: {:?} is not a {kind} name", name.get_ref())))?;
    if tests.iter().filter(|t| **t).count() != 1 {
        return err(&format!("give exactly one of present, equals or matches for the {kind}"));
    }
    let test = match (present, equals, matches) {
        (Some(p), _, _) => Test::Present(*p),
        (_, Some(e), _) if e.get_ref().is_empty() => {
            return Err(here(&e.span(), format!("{field}: equals: an empty value; use present = false")));
        }
        (_, Some(e), _) => Test::Equals(e.get_ref().as_bytes().to_vec()),
        (_, _, Some(m)) => Test::Matches(
            regex::bytes::RegexBuilder::new(m.get_ref())
                .size_limit(MAX_REGEX_SIZE)
                .build()
                .map_err(|e| here(&m.span(), format!("{field}: matches: invalid regex: {e}")))?,
        ),
        _ => unreachable!("exactly one test was checked above"),
    };
    Ok(Condition::Part { part, test })
}
