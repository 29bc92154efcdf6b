//! Strings a caller chose (a rate limit service's domain, descriptor keys and values), made safe
//! for a log line in every format: cut to a bounded length, and every control, format or
//! bidirectional character (C0, DEL, C1, Unicode Cf such as U+202E) written as `\u{…}`, so that
//! no caller can break a line, forge one, or reorder what an operator's terminal shows.

use std::borrow::Cow;

/// Bytes of a caller's string a log line keeps (then `…`).
pub const MAX_LOGGED_BYTES: usize = 256;

/// `text` as a log line may carry it.
pub fn caller_text(text: &str) -> Cow<'_, str> {
    let mut cut = text.len().min(MAX_LOGGED_BYTES);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let escaped = crate::safe_text::escape_where(&text[..cut], needs_escape);
    if cut == text.len() {
        return escaped;
    }
    let mut out = escaped.into_owned();
    out.push('…');
    Cow::Owned(out)
}

/// What [`crate::safe_text`] escapes, and the backslash, so that an escape cannot be forged in a
/// line read back.
pub fn needs_escape(c: char) -> bool {
    c == '\\' || crate::safe_text::is_unsafe(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_are_escaped_and_long_text_is_cut() {
        assert!(matches!(caller_text("api.example"), Cow::Borrowed(_)));
        assert_eq!(caller_text("a\nINFO forged"), "a\\u{a}INFO forged");
        assert_eq!(caller_text("x\u{202e}gnp.exe"), "x\\u{202e}gnp.exe");
        assert_eq!(caller_text("\u{1b}[31mred"), "\\u{1b}[31mred");
        assert_eq!(caller_text("a\\u{a}"), "a\\u{5c}u{a}", "an escape cannot be forged");
        let long = "é".repeat(200);
        let cut = caller_text(&long);
        assert!(cut.len() <= MAX_LOGGED_BYTES + '…'.len_utf8() && cut.ends_with('…'), "{}", cut.len());
    }
}
