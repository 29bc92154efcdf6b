//! A limit reference's `when` / `unless` at request time (`config::conditions`): whether it
//! applies to this request, decided before its zone's key is read, for every front door the key
//! step serves (proxy, replay).

use crate::config::conditions::{Condition, Conditions, Test};
use crate::keys::RequestFacts;

/// Whether a reference with these conditions applies: every `when` holds and no `unless` does.
pub fn applies(conditions: &Conditions, facts: &RequestFacts<'_>) -> bool {
    conditions.when.iter().all(|c| holds(c, facts)) && !conditions.unless.iter().any(|c| holds(c, facts))
}

fn holds(condition: &Condition, facts: &RequestFacts<'_>) -> bool {
    match condition {
        Condition::Method(methods) => facts.method.is_some_and(|m| methods.contains(m)),
        Condition::Ip(nets) => facts.client_ip.is_some_and(|ip| nets.iter().any(|n| n.contains(&ip))),
        Condition::Part { part, test } => {
            let value = part.raw_value(facts);
            match test {
                Test::Present(present) => value.is_empty() != *present,
                Test::Equals(expected) => same_bytes(&value, expected),
                Test::Matches(regex) => !value.is_empty() && regex.is_match(&value),
            }
        }
    }
}

/// `a == b` in time that depends on their lengths only: `equals` is often a bypass token, and a
/// comparison that stops at the first difference tells a client how much of its guess was right.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_equality() {
        assert!(same_bytes(b"token", b"token"));
        assert!(!same_bytes(b"token", b"tokem"));
        assert!(!same_bytes(b"token", b"token2"));
        assert!(!same_bytes(b"", b"x"));
    }
}
