//! What the upstream is told about the client, like nginx's `proxy_set_header X-Forwarded-For
//! $proxy_add_x_forwarded_for`: the TCP peer is appended to the chain a trusted proxy sent, and a
//! chain from anyone else is replaced, so an untrusted client cannot put words in a trusted
//! proxy's mouth. `X-Real-IP` carries the client address Weir limited on; `Forwarded` (RFC 7239)
//! is passed on from trusted peers only.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName};

use super::ip_text::IpText;

pub const X_FORWARDED_FOR: &str = "x-forwarded-for";
pub const X_REAL_IP: &str = "x-real-ip";
pub use http::header::FORWARDED;

/// The names parsed once, for lookups (a `&str` name is parsed again on every lookup).
pub static X_FORWARDED_FOR_NAME: HeaderName = HeaderName::from_static(X_FORWARDED_FOR);
pub static X_REAL_IP_NAME: HeaderName = HeaderName::from_static(X_REAL_IP);

/// The client headers to send upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardedHeaders {
    pub x_forwarded_for: String,
    pub x_real_ip: Option<String>,
    /// Whether an incoming `Forwarded` header may be passed on.
    pub keep_forwarded: bool,
}

/// `peer` is the TCP peer, `client` the address limits were keyed on (the real IP when the peer
/// is a trusted proxy), `peer_trusted` whether the peer is inside `real_ip.trusted`.
pub fn compute(headers: &HeaderMap, peer: IpAddr, client: Option<IpAddr>, peer_trusted: bool) -> ForwardedHeaders {
    let sent = headers.get_all(&X_FORWARDED_FOR_NAME);
    // One allocation: the chain as sent, its separators and the longest address text.
    let mut chain =
        String::with_capacity(if peer_trusted { sent.iter().map(|l| l.len() + 2).sum::<usize>() } else { 0 } + 45);
    if peer_trusted {
        for line in sent {
            if let Ok(text) = line.to_str() {
                let text = text.trim();
                if !text.is_empty() {
                    chain.push_str(text);
                    chain.push_str(", ");
                }
            }
        }
    }
    let peer_text = IpText::new(peer);
    chain.push_str(peer_text.as_str());
    // Usually the client is the peer: its text is already written.
    let x_real_ip = match client {
        Some(ip) if ip == peer => Some(peer_text.as_str().to_owned()),
        other => other.map(|ip| IpText::new(ip).as_str().to_owned()),
    };
    ForwardedHeaders { x_forwarded_for: chain, x_real_ip, keep_forwarded: peer_trusted }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn untrusted_chains_are_replaced_trusted_ones_extended() {
        let mut h = HeaderMap::new();
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("1.1.1.1"));
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("2.2.2.2, 3.3.3.3"));
        let untrusted = compute(&h, ip("192.0.2.7"), Some(ip("192.0.2.7")), false);
        assert_eq!(untrusted.x_forwarded_for, "192.0.2.7");
        assert_eq!(untrusted.x_real_ip.as_deref(), Some("192.0.2.7"));
        assert!(!untrusted.keep_forwarded);
        let trusted = compute(&h, ip("10.0.0.1"), Some(ip("3.3.3.3")), true);
        assert_eq!(trusted.x_forwarded_for, "1.1.1.1, 2.2.2.2, 3.3.3.3, 10.0.0.1");
        assert_eq!(trusted.x_real_ip.as_deref(), Some("3.3.3.3"));
        assert!(trusted.keep_forwarded);
        assert_eq!(compute(&HeaderMap::new(), ip("::1"), None, true).x_forwarded_for, "::1");
    }
}
