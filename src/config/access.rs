//! A route's `allow` / `deny` rules (nginx's access module), compiled into one list in file order
//! that `engine::access` checks.

use std::ops::Range;

use ipnet::IpNet;

use super::error::ConfigError;
use super::spanned::Spanned;

/// One `allow` or `deny` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessRule {
    pub net: IpNet,
    pub allow: bool,
}

type Here<'a> = &'a dyn Fn(&Range<usize>, String) -> ConfigError;

/// `allow` and `deny` entries merged in file order (by their position in the text), so the first
/// rule written is the first rule checked, whichever list it is in — nginx's semantics.
pub fn access_rules(
    allow: &[Spanned<String>],
    deny: &[Spanned<String>],
    here: Here<'_>,
) -> Result<Vec<AccessRule>, ConfigError> {
    let mut rules: Vec<(usize, AccessRule)> = Vec::new();
    for (list, is_allow, field) in [(allow, true, "allow"), (deny, false, "deny")] {
        for entry in list {
            let text = entry.get_ref();
            let net = if text == "all" {
                None
            } else {
                Some(text.parse::<IpNet>().ok().or_else(|| text.parse::<std::net::IpAddr>().ok().map(IpNet::from)))
            };
            let nets: Vec<IpNet> = match net {
                // nginx's `all`: every IPv4 and IPv6 address.
                None => vec![IpNet::V4(Default::default()), IpNet::V6(Default::default())],
                Some(Some(n)) => vec![n],
                Some(None) => {
                    return Err(here(
                        &entry.span(),
                        format!("{field}: {text:?} is not an IP address, a CIDR like \"10.0.0.0/8\", or \"all\""),
                    ))
                }
            };
            for net in nets {
                rules.push((entry.span().start, AccessRule { net, allow: is_allow }));
            }
        }
    }
    rules.sort_by_key(|(pos, _)| *pos);
    Ok(rules.into_iter().map(|(_, r)| r).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::allowed;

    #[test]
    fn first_matching_rule_in_file_order_wins() {
        let text = "allow = [\"10.0.0.0/8\", \"2001:db8::/32\"]\ndeny = [\"all\"]\n";
        #[derive(serde::Deserialize)]
        struct T {
            allow: Vec<Spanned<String>>,
            deny: Vec<Spanned<String>>,
        }
        let t: T = toml::from_str(text).unwrap();
        let here = |_: &Range<usize>, m: String| ConfigError { file: "t".into(), line: None, message: m };
        let rules = access_rules(&t.allow, &t.deny, &here).unwrap();
        assert!(allowed(&rules, "10.1.2.3".parse().unwrap()));
        assert!(allowed(&rules, "2001:db8::7".parse().unwrap()));
        assert!(!allowed(&rules, "192.0.2.1".parse().unwrap()));
        assert!(!allowed(&rules, "::1".parse().unwrap()));

        // deny written first: it wins over a later allow.
        let text = "deny = [\"10.0.0.1\"]\nallow = [\"10.0.0.0/8\"]\n";
        let t: T = toml::from_str(text).unwrap();
        let rules = access_rules(&t.allow, &t.deny, &here).unwrap();
        assert!(!allowed(&rules, "10.0.0.1".parse().unwrap()));
        assert!(allowed(&rules, "10.0.0.2".parse().unwrap()));
        assert!(allowed(&[], "10.0.0.2".parse().unwrap()));

        let bad: T = toml::from_str("allow = [\"10.0.0.0/33\"]\ndeny = []").unwrap();
        assert!(access_rules(&bad.allow, &bad.deny, &here).is_err());
    }
}
