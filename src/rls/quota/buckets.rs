//! Which `[[rls.domain.bucket]]` rule an Envoy's bucket id lands on, and its key in the rule's
//! zone: pure code.
//!
//! A bucket id is a map (Envoy's `bucket_id_builder`), so a rule names a set of entries rather
//! than a path: an id matches a rule when it has exactly the rule's keys and each value matches
//! as a descriptor entry's does (exact, `*` pattern, or any). Of several matching rules the most
//! specific wins — more exact values first, then the patterns' literal characters (or file order
//! with `pattern_order = "file"`) — and the first in file order of equals.

use std::collections::HashMap;

use crate::config::rls::{BucketRule, PatternOrder, ValueMatch};
use crate::keys;

/// The most bytes a bucket id's key or value may have (Envoy's are header values or literals).
pub const MAX_ID_TEXT: usize = 1024;

/// The rule an id lands on (index into `rules`), if any.
pub fn find(rules: &[BucketRule], id: &HashMap<String, String>, order: PatternOrder) -> Option<usize> {
    let mut best: Option<((usize, usize), usize)> = None;
    for (i, rule) in rules.iter().enumerate() {
        if rule.id.len() != id.len() {
            continue;
        }
        let mut rank = (0usize, 0usize);
        let matched = rule.id.iter().all(|(key, value)| {
            let Some(v) = id.get(key) else { return false };
            match (value, value.rank(v, order)) {
                (_, None) => false,
                (ValueMatch::Exact(_), Some(_)) => {
                    rank.0 += 1;
                    true
                }
                (_, Some(r)) => {
                    rank.1 += r;
                    true
                }
            }
        });
        if matched && best.is_none_or(|(b, _)| rank > b) {
            best = Some((rank, i));
        }
    }
    best.map(|(_, i)| i)
}

/// The bucket's key in its rule's zone: the id's values in the rule's key order (sorted), joined
/// as a composite key's parts are (`keys::push_part`), bounded like every key.
pub fn zone_key(rule: &BucketRule, id: &HashMap<String, String>) -> Vec<u8> {
    let mut key = Vec::new();
    for (i, (k, _)) in rule.id.iter().enumerate() {
        if i > 0 {
            key.push(keys::PART_SEPARATOR);
        }
        keys::push_part(&mut key, id.get(k).map_or(&[][..], |v| v.as_bytes()));
    }
    keys::bound(key)
}

/// One text that names the id whatever the order of its map: `key=value` pairs sorted by key,
/// each part escaped, so two ids have one text only when they are the same id.
pub fn canonical(id: &HashMap<String, String>) -> Vec<u8> {
    let mut pairs: Vec<(&String, &String)> = id.iter().collect();
    pairs.sort();
    let mut text = Vec::new();
    for (k, v) in pairs {
        keys::push_part(&mut text, k.as_bytes());
        text.push(keys::PART_SEPARATOR);
        keys::push_part(&mut text, v.as_bytes());
        text.push(keys::PART_SEPARATOR);
    }
    text
}

/// Why an id cannot be a bucket's (Envoy's own validation refuses the same).
pub fn invalid(id: &HashMap<String, String>) -> Option<String> {
    if id.is_empty() {
        return Some("a bucket_id with no entries".into());
    }
    if id.len() > crate::config::rls::quota::MAX_ID_ENTRIES {
        return Some(format!(
            "a bucket_id with {} entries (at most {})",
            id.len(),
            crate::config::rls::quota::MAX_ID_ENTRIES
        ));
    }
    for (k, v) in id {
        if k.is_empty() || v.is_empty() {
            return Some("a bucket_id with an empty key or value".into());
        }
        if k.len() > MAX_ID_TEXT || v.len() > MAX_ID_TEXT {
            return Some(format!("a bucket_id key or value over {MAX_ID_TEXT} bytes"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::rls::BucketLimit;

    fn rule(entries: &[(&str, &str)]) -> BucketRule {
        let mut id: Vec<(String, ValueMatch)> = entries
            .iter()
            .map(|(k, v)| (k.to_string(), if *v == "*" { ValueMatch::Any } else { ValueMatch::parse(Some(v)) }))
            .collect();
        id.sort_by(|a, b| a.0.cmp(&b.0));
        BucketRule { id, limit: BucketLimit::Unlimited }
    }

    fn id(entries: &[(&str, &str)]) -> HashMap<String, String> {
        entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn exact_beats_patterns_beats_any_and_keys_must_be_the_same_set() {
        let rules = vec![
            rule(&[("name", "*"), ("env", "*")]),
            rule(&[("name", "api*"), ("env", "*")]),
            rule(&[("name", "api-v2"), ("env", "*")]),
            rule(&[("name", "*")]),
        ];
        let find = |e: &[(&str, &str)]| find(&rules, &id(e), PatternOrder::Specific);
        assert_eq!(find(&[("name", "web"), ("env", "prod")]), Some(0));
        assert_eq!(find(&[("name", "api-v1"), ("env", "prod")]), Some(1));
        assert_eq!(find(&[("env", "prod"), ("name", "api-v2")]), Some(2), "the map's order does not matter");
        assert_eq!(find(&[("name", "web")]), Some(3));
        assert_eq!(find(&[("name", "web"), ("env", "prod"), ("extra", "x")]), None, "a key no rule names");
        assert_eq!(find(&[("env", "prod")]), None, "a key the rule names is missing");
    }

    #[test]
    fn file_order_lets_the_first_pattern_win() {
        let rules = vec![rule(&[("path", "/api/*")]), rule(&[("path", "/api/admin/*")])];
        let e = id(&[("path", "/api/admin/x")]);
        assert_eq!(find(&rules, &e, PatternOrder::Specific), Some(1));
        assert_eq!(find(&rules, &e, PatternOrder::File), Some(0));
    }

    #[test]
    fn keys_follow_the_rules_key_order_and_ids_have_one_canonical_text() {
        let r = rule(&[("tenant", "*"), ("name", "api")]);
        assert_eq!(zone_key(&r, &id(&[("tenant", "acme"), ("name", "api")])), b"api\x1facme".to_vec());
        assert_ne!(
            zone_key(&r, &id(&[("tenant", "a\u{1f}b"), ("name", "api")])),
            zone_key(&r, &id(&[("tenant", "b"), ("name", "api\u{1f}a")])),
            "a separator in a value is escaped"
        );
        assert_eq!(canonical(&id(&[("a", "1"), ("b", "2")])), canonical(&id(&[("b", "2"), ("a", "1")])));
        assert_ne!(canonical(&id(&[("a", "1=b")])), canonical(&id(&[("a", "1"), ("b", "")])));
    }

    #[test]
    fn hostile_ids_are_named() {
        assert!(invalid(&id(&[])).is_some());
        assert!(invalid(&id(&[("", "x")])).is_some());
        assert!(invalid(&id(&[("k", "")])).is_some());
        let long = "v".repeat(MAX_ID_TEXT + 1);
        assert!(invalid(&id(&[("k", long.as_str())])).is_some());
        let many: HashMap<String, String> = (0..17).map(|i| (format!("k{i}"), "v".to_string())).collect();
        assert!(invalid(&many).unwrap().contains("17 entries"));
        assert_eq!(invalid(&id(&[("name", "api")])), None);
    }
}
