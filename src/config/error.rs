//! Config errors that point at the place to fix: `file:line: what is wrong`.

use std::fmt;
use std::ops::Range;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    /// 1-based line of the offending value, when known.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file, line, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The most errors one report names (`weir check`, a refused reload): the rest are counted, so
/// a file of a hundred thousand bad zones cannot flood a terminal or a log line.
pub const MAX_REPORTED: usize = 50;

/// `errors` as a report shows them, one string each: the first [`MAX_REPORTED`], then
/// "and N more errors".
pub fn shown(errors: &[ConfigError]) -> Vec<String> {
    let mut out: Vec<String> = errors.iter().take(MAX_REPORTED).map(ToString::to_string).collect();
    if errors.len() > MAX_REPORTED {
        out.push(format!("and {} more errors", errors.len() - MAX_REPORTED));
    }
    out
}

/// [`shown`] on one line (a log line, the admin API's answer), `; ` between errors: a single
/// error reads as it always did.
pub fn one_line(errors: &[ConfigError]) -> String {
    shown(errors).join("; ")
}

/// The text being compiled, and what it may ask of the world (files, environment, DNS, clock).
/// Turns byte spans of the text into line numbers for error messages.
pub struct Source<'a> {
    pub file: &'a str,
    pub text: &'a str,
    pub outside: &'a dyn super::Outside,
}

impl Source<'_> {
    pub fn line_of(&self, span: &Range<usize>) -> usize {
        let end = span.start.min(self.text.len());
        self.text.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count() + 1
    }

    pub fn error_at(&self, span: &Range<usize>, message: impl Into<String>) -> ConfigError {
        ConfigError { file: self.file.to_string(), line: Some(self.line_of(span)), message: message.into() }
    }

    pub fn error(&self, message: impl Into<String>) -> ConfigError {
        ConfigError { file: self.file.to_string(), line: None, message: message.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(line: usize) -> ConfigError {
        ConfigError { file: "t.toml".into(), line: Some(line), message: format!("bad {line}") }
    }

    #[test]
    fn a_report_names_the_first_fifty_and_counts_the_rest() {
        let errors: Vec<ConfigError> = (1..=MAX_REPORTED + 7).map(error).collect();
        let shown = shown(&errors);
        assert_eq!(shown.len(), MAX_REPORTED + 1);
        assert_eq!(shown[0], "t.toml:1: bad 1");
        assert_eq!(shown[MAX_REPORTED - 1], format!("t.toml:{MAX_REPORTED}: bad {MAX_REPORTED}"));
        assert_eq!(shown[MAX_REPORTED], "and 7 more errors");
    }

    #[test]
    fn one_line_reads_like_one_error_when_there_is_one() {
        assert_eq!(one_line(&[error(3)]), "t.toml:3: bad 3");
        assert_eq!(one_line(&[error(3), error(8)]), "t.toml:3: bad 3; t.toml:8: bad 8");
        let many: Vec<ConfigError> = (1..=MAX_REPORTED + 1).map(error).collect();
        assert!(one_line(&many).ends_with(&format!("t.toml:{MAX_REPORTED}: bad {MAX_REPORTED}; and 1 more errors")));
    }
}
