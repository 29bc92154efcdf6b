//! nginx's `allow` / `deny` at request time, on the real client address.

use std::net::IpAddr;

use crate::config::AccessRule;

/// Whether `ip` may pass the rules: the first matching rule in file order decides; no match allows.
pub fn allowed(rules: &[AccessRule], ip: IpAddr) -> bool {
    rules.iter().find(|r| r.net.contains(&ip)).is_none_or(|r| r.allow)
}
