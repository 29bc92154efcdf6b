//! The host a request names, read as nginx reads it (`ngx_http_validate_host`): case folded, a
//! trailing dot dropped, the port apart. Where nginx is lenient in a way that lets one host be
//! spelled so that Weir's routes miss it (`api.example.com:1:1` is `api.example.com` to nginx),
//! the spelling is refused instead: a port is digits, a name is letters, digits, `-`, `_` and
//! dots between non-empty labels, or a bracketed IPv6 literal.

use std::borrow::Cow;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host<'a> {
    /// Lower case, no trailing dot; an IPv6 literal keeps its brackets.
    pub name: Cow<'a, str>,
    pub port: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("the host is empty")]
    Empty,
    #[error("the host's port must be decimal digits after one ':'")]
    BadPort,
    #[error("the host may only contain letters, digits, '-', '_' and '.' between non-empty labels")]
    BadName,
}

impl<'a> Host<'a> {
    pub fn parse(raw: &'a str) -> Result<Host<'a>, HostError> {
        let (name, port) = split_port(raw)?;
        let name = if name.starts_with('[') {
            if !is_ipv6_literal(name) {
                return Err(HostError::BadName);
            }
            name
        } else {
            let name = name.strip_suffix(".").unwrap_or(name);
            if name.is_empty() {
                return Err(HostError::Empty);
            }
            if !is_host_name(name) {
                return Err(HostError::BadName);
            }
            name
        };
        let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(name.to_ascii_lowercase())
        } else {
            Cow::Borrowed(name)
        };
        Ok(Host { name, port })
    }

    /// The `Host` value forwarded: the name decided on, with the port as sent.
    pub fn header_value(&self) -> String {
        match self.port {
            Some(port) => format!("{}:{port}", self.name),
            None => self.name.to_string(),
        }
    }

    /// Whether `raw` is already spelled as it would be forwarded.
    pub fn spelled_as(&self, raw: &str) -> bool {
        match self.port {
            Some(port) => {
                raw.len() == self.name.len() + 1 + port.len()
                    && raw.starts_with(self.name.as_ref())
                    && raw.as_bytes()[self.name.len()] == b':'
            }
            None => raw == self.name,
        }
    }
}

/// A host name as Weir accepts one, in requests and in route patterns: non-empty labels of
/// letters, digits, `-` and `_`, joined by dots.
pub fn is_host_name(name: &str) -> bool {
    // One pass over the bytes (every request's Host goes through here).
    let mut label_len = 0usize;
    for &b in name.as_bytes() {
        if b == b'.' {
            if label_len == 0 {
                return false;
            }
            label_len = 0;
        } else if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            label_len += 1;
        } else {
            return false;
        }
    }
    label_len > 0
}

/// An IPv6 address in brackets (`[::1]`).
pub fn is_ipv6_literal(name: &str) -> bool {
    name.strip_prefix('[').and_then(|n| n.strip_suffix(']')).is_some_and(|n| n.parse::<std::net::Ipv6Addr>().is_ok())
}

/// `name` and an optional port (`host:` has none). One `:` outside IPv6 brackets.
fn split_port(raw: &str) -> Result<(&str, Option<&str>), HostError> {
    if raw.is_empty() {
        return Err(HostError::Empty);
    }
    let name_end = if raw.starts_with('[') { raw.find(']').ok_or(HostError::BadName)? + 1 } else { 0 };
    let (name, rest) = match raw.as_bytes()[name_end..].iter().position(|&b| b == b':') {
        Some(colon) => (&raw[..name_end + colon], Some(&raw[name_end + colon + 1..])),
        None if name_end == 0 => (raw, None),
        None if name_end == raw.len() => (raw, None),
        None => return Err(HostError::BadName),
    };
    match rest {
        None | Some("") => Ok((name, None)),
        Some(port) if port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit()) => Ok((name, Some(port))),
        Some(_) => Err(HostError::BadPort),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(raw: &str) -> Result<(String, Option<&str>), HostError> {
        Host::parse(raw).map(|h| (h.name.into_owned(), h.port))
    }

    #[test]
    fn spellings_of_one_host() {
        for raw in ["api.example.com", "API.Example.COM", "api.example.com.", "api.example.com:"] {
            assert_eq!(host(raw), Ok(("api.example.com".to_string(), None)), "{raw}");
        }
        assert_eq!(host("API.example.com.:8080"), Ok(("api.example.com".to_string(), Some("8080"))));
        assert_eq!(host("[::1]:80"), Ok(("[::1]".to_string(), Some("80"))));
        assert_eq!(host("[2001:DB8::1]"), Ok(("[2001:db8::1]".to_string(), None)));
        assert_eq!(host("my_host-1"), Ok(("my_host-1".to_string(), None)));
    }

    #[test]
    fn ambiguous_hosts_are_refused() {
        assert_eq!(host("api.example.com:1:1"), Err(HostError::BadPort));
        assert_eq!(host("api.example.com:x"), Err(HostError::BadPort));
        assert_eq!(host("h:123456"), Err(HostError::BadPort));
        for bad in ["api..example.com", ".api", "api.example.com/x", "a b", "a\\b", "[::1", "[x]", "[::1]x", "é.com"] {
            assert_eq!(host(bad), Err(HostError::BadName), "{bad}");
        }
        assert_eq!(host(""), Err(HostError::Empty));
        assert_eq!(host(":80"), Err(HostError::Empty));
        assert_eq!(host("."), Err(HostError::Empty));
    }

    #[test]
    fn forwarded_spelling() {
        let h = Host::parse("API.example.com.:81").unwrap();
        assert_eq!(h.header_value(), "api.example.com:81");
        assert!(!h.spelled_as("API.example.com.:81"));
        assert!(h.spelled_as("api.example.com:81"));
        assert!(Host::parse("a.b").unwrap().spelled_as("a.b"));
    }
}
