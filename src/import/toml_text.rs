//! Writing TOML values by hand: the importers print commented TOML, which a serializer cannot.

/// A TOML basic string, quoted and escaped.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `["a", "b"]`.
pub fn list<S: AsRef<str>>(items: &[S]) -> String {
    let parts: Vec<String> = items.iter().map(|s| quote(s.as_ref())).collect();
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_and_escapes() {
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(list(&["x", "y"]), r#"["x", "y"]"#);
        let parsed: toml::Value = toml::from_str(&format!("v = {}", quote("\u{1}\n\"é"))).unwrap();
        assert_eq!(parsed["v"].as_str(), Some("\u{1}\n\"é"));
    }
}
