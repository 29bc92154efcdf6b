//! `--suggest`'s proposals as config to paste: each zone's `[[limit_req_zone]]` block and each
//! route's `limit_req` array.

use std::fmt::Write as _;

use super::suggest::{Proposals as Suggest, Suggestion};
use super::text::{duration_text, rate_text};
use crate::config::Runtime;
use crate::keys::{KeyPart, TokenPolicy};
use crate::limit::{Algorithm, DelayPolicy, LimitReq};

fn part_text(p: &KeyPart) -> String {
    p.to_string()
}

/// `"ip"` or `["ip", "header:x-api-key"]`.
fn key_toml(parts: &[KeyPart]) -> String {
    let parts: Vec<String> = parts.iter().map(|p| format!("\"{}\"", part_text(p))).collect();
    if parts.len() == 1 {
        parts[0].clone()
    } else {
        format!("[{}]", parts.join(", "))
    }
}

fn reference_toml(zone: &str, l: &LimitReq, dry_run: bool) -> String {
    let mut s = format!("{{ zone = \"{zone}\"");
    if !l.algorithm.is_window() {
        let _ = write!(s, ", burst = {}", l.burst);
        match (l.algorithm, l.delay) {
            (Algorithm::TokenBucket, _) | (_, DelayPolicy::After(0)) => {}
            (_, DelayPolicy::NoDelay) => s.push_str(", nodelay = true"),
            (_, DelayPolicy::After(d)) => {
                let _ = write!(s, ", delay = {d}");
            }
        }
    }
    if dry_run {
        s.push_str(", dry_run = true");
    }
    s.push_str(" }");
    s
}

/// The suggested limits as config to paste: each zone's block and each route's `limit_req`.
pub fn toml_snippet(rt: &Runtime, s: &Suggest) -> String {
    let mut out = format!(
        "# weir replay --suggest --max-rejected {:.3}% --max-keys-hit {:.3}%\n",
        100.0 * s.targets.max_rejected,
        100.0 * s.targets.max_keys_hit
    );
    let proposed = |ri: usize, li: usize| -> Option<&Suggestion> {
        s.suggestions.iter().find(|x| x.route == ri && x.limit == li && x.proposed.is_some())
    };
    let mut zones_done = Vec::new();
    for x in s.suggestions.iter().filter(|x| x.proposed.is_some()) {
        let zi = rt.routes[x.route].limits[x.limit].zone;
        if zones_done.contains(&zi) {
            continue;
        }
        zones_done.push(zi);
        let zone = &rt.zones[zi];
        let Some((l, _)) = &x.proposed else { continue };
        let _ = write!(out, "[[limit_req_zone]]\nname = \"{}\"\nkey = {}\n", zone.name, key_toml(&zone.key.parts));
        if let TokenPolicy::Fallback(parts) = &zone.key.on_bad_token {
            let _ = writeln!(out, "bad_token_key = {}", key_toml(parts));
        }
        if zone.algorithm != Algorithm::LeakyBucket {
            let _ = writeln!(out, "algorithm = \"{}\"", zone.algorithm.as_str());
        }
        if zone.algorithm.is_window() {
            let _ = writeln!(out, "window = \"{}\"\nlimit = {}", duration_text(l.rate.period_us), l.rate.count);
        } else {
            let _ = writeln!(
                out,
                "rate = \"{}\"                    # was \"{}\"",
                rate_text(&l.rate),
                rate_text(&zone.rate)
            );
        }
        if !zone.overrides.is_empty() {
            let _ = writeln!(out, "# (keep this zone's [[limit_req_zone.override]] entries)");
        }
        out.push('\n');
    }
    for (ri, route) in rt.routes.iter().enumerate() {
        if !(0..route.limits.len()).any(|li| proposed(ri, li).is_some()) {
            continue;
        }
        let refs: Vec<String> = route
            .limits
            .iter()
            .enumerate()
            .map(|(li, zl)| {
                let l = proposed(ri, li).and_then(|x| x.proposed.as_ref()).map_or(zl.limit, |(l, _)| *l);
                reference_toml(&rt.zones[zl.zone].name, &l, zl.dry_run)
            })
            .collect();
        let _ = writeln!(out, "# in [[route]] name = \"{}\":\nlimit_req = [ {} ]", route.name, refs.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Rate;

    #[test]
    fn references_as_toml() {
        let l = LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("600r/m").unwrap(),
            burst: 20,
            delay: DelayPolicy::After(10),
        };
        assert_eq!(reference_toml("k", &l, false), "{ zone = \"k\", burst = 20, delay = 10 }");
        let nodelay = LimitReq { delay: DelayPolicy::NoDelay, ..l };
        assert_eq!(reference_toml("k", &nodelay, true), "{ zone = \"k\", burst = 20, nodelay = true, dry_run = true }");
        assert_eq!(part_text(&KeyPart::parse("header:X-Api-Key").unwrap()), "header:x-api-key");
    }
}
