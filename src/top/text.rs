//! Text from clients and from the admin API, made safe for a terminal and a page: control
//! characters (C0, DEL, C1: ESC starts a terminal escape sequence) and format characters
//! (Unicode Cf: U+202E reverses what follows, U+200B hides itself), plus the line and paragraph
//! separators, are written as `\u{…}`. Pure.

use std::borrow::Cow;

use serde_json::Value;

/// Whether `c` must not reach a terminal or a page as it is.
pub fn is_unsafe(c: char) -> bool {
    c.is_control() || is_format(c) || matches!(c, '\u{2028}' | '\u{2029}')
}

/// Unicode general category Cf (format characters), Unicode 15.1.
fn is_format(c: char) -> bool {
    matches!(
        c as u32,
        0xAD | 0x600..=0x605
            | 0x61C
            | 0x6DD
            | 0x70F
            | 0x890..=0x891
            | 0x8E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

/// `text` with every unsafe character written as `\u{hex}`; borrowed when there is none.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_unsafe(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Every string of `value`, object keys included, through [`escape`].
pub fn escape_json(value: &mut Value) {
    match value {
        Value::String(s) => {
            if let Cow::Owned(safe) = escape(s) {
                *s = safe;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(escape_json),
        Value::Object(fields) => {
            if fields.keys().any(|k| k.chars().any(is_unsafe)) {
                let old = std::mem::take(fields);
                for (k, v) in old {
                    fields.insert(escape(&k).into_owned(), v);
                }
            }
            fields.values_mut().for_each(escape_json);
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_format_characters_are_escaped() {
        assert_eq!(escape("203.0.113.7"), "203.0.113.7");
        assert!(matches!(escape("plain ünïcode ✓"), Cow::Borrowed(_)));
        assert_eq!(escape("a\u{1b}[2Jb\n"), "a\\u{1b}[2Jb\\u{a}");
        assert_eq!(escape("evil\u{202e}gpj.exe"), "evil\\u{202e}gpj.exe");
        assert_eq!(
            escape("\u{9b}31m\u{7f}\u{200b}\u{2066}\u{feff}\u{2028}"),
            "\\u{9b}31m\\u{7f}\\u{200b}\\u{2066}\\u{feff}\\u{2028}"
        );
        assert_eq!(escape("\u{e0041}tag"), "\\u{e0041}tag");
    }

    #[test]
    fn every_string_of_a_document_is_escaped() {
        let mut v = serde_json::json!({"zone\u{1b}": ["k\u{202e}", {"instance": "h\u{85}"}], "n": 1});
        escape_json(&mut v);
        assert_eq!(v, serde_json::json!({"zone\\u{1b}": ["k\\u{202e}", {"instance": "h\\u{85}"}], "n": 1}));
    }
}
