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
