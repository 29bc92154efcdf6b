//! envoyproxy/ratelimit's YAML config read as its own loader reads it (`src/config/config_impl.go`
//! at f2fb157): the same accepted keys, the same refusals with the same reasons, the same merge of
//! several files of one domain. Pure: text in, domains or the peer's error out.

use std::collections::HashSet;

use serde_yaml::{Mapping, Value};

/// Every key the peer accepts, anywhere in a file (it checks names, not places).
const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// The peer's units (`RateLimitResponse.RateLimit.Unit`, upper case) and their windows in
/// seconds (`utils.UnitToDivider`: a month is 30 days, a year 365).
pub const UNITS: &[(&str, u64)] = &[
    ("SECOND", 1),
    ("MINUTE", 60),
    ("HOUR", 3600),
    ("DAY", 86_400),
    ("WEEK", 7 * 86_400),
    ("MONTH", 30 * 86_400),
    ("YEAR", 365 * 86_400),
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    pub name: String,
    pub descriptors: Vec<Descriptor>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub key: String,
    /// `None` for an absent or empty value (the peer makes no difference).
    pub value: Option<String>,
    pub rate_limit: Option<RateLimit>,
    pub descriptors: Vec<Descriptor>,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub detailed_metric: bool,
    pub value_to_metric: bool,
    pub share_threshold: bool,
    pub has_metadata: bool,
    /// Accepted keys in a place the peer does not read them (it ignores them silently).
    pub ignored: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    /// The window in seconds; `None` for `unlimited`.
    pub unit: Option<(String, u64)>,
    pub requests_per_unit: u32,
    pub unlimited: bool,
    pub name: Option<String>,
    pub replaces: Vec<String>,
}

impl Descriptor {
    /// The peer's map key at one level: `key` or `key_value`.
    pub fn composite_key(&self) -> String {
        match &self.value {
            Some(v) => format!("{}_{v}", self.key),
            None => self.key.clone(),
        }
    }
}

/// The peer's error: `<file>: <reason>`.
fn error(file: &str, reason: impl std::fmt::Display) -> String {
    format!("{file}: {reason}")
}

/// Loads files into domains as the peer does: a domain's second file is refused, or with
/// `merge` (the peer's `MERGE_DOMAIN_CONFIG`) its descriptors join the first's.
pub fn load(files: &[(String, String)], merge: bool) -> Result<Vec<Domain>, String> {
    let mut domains: Vec<Domain> = Vec::new();
    for (file, text) in files {
        let (name, list, raw) = read_file(file, text)?;
        let at = domains.iter().position(|d| d.name == name);
        let into = match at {
            Some(_) if !merge => return Err(error(file, format!("duplicate domain '{name}' in config file"))),
            Some(i) => &mut domains[i],
            None => {
                domains.push(Domain { name: name.clone(), descriptors: Vec::new() });
                domains.last_mut().ok_or("unreachable: a domain was just added")?
            }
        };
        load_descriptors(file, &format!("{name}."), &list, &raw, &mut into.descriptors)?;
    }
    Ok(domains)
}

/// One file's domain and its descriptor list (as values, and as the scalars' text), after the
/// peer's key check.
fn read_file(file: &str, text: &str) -> Result<(String, Vec<Value>, Vec<RawDescriptor>), String> {
    if super::import_input::nesting_bound(text) > super::import_input::MAX_NESTING {
        // The parser's time grows with the square of the nesting: refused unparsed.
        return Err(error(
            file,
            format!(
                "nested deeper than {} levels, refused before parsing (Weir reads YAML nested up to 128 levels)",
                super::import_input::MAX_NESTING
            ),
        ));
    }
    let loading = |e: serde_yaml::Error| error(file, format!("error loading config file: {e}"));
    let root: Value = serde_yaml::from_str(text).map_err(loading)?;
    let root = match root {
        Value::Mapping(m) => m,
        // An empty file: no domain.
        Value::Null => Mapping::new(),
        other => return Err(error(file, format!("error loading config file: not a map: {}", scalar(&other)))),
    };
    validate_keys(file, &root)?;
    // Read again for the text of each scalar a string field holds (the values above are typed:
    // `+44` is the number 44 there). Every field was checked a scalar or a list of maps above,
    // so this reading of the same text cannot refuse what that one took.
    let raw: RawFile = match root.is_empty() {
        true => RawFile::default(),
        false => serde_yaml::from_str(text).map_err(loading)?,
    };
    let domain =
        root.get("domain").map(|v| text_of(file, "domain", v, raw.domain.as_ref())).transpose()?.unwrap_or_default();
    if domain.is_empty() {
        return Err(error(file, "config file cannot have empty domain"));
    }
    let list = match root.get("descriptors") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Sequence(s)) => s.clone(),
        Some(_) => return Err(error(file, "error loading config file: descriptors must be a list")),
    };
    Ok((domain, list, raw.descriptors.unwrap_or_default()))
}

/// The peer's `validateYamlKeys`: string keys from its list, lists of maps, scalar leaves;
/// `metadata` is free-form.
fn validate_keys(file: &str, map: &Mapping) -> Result<(), String> {
    for (k, v) in map {
        let Value::String(k) = k else {
            return Err(error(file, format!("config error, key is not of type string: {}", scalar(k))));
        };
        if !VALID_KEYS.contains(&k.as_str()) {
            return Err(error(file, format!("config error, unknown key '{k}'")));
        }
        if k == "metadata" {
            continue;
        }
        match v {
            Value::Sequence(list) => {
                for e in list {
                    let Value::Mapping(m) = e else {
                        return Err(error(
                            file,
                            format!("config error, yaml file contains list of type other than map: {}", scalar(e)),
                        ));
                    };
                    validate_keys(file, m)?;
                }
            }
            Value::Mapping(m) => validate_keys(file, m)?,
            Value::String(_) | Value::Bool(_) | Value::Null => {}
            Value::Number(n) if n.is_i64() || n.is_u64() => {}
            _ => return Err(error(file, "error checking config")),
        }
    }
    Ok(())
}

/// The peer's `loadDescriptors` for one level (into `into`, which may hold a merged file's);
/// `texts` is the same level read for its scalars' text.
fn load_descriptors(
    file: &str,
    parent: &str,
    list: &[Value],
    texts: &[RawDescriptor],
    into: &mut Vec<Descriptor>,
) -> Result<(), String> {
    let no_text = RawDescriptor::default();
    // The level's composite keys so far (a merged file's included): one look each, not a scan.
    let mut taken: HashSet<String> = into.iter().map(Descriptor::composite_key).collect();
    for (i, entry) in list.iter().enumerate() {
        let Value::Mapping(m) = entry else {
            return Err(error(file, "config error, yaml file contains list of type other than map"));
        };
        let raw = texts.get(i).unwrap_or(&no_text);
        let key = m.get("key").map(|v| text_of(file, "key", v, raw.key.as_ref())).transpose()?.unwrap_or_default();
        if key.is_empty() {
            return Err(error(file, "descriptor has empty key"));
        }
        let value = m
            .get("value")
            .map(|v| text_of(file, "value", v, raw.value.as_ref()))
            .transpose()?
            .filter(|v| !v.is_empty());
        let mut d = Descriptor {
            key,
            value,
            rate_limit: None,
            descriptors: Vec::new(),
            shadow_mode: flag(file, m, "shadow_mode")?,
            quota_mode: flag(file, m, "quota_mode")?,
            detailed_metric: flag(file, m, "detailed_metric")?,
            value_to_metric: flag(file, m, "value_to_metric")?,
            share_threshold: flag(file, m, "share_threshold")?,
            has_metadata: m.get("metadata").is_some_and(|v| !v.is_null()),
            ignored: Vec::new(),
        };
        let composite = d.composite_key();
        let full = format!("{parent}{composite}");
        if !taken.insert(composite.clone()) {
            return Err(error(file, format!("duplicate descriptor composite key '{full}'")));
        }
        for k in m.keys().filter_map(Value::as_str) {
            if !DESCRIPTOR_KEYS.contains(&k) {
                d.ignored.push(k.to_string());
            }
        }
        if let Some(rl) = m.get("rate_limit").filter(|v| !v.is_null()) {
            let Value::Mapping(rl) = rl else {
                return Err(error(file, "error loading config file: rate_limit must be a map"));
            };
            let no_text = RawRateLimit::default();
            let texts = raw.rate_limit.as_ref().unwrap_or(&no_text);
            d.rate_limit = Some(rate_limit(file, rl, texts, &mut d.ignored)?);
        }
        if d.share_threshold && !composite.contains('*') {
            return Err(error(
                file,
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but found key '{composite}'"
                ),
            ));
        }
        if let Some(children) = m.get("descriptors") {
            match children {
                Value::Null => {}
                Value::Sequence(s) => {
                    let texts = raw.descriptors.as_deref().unwrap_or_default();
                    load_descriptors(file, &format!("{full}."), s, texts, &mut d.descriptors)?
                }
                _ => return Err(error(file, "error loading config file: descriptors must be a list")),
            }
        }
        into.push(d);
    }
    Ok(())
}

/// Keys the peer reads on a descriptor (others from its list are ignored there).
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

fn rate_limit(file: &str, m: &Mapping, raw: &RawRateLimit, ignored: &mut Vec<String>) -> Result<RateLimit, String> {
    for k in m.keys().filter_map(Value::as_str) {
        if !["requests_per_unit", "unit", "unlimited", "name", "replaces"].contains(&k) {
            ignored.push(format!("rate_limit.{k}"));
        }
    }
    let requests_per_unit = match m.get("requests_per_unit") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
            error(file, format!("error loading config file: requests_per_unit {} is not a uint32", scalar(v)))
        })?,
    };
    let unlimited = flag(file, m, "unlimited")?;
    let unit_text = m.get("unit").map(|v| text_of(file, "unit", v, raw.unit.as_ref())).transpose()?.unwrap_or_default();
    let unit = UNITS.iter().find(|(u, _)| u.eq_ignore_ascii_case(&unit_text)).map(|&(u, s)| (u.to_string(), s));
    if unlimited && unit.is_some() {
        return Err(error(file, "should not specify rate limit unit when unlimited"));
    }
    if !unlimited && unit.is_none() {
        return Err(error(file, format!("invalid rate limit unit '{unit_text}'")));
    }
    let name =
        m.get("name").map(|v| text_of(file, "name", v, raw.name.as_ref())).transpose()?.filter(|n| !n.is_empty());
    let mut replaces = Vec::new();
    match m.get("replaces") {
        None | Some(Value::Null) => {}
        Some(Value::Sequence(list)) => {
            let texts = raw.replaces.as_deref().unwrap_or_default();
            for (i, r) in list.iter().enumerate() {
                let text = texts.get(i).and_then(|t| t.name.as_ref());
                let r = r.get("name").map(|v| text_of(file, "name", v, text)).transpose()?.unwrap_or_default();
                if r.is_empty() {
                    return Err(error(file, "should not have an empty replaces entry"));
                }
                if Some(&r) == name.as_ref() {
                    return Err(error(file, "replaces should not contain name of same descriptor"));
                }
                replaces.push(r);
            }
        }
        Some(_) => return Err(error(file, "error loading config file: replaces must be a list")),
    }
    Ok(RateLimit { unit: if unlimited { None } else { unit }, requests_per_unit, unlimited, name, replaces })
}

/// A scalar read into a string field, as the peer's YAML library does: its text as written
/// (`value: +44` is "+44", `0x1F` "0x1F", `True` "True"), which is what Envoy sends. `text` is
/// that text; without it (never, once a file has loaded) the typed value's spelling.
fn text_of(file: &str, field: &str, v: &Value, text: Option<&Raw>) -> Result<String, String> {
    match (v, text) {
        (Value::Null, _) => Ok(String::new()),
        (Value::String(_) | Value::Number(_) | Value::Bool(_), Some(Raw(t))) => Ok(t.clone()),
        (Value::String(s), None) => Ok(s.clone()),
        (Value::Number(n), None) => Ok(n.to_string()),
        (Value::Bool(b), None) => Ok(b.to_string()),
        _ => Err(error(file, format!("error loading config file: {field} must be a string"))),
    }
}

/// The peer's string fields, read as the text of their scalars (serde_yaml hands a scalar read
/// as a string over as written; its `Value` resolves it to a number or a bool first). Fields the
/// peer does not read as strings are left out, and so ignored here.
#[derive(Debug, Default, serde::Deserialize)]
struct RawFile {
    #[serde(default)]
    domain: Option<Raw>,
    #[serde(default)]
    descriptors: Option<Vec<RawDescriptor>>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct RawDescriptor {
    #[serde(default)]
    key: Option<Raw>,
    #[serde(default)]
    value: Option<Raw>,
    #[serde(default)]
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    descriptors: Option<Vec<RawDescriptor>>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct RawRateLimit {
    #[serde(default)]
    unit: Option<Raw>,
    #[serde(default)]
    name: Option<Raw>,
    #[serde(default)]
    replaces: Option<Vec<RawReplace>>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct RawReplace {
    #[serde(default)]
    name: Option<Raw>,
}

/// A scalar's text as written (after unquoting).
#[derive(Debug)]
struct Raw(String);

impl<'de> serde::Deserialize<'de> for Raw {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A string read is the scalar's text, whatever type it would resolve to.
        String::deserialize(d).map(Raw)
    }
}

fn flag(file: &str, m: &Mapping, field: &str) -> Result<bool, String> {
    match m.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => v
            .as_str()
            .and_then(yaml_1_1_bool)
            .ok_or_else(|| error(file, format!("error loading config file: {field}: {} is not a bool", scalar(v)))),
    }
}

/// The words YAML 1.1 reads as booleans, as the peer's parser (gopkg.in/yaml.v2) does for a bool
/// field (`shadow_mode: yes`); serde_yaml reads YAML 1.2, where they are strings. A quoted "yes",
/// which the peer refuses for a bool, is taken here too: serde_yaml does not say it was quoted.
fn yaml_1_1_bool(word: &str) -> Option<bool> {
    match word {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

/// A value as the peer prints it in an error (`0.25`, `a`).
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => serde_yaml::to_string(other).map_or_else(|_| "?".into(), |s| s.trim().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Result<Vec<Domain>, String> {
        load(&[("f.yaml".into(), text.into())], false)
    }

    #[test]
    fn reads_units_values_and_nesting() {
        let d = one("domain: d\ndescriptors:\n  - key: k\n    value: 123\n    rate_limit: {unit: Month, requests_per_unit: 0}\n    descriptors:\n      - key: s\n        rate_limit: {unlimited: true, name: n}\n").expect("loads");
        let k = &d[0].descriptors[0];
        assert_eq!(k.value.as_deref(), Some("123"));
        let rl = k.rate_limit.as_ref().expect("limit");
        assert_eq!((rl.unit.clone(), rl.requests_per_unit), (Some(("MONTH".into(), 30 * 86_400)), 0));
        let s = k.descriptors[0].rate_limit.as_ref().expect("limit");
        assert!(s.unlimited && s.unit.is_none());
        assert_eq!(s.name.as_deref(), Some("n"));
    }

    #[test]
    fn bool_fields_take_yaml_1_1_words_as_the_peer_does() {
        let with = |flag: &str| {
            format!("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: {flag}\n    quota_mode: {flag}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n")
        };
        for (word, expected) in
            [("yes", true), ("On", true), ("Y", true), ("true", true), ("no", false), ("OFF", false), ("false", false)]
        {
            let d = one(&with(word)).unwrap_or_else(|e| panic!("{word}: {e}"));
            let k = &d[0].descriptors[0];
            assert_eq!((k.shadow_mode, k.quota_mode), (expected, expected), "{word}");
        }
        let refused = one(&with("maybe")).expect_err("not a bool");
        assert!(refused.contains("shadow_mode: maybe is not a bool"), "{refused}");
    }

    #[test]
    fn string_fields_keep_their_scalars_as_written() {
        let text = "domain: 0x10\ndescriptors:\n  - {key: +1, value: +44, rate_limit: {unit: day, name: True}}\n  - {key: k, value: 0o17, descriptors: [{key: s, value: 1_0}]}\n  - {key: k, value: '+44'}\n";
        let d = one(text).expect("loads");
        assert_eq!(d[0].name, "0x10");
        let [a, b, c] = &d[0].descriptors[..] else { panic!("three descriptors") };
        assert_eq!((a.key.as_str(), a.value.as_deref()), ("+1", Some("+44")));
        assert_eq!(a.rate_limit.as_ref().and_then(|r| r.name.as_deref()), Some("True"));
        assert_eq!((b.value.as_deref(), b.descriptors[0].value.as_deref()), (Some("0o17"), Some("1_0")));
        assert_eq!(c.value.as_deref(), Some("+44"), "quoted or not, the same text");
        // `+44` and `44` are two values (they were one, and refused as a duplicate).
        assert!(one("domain: d\ndescriptors:\n  - {key: k, value: +44}\n  - {key: k, value: 44}\n").is_ok());
    }

    #[test]
    fn refuses_what_the_peer_refuses() {
        let cases = [
            ("domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: day}\n", "unknown key 'ratelimit'"),
            ("domain: d\ndescriptors:\n  - a\n", "list of type other than map: a"),
            ("0.25: d\n", "key is not of type string: 0.25"),
            ("descriptors:\n", "cannot have empty domain"),
            ("domain: d\ndescriptors:\n  - value: v\n", "descriptor has empty key"),
            (
                "domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n",
                "duplicate descriptor composite key 'd.k_v'",
            ),
            (
                "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: fortnight}}\n",
                "invalid rate limit unit 'fortnight'",
            ),
            (
                "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: unknown}}\n",
                "invalid rate limit unit 'unknown'",
            ),
            (
                "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: day, unlimited: true}}\n",
                "should not specify rate limit unit",
            ),
            (
                "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: day, replaces: [{name: }]}}\n",
                "empty replaces entry",
            ),
            (
                "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: day, name: a, replaces: [{name: a}]}}\n",
                "name of same descriptor",
            ),
            (
                "domain: d\ndescriptors:\n  - {key: k, value: v, share_threshold: true, rate_limit: {unit: day}}\n",
                "share_threshold can only be used with wildcard",
            ),
            ("domain: d\ndomain: e\n", "error loading config file"),
            (
                "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: day, requests_per_unit: 1.5}}\n",
                "error checking config",
            ),
            ("domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: day, requests_per_unit: -1}}\n", "not a uint32"),
        ];
        for (text, reason) in cases {
            let e = one(text).expect_err(text);
            assert!(e.starts_with("f.yaml: ") && e.contains(reason), "{e}\n--- for ---\n{text}");
        }
    }

    #[test]
    fn merges_a_domains_files_only_when_asked() {
        let a = ("a.yaml".to_string(), "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: day}}\n".to_string());
        let b = ("b.yaml".to_string(), "domain: d\ndescriptors:\n  - {key: b, rate_limit: {unit: day}}\n".to_string());
        assert_eq!(load(&[a.clone(), b.clone()], false).unwrap_err(), "b.yaml: duplicate domain 'd' in config file");
        let merged = load(&[a.clone(), b], true).expect("merges");
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].descriptors.len(), 2);
        let e = load(&[a.clone(), a], true).unwrap_err();
        assert_eq!(e, "a.yaml: duplicate descriptor composite key 'd.a'");
    }
}
