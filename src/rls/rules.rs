//! The descriptor rules of one RLS domain and how a descriptor finds its limit: pure code.
//!
//! A descriptor is a list of entries, `[("remote_address", "1.2.3.4"), ("path", "/login")]`. Like
//! envoyproxy/ratelimit's nested descriptors, the first entry picks a top-level rule by key (and
//! value), the second a rule nested in that one, and so on; the rule the last entry lands on
//! gives the limit. An entry with no rule for it, or a last rule without a zone, leaves the
//! descriptor unlimited. At each level an exact value beats the longest `prefix*` value, which
//! beats a rule that names the key alone.

use crate::config::rls::{PatternOrder, Rule, ValueMatch};
use crate::keys;

impl ValueMatch {
    /// How well `value` matches: larger is more specific; `None` when it does not. A pattern
    /// ranks by its literal characters (`/api/admin/*` beats `/api/*`), or with `File` order all
    /// patterns rank alike, so the first in file order wins.
    pub(crate) fn rank(&self, value: &str, order: PatternOrder) -> Option<usize> {
        match self {
            ValueMatch::Any => Some(0),
            ValueMatch::Pattern { parts, .. } if wildcard_match(parts, value) => Some(match order {
                PatternOrder::Specific => 1 + parts.iter().map(String::len).sum::<usize>(),
                PatternOrder::File => 1,
            }),
            ValueMatch::Exact(v) if v == value => Some(usize::MAX),
            _ => None,
        }
    }
}

/// Whether `value` matches a pattern split on its `*`s (`parts`, at least two): it starts with
/// the first part, ends with the last, and holds the middle ones in order, none overlapping.
/// Linear in the value's length per part; no allocation.
pub fn wildcard_match(parts: &[String], value: &str) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else { return false };
    if parts.len() == 1 {
        return first == value;
    }
    if value.len() < parts.iter().map(String::len).sum::<usize>()
        || !value.starts_with(first.as_str())
        || !value.ends_with(last.as_str())
    {
        return false;
    }
    // The length check above keeps the prefix and suffix apart.
    let mut middle = &value[first.len()..value.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match middle.find(part.as_str()) {
            Some(at) => middle = &middle[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// The rules a descriptor's entries walk, one per entry, when every entry finds one; at each
/// level the most specific match wins, the first of equals in file order.
pub fn find_path<'r>(rules: &'r [Rule], entries: &[(&str, &str)], order: PatternOrder) -> Option<Vec<&'r Rule>> {
    let mut level = rules;
    let mut path = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        let rule = level
            .iter()
            .filter(|r| r.key == *key)
            .filter_map(|r| r.value.rank(value, order).map(|rank| (rank, r)))
            .fold(None::<(usize, &Rule)>, |best, (rank, r)| match best {
                Some((b, _)) if b >= rank => best,
                _ => Some((rank, r)),
            })?
            .1;
        path.push(rule);
        level = &rule.children;
    }
    (!path.is_empty()).then_some(path)
}

/// The rule a descriptor lands on (its last entry's), if every entry finds one.
pub fn find_rule<'r>(rules: &'r [Rule], entries: &[(&str, &str)], order: PatternOrder) -> Option<&'r Rule> {
    find_path(rules, entries, order).and_then(|p| p.last().copied())
}

/// A descriptor's key in its zone: the entries' values joined like a composite HTTP key, bounded
/// like every key (a long one is replaced by its SHA-256).
///
/// The values are joined as the parts of a composite HTTP key are (`keys::push_part`): a one-entry
/// descriptor keys a zone the same as a one-part HTTP key with the same value, so both front
/// doors can share a zone's counters, and a value holding the separator is escaped, so it can
/// never land on another descriptor's counter. An entry matched by a `share_threshold` rule
/// contributes the rule's pattern instead of its value, marked so that no value can spell it, so
/// every matching value lands on one counter.
pub fn descriptor_key(entries: &[(&str, &str)], path: &[&Rule]) -> Vec<u8> {
    let mut key = Vec::with_capacity(entries.iter().map(|(_, v)| v.len() + 1).sum());
    for (i, (_, value)) in entries.iter().enumerate() {
        if i > 0 {
            key.push(keys::PART_SEPARATOR);
        }
        match path.get(i).map(|r| (&r.value, r.share_threshold)) {
            Some((ValueMatch::Pattern { text, .. }, true)) => {
                key.push(keys::PATTERN_MARK);
                key.extend_from_slice(text.as_bytes());
            }
            _ => keys::push_part(&mut key, value.as_bytes()),
        }
    }
    keys::bound(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(key: &str, value: Option<&str>, limit: Option<usize>, children: Vec<Rule>) -> Rule {
        Rule {
            key: key.into(),
            value: ValueMatch::parse(value),
            limits: limit.into_iter().collect(),
            unlimited: false,
            name: None,
            replaces: Vec::new(),
            share_threshold: false,
            quota: false,
            children,
        }
    }

    fn find_limit(rules: &[Rule], entries: &[(&str, &str)]) -> Option<usize> {
        find_rule(rules, entries, PatternOrder::Specific).and_then(|r| r.limits.first().copied())
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
    fn file_order_lets_the_first_matching_pattern_win() {
        let r = example();
        let path = |order| find_rule(&r, &[("path", "/api/admin/x")], order).and_then(|r| r.limits.first().copied());
        assert_eq!(path(PatternOrder::Specific), Some(5), "the longer pattern");
        assert_eq!(path(PatternOrder::File), Some(4), "the first in file order, as envoyproxy/ratelimit");
        assert_eq!(find_limit(&r, &[("path", "/other")]), Some(6), "the key alone still comes last");
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
        assert_eq!(descriptor_key(&[("remote_address", "1.2.3.4")], &[]), b"1.2.3.4".to_vec());
        assert_eq!(descriptor_key(&[("a", "x"), ("b", "y")], &[]), b"x\x1fy".to_vec());
        let long = "v".repeat(10_000);
        assert!(descriptor_key(&[("k", long.as_str())], &[]).len() <= keys::MAX_KEY_LEN);
        // A value holding the separator is not two values, nor can a value spell a hash.
        assert_ne!(descriptor_key(&[("a", "x\u{1f}y")], &[]), descriptor_key(&[("a", "x"), ("b", "y")], &[]));
        assert_ne!(
            descriptor_key(&[("a", "x\u{1d}\u{1f}y")], &[]),
            descriptor_key(&[("a", "x\u{1d}"), ("b", "y")], &[])
        );
        assert_eq!(descriptor_key(&[("a", "\u{1b}[2J")], &[]), b"\x1b[2J", "other controls are kept as they are");
        let hash = String::from_utf8(descriptor_key(&[("k", long.as_str())], &[])).expect("hex");
        assert_ne!(descriptor_key(&[("k", hash.as_str())], &[]), hash.as_bytes());
    }

    /// envoyproxy/ratelimit's wildcard.yaml and README example 9: `*` anywhere, each matching any
    /// run of characters (none included).
    #[test]
    fn stars_anywhere_match_like_the_peer() {
        let parts = |p: &str| p.split('*').map(str::to_string).collect::<Vec<_>>();
        let cases: &[(&str, &str, bool)] = &[
            ("foo*", "foo", true),
            ("foo*", "foobar", true),
            ("foo*", "fo", false),
            ("bar*b", "barb", true),
            ("bar*b", "barxyzb", true),
            ("bar*b", "bar", false),
            ("bar*b", "barbx", false),
            ("foo*bar*baz", "foobarbaz", true),
            ("foo*bar*baz", "foo1bar2baz", true),
            ("foo*bar*baz", "foobazbar", false),
            ("foo*bar*baz", "foobarbazbaz", true),
            ("/api/*/action", "/api/123/action", true),
            ("/api/*/action", "/api/123/other", false),
            ("/api/*/resource/*/action", "/api/v1/resource/123/action", true),
            ("/api/*/resource/*/action", "/api/v1/resource/action", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("*x*", "x", true),
            ("*x*", "y", false),
        ];
        for (pattern, value, expected) in cases {
            assert_eq!(wildcard_match(&parts(pattern), value), *expected, "{pattern} against {value}");
        }
    }

    #[test]
    fn shared_thresholds_key_by_the_pattern() {
        let mut shared = rule("files", Some("files/*"), Some(0), vec![]);
        shared.share_threshold = true;
        let rules = vec![shared, rule("own", Some("own/*"), Some(1), vec![])];
        let key = |entries: &[(&str, &str)]| {
            let path = find_path(&rules, entries, PatternOrder::Specific).expect("matches");
            descriptor_key(entries, &path)
        };
        assert_eq!(key(&[("files", "files/a.pdf")]), key(&[("files", "files/b.csv")]));
        assert_eq!(key(&[("files", "files/a.pdf")]), b"\x1efiles/*".to_vec());
        // A value spelling the pattern is its own counter, not the shared one.
        assert_ne!(key(&[("files", "files/*")]), b"files/*".to_vec());
        assert_ne!(key(&[("own", "own/a")]), key(&[("own", "own/b")]));
    }
}
