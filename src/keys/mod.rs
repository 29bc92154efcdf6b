//! Client keys: who a request counts against.
//!
//! The client IP is the TCP peer, or — only when the peer is a trusted proxy — the address found by
//! walking the forwarding header right to left past trusted hops (nginx `real_ip_recursive on`).
//! Keys are bytes (header values need not be UTF-8) and are bounded: a key longer than
//! [`MAX_KEY_LEN`] is replaced by its SHA-256, never skipped (nginx stops limiting keys over 64 KiB).

pub mod ip_prefix;
pub mod jwt;

use std::cell::OnceCell;
use std::fmt;
use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, AUTHORIZATION, COOKIE};
use ipnet::IpNet;
use regex::Regex;
use sha2::{Digest, Sha256};

pub use ip_prefix::IpPrefix;
use jwt::{Claims, TokenError, Verifier};

/// Longer keys are hashed. Short enough for compact Redis keys, long enough for API keys and IPs.
pub const MAX_KEY_LEN: usize = 128;
/// Separates the parts of a composite key. Header values cannot hold it, but decoded query and
/// cookie values and rate limit service descriptor values can: [`push_part`] escapes it there.
pub const PART_SEPARATOR: u8 = 0x1f;
/// Marks a part that is not a request's value (an RLS `share_threshold` rule's pattern): escaped
/// in values, so no value can spell a marked part.
pub const PATTERN_MARK: u8 = 0x1e;
/// Escapes, inside a part's value, the bytes that structure a key (separator, marks, itself): a
/// control character no header, query or descriptor value has a reason to hold.
const PART_ESCAPE: u8 = 0x1d;
/// Starts the key of a request whose token could not be verified (`bad_token_key`), so that such
/// keys never meet a verified claim's.
const BAD_TOKEN_MARK: &[u8] = b"\x1ebad-token\x1e";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// `ip`: the whole client address (nginx's `$binary_remote_addr`).
    ClientIp,
    /// `ip/24,64`: the client's network.
    IpPrefix(IpPrefix),
    Header(HeaderName),
    Query(String),
    Cookie(String),
    /// `route`: the name of the route the request took (one bucket per route).
    Route,
    /// `const:TEXT`: the same text for every request (one bucket for the zone).
    Const(String),
    /// `jwt:sub`, `jwt:/org/id`: a claim of the verified bearer token.
    Claim(String),
    /// `path:NAME`: the named group `NAME` of the route's `path_regex`, on the canonical path.
    PathPart(String),
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "expected \"ip\", \"ip/V4LEN\" or \"ip/V4LEN,V6LEN\", \"route\", \"const:TEXT\", \"header:NAME\", \"query:NAME\", \
     \"cookie:NAME\", \"jwt:CLAIM\" (a name or a /JSON/pointer) or \"path:GROUP\", got {0:?}"
)]
pub struct KeyPartError(pub String);

impl KeyPart {
    pub fn parse(text: &str) -> Result<KeyPart, KeyPartError> {
        let err = || KeyPartError(text.to_string());
        match text {
            "ip" => return Ok(KeyPart::ClientIp),
            "route" => return Ok(KeyPart::Route),
            _ => {}
        }
        if let Some(lengths) = text.strip_prefix("ip/") {
            return IpPrefix::parse(lengths).map(KeyPart::IpPrefix).ok_or_else(err);
        }
        let (kind, name) = text.split_once(':').ok_or_else(err)?;
        if name.is_empty() {
            return Err(err());
        }
        match kind {
            "header" => HeaderName::from_bytes(name.as_bytes()).map(KeyPart::Header).map_err(|_| err()),
            "query" => Ok(KeyPart::Query(name.to_string())),
            "cookie" => Ok(KeyPart::Cookie(name.to_string())),
            "const" => Ok(KeyPart::Const(name.to_string())),
            "jwt" => Ok(KeyPart::Claim(name.to_string())),
            "path" if is_group_name(name) => Ok(KeyPart::PathPart(name.to_string())),
            _ => Err(err()),
        }
    }
}

/// A name the regex crate accepts for a capture group.
fn is_group_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The config spelling of a part.
impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::ClientIp => f.write_str("ip"),
            KeyPart::IpPrefix(p) => write!(f, "{p}"),
            KeyPart::Header(h) => write!(f, "header:{h}"),
            KeyPart::Query(q) => write!(f, "query:{q}"),
            KeyPart::Cookie(c) => write!(f, "cookie:{c}"),
            KeyPart::Route => f.write_str("route"),
            KeyPart::Const(t) => write!(f, "const:{t}"),
            KeyPart::Claim(c) => write!(f, "jwt:{c}"),
            KeyPart::PathPart(p) => write!(f, "path:{p}"),
        }
    }
}

/// The request facts keys are made of; borrowed from the request, so extraction stays pure. The
/// bearer token is verified at most once per request, when a key first asks for a claim.
pub struct RequestFacts<'a> {
    pub client_ip: Option<IpAddr>,
    pub headers: &'a HeaderMap,
    pub query: Option<&'a str>,
    /// The route's name (`route`), empty outside a route.
    pub route: &'a str,
    /// The canonical path, and the route's `path_regex` its `path:` parts are captured with.
    pub path: &'a str,
    pub path_regex: Option<&'a Regex>,
    /// `[jwt]`'s keys; `None` when the config has none.
    pub jwt: Option<&'a Verifier>,
    /// The request's time in seconds since the Unix epoch, for a token's `exp`/`nbf`; `None`:
    /// now (read only when a token is verified).
    pub now_secs: Option<u64>,
    /// The method routes matched on, for a limit's `method` condition; `None` outside a route.
    pub method: Option<&'a http::Method>,
    token: OnceCell<Result<Claims, TokenError>>,
}

impl<'a> RequestFacts<'a> {
    pub fn new(client_ip: Option<IpAddr>, headers: &'a HeaderMap, query: Option<&'a str>) -> Self {
        RequestFacts {
            client_ip,
            headers,
            query,
            route: "",
            path: "/",
            path_regex: None,
            jwt: None,
            now_secs: None,
            method: None,
            token: OnceCell::new(),
        }
    }

    /// The verified token's claims (verified on first use).
    pub fn claims(&self) -> Result<&Claims, &TokenError> {
        self.token
            .get_or_init(|| match self.jwt {
                Some(verifier) => {
                    verifier.verify(self.headers, self.now_secs.unwrap_or_else(|| crate::tls::unix_now().max(0) as u64))
                }
                None => Err(TokenError::Refused("no [jwt] keys are configured".into())),
            })
            .as_ref()
    }

    fn claim(&self, name: &str) -> Result<Vec<u8>, TokenError> {
        let claims = self.claims().map_err(Clone::clone)?;
        claims.get(name).ok_or_else(|| TokenError::MissingClaim(name.to_string()))
    }
}

/// What a zone does with a request whose key needs a claim it cannot have (no token, a token that
/// fails verification, a verified token without the claim).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TokenPolicy {
    /// Refuse it with 401.
    #[default]
    Reject,
    /// Key it by these parts instead, marked so it never shares a verified user's bucket.
    Fallback(Vec<KeyPart>),
}

/// A zone's key: one part, or several joined (composite). Empty when every part is empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    pub parts: Vec<KeyPart>,
    pub on_bad_token: TokenPolicy,
}

/// A request a zone refuses (401) because its key needs a verified claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadToken(pub TokenError);

impl KeySpec {
    pub fn new(parts: Vec<KeyPart>) -> Self {
        KeySpec { parts, on_bad_token: TokenPolicy::Reject }
    }

    pub fn extract(&self, req: &RequestFacts<'_>) -> Result<Vec<u8>, BadToken> {
        match join(&self.parts, req) {
            Ok(key) => Ok(key),
            Err(e) => match &self.on_bad_token {
                TokenPolicy::Reject => Err(BadToken(e)),
                TokenPolicy::Fallback(parts) => {
                    // Never empty, so never unlimited: without any fallback part, one shared bucket.
                    let mut key = BAD_TOKEN_MARK.to_vec();
                    key.extend(join(parts, req).unwrap_or_default());
                    Ok(bound(key))
                }
            },
        }
    }

    /// Whether any part needs the verified token.
    pub fn reads_claims(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, KeyPart::Claim(_)))
    }
}

fn join(parts: &[KeyPart], req: &RequestFacts<'_>) -> Result<Vec<u8>, TokenError> {
    let mut key = Vec::new();
    let mut any = false;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            key.push(PART_SEPARATOR);
        }
        let before = key.len();
        part_value(part, req, &mut key)?;
        escape_part(&mut key, before);
        any |= key.len() > before;
    }
    if !any {
        return Ok(Vec::new());
    }
    Ok(bound(key))
}

fn part_value(part: &KeyPart, req: &RequestFacts<'_>, out: &mut Vec<u8>) -> Result<(), TokenError> {
    match part {
        KeyPart::ClientIp => {
            if let Some(ip) = req.client_ip {
                out.extend_from_slice(crate::request::ip_text::IpText::new(ip).as_bytes());
            }
        }
        KeyPart::IpPrefix(prefix) => {
            if let Some(ip) = req.client_ip {
                prefix.write(ip, out);
            }
        }
        KeyPart::Header(name) => {
            // The first field line, as most upstreams read it; several lines are refused before
            // extraction (see `KeySpec::ambiguity`), so this is the only line there is.
            if let Some(v) = req.headers.get(name) {
                out.extend_from_slice(v.as_bytes());
            }
        }
        KeyPart::Query(name) => {
            if let Some(v) = query_args(req.query, name).next() {
                out.extend_from_slice(v.as_bytes());
            }
        }
        KeyPart::Cookie(name) => {
            if let Some(v) = cookies(req.headers, name).next() {
                out.extend_from_slice(&v);
            }
        }
        KeyPart::Route => out.extend_from_slice(req.route.as_bytes()),
        KeyPart::Const(text) => out.extend_from_slice(text.as_bytes()),
        KeyPart::Claim(name) => out.extend(req.claim(name)?),
        KeyPart::PathPart(name) => {
            let captured = req.path_regex.and_then(|r| r.captures(req.path)).and_then(|c| c.name(name));
            if let Some(m) = captured {
                out.extend_from_slice(m.as_str().as_bytes());
            }
        }
    }
    Ok(())
}

/// Why a request's key cannot be told: the same key part carried twice with different values,
/// which upstreams resolve differently (first, last or joined). Answered with a 400, because any
/// choice of ours would let a client pick a fresh bucket with the value the upstream ignores.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} is given more than once with different values")]
pub struct AmbiguousKey(pub String);

impl KeySpec {
    /// The first part of this key a request carries ambiguously, if any.
    pub fn ambiguity(&self, req: &RequestFacts<'_>) -> Option<AmbiguousKey> {
        self.parts.iter().chain(self.fallback_parts()).find_map(|part| part.ambiguity(req))
    }

    fn fallback_parts(&self) -> &[KeyPart] {
        match &self.on_bad_token {
            TokenPolicy::Reject => &[],
            TokenPolicy::Fallback(parts) => parts,
        }
    }
}

impl KeyPart {
    /// Whether a request carries this part ambiguously (a header line twice, a query argument or
    /// cookie twice with different values): the same test for a key and for an override's match.
    pub fn ambiguity(&self, req: &RequestFacts<'_>) -> Option<AmbiguousKey> {
        let ambiguous = match self {
            KeyPart::ClientIp | KeyPart::IpPrefix(_) | KeyPart::Route | KeyPart::Const(_) | KeyPart::PathPart(_) => {
                false
            }
            KeyPart::Claim(_) => req.headers.get_all(AUTHORIZATION).iter().nth(1).is_some(),
            KeyPart::Header(name) => req.headers.get_all(name).iter().nth(1).is_some(),
            KeyPart::Query(name) => differ(query_args(req.query, name)),
            KeyPart::Cookie(name) => differ(cookies(req.headers, name)),
        };
        ambiguous.then(|| AmbiguousKey(self.describe()))
    }

    /// This part's value for a request alone (bounded like a whole key; empty when absent).
    /// A claim that cannot be had is empty here (the zone's token policy acts on the whole key).
    /// The part's value as the request gives it, never hashed however long (a limit's
    /// condition compares or matches it); empty when absent.
    pub fn raw_value(&self, req: &RequestFacts<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        if part_value(self, req, &mut out).is_err() {
            out.clear();
        }
        out
    }

    pub fn value(&self, req: &RequestFacts<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        if part_value(self, req, &mut out).is_err() {
            out.clear();
        }
        bound(out)
    }

    fn describe(&self) -> String {
        match self {
            KeyPart::Header(name) => format!("header {name}"),
            KeyPart::Query(name) => format!("query argument {name}"),
            KeyPart::Cookie(name) => format!("cookie {name}"),
            KeyPart::Claim(_) => "header authorization".to_string(),
            other => other.to_string(),
        }
    }
}

fn differ<T: PartialEq>(mut values: impl Iterator<Item = T>) -> bool {
    let Some(first) = values.next() else { return false };
    values.any(|v| v != first)
}

/// The values of query argument `name`, names and values decoded like a form
/// (`%6b=%61` is `k=a`, `+` is a space), so every spelling of one value is one key.
fn query_args<'q>(query: Option<&'q str>, name: &'q str) -> impl Iterator<Item = String> + 'q {
    form_urlencoded::parse(query.unwrap_or("").as_bytes()).filter(move |(k, _)| k == name).map(|(_, v)| v.into_owned())
}

/// The values of cookie `name` over every Cookie line, parsed like browsers and frameworks do
/// (RFC 6265 §5.2, leniently): whitespace around names and values is dropped, one pair of double
/// quotes around a value is removed, and percent-escapes are decoded.
fn cookies<'h>(headers: &'h HeaderMap, name: &'h str) -> impl Iterator<Item = Vec<u8>> + 'h {
    headers.get_all(COOKIE).iter().flat_map(move |line| {
        line.as_bytes().split(|&b| b == b';').filter_map(move |pair| {
            let eq = pair.iter().position(|&b| b == b'=')?;
            if pair[..eq].trim_ascii() != name.as_bytes() {
                return None;
            }
            let mut value = pair[eq + 1..].trim_ascii();
            if value.len() >= 2 && value[0] == b'"' && value[value.len() - 1] == b'"' {
                value = &value[1..value.len() - 1];
            }
            Some(percent_encoding::percent_decode(value).collect())
        })
    })
}

/// Appends one part's value to a composite key, escaped so that no value can read as a separator
/// or a mark: two different lists of values never make the same key (`("a\x1fb")` is not
/// `("a", "b")`). Values without those bytes are appended as they are.
pub fn push_part(key: &mut Vec<u8>, value: &[u8]) {
    let from = key.len();
    key.extend_from_slice(value);
    escape_part(key, from);
}

/// Escapes the structuring bytes in `key[from..]` (one part's value), in place.
fn escape_part(key: &mut Vec<u8>, from: usize) {
    let structural = |b: &u8| matches!(*b, PART_SEPARATOR | PART_ESCAPE | PATTERN_MARK);
    if !key[from..].iter().any(structural) {
        return;
    }
    let value = key.split_off(from);
    for b in value {
        if structural(&b) {
            key.push(PART_ESCAPE);
        }
        key.push(b);
    }
}

/// Replaces an over-long key by `#` + hex SHA-256, so a huge header can neither bypass the limit
/// nor bloat the store. A key that starts with `#` is hashed too, so that no value can be spelt
/// as another key's hash and share its counter.
pub fn bound(key: Vec<u8>) -> Vec<u8> {
    if key.len() <= MAX_KEY_LEN && key.first() != Some(&b'#') {
        return key;
    }
    hashed(&key)
}

/// `#` + the hex SHA-256 of `key`: the one form long keys take, here and in Redis key names.
pub fn hashed(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(65);
    out.push(b'#');
    for byte in Sha256::digest(key) {
        out.extend_from_slice(format!("{byte:02x}").as_bytes());
    }
    out
}

/// nginx `set_real_ip_from` + `real_ip_header` + `real_ip_recursive` (on by default).
#[derive(Debug, Clone)]
pub struct RealIp {
    pub trusted: Vec<IpNet>,
    pub header: HeaderName,
    /// `real_ip_recursive on`: walk past trusted hops; off: the header's last address, trusted or not.
    pub recursive: bool,
}

impl RealIp {
    fn is_trusted(&self, ip: &IpAddr) -> bool {
        let ip = canonical(*ip);
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client address: the peer, or if the peer is trusted, the rightmost untrusted address of
    /// the header (the leftmost one if every hop is trusted). An unparsable hop ends the walk at
    /// the last good address, like nginx.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut current = canonical(peer);
        if !self.is_trusted(&current) {
            return current;
        }
        if !self.recursive {
            // nginx with `real_ip_recursive off`: the rightmost address of the last line, if it
            // is one; else the peer.
            let last = headers.get_all(&self.header).iter().next_back();
            return last
                .and_then(|line| line.as_bytes().rsplit(|&b| b == b',').next())
                .and_then(parse_hop)
                .unwrap_or(current);
        }
        for line in headers.get_all(&self.header).iter().rev() {
            for hop in line.as_bytes().rsplit(|&b| b == b',') {
                match parse_hop(hop) {
                    Some(ip) => current = ip,
                    None => return current,
                }
                if !self.is_trusted(&current) {
                    return current;
                }
            }
        }
        current
    }
}

/// Whether the TCP peer is a proxy listed in `real_ip.trusted` (false without `[real_ip]`).
pub fn peer_is_trusted(peer: Option<IpAddr>, real_ip: Option<&RealIp>) -> bool {
    matches!((peer, real_ip), (Some(ip), Some(r)) if r.is_trusted(&ip))
}

/// Resolves the client IP for a request given the optional real-IP settings.
pub fn client_ip(peer: Option<IpAddr>, headers: &HeaderMap, real_ip: Option<&RealIp>) -> Option<IpAddr> {
    let peer = peer?;
    Some(match real_ip {
        Some(r) => r.client_ip(peer, headers),
        None => canonical(peer),
    })
}

/// IPv4-mapped IPv6 (`::ffff:1.2.3.4`, as dual-stack sockets report) counts as the IPv4 address.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// One hop of X-Forwarded-For / X-Real-IP: `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`, `[2001:db8::1]:443`.
fn parse_hop(raw: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(raw).ok()?.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    let host = match text.strip_prefix('[') {
        Some(rest) => rest.split_once(']')?.0,
        None => text.rsplit_once(':')?.0,
    };
    host.parse::<IpAddr>().ok().map(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    fn real_ip(trusted: &[&str]) -> RealIp {
        RealIp {
            trusted: trusted.iter().map(|t| t.parse().unwrap()).collect(),
            header: HeaderName::from_static("x-forwarded-for"),
            recursive: true,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn untrusted_peer_is_the_client_whatever_the_header_says() {
        let h = headers(&[("x-forwarded-for", b"203.0.113.9")]);
        assert_eq!(real_ip(&["10.0.0.0/8"]).client_ip(ip("192.0.2.1"), &h), ip("192.0.2.1"));
    }

    #[test]
    fn walks_right_to_left_past_trusted_hops() {
        let r = real_ip(&["10.0.0.0/8", "127.0.0.1/32"]);
        let h = headers(&[("x-forwarded-for", b"198.51.100.1, 203.0.113.9, 10.1.2.3")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &h), ip("203.0.113.9"));
        // Several header lines are one list, the last line rightmost.
        let h = headers(&[("x-forwarded-for", b"203.0.113.9"), ("x-forwarded-for", b"10.0.0.5")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &h), ip("203.0.113.9"));
        // All hops trusted: the leftmost.
        let h = headers(&[("x-forwarded-for", b"10.0.0.1, 10.0.0.2")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &h), ip("10.0.0.1"));
        // No header: the peer.
        assert_eq!(r.client_ip(ip("127.0.0.1"), &HeaderMap::new()), ip("127.0.0.1"));
    }

    #[test]
    fn without_recursion_the_last_address_is_the_client_even_if_trusted() {
        let r = RealIp { recursive: false, ..real_ip(&["10.0.0.0/8", "127.0.0.1/32"]) };
        let h = headers(&[("x-forwarded-for", b"198.51.100.1, 203.0.113.9, 10.1.2.3")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &h), ip("10.1.2.3"));
        let h = headers(&[("x-forwarded-for", b"203.0.113.9"), ("x-forwarded-for", b"198.51.100.7")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &h), ip("198.51.100.7"));
        let h = headers(&[("x-forwarded-for", b"203.0.113.9, garbage")]);
        assert_eq!(r.client_ip(ip("127.0.0.1"), &h), ip("127.0.0.1"));
        // An untrusted peer is the client, as with recursion.
        assert_eq!(r.client_ip(ip("192.0.2.1"), &h), ip("192.0.2.1"));
    }

    #[test]
    fn parses_ipv6_ports_and_stops_at_garbage() {
        let r = real_ip(&["::1/128", "10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", b"[2001:db8::7]:443")]);
        assert_eq!(r.client_ip(ip("::1"), &h), ip("2001:db8::7"));
        let h = headers(&[("x-forwarded-for", b"203.0.113.5:1234")]);
        assert_eq!(r.client_ip(ip("::1"), &h), ip("203.0.113.5"));
        let h = headers(&[("x-forwarded-for", b"203.0.113.5, garbage, 10.0.0.9")]);
        assert_eq!(r.client_ip(ip("::1"), &h), ip("10.0.0.9"));
        let h = headers(&[("x-forwarded-for", b"\xff\xfe")]);
        assert_eq!(r.client_ip(ip("::1"), &h), ip("::1"));
        // A v4-mapped peer is matched against v4 ranges.
        let h = headers(&[("x-forwarded-for", b"203.0.113.5")]);
        assert_eq!(r.client_ip(ip("::ffff:10.0.0.1"), &h), ip("203.0.113.5"));
    }

    #[test]
    fn extracts_header_query_cookie_and_composites() {
        let h = headers(&[("x-api-key", b"k1"), ("cookie", b"a=1; session=s9; b=2")]);
        let facts = RequestFacts::new(Some(ip("192.0.2.1")), &h, Some("x=1&tenant=t7"));
        let spec = |parts: &[&str]| KeySpec::new(parts.iter().map(|p| KeyPart::parse(p).unwrap()).collect());
        assert_eq!(spec(&["header:X-Api-Key"]).extract(&facts).unwrap(), b"k1");
        assert_eq!(spec(&["query:tenant"]).extract(&facts).unwrap(), b"t7");
        assert_eq!(spec(&["cookie:session"]).extract(&facts).unwrap(), b"s9");
        assert_eq!(spec(&["ip", "header:x-api-key"]).extract(&facts).unwrap(), b"192.0.2.1\x1fk1");
        assert_eq!(spec(&["header:x-missing"]).extract(&facts).unwrap(), b"");
        assert_eq!(spec(&["header:x-missing", "query:nope"]).extract(&facts).unwrap(), b"");
        // A composite with one part present is still limited.
        assert_eq!(spec(&["header:x-missing", "ip"]).extract(&facts).unwrap(), b"\x1f192.0.2.1");
    }

    #[test]
    fn long_and_non_utf8_keys_are_hashed_not_skipped() {
        let long = vec![b'a'; 60 * 1024];
        let h = headers(&[("x-api-key", &long)]);
        let facts = RequestFacts::new(None, &h, None);
        let key = KeySpec::new(vec![KeyPart::parse("header:x-api-key").unwrap()]).extract(&facts).unwrap();
        assert_eq!(key.len(), 65);
        assert_eq!(key[0], b'#');
        let h2 = headers(&[("x-api-key", b"\xff\xfe{}")]);
        let facts = RequestFacts::new(None, &h2, None);
        assert_eq!(
            KeySpec::new(vec![KeyPart::Header(HeaderName::from_static("x-api-key"))]).extract(&facts).unwrap(),
            b"\xff\xfe{}"
        );
    }

    #[test]
    fn encodings_of_one_value_are_one_key() {
        let spec = |p: &str| KeySpec::new(vec![KeyPart::parse(p).unwrap()]);
        let key = |p: &str, query: &str, cookie: &[u8]| {
            let h = headers(&[("cookie", cookie)]);
            spec(p).extract(&RequestFacts::new(None, &h, Some(query))).unwrap()
        };
        for q in ["k=a", "k=%61", "%6b=a", "%6B=%61", "x=1&k=a"] {
            assert_eq!(key("query:k", q, b""), b"a", "{q}");
        }
        assert_eq!(key("query:k", "k=a+b", b""), b"a b");
        assert_eq!(key("query:k", "k=a%20b", b""), b"a b");
        for c in [&b"sid=s1"[..], b"sid =s1", b"sid= s1 ", b"sid=\"s1\"", b"a=1;sid=%73%31", b" sid=s1;"] {
            assert_eq!(key("cookie:sid", "", c), b"s1", "{}", String::from_utf8_lossy(c));
        }
    }

    #[test]
    fn a_key_part_given_twice_with_different_values_is_ambiguous() {
        let spec = |p: &str| KeySpec::new(vec![KeyPart::parse("ip").unwrap(), KeyPart::parse(p).unwrap()]);
        let check = |p: &str, h: &HeaderMap, query: &str| spec(p).ambiguity(&RequestFacts::new(None, h, Some(query)));
        let none = HeaderMap::new();
        let two_keys = headers(&[("x-api-key", b"k1"), ("x-api-key", b"k2")]);
        let same_twice = headers(&[("x-api-key", b"k1"), ("x-api-key", b"k1")]);
        assert!(check("header:x-api-key", &two_keys, "").is_some());
        // Even equal repeated lines: a header key must be one field line.
        assert!(check("header:x-api-key", &same_twice, "").is_some());
        assert!(check("header:x-api-key", &headers(&[("x-api-key", b"k1")]), "").is_none());
        assert!(check("query:k", &none, "k=a&k=b").is_some());
        assert!(check("query:k", &none, "k=a&%6b=%61").is_none(), "one value, two spellings");
        let cookies = headers(&[("cookie", b"sid=s1"), ("cookie", b"sid=s2")]);
        assert!(check("cookie:sid", &cookies, "").is_some());
        assert!(check("cookie:sid", &headers(&[("cookie", b"sid=s1; sid=\"s1\"")]), "").is_none());
        assert_eq!(
            check("query:k", &none, "k=a&k=b").unwrap().to_string(),
            "query argument k is given more than once with different values"
        );
    }

    #[test]
    fn route_const_prefix_and_path_parts() {
        let spec = |parts: &[&str]| KeySpec::new(parts.iter().map(|p| KeyPart::parse(p).unwrap()).collect());
        let h = HeaderMap::new();
        let regex = Regex::new("^/tenants/(?P<tenant>[^/]+)/(?P<rest>.*)$").unwrap();
        let mut facts = RequestFacts::new(Some(ip("2001:db8:1:2::99")), &h, None);
        facts.route = "login";
        facts.path = "/tenants/t%2F7/items";
        facts.path_regex = Some(&regex);
        assert_eq!(spec(&["route"]).extract(&facts).unwrap(), b"login");
        assert_eq!(spec(&["const:all"]).extract(&facts).unwrap(), b"all");
        assert_eq!(spec(&["const:login", "ip/24"]).extract(&facts).unwrap(), b"login\x1f2001:db8:1:2::/64");
        assert_eq!(spec(&["path:tenant"]).extract(&facts).unwrap(), b"t%2F7");
        assert_eq!(spec(&["path:tenant", "path:nope"]).extract(&facts).unwrap(), b"t%2F7\x1f");
        facts.path = "/other";
        assert_eq!(spec(&["path:tenant"]).extract(&facts).unwrap(), b"", "no match: empty, like a missing header");
        for text in [
            "ip",
            "ip/24,64",
            "route",
            "const:x",
            "header:x-a",
            "query:q",
            "cookie:c",
            "jwt:sub",
            "jwt:/o/id",
            "path:t",
        ] {
            assert_eq!(KeyPart::parse(text).unwrap().to_string(), text);
        }
    }

    #[test]
    fn a_claim_without_a_verified_token_rejects_or_falls_back_never_empty() {
        let h = headers(&[("authorization", b"Bearer not.a.token")]);
        let facts = RequestFacts::new(Some(ip("192.0.2.1")), &h, None);
        let mut spec = KeySpec::new(vec![KeyPart::parse("jwt:sub").unwrap()]);
        assert!(spec.extract(&facts).is_err(), "no [jwt]: refused, not unlimited");
        spec.on_bad_token = TokenPolicy::Fallback(vec![KeyPart::parse("ip").unwrap()]);
        assert_eq!(spec.extract(&facts).unwrap(), b"\x1ebad-token\x1e192.0.2.1");
        spec.on_bad_token = TokenPolicy::Fallback(vec![KeyPart::parse("header:x-none").unwrap()]);
        assert_eq!(spec.extract(&facts).unwrap(), b"\x1ebad-token\x1e", "an empty fallback is one shared bucket");
        let two = headers(&[("authorization", b"Bearer a.b.c"), ("authorization", b"Bearer d.e.f")]);
        assert!(spec.ambiguity(&RequestFacts::new(None, &two, None)).is_some());
    }

    #[test]
    fn rejects_bad_key_parts() {
        for bad in [
            "",
            "ip:x",
            "header:",
            "header:bad name",
            "path",
            "query",
            "ip/0",
            "ip/33",
            "ip/24,129",
            "const:",
            "jwt:",
            "path:1x",
            "path:a-b",
            "routes",
        ] {
            assert!(KeyPart::parse(bad).is_err(), "{bad}");
        }
    }
}
