//! Text a client or caller chose, made safe for a terminal, a page or a log line: control
//! characters (C0, DEL, C1: ESC starts a terminal escape sequence) and format characters
//! (Unicode Cf: U+202E reverses what follows, U+200B hides itself), plus the line and paragraph
//! separators, are written as `\u{…}`. Pure; the live view (`top::text`) and the logs
//! (`logging::caller`) use it.

use std::borrow::Cow;
use std::fmt::Write;

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
    escape_where(text, is_unsafe)
}

/// `text` with every character `unsafe_char` names written as `\u{hex}`; borrowed when none is.
pub fn escape_where(text: &str, unsafe_char: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(&unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
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
}
