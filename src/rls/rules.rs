//! The descriptor rules of one RLS domain and how a descriptor finds its limit: pure code.
//!
//! A descriptor is a list of entries, `[("remote_address", "1.2.3.4"), ("path", "/login")]`. Like
//! envoyproxy/ratelimit's nested descriptors, the first entry picks a top-level rule by key (and
//! value), the second a rule nested in that one, and so on; the rule the last entry lands on
//! gives the limit. An entry with no rule for it, or a last rule without a zone, leaves the
//! descriptor unlimited. At each level an exact value beats the longest `prefix*` value, which
//! beats a rule that names the key alone.

use crate::config::rls::{Rule, ValueMatch};
use crate::keys;

impl ValueMatch {
    /// How well `value` matches: larger is more specific; `None` when it does not.
    fn rank(&self, value: &str) -> Option<usize> {
        match self {
            ValueMatch::Any => Some(0),
            ValueMatch::Prefix(p) if value.starts_with(p.as_str()) => Some(1 + p.len()),
            ValueMatch::Exact(v) if v == value => Some(usize::MAX),
            _ => None,
        }
    }
}

/// The limit (index into the domain's `Route::limits`) that applies to a descriptor's entries,
/// if any.
pub fn find_limit(rules: &[Rule], entries: &[(&str, &str)]) -> Option<usize> {
    let mut level = rules;
    let mut found = None;
    for (key, value) in entries {
        let rule = level
            .iter()
            .filter(|r| r.key == *key)
            .filter_map(|r| r.value.rank(value).map(|rank| (rank, r)))
            // The first of equally specific rules (file order), like route matching.
            .fold(None::<(usize, &Rule)>, |best, (rank, r)| match best {
                Some((b, _)) if b >= rank => best,
                _ => Some((rank, r)),
            })?
            .1;
        found = Some(rule);
        level = &rule.children;
    }
    found?.limit
}

/// A descriptor's key in its zone: the entries' values joined like a composite HTTP key, bounded
/// like every key (a long one is replaced by its SHA-256).
///
/// The values are joined as the parts of a composite HTTP key are (`keys::push_part`): a one-entry
/// descriptor keys a zone the same as a one-part HTTP key with the same value, so both front
/// doors can share a zone's counters, and a value holding the separator is escaped, so it can
/// never land on another descriptor's counter.
pub fn descriptor_key(entries: &[(&str, &str)]) -> Vec<u8> {
    let mut key = Vec::with_capacity(entries.iter().map(|(_, v)| v.len() + 1).sum());
    for (i, (_, value)) in entries.iter().enumerate() {
        if i > 0 {
            key.push(keys::PART_SEPARATOR);
        }
        keys::push_part(&mut key, value.as_bytes());
    }
    keys::bound(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(key: &str, value: Option<&str>, limit: Option<usize>, children: Vec<Rule>) -> Rule {
        Rule { key: key.into(), value: ValueMatch::parse(value), limit, children }
    }

    /// envoyproxy/ratelimit's README example, flattened into limit indices.
    fn example() -> Vec<Rule> {
        vec![
            rule("database", Some("users"), Some(0), vec![]),
            rule("database", Some("default"), Some(1), vec![]),
            rule("message_type", Some("marketing"), None, vec![rule("to_number", None, Some(2), vec![])]),
            rule("to_number", None, Some(3), vec![]),
            rule("path", Some("/api/*"), Some(4), vec![]),
            rule("path", Some("/api/admin/*"), Some(5), vec![]),
            rule("path", None, Some(6), vec![]),
        ]
    }

    #[test]
    fn exact_values_prefixes_and_keys_alone() {
        let r = example();
        assert_eq!(find_limit(&r, &[("database", "users")]), Some(0));
        assert_eq!(find_limit(&r, &[("database", "default")]), Some(1));
        assert_eq!(find_limit(&r, &[("database", "other")]), None, "no rule for this value, none for the key alone");
        assert_eq!(find_limit(&r, &[("path", "/api/x")]), Some(4));
        assert_eq!(find_limit(&r, &[("path", "/api/admin/x")]), Some(5), "the longest prefix wins");
        assert_eq!(find_limit(&r, &[("path", "/other")]), Some(6), "the key alone is the default");
    }

    #[test]
    fn nested_entries_walk_down_and_need_a_limit_at_the_end() {
        let r = example();
        assert_eq!(find_limit(&r, &[("message_type", "marketing"), ("to_number", "2061234567")]), Some(2));
        assert_eq!(find_limit(&r, &[("to_number", "2061234567")]), Some(3));
        assert_eq!(find_limit(&r, &[("message_type", "marketing")]), None, "the parent has no limit of its own");
        assert_eq!(
            find_limit(&r, &[("message_type", "marketing"), ("to_number", "1"), ("extra", "x")]),
            None,
            "an entry with no rule leaves the descriptor unlimited"
        );
        assert_eq!(find_limit(&r, &[("unknown", "x")]), None);
        assert_eq!(find_limit(&r, &[]), None);
    }

    #[test]
    fn keys_join_values_and_stay_bounded() {
        assert_eq!(descriptor_key(&[("remote_address", "1.2.3.4")]), b"1.2.3.4".to_vec());
        assert_eq!(descriptor_key(&[("a", "x"), ("b", "y")]), b"x\x1fy".to_vec());
        let long = "v".repeat(10_000);
        assert!(descriptor_key(&[("k", long.as_str())]).len() <= keys::MAX_KEY_LEN);
        // A value holding the separator is not two values, nor can a value spell a hash.
        assert_ne!(descriptor_key(&[("a", "x\u{1f}y")]), descriptor_key(&[("a", "x"), ("b", "y")]));
        assert_ne!(descriptor_key(&[("a", "x\u{1d}\u{1f}y")]), descriptor_key(&[("a", "x\u{1d}"), ("b", "y")]));
        assert_eq!(descriptor_key(&[("a", "\u{1b}[2J")]), b"\x1b[2J", "other controls are kept as they are");
        let hash = String::from_utf8(descriptor_key(&[("k", long.as_str())])).expect("hex");
        assert_ne!(descriptor_key(&[("k", hash.as_str())]), hash.as_bytes());
    }
}
