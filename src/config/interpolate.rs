//! `${NAME}` in any string value of the config: replaced by the environment variable `NAME` before
//! the file is parsed, so secrets (a Redis password, the admin token) can stay out of the file and
//! of the ConfigMap that holds it. `${NAME:-default}` gives a default for an unset variable;
//! `$${` writes a literal `${`; a lone `$` is left alone. An unset variable without a default is
//! an error naming it and its line, never an empty string.
//!
//! Only string values are rewritten, in place in the text: each is re-encoded as a TOML string on
//! as many lines as it had, so every other value keeps its line and errors still point at it.

use std::ops::Range;

use toml_edit::{ImDocument, Item, Value};

use super::error::{ConfigError, Source};
use super::redact::encode;

/// One value that read the environment: the setting (`store.url`) and the variables it names.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EnvUse {
    pub setting: String,
    pub variables: Vec<String>,
}

/// The text with every `${NAME}` replaced, and where the environment was read. The values read
/// are returned separately so error messages can hide them again.
pub struct Interpolated {
    pub text: String,
    pub uses: Vec<EnvUse>,
    /// `(variable, value)` of every substitution, for [`Interpolated::redact`].
    values: Vec<(String, String)>,
    /// Where each value that read the environment is (in the text before and after: values
    /// keep their lines), with its variables: errors on that line name them.
    pub origins: Vec<(Range<usize>, Vec<String>)>,
}

impl std::fmt::Debug for Interpolated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interpolated").field("uses", &self.uses).finish_non_exhaustive()
    }
}

impl Interpolated {
    /// `message` with every substituted value shown as the `${NAME}` it came from: an error
    /// about a setting never prints what the environment put in it.
    pub fn redact(&self, message: &str) -> String {
        let values = self.values.iter().map(|(name, value)| (format!("${{{name}}}"), value.as_str()));
        super::redact::redact_all(message, values)
    }
}

/// Replaces `${NAME}` in the string values of `text` with `lookup(NAME)` (the process
/// environment in [`expand`]). Text that is not valid TOML is returned unchanged: the parser
/// that follows reports its error with the line.
/// Every unset variable is reported, not only the first.
pub fn expand_with(
    src: &Source<'_>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Interpolated, Vec<ConfigError>> {
    let mut result =
        Interpolated { text: src.text.to_string(), uses: Vec::new(), values: Vec::new(), origins: Vec::new() };
    if !src.text.contains('$') {
        return Ok(result);
    }
    let Ok(doc) = ImDocument::parse(src.text) else { return Ok(result) };
    let mut found = Vec::new();
    strings_in_table(doc.as_table(), "", &mut found);
    let mut edits: Vec<(Range<usize>, String)> = Vec::new();
    let mut errors = Vec::new();
    for (setting, span, value) in found {
        if !value.contains('$') {
            continue;
        }
        let (expanded, variables) = match substitute(&value, lookup, &mut result.values) {
            Ok(done) => done,
            Err(message) => {
                errors.push(src.error_at(&span, format!("{setting}: {message}")));
                continue;
            }
        };
        if expanded == value {
            continue;
        }
        let lines = src.text[span.clone()].matches('\n').count();
        edits.push((span.clone(), encode(&expanded, lines)));
        if !variables.is_empty() {
            result.origins.push((span, variables.clone()));
            result.uses.push(EnvUse { setting, variables });
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    edits.sort_by_key(|(span, _)| span.start);
    let mut text = String::with_capacity(src.text.len());
    let mut at = 0;
    for (span, encoded) in edits {
        text.push_str(&src.text[at..span.start]);
        text.push_str(&encoded);
        at = span.end;
    }
    text.push_str(&src.text[at..]);
    result.text = text;
    Ok(result)
}

/// [`expand_with`] the process environment.
pub fn expand(src: &Source<'_>) -> Result<Interpolated, Vec<ConfigError>> {
    expand_with(src, &|name| src.outside.var(name))
}

/// Every string value under `table`, with its setting's name (`server.admin_token`,
/// `route[2].upstream`) and its span in the text.
fn strings_in_table(table: &toml_edit::Table, path: &str, out: &mut Vec<(String, Range<usize>, String)>) {
    for (key, item) in table.iter() {
        let here = join(path, key);
        match item {
            Item::Value(v) => strings_in_value(v, &here, out),
            Item::Table(t) => strings_in_table(t, &here, out),
            Item::ArrayOfTables(a) => {
                for (i, t) in a.iter().enumerate() {
                    strings_in_table(t, &format!("{here}[{}]", i + 1), out);
                }
            }
            Item::None => {}
        }
    }
}

fn strings_in_value(value: &Value, path: &str, out: &mut Vec<(String, Range<usize>, String)>) {
    match value {
        Value::String(s) => {
            if let Some(span) = value.span() {
                out.push((path.to_string(), span, s.value().clone()));
            }
        }
        Value::Array(a) => {
            for v in a.iter() {
                strings_in_value(v, path, out);
            }
        }
        Value::InlineTable(t) => {
            for (key, v) in t.iter() {
                strings_in_value(v, &join(path, key), out);
            }
        }
        _ => {}
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// `value` with `${NAME}` replaced and `$${` unescaped; the names read, in order.
fn substitute(
    value: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    read: &mut Vec<(String, String)>,
) -> Result<(String, Vec<String>), String> {
    let mut out = String::with_capacity(value.len());
    let mut names = Vec::new();
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = tail.strip_prefix("${") {
            let end = after.find('}').ok_or("\"${\" without its closing \"}\" (write $${ for a literal ${)")?;
            let (name, default) = match after[..end].split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (&after[..end], None),
            };
            let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!(
                    "${{{name}}}: an environment variable name is letters, digits and _ (write $${{ for a literal ${{)"
                ));
            }
            let Some(found) = lookup(name).or_else(|| default.map(str::to_string)) else {
                return Err(format!(
                    "the environment variable {name} is not set (from ${{{name}}}); set it, or write the value"
                ));
            };
            out.push_str(&found);
            read.push((name.to_string(), found));
            names.push(name.to_string());
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    Ok((out, names))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "PW" => Some("s3cr\"et\\x".into()),
            "HOST" => Some("10.0.0.1".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn run(text: &str) -> Result<Interpolated, ConfigError> {
        run_all(text).map_err(|mut errors| errors.remove(0))
    }

    fn run_all(text: &str) -> Result<Interpolated, Vec<ConfigError>> {
        expand_with(&Source { file: "t.toml", text, outside: &crate::config::Machine }, &env)
    }

    #[test]
    fn replaces_variables_in_every_kind_of_string() {
        let text = "[store]\nurl = \"redis://:${PW}@${HOST}:6379\"\nkey = ['$remote_addr', '${HOST}']\n\
                    [[route]]\nname = \"a\"\nx = { y = \"${EMPTY}z\" }\n";
        let out = run(text).expect("expands");
        let parsed: toml::Value = toml::from_str(&out.text).expect("still TOML");
        assert_eq!(parsed["store"]["url"].as_str(), Some("redis://:s3cr\"et\\x@10.0.0.1:6379"));
        assert_eq!(parsed["store"]["key"][0].as_str(), Some("$remote_addr"));
        assert_eq!(parsed["store"]["key"][1].as_str(), Some("10.0.0.1"));
        assert_eq!(parsed["route"][0]["x"]["y"].as_str(), Some("z"));
        assert_eq!(out.text.lines().count(), text.lines().count());
        let settings: Vec<&str> = out.uses.iter().map(|u| u.setting.as_str()).collect();
        assert_eq!(settings, ["store.url", "store.key", "route[1].x.y"]);
        assert_eq!(out.uses[0].variables, ["PW", "HOST"]);
    }

    #[test]
    fn multi_line_strings_keep_the_lines_after_them() {
        let text = "a = \"\"\"\n${HOST}\nb\"\"\"\nc = \"${HOST}\"\nd = 1\n";
        let out = run(text).expect("expands");
        assert_eq!(out.text.lines().count(), text.lines().count());
        let parsed: toml::Value = toml::from_str(&out.text).expect("still TOML");
        assert_eq!(parsed["a"].as_str(), Some("10.0.0.1\nb"));
        let d_line = out.text.lines().position(|l| l.starts_with("d = ")).expect("d");
        assert_eq!(d_line, 4);
    }

    #[test]
    fn unset_and_malformed_variables_name_the_line() {
        let err = run("[server]\n\nadmin_token = \"${NOPE}\"\n").expect_err("unset");
        assert_eq!(err.line, Some(3));
        assert!(err.message.starts_with("server.admin_token: the environment variable NOPE is not set"), "{err}");
        let err = run("a = \"${PW\"\n").expect_err("unclosed");
        assert!(err.message.contains("closing"), "{err}");
        let err = run("a = \"${1X}\"\n").expect_err("bad name");
        assert!(err.message.contains("letters, digits"), "{err}");
    }

    #[test]
    fn every_unset_variable_is_reported() {
        let errors = run_all("a = \"${NOPE}\"\nb = \"${HOST}\"\nc = \"${ALSO_NOPE}\"\n").expect_err("unset");
        let lines: Vec<Option<usize>> = errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, [Some(1), Some(3)], "{errors:?}");
        assert!(errors[1].message.contains("ALSO_NOPE"), "{}", errors[1]);
    }

    #[test]
    fn escapes_and_redaction() {
        let out = run("a = \"$${PW} costs $5\"\nb = \"${PW}\"\nc = \"${NOPE:-x:y}${HOST:-z}\"\n").expect("expands");
        let parsed: toml::Value = toml::from_str(&out.text).expect("still TOML");
        assert_eq!(parsed["a"].as_str(), Some("${PW} costs $5"));
        assert_eq!(parsed["c"].as_str(), Some("x:y10.0.0.1"));
        assert_eq!(out.redact("bad value \"s3cr\"et\\x\" here"), "bad value \"${PW}\" here");
        // As TOML, JSON and Rust's Debug write it (a parser error quotes the expanded line).
        assert_eq!(out.redact(r#"b = "s3cr\"et\\x""#), r#"b = "${PW}""#);
        assert_eq!(out.redact(&format!("{:?}", "s3cr\"et\\x")), "\"${PW}\"");
    }

    #[test]
    fn invalid_toml_is_left_to_the_parser() {
        let text = "a = \"${NOPE}\"\nb = [\n";
        assert_eq!(run(text).expect("unchanged").text, text);
    }
}
