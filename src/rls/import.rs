//! `weir import-rls FILE|DIR…`: envoyproxy/ratelimit configs as one Weir TOML.
//!
//! The files are read as the peer's loader reads them (`peer_yaml`: its keys, its refusals and
//! reasons, its domain merge). Each `rate_limit` becomes a `fixed_window` zone with the unit as
//! its window (aligned to the epoch, as the peer's `now / unit`) and `requests_per_unit` as its
//! limit (0 blocks); every other field maps to a rule field of the same meaning. What Weir
//! cannot say the same way is an error, unless `allow_unexpressed` leaves that domain out (and
//! names it in a note) to import the rest.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::peer_yaml::{self, Descriptor, Domain};

#[derive(Debug, Clone)]
pub struct Options {
    /// `[rls] listen` of the output.
    pub listen: String,
    /// Merge files of one domain (the peer's `MERGE_DOMAIN_CONFIG`); else a second file of a
    /// domain is refused, as the peer refuses it.
    pub merge_domains: bool,
    /// Leave out (and name) the domains Weir cannot express, instead of refusing the whole import.
    pub allow_unexpressed: bool,
}

/// The TOML, and notes on fields that do not change decisions (metrics, metadata).
#[derive(Debug)]
pub struct Imported {
    pub toml: String,
    pub notes: Vec<String>,
}

/// `files` are (name for messages, text), in load order.
pub fn import(files: &[(String, String)], opts: &Options) -> Result<Imported, String> {
    let domains = peer_yaml::load(files, opts.merge_domains)?;
    let mut out = Importer {
        zones: String::new(),
        rules: String::new(),
        names: HashSet::new(),
        suffixes: HashMap::new(),
        notes: Vec::new(),
    };
    let mut refusals = Vec::new();
    for domain in &domains {
        // A refused domain leaves nothing behind: its zones and rules are written only whole.
        let written = (out.zones.len(), out.rules.len(), out.notes.len());
        if let Err(e) = out.domain(domain) {
            out.zones.truncate(written.0);
            out.rules.truncate(written.1);
            out.notes.truncate(written.2);
            refusals.push(e);
        }
    }
    if !refusals.is_empty() {
        if !opts.allow_unexpressed {
            return Err(format!(
                "{}\n(Weir cannot express these as envoyproxy/ratelimit decides them; --allow-unexpressed imports the \
                 other domains)",
                refusals.join("\n")
            ));
        }
        out.notes.extend(refusals.into_iter().map(|r| format!("domain left out: {r}")));
    }
    let mut toml = String::new();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    let _ = writeln!(toml, "# Imported from envoyproxy/ratelimit by `weir import-rls` ({}).", names.join(", "));
    let _ =
        writeln!(toml, "# Fixed windows aligned to the epoch, like envoyproxy/ratelimit's; docs/rls.md has the rest.");
    for note in &out.notes {
        let _ = writeln!(toml, "# NOTE: {note}");
    }
    let _ = writeln!(
        toml,
        "# Shared limits across instances need a Redis store:\n# [store]\n# kind = \"redis\"\n# url = \"redis://127.0.0.1:6379\"\n"
    );
    toml.push_str(&out.zones);
    let _ = writeln!(toml, "[rls]\nlisten = [{}]", quote(&opts.listen));
    toml.push_str(&out.rules);
    Ok(Imported { toml, notes: out.notes })
}

struct Importer {
    zones: String,
    rules: String,
    names: HashSet<String>,
    /// The next `-N` to try for each truncated base name.
    suffixes: HashMap<String, usize>,
    notes: Vec<String>,
}

impl Importer {
    fn domain(&mut self, domain: &Domain) -> Result<(), String> {
        let name = &domain.name;
        let valid = name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if !valid {
            // Envoy sends the domain as written: a renamed one would never match.
            return Err(format!("domain {name:?}: Weir's domain names are 1-64 characters of A-Z a-z 0-9 _ - ."));
        }
        // The peer takes the first matching `*` value at a level, in file order.
        let _ = writeln!(self.rules, "\n[[rls.domain]]\nname = {}\npattern_order = \"file\"", quote(name));
        self.level(&domain.descriptors, name, 1)
    }

    fn level(&mut self, list: &[Descriptor], path: &str, depth: usize) -> Result<(), String> {
        // Keys with a rule for the key alone at this level, found once (not per descriptor).
        let alone: HashSet<&str> = list.iter().filter(|o| o.value.is_none()).map(|o| o.key.as_str()).collect();
        for d in list {
            self.descriptor(d, path, depth, alone.contains(d.key.as_str()))?;
        }
        Ok(())
    }

    fn descriptor(&mut self, d: &Descriptor, parent: &str, depth: usize, key_alone_too: bool) -> Result<(), String> {
        let place = format!("{parent}.{}", d.composite_key());
        let mut rule = format!("\n[[rls.domain{}]]\n", ".descriptor".repeat(depth));
        let _ = writeln!(rule, "key = {}", quote(&d.key));
        match d.value.as_deref() {
            // `*` alone: any value, ranked above the key alone; Weir's key alone is the same
            // unless both are given.
            // `*` alone: any value, as Weir's rule without a value, unless both are given (the
            // peer then ranks `*` above the key alone; Weir has one rule for any value).
            Some("*") if key_alone_too => {
                return Err(format!("{place}: value \"*\" beside a rule for the key alone"));
            }
            Some("*") => {}
            Some(v) => {
                let _ = writeln!(rule, "value = {}", quote(v));
            }
            None => {}
        }
        if d.share_threshold {
            if d.value.as_deref().is_none_or(|v| !v.contains('*')) {
                return Err(format!("{place}: share_threshold on a key with `*` (Weir matches keys exactly)"));
            }
            let _ = writeln!(rule, "share_threshold = true");
        }
        if d.detailed_metric || d.value_to_metric {
            self.notes.push(format!(
                "{place}: detailed_metric/value_to_metric name metrics after values; Weir counts per zone \
                 (weir_limit_req_decisions_total) and shows the busiest keys in `weir top`"
            ));
        }
        if d.has_metadata {
            self.notes.push(format!(
                "{place}: metadata goes into envoyproxy/ratelimit's optional response dynamic metadata, which Weir \
                 does not send"
            ));
        }
        for k in &d.ignored {
            self.notes.push(format!("{place}: {k} is not read in this place (envoyproxy/ratelimit ignores it too)"));
        }
        match &d.rate_limit {
            Some(rl) => {
                if let Some(name) = &rl.name {
                    let _ = writeln!(rule, "name = {}", quote(name));
                }
                if !rl.replaces.is_empty() {
                    let list: Vec<String> = rl.replaces.iter().map(|r| quote(r)).collect();
                    let _ = writeln!(rule, "replaces = [{}]", list.join(", "));
                }
                match &rl.unit {
                    None => {
                        let _ = writeln!(rule, "unlimited = true");
                    }
                    Some((unit, seconds)) => {
                        let zone = self.zone_name(&place);
                        let _ = writeln!(
                            self.zones,
                            "[[limit_req_zone]]\nname = {}  # {} per {}\nalgorithm = \"fixed_window\"\nwindow = {}\nlimit = {}\n",
                            quote(&zone),
                            rl.requests_per_unit,
                            unit.to_ascii_lowercase(),
                            quote(&window(*seconds)),
                            rl.requests_per_unit
                        );
                        let _ = writeln!(rule, "zone = {}", quote(&zone));
                        if d.shadow_mode {
                            let _ = writeln!(rule, "dry_run = true");
                        }
                        if d.quota_mode {
                            let _ = writeln!(rule, "quota_mode = true");
                        }
                    }
                }
            }
            // A leaf without a limit matches and limits nothing, answered as unmatched.
            None if d.descriptors.is_empty() => {
                let _ = writeln!(rule, "exempt = true");
            }
            None => {}
        }
        self.rules.push_str(&rule);
        self.level(&d.descriptors, &place, depth + 1)
    }

    /// A zone name from a descriptor path: the allowed characters, at most 64, unique.
    fn zone_name(&mut self, path: &str) -> String {
        let base: String = path
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || "_-.".contains(c) { c } else { '_' })
            .take(56)
            .collect();
        let mut name = base.clone();
        // Many paths can share their first 56 characters: each base remembers its next suffix,
        // so a name is found in a look or two, not by counting up from 2 every time.
        let next = self.suffixes.entry(base.clone()).or_insert(2);
        while !self.names.insert(name.clone()) {
            name = format!("{base}-{next}");
            *next += 1;
        }
        name
    }
}

/// A unit's window in Weir's duration syntax.
fn window(seconds: u64) -> String {
    match seconds {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

fn quote(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::rules::find_rule;
    use crate::rls::PatternOrder;

    const EXAMPLE: &str = r#"
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: week
      requests_per_unit: 100
  - key: path
    value: "/admin/*/x*"
    shadow_mode: true
    detailed_metric: true
    rate_limit:
      unit: second
      requests_per_unit: 0
      name: admin
      replaces: [{name: other}]
  - key: client
    value: vip
    rate_limit:
      unlimited: true
"#;

    fn options() -> Options {
        Options { listen: "127.0.0.1:8081".into(), merge_domains: false, allow_unexpressed: false }
    }

    fn one(text: &str) -> Result<Imported, String> {
        import(&[("f.yaml".into(), text.into())], &options())
    }

    #[test]
    fn imports_every_field_into_rules_and_zones() {
        let imported = one(EXAMPLE).expect("imports");
        let rt = crate::config::from_text(&imported.toml, "imported.toml")
            .unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
        let domain = rt.rls.as_ref().and_then(|r| r.domain("messaging")).expect("domain");
        assert_eq!(domain.rules.len(), 4);
        assert_eq!(rt.zones.len(), 3);
        let zone_of = |entries: &[(&str, &str)]| {
            let rule = find_rule(&domain.rules, entries, domain.pattern_order).expect("a rule");
            let z = &rt.zones[domain.route.limits[rule.limits[0]].zone];
            (z.rate.count, z.rate.period_us / 1_000_000)
        };
        assert_eq!(zone_of(&[("message_type", "marketing"), ("to_number", "1")]), (5, 86_400));
        assert_eq!(zone_of(&[("to_number", "1")]), (100, 7 * 86_400));
        assert_eq!(zone_of(&[("path", "/admin/a/xyz")]), (0, 1), "a middle and a trailing star; 0 blocks");
        let admin = find_rule(&domain.rules, &[("path", "/admin/a/x")], domain.pattern_order).expect("a rule");
        assert_eq!((admin.name.as_deref(), admin.replaces.clone()), (Some("admin"), vec!["other".to_string()]));
        assert!(find_rule(&domain.rules, &[("client", "vip")], domain.pattern_order).expect("a rule").unlimited);
        assert_eq!(domain.pattern_order, PatternOrder::File, "the first matching * value wins, as the peer's");
        assert!(imported.notes.iter().any(|n| n.contains("detailed_metric")), "{:?}", imported.notes);
        assert!(imported.toml.contains("dry_run = true"));
    }

    #[test]
    fn several_files_make_one_rls_section() {
        let a = (
            "a.yaml".to_string(),
            "domain: a\ndescriptors:\n  - {key: k, rate_limit: {unit: year, requests_per_unit: 3}}\n".to_string(),
        );
        let b = (
            "b.yaml".to_string(),
            "domain: b\ndescriptors:\n  - {key: k, rate_limit: {unit: month, requests_per_unit: 3}}\n".to_string(),
        );
        let imported = import(&[a, b], &options()).expect("imports");
        assert_eq!(imported.toml.matches("[rls]").count(), 1);
        let rt =
            crate::config::from_text(&imported.toml, "i.toml").unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
        assert_eq!(rt.rls.as_ref().map(|r| r.domains.len()), Some(2));
    }

    #[test]
    fn refuses_what_weir_cannot_express_or_leaves_that_domain_out() {
        let e = one("domain: \"a b\"\n").expect_err("a domain Weir cannot name");
        assert!(e.contains("--allow-unexpressed"), "{e}");
        let both = "domain: d\ndescriptors:\n  - {key: k, value: '*', rate_limit: {unit: day}}\n  - {key: k, rate_limit: {unit: day}}\n";
        let other = "domain: e\ndescriptors:\n  - {key: k, rate_limit: {unit: day}}\n";
        let files = [("a.yaml".to_string(), both.to_string()), ("b.yaml".to_string(), other.to_string())];
        assert!(import(&files, &options()).is_err(), "`*` beside the key alone");
        let allowed = import(&files, &Options { allow_unexpressed: true, ..options() }).expect("the rest imports");
        assert!(
            allowed.notes.iter().any(|n| n.contains("domain left out") && n.contains("beside")),
            "{:?}",
            allowed.notes
        );
        let rt = crate::config::from_text(&allowed.toml, "i.toml").unwrap_or_else(|e| panic!("{e}\n{}", allowed.toml));
        let rls = rt.rls.as_ref().expect("[rls]");
        assert!(rls.domain("d").is_none() && rls.domain("e").is_some(), "d left out whole, e imported");
        // `*` alone, without a rule for the key alone: any value.
        let star =
            one("domain: d\ndescriptors:\n  - {key: k, value: '*', rate_limit: {unit: day, requests_per_unit: 3}}\n")
                .expect("imports");
        let rt = crate::config::from_text(&star.toml, "i.toml").expect("compiles");
        let domain = rt.rls.as_ref().and_then(|r| r.domain("d")).expect("domain");
        assert!(find_rule(&domain.rules, &[("k", "anything")], domain.pattern_order).is_some());
    }
}
