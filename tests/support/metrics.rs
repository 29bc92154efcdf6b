//! Weir's Prometheus metrics as tests read them: `GET /metrics` on the admin listener, parsed
//! from the text exposition format into samples that can be looked up by name and labels.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use super::http;
use super::poll::poll;

/// One line of the exposition: `name{labels} value`.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// One scrape of `/metrics`, parsed.
#[derive(Debug)]
pub struct Scrape {
    pub samples: Vec<Sample>,
    /// `# TYPE name kind`
    pub types: HashMap<String, String>,
    /// The text as scraped.
    pub text: String,
}

impl Scrape {
    /// Parses the Prometheus text exposition format (version 0.0.4): `# HELP`/`# TYPE` comments and
    /// `name{label="value",...} value [timestamp]` lines, with `\\`, `\"` and `\n` escapes in values.
    /// Panics, naming the line, on anything else.
    pub fn parse(text: &str) -> Scrape {
        let mut samples = Vec::new();
        let mut types = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                let words: Vec<&str> = comment.split_whitespace().collect();
                if words.first() == Some(&"TYPE") {
                    assert_eq!(words.len(), 3, "line {}: bad TYPE line {line:?}", n + 1);
                    types.insert(words[1].to_string(), words[2].to_string());
                }
                continue;
            }
            samples.push(parse_sample(line).unwrap_or_else(|e| panic!("line {}: {e}: {line:?}", n + 1)));
        }
        Scrape { samples, types, text: text.to_string() }
    }

    /// The value of the series `name` whose label set is exactly `labels` (any order).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want = label_set(labels);
        let found: Vec<&Sample> = self.samples.iter().filter(|s| s.name == name && s.labels == want).collect();
        assert!(found.len() <= 1, "series {name}{want:?} appears {} times:\n{}", found.len(), self.text);
        found.first().map(|s| s.value)
    }

    /// Like [`Scrape::value`], with 0 for a series not exported (yet): a counter has no series
    /// until it is first incremented.
    pub fn value_or_zero(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or(0.0)
    }

    /// Like [`Scrape::value`], panicking with the whole scrape when the series is absent.
    pub fn must(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels)
            .unwrap_or_else(|| panic!("no series {name}{labels:?} in /metrics:\n{}", self.filtered()))
    }

    /// Every series of `name`: label set → value.
    pub fn series(&self, name: &str) -> BTreeMap<BTreeMap<String, String>, f64> {
        self.samples.iter().filter(|s| s.name == name).map(|s| (s.labels.clone(), s.value)).collect()
    }

    /// The sum of every series of `name` whose labels include `labels` (all of them for `&[]`).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
            .map(|s| s.value)
            .sum()
    }

    /// The scrape without comments and histogram buckets, for assertion messages.
    pub fn filtered(&self) -> String {
        self.text.lines().filter(|l| !l.starts_with('#') && !l.contains("_bucket{")).collect::<Vec<_>>().join("\n")
    }
}

/// `[("k", "v"), …]` as a label set.
pub fn label_set(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Parses one sample line: `name{label="value",...} value [timestamp]`.
pub fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("bad metric name".into());
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        let consumed = loop {
            // Skip separators and spaces; `}` ends the set.
            while let Some(&(_, c)) = chars.peek() {
                if c == ',' || c == ' ' {
                    chars.next();
                } else {
                    break;
                }
            }
            match chars.next() {
                Some((i, '}')) => break i + 1,
                Some((start, c)) if c.is_ascii_alphabetic() || c == '_' => {
                    let mut end = start + c.len_utf8();
                    while let Some(&(i, c)) = chars.peek() {
                        if c.is_ascii_alphanumeric() || c == '_' {
                            chars.next();
                            end = i + 1;
                        } else {
                            break;
                        }
                    }
                    let key = after[start..end].to_string();
                    if chars.next().map(|(_, c)| c) != Some('=') {
                        return Err(format!("label {key}: expected '='"));
                    }
                    if chars.next().map(|(_, c)| c) != Some('"') {
                        return Err(format!("label {key}: expected '\"'"));
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next() {
                            None => return Err(format!("label {key}: unterminated value")),
                            Some((_, '"')) => break,
                            Some((_, '\\')) => match chars.next() {
                                Some((_, 'n')) => value.push('\n'),
                                Some((_, '\\')) => value.push('\\'),
                                Some((_, '"')) => value.push('"'),
                                other => return Err(format!("label {key}: bad escape {other:?}")),
                            },
                            Some((_, c)) => value.push(c),
                        }
                    }
                    if labels.insert(key.clone(), value).is_some() {
                        return Err(format!("label {key} repeated"));
                    }
                }
                None => return Err("unterminated label set".into()),
                other => return Err(format!("unexpected {other:?} in labels")),
            }
        };
        rest = &after[consumed..];
    }
    let mut fields = rest.split_whitespace();
    let raw = fields.next().ok_or("no value")?;
    let value = match raw {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().map_err(|_| format!("bad value {v:?}"))?,
    };
    if let Some(ts) = fields.next() {
        ts.parse::<i64>().map_err(|_| format!("bad timestamp {ts:?}"))?;
    }
    if fields.next().is_some() {
        return Err("trailing fields".into());
    }
    Ok(Sample { name: name.to_string(), labels, value })
}

/// `GET /metrics` on the admin listener `admin` (no token), which must answer 200, parsed.
pub fn scrape(admin: SocketAddr) -> Scrape {
    let r = http::get(admin, "/metrics");
    assert_eq!(r.status, 200, "GET /metrics: {}", r.summary());
    Scrape::parse(&r.text())
}

/// Scrapes `admin` every `every` until `ok` holds, bounded by `timeout`: `Ok` with the scrape
/// that satisfied it, or `Err` with the last one. Metrics are recorded after the response is
/// sent, so a test that has read its responses may still have to wait for them.
pub fn scrape_until(
    admin: SocketAddr,
    timeout: Duration,
    every: Duration,
    ok: impl Fn(&Scrape) -> bool,
) -> Result<Scrape, Scrape> {
    poll(timeout, every, || scrape(admin), ok)
}
