//! `weir import-rls FILE.yaml`: an envoyproxy/ratelimit config (one domain per file) as Weir TOML.
//!
//! envoyproxy/ratelimit counts in fixed windows of one unit, so each `rate_limit` becomes a
//! `fixed_window` zone with that window and `requests_per_unit` as its limit: the same decisions.
//! Nested descriptors, values, `value: "prefix*"`, `unlimited` and `shadow_mode` map one to one;
//! what has no equivalent is listed in the report (and in a comment atop the output).

use std::collections::HashSet;
use std::fmt::Write as _;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct RatelimitFile {
    domain: String,
    #[serde(default)]
    descriptors: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
struct Descriptor {
    key: String,
    value: Option<String>,
    rate_limit: Option<RateLimit>,
    #[serde(default)]
    descriptors: Vec<Descriptor>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(flatten)]
    other: serde_yaml::Mapping,
}

#[derive(Debug, Deserialize)]
struct RateLimit {
    unit: String,
    requests_per_unit: u64,
    name: Option<String>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    replaces: Vec<serde_yaml::Value>,
    #[serde(flatten)]
    other: serde_yaml::Mapping,
}

/// The TOML, and what could not be expressed (each one line).
#[derive(Debug)]
pub struct Imported {
    pub toml: String,
    pub not_expressed: Vec<String>,
}

pub fn import(yaml: &str, listen: &str) -> Result<Imported, String> {
    let file: RatelimitFile =
        serde_yaml::from_str(yaml).map_err(|e| format!("not an envoyproxy/ratelimit config: {e}"))?;
    if file.domain.is_empty() {
        return Err("domain: must not be empty".into());
    }
    let mut out = Importer { zones: String::new(), rules: String::new(), names: HashSet::new(), notes: Vec::new() };
    for d in &file.descriptors {
        out.descriptor(d, &file.domain, &[], 1)?;
    }
    let domain = sanitize(&file.domain);
    if domain != file.domain {
        out.notes.push(format!("domain {:?} renamed {domain:?} (names are A-Z a-z 0-9 _ - .)", file.domain));
    }
    let mut toml = String::new();
    let _ = writeln!(toml, "# Imported from envoyproxy/ratelimit by `weir import-rls` (domain {:?}).", file.domain);
    let _ = writeln!(toml, "# Fixed windows like envoyproxy/ratelimit's; other algorithms: docs/rls.md.");
    for note in &out.notes {
        let _ = writeln!(toml, "# NOT EXPRESSED: {note}");
    }
    let _ = writeln!(toml, "# Shared limits across instances need a Redis store:\n# [store]\n# kind = \"redis\"\n# url = \"redis://127.0.0.1:6379\"\n");
    toml.push_str(&out.zones);
    let _ = writeln!(toml, "[rls]\nlisten = [{}]\n", quote(listen));
    let _ = writeln!(toml, "[[rls.domain]]\nname = {}", quote(&domain));
    toml.push_str(&out.rules);
    Ok(Imported { toml, not_expressed: out.notes })
}

struct Importer {
    zones: String,
    rules: String,
    names: HashSet<String>,
    notes: Vec<String>,
}

impl Importer {
    fn descriptor(&mut self, d: &Descriptor, domain: &str, path: &[String], depth: usize) -> Result<(), String> {
        let mut here = path.to_vec();
        here.push(match &d.value {
            Some(v) => format!("{}_{}", d.key, v),
            None => d.key.clone(),
        });
        let place = format!("{domain}: {}", here.join(" > "));
        let header = format!("\n[[rls.domain{}]]\n", ".descriptor".repeat(depth));
        let mut rule = header;
        let _ = writeln!(rule, "key = {}", quote(&d.key));
        if let Some(v) = &d.value {
            let _ = writeln!(rule, "value = {}", quote(v));
        }
        if d.detailed_metric {
            self.notes.push(format!("{place}: detailed_metric (Weir's metrics are per zone, never per value)"));
        }
        for key in d.other.keys() {
            self.notes.push(format!("{place}: unknown field {}", yaml_text(key)));
        }
        match &d.rate_limit {
            Some(rl) if rl.unlimited => {
                let _ = writeln!(rule, "unlimited = true");
            }
            Some(rl) => {
                let (window, unit_note) = window_of(&rl.unit).ok_or_else(|| {
                    format!("{place}: rate_limit.unit {:?} is not second, minute, hour or day", rl.unit)
                })?;
                if let Some(n) = unit_note {
                    self.notes.push(format!("{place}: {n}"));
                }
                if rl.requests_per_unit == 0 {
                    return Err(format!("{place}: requests_per_unit 0 (use unlimited, or a value that blocks)"));
                }
                if !rl.replaces.is_empty() {
                    self.notes.push(format!(
                        "{place}: replaces (each matched descriptor is decided; no limit replaces another)"
                    ));
                }
                for key in rl.other.keys() {
                    self.notes.push(format!("{place}: rate_limit field {}", yaml_text(key)));
                }
                let zone = self.zone_name(&format!("{domain}.{}", here.join(".")));
                let _ = writeln!(self.zones, "[[limit_req_zone]]");
                if let Some(name) = &rl.name {
                    let _ = writeln!(self.zones, "# name: {name}");
                }
                let _ = writeln!(
                    self.zones,
                    "name = {}\nalgorithm = \"fixed_window\"\nwindow = {}\nlimit = {}\n",
                    quote(&zone),
                    quote(window),
                    rl.requests_per_unit
                );
                let _ = writeln!(rule, "zone = {}", quote(&zone));
                if d.shadow_mode {
                    let _ = writeln!(rule, "dry_run = true");
                }
            }
            None if d.descriptors.is_empty() => {
                // A leaf without a limit matches and limits nothing, like envoyproxy/ratelimit.
                let _ = writeln!(rule, "unlimited = true");
            }
            None => {}
        }
        self.rules.push_str(&rule);
        for child in &d.descriptors {
            self.descriptor(child, domain, &here, depth + 1)?;
        }
        Ok(())
    }

    /// A zone name from a descriptor path: the allowed characters, at most 64, unique.
    fn zone_name(&mut self, path: &str) -> String {
        let base: String = sanitize(path).chars().take(56).collect();
        let mut name = base.clone();
        let mut n = 2;
        while !self.names.insert(name.clone()) {
            name = format!("{base}-{n}");
            n += 1;
        }
        name
    }
}

fn window_of(unit: &str) -> Option<(&'static str, Option<&'static str>)> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "second" => ("1s", None),
        "minute" => ("1m", None),
        "hour" => ("1h", None),
        "day" => ("24h", None),
        _ => return None,
    })
}

fn sanitize(text: &str) -> String {
    let s: String =
        text.chars().map(|c| if c.is_ascii_alphanumeric() || "_-.".contains(c) { c } else { '_' }).take(64).collect();
    if s.is_empty() {
        "_".into()
    } else {
        s
    }
}

fn quote(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

fn yaml_text(v: &serde_yaml::Value) -> String {
    serde_yaml::to_string(v).map_or_else(|_| "?".into(), |s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

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
      unit: day
      requests_per_unit: 100
  - key: path
    value: "/admin*"
    shadow_mode: true
    detailed_metric: true
    rate_limit:
      unit: second
      requests_per_unit: 1
  - key: client
    value: vip
    rate_limit:
      unlimited: true
      unit: second
      requests_per_unit: 0
"#;

    #[test]
    fn imports_nested_descriptors_as_fixed_windows() {
        let imported = import(EXAMPLE, "127.0.0.1:8081").expect("imports");
        let rt = crate::config::from_text(&imported.toml, "imported.toml")
            .unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
        let domain = rt.rls.as_ref().and_then(|r| r.domain("messaging")).expect("domain");
        assert_eq!(domain.rules.len(), 4);
        assert_eq!(rt.zones.len(), 3);
        let nested = &domain.route.limits[crate::rls::rules::find_limit(
            &domain.rules,
            &[("message_type", "marketing"), ("to_number", "1")],
        )
        .expect("limited")];
        assert_eq!(rt.zones[nested.zone].rate.count, 5);
        assert_eq!(rt.zones[nested.zone].rate.period_us, 86_400_000_000);
        assert_eq!(crate::rls::rules::find_limit(&domain.rules, &[("client", "vip")]), None);
        assert!(imported.not_expressed.iter().any(|n| n.contains("detailed_metric")), "{:?}", imported.not_expressed);
        assert!(imported.toml.contains("dry_run = true"));
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert!(import(
            "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: week, requests_per_unit: 1}\n",
            "127.0.0.1:1"
        )
        .is_err());
        assert!(import("not: [valid", "127.0.0.1:1").is_err());
        assert!(import("domain: \"\"\n", "127.0.0.1:1").is_err());
    }
}
