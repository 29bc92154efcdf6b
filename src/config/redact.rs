//! How a value may be written, and every form of it hidden: the ground both `${NAME}`
//! interpolation and secrets stand on (each redacts what it put into the config; secrets also
//! encode as interpolation does), kept apart so that neither imports the other.

use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

/// Characters a password must not show raw in a URL's userinfo (RFC 3986 `userinfo`).
pub(super) const USERINFO: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b':')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'@')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// `value` as a TOML basic string spanning `lines` more lines, like the literal it replaces:
/// those lines end in a line-ending backslash, which TOML drops with the newline.
pub(super) fn encode(value: &str, lines: usize) -> String {
    let mut escaped = String::with_capacity(value.len() + 2);
    for c in value.chars() {
        match c {
            '"' => escaped.push_str("\\\""),
            '\\' => escaped.push_str("\\\\"),
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            '\t' => escaped.push_str("\\t"),
            c if c.is_control() => escaped.push_str(&format!("\\u{:04X}", c as u32)),
            c => escaped.push(c),
        }
    }
    if lines == 0 {
        format!("\"{escaped}\"")
    } else {
        format!("\"\"\"{escaped}{}\"\"\"", "\\\n".repeat(lines))
    }
}

/// How a secret may appear in a message: as it is, as a TOML, JSON or Rust string writes it (a
/// parser error quotes the expanded line; `{:?}` escapes quotes and backslashes), and
/// percent-encoded as in a URL's userinfo (`store.password` goes into the Redis URL).
pub(super) fn forms(value: &str) -> Vec<String> {
    let quoted = |s: String| s.get(1..s.len().saturating_sub(1)).unwrap_or_default().to_string();
    let mut forms = vec![
        value.to_string(),
        quoted(encode(value, 0)),
        quoted(serde_json::Value::from(value).to_string()),
        quoted(format!("{value:?}")),
        utf8_percent_encode(value, USERINFO).to_string(),
        utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC).to_string(),
    ];
    forms.sort();
    forms.dedup();
    forms
}

/// `message` with every form of each value shown as its replacement; values shorter than 3
/// bytes are left (they would match everywhere). Longest first, so that a value containing
/// another is replaced whole.
pub(super) fn redact_all<'a>(message: &str, values: impl Iterator<Item = (String, &'a str)>) -> String {
    let mut all: Vec<(String, String)> = values
        .filter(|(_, value)| value.len() >= 3)
        .flat_map(|(replacement, value)| forms(value).into_iter().map(move |form| (form, replacement.clone())))
        .collect();
    all.sort_by_key(|(form, _)| std::cmp::Reverse(form.len()));
    let mut out = message.to_string();
    for (form, replacement) in all {
        out = out.replace(&form, &replacement);
    }
    out
}
