//! The `ip/V4,V6` key part: the client address masked to a prefix length per family, so that one
//! subscriber's whole allocation is one bucket (an IPv6 host picks any of its /64's 2^64 addresses).

use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;

/// The IPv6 length when `ip/N` names only the IPv4 one: a /64 is the smallest block an end site
/// gets (SLAAC needs it), so every address of it is one host's or one household's to choose.
pub const DEFAULT_V6_LEN: u8 = 64;

/// `ip/24` (IPv6 /64) or `ip/24,56`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpPrefix {
    pub v4: u8,
    pub v6: u8,
}

impl IpPrefix {
    /// The text after `ip/`: `V4` or `V4,V6`.
    pub fn parse(lengths: &str) -> Option<IpPrefix> {
        let (v4, v6) = match lengths.split_once(',') {
            Some((v4, v6)) => (v4.trim(), Some(v6.trim())),
            None => (lengths.trim(), None),
        };
        let len = |text: &str, max: u8| text.parse::<u8>().ok().filter(|n| (1..=max).contains(n));
        let v4 = len(v4, 32)?;
        let v6 = match v6 {
            Some(text) => len(text, 128)?,
            None => DEFAULT_V6_LEN,
        };
        Some(IpPrefix { v4, v6 })
    }

    /// The network the address belongs to (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn network(&self, ip: IpAddr) -> IpNet {
        let ip = super::canonical(ip);
        let len = if ip.is_ipv4() { self.v4 } else { self.v6 };
        // The lengths were checked against each family when parsed.
        IpNet::new(ip, len).map_or_else(|_| IpNet::from(ip), |net| net.trunc())
    }

    /// The key text: `203.0.113.0/24`, `2001:db8:1:2::/64`.
    pub fn write(&self, ip: IpAddr, out: &mut Vec<u8>) {
        let mut text = String::with_capacity(48);
        let _ = write!(text, "{}", self.network(ip));
        out.extend_from_slice(text.as_bytes());
    }
}

impl std::fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ip/{},{}", self.v4, self.v6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(prefix: &str, ip: &str) -> String {
        let mut out = Vec::new();
        IpPrefix::parse(prefix).unwrap().write(ip.parse().unwrap(), &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn masks_each_family_with_its_own_length() {
        assert_eq!(key("24", "203.0.113.77"), "203.0.113.0/24");
        assert_eq!(key("24", "2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::/64", "IPv6 defaults to /64");
        assert_eq!(key("32,56", "2001:db8:1:2ff::9"), "2001:db8:1:200::/56");
        assert_eq!(key("32,128", "2001:db8::9"), "2001:db8::9/128");
        assert_eq!(key("16,64", "::ffff:198.51.100.7"), "198.51.0.0/16", "IPv4-mapped is IPv4");
    }

    #[test]
    fn rejects_lengths_outside_the_family() {
        for bad in ["", "0", "33", "24,0", "24,129", "x", "24,", ",64", "24,64,1"] {
            assert!(IpPrefix::parse(bad).is_none(), "{bad:?}");
        }
        assert_eq!(IpPrefix::parse("24, 48"), Some(IpPrefix { v4: 24, v6: 48 }));
    }
}
