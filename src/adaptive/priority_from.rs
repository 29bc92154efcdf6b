//! A request's priority taken from the request itself (route `priority_from`): a header a trusted
//! layer in front sets, or a claim of the verified bearer token. Pure.
//!
//! What a client may claim: a header is the client's own word, so by default it can only *lower*
//! the request's priority below the route's (`max` defaults to the route's `priority`); raising it
//! takes an explicit `max`, which says a layer in front sets or strips the header. A claim counts
//! only from a token that verified. Anything else — no header, the header twice, a value the map
//! does not know, no token, a token that fails, no such claim — is the route's priority.

use http::HeaderName;

use super::admission::Priority;
use crate::keys::RequestFacts;

/// Where the value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Header(HeaderName),
    /// A claim by name or JSON pointer, as `jwt:` key parts read it.
    Claim(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityFrom {
    pub source: Source,
    /// Value → priority; empty: the values are the priorities' names (`low`, `normal`, `high`).
    pub map: Vec<(Box<[u8]>, Priority)>,
    /// The most the value may give; `None`: the route's priority for a header, no cap for a claim.
    pub max: Option<Priority>,
}

impl PriorityFrom {
    /// The request's priority on a route whose own is `route`.
    pub fn resolve(&self, facts: &RequestFacts<'_>, route: Priority) -> Priority {
        let (value, max) = match &self.source {
            Source::Header(name) => {
                let mut values = facts.headers.get_all(name).iter();
                let value = match (values.next(), values.next()) {
                    (Some(one), None) => one.as_bytes().to_vec(),
                    // Absent, or given twice (which one would a layer in front have checked?).
                    _ => return route,
                };
                (value, self.max.unwrap_or(route))
            }
            Source::Claim(claim) => match facts.claims() {
                Ok(claims) => match claims.get(claim) {
                    Some(value) => (value, self.max.unwrap_or(Priority::High)),
                    None => return route,
                },
                Err(_) => return route,
            },
        };
        self.lookup(&value).map_or(route, |p| p.min(max))
    }

    fn lookup(&self, value: &[u8]) -> Option<Priority> {
        let value = value.trim_ascii();
        if self.map.is_empty() {
            return std::str::from_utf8(value).ok().and_then(Priority::parse);
        }
        self.map.iter().find(|(k, _)| &**k == value).map(|(_, p)| *p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    fn header(max: Option<Priority>, map: &[(&str, Priority)]) -> PriorityFrom {
        PriorityFrom {
            source: Source::Header(HeaderName::from_static("x-priority")),
            map: map.iter().map(|(k, p)| (k.as_bytes().into(), *p)).collect(),
            max,
        }
    }

    fn with(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-priority", HeaderValue::from_str(v).expect("a header value"));
        }
        h
    }

    fn resolve(p: &PriorityFrom, values: &[&str], route: Priority) -> Priority {
        let headers = with(values);
        p.resolve(&RequestFacts::new(None, &headers, None), route)
    }

    #[test]
    fn a_header_lowers_but_never_raises_above_the_route_by_default() {
        let p = header(None, &[]);
        assert_eq!(resolve(&p, &["low"], Priority::Normal), Priority::Low);
        assert_eq!(resolve(&p, &["high"], Priority::Normal), Priority::Normal, "a client cannot promote itself");
        assert_eq!(resolve(&p, &[" high "], Priority::High), Priority::High);
    }

    #[test]
    fn an_explicit_max_lets_a_trusted_header_raise_up_to_it() {
        let p = header(Some(Priority::High), &[]);
        assert_eq!(resolve(&p, &["high"], Priority::Low), Priority::High);
        let p = header(Some(Priority::Normal), &[]);
        assert_eq!(resolve(&p, &["high"], Priority::Low), Priority::Normal);
    }

    #[test]
    fn absent_repeated_or_unknown_values_are_the_routes_priority() {
        let p = header(Some(Priority::High), &[("gold", Priority::High), ("free", Priority::Low)]);
        assert_eq!(resolve(&p, &[], Priority::Normal), Priority::Normal);
        assert_eq!(resolve(&p, &["gold", "gold"], Priority::Normal), Priority::Normal);
        assert_eq!(resolve(&p, &["silver"], Priority::Normal), Priority::Normal);
        // With a map, the priorities' own names are not values.
        assert_eq!(resolve(&p, &["high"], Priority::Normal), Priority::Normal);
        assert_eq!(resolve(&p, &["GOLD"], Priority::Normal), Priority::Normal, "values are exact");
        assert_eq!(resolve(&p, &["gold"], Priority::Normal), Priority::High);
        assert_eq!(resolve(&p, &["free"], Priority::Normal), Priority::Low);
    }

    #[test]
    fn a_claim_without_a_verified_token_is_the_routes_priority() {
        let p = PriorityFrom {
            source: Source::Claim("tier".into()),
            map: vec![(b"gold".as_slice().into(), Priority::High)],
            max: None,
        };
        // No [jwt] verifier at all, and a token that is not even one.
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_static("Bearer not-a-token"));
        let facts = RequestFacts::new(None, &headers, None);
        assert_eq!(p.resolve(&facts, Priority::Low), Priority::Low);
    }
}
