//! Client keys: who a request counts against.
//!
//! The client IP is the TCP peer, or — only when the peer is a trusted proxy — the address found by
//! walking the forwarding header right to left past trusted hops (nginx `real_ip_recursive on`).
//! Keys are bytes (header values need not be UTF-8) and are bounded: a key longer than
//! [`MAX_KEY_LEN`] is replaced by its SHA-256, never skipped (nginx stops limiting keys over 64 KiB).

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, COOKIE};
use ipnet::IpNet;
use sha2::{Digest, Sha256};

/// Longer keys are hashed. Short enough for compact Redis keys, long enough for API keys and IPs.
pub const MAX_KEY_LEN: usize = 128;
/// Separates the parts of a composite key; a control character cannot occur in header values.
const PART_SEPARATOR: u8 = 0x1f;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    ClientIp,
    Header(HeaderName),
    Query(String),
    Cookie(String),
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("expected \"ip\", \"header:NAME\", \"query:NAME\" or \"cookie:NAME\", got {0:?}")]
pub struct KeyPartError(pub String);

impl KeyPart {
    pub fn parse(text: &str) -> Result<KeyPart, KeyPartError> {
        let err = || KeyPartError(text.to_string());
        if text == "ip" {
            return Ok(KeyPart::ClientIp);
        }
        let (kind, name) = text.split_once(':').ok_or_else(err)?;
        if name.is_empty() {
            return Err(err());
        }
        match kind {
            "header" => HeaderName::from_bytes(name.as_bytes()).map(KeyPart::Header).map_err(|_| err()),
            "query" => Ok(KeyPart::Query(name.to_string())),
            "cookie" => Ok(KeyPart::Cookie(name.to_string())),
            _ => Err(err()),
        }
    }
}

/// The request facts keys are made of; borrowed from the session, so extraction stays pure.
pub struct RequestFacts<'a> {
    pub client_ip: Option<IpAddr>,
    pub headers: &'a HeaderMap,
    pub query: Option<&'a str>,
}

/// A zone's key: one part, or several joined (composite). Empty when every part is empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec(pub Vec<KeyPart>);

impl KeySpec {
    pub fn extract(&self, req: &RequestFacts<'_>) -> Vec<u8> {
        let mut key = Vec::new();
        let mut any = false;
        for (i, part) in self.0.iter().enumerate() {
            if i > 0 {
                key.push(PART_SEPARATOR);
            }
            let before = key.len();
            part_value(part, req, &mut key);
            any |= key.len() > before;
        }
        if !any {
            return Vec::new();
        }
        bound(key)
    }
}

fn part_value(part: &KeyPart, req: &RequestFacts<'_>, out: &mut Vec<u8>) {
    match part {
        KeyPart::ClientIp => {
            if let Some(ip) = req.client_ip {
                out.extend_from_slice(crate::request::ip_text::IpText::new(ip).as_bytes());
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
    }
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
        self.0.iter().find_map(|part| {
            let ambiguous = match part {
                KeyPart::ClientIp => false,
                KeyPart::Header(name) => req.headers.get_all(name).iter().nth(1).is_some(),
                KeyPart::Query(name) => differ(query_args(req.query, name)),
                KeyPart::Cookie(name) => differ(cookies(req.headers, name)),
            };
            ambiguous.then(|| AmbiguousKey(part.describe()))
        })
    }
}

impl KeyPart {
    /// This part's value for a request alone (bounded like a whole key; empty when absent).
    pub fn value(&self, req: &RequestFacts<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        part_value(self, req, &mut out);
        bound(out)
    }

    fn describe(&self) -> String {
        match self {
            KeyPart::ClientIp => "ip".to_string(),
            KeyPart::Header(name) => format!("header {name}"),
            KeyPart::Query(name) => format!("query argument {name}"),
            KeyPart::Cookie(name) => format!("cookie {name}"),
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

/// Replaces an over-long key by `#` + hex SHA-256, so a huge header can neither bypass the limit
/// nor bloat the store.
pub fn bound(key: Vec<u8>) -> Vec<u8> {
    if key.len() <= MAX_KEY_LEN {
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

/// nginx `set_real_ip_from` + `real_ip_header` + `real_ip_recursive on`.
#[derive(Debug, Clone)]
pub struct RealIp {
    pub trusted: Vec<IpNet>,
    pub header: HeaderName,
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
        let lines: Vec<&[u8]> = headers.get_all(&self.header).iter().map(|v| v.as_bytes()).collect();
        for line in lines.iter().rev() {
            for hop in line.rsplit(|&b| b == b',') {
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
fn canonical(ip: IpAddr) -> IpAddr {
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
        let facts = RequestFacts { client_ip: Some(ip("192.0.2.1")), headers: &h, query: Some("x=1&tenant=t7") };
        let spec = |parts: &[&str]| KeySpec(parts.iter().map(|p| KeyPart::parse(p).unwrap()).collect());
        assert_eq!(spec(&["header:X-Api-Key"]).extract(&facts), b"k1");
        assert_eq!(spec(&["query:tenant"]).extract(&facts), b"t7");
        assert_eq!(spec(&["cookie:session"]).extract(&facts), b"s9");
        assert_eq!(spec(&["ip", "header:x-api-key"]).extract(&facts), b"192.0.2.1\x1fk1");
        assert_eq!(spec(&["header:x-missing"]).extract(&facts), b"");
        assert_eq!(spec(&["header:x-missing", "query:nope"]).extract(&facts), b"");
        // A composite with one part present is still limited.
        assert_eq!(spec(&["header:x-missing", "ip"]).extract(&facts), b"\x1f192.0.2.1");
    }

    #[test]
    fn long_and_non_utf8_keys_are_hashed_not_skipped() {
        let long = vec![b'a'; 60 * 1024];
        let h = headers(&[("x-api-key", &long)]);
        let facts = RequestFacts { client_ip: None, headers: &h, query: None };
        let key = KeySpec(vec![KeyPart::parse("header:x-api-key").unwrap()]).extract(&facts);
        assert_eq!(key.len(), 65);
        assert_eq!(key[0], b'#');
        let h2 = headers(&[("x-api-key", b"\xff\xfe{}")]);
        let facts = RequestFacts { client_ip: None, headers: &h2, query: None };
        assert_eq!(KeySpec(vec![KeyPart::Header(HeaderName::from_static("x-api-key"))]).extract(&facts), b"\xff\xfe{}");
    }

    #[test]
    fn encodings_of_one_value_are_one_key() {
        let spec = |p: &str| KeySpec(vec![KeyPart::parse(p).unwrap()]);
        let key = |p: &str, query: &str, cookie: &[u8]| {
            let h = headers(&[("cookie", cookie)]);
            spec(p).extract(&RequestFacts { client_ip: None, headers: &h, query: Some(query) })
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
        let spec = |p: &str| KeySpec(vec![KeyPart::parse("ip").unwrap(), KeyPart::parse(p).unwrap()]);
        let check = |p: &str, h: &HeaderMap, query: &str| {
            spec(p).ambiguity(&RequestFacts { client_ip: None, headers: h, query: Some(query) })
        };
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
    fn rejects_bad_key_parts() {
        for bad in ["", "ip:x", "header:", "header:bad name", "path", "query"] {
            assert!(KeyPart::parse(bad).is_err(), "{bad}");
        }
    }
}
