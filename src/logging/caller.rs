//! Strings a caller chose (a rate limit service's domain, descriptor keys and values), made safe
//! for a log line in every format: cut to a bounded length, and every control, format or
//! bidirectional character (C0, DEL, C1, Unicode Cf such as U+202E) written as `\u{…}`, so that
//! no caller can break a line, forge one, or reorder what an operator's terminal shows.

use std::borrow::Cow;
use std::fmt::Write;

/// Bytes of a caller's string a log line keeps (then `…`).
pub const MAX_LOGGED_BYTES: usize = 256;

/// `text` as a log line may carry it.
pub fn caller_text(text: &str) -> Cow<'_, str> {
    let mut cut = text.len().min(MAX_LOGGED_BYTES);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let kept = &text[..cut];
    if cut == text.len() && !kept.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(kept.len() + 8);
    for c in kept.chars() {
        if needs_escape(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    if cut < text.len() {
        out.push('…');
    }
    Cow::Owned(out)
}

/// Controls (C0, DEL, C1), the backslash (so an escape cannot be forged), and the format
/// characters of Unicode category Cf that change how text is shown: bidirectional marks,
/// embeddings, overrides and isolates, zero-width characters, the BOM, tags.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || c == '\\'
        || matches!(c,
            '\u{ad}' | '\u{600}'..='\u{605}' | '\u{61c}' | '\u{6dd}' | '\u{70f}' | '\u{180e}'
            | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}'
            | '\u{110bd}' | '\u{1d173}'..='\u{1d17a}' | '\u{e0001}' | '\u{e0020}'..='\u{e007f}')
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
