//! A cursor over the space-separated, quoted and bracketed fields of an nginx log line.

pub struct Cursor<'a> {
    line: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(line: &'a [u8]) -> Self {
        Self { line, pos: 0 }
    }

    fn skip_spaces(&mut self) {
        while self.line.get(self.pos) == Some(&b' ') {
            self.pos += 1;
        }
    }

    pub fn at_end(&mut self) -> bool {
        self.skip_spaces();
        self.pos >= self.line.len()
    }

    /// The next character, after spaces.
    pub fn peek(&mut self) -> Option<u8> {
        self.skip_spaces();
        self.line.get(self.pos).copied()
    }

    /// A bare field up to the next space.
    pub fn word(&mut self, what: &str) -> Result<&'a [u8], String> {
        self.skip_spaces();
        let start = self.pos;
        while self.pos < self.line.len() && self.line[self.pos] != b' ' {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(format!("missing {what}"));
        }
        Ok(&self.line[start..self.pos])
    }

    /// A field between `open` and `close`; a backslash escapes the next byte (nginx itself writes
    /// `"` as `\x22`, other loggers as `\"`).
    fn delimited(&mut self, open: u8, close: u8, what: &str) -> Result<&'a [u8], String> {
        self.skip_spaces();
        if self.line.get(self.pos) != Some(&open) {
            return Err(format!("expected {what} starting with {}", open as char));
        }
        let start = self.pos + 1;
        let mut i = start;
        while i < self.line.len() {
            match self.line[i] {
                b'\\' => i += 2,
                c if c == close => {
                    self.pos = i + 1;
                    return Ok(&self.line[start..i]);
                }
                _ => i += 1,
            }
        }
        Err(format!("{what} has no closing {}", close as char))
    }

    pub fn quoted(&mut self, what: &str) -> Result<&'a [u8], String> {
        self.delimited(b'"', b'"', what)
    }

    pub fn bracketed(&mut self, what: &str) -> Result<&'a [u8], String> {
        self.delimited(b'[', b']', what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_quotes_and_brackets() {
        let mut c = Cursor::new(br#"1.2.3.4  - [t 1] "GET / \"x\"" "" end"#);
        assert_eq!(c.word("a").unwrap(), b"1.2.3.4");
        assert_eq!(c.word("b").unwrap(), b"-");
        assert_eq!(c.bracketed("t").unwrap(), b"t 1");
        assert_eq!(c.quoted("r").unwrap(), br#"GET / \"x\""#);
        assert_eq!(c.quoted("e").unwrap(), b"");
        assert_eq!(c.peek(), Some(b'e'));
        assert_eq!(c.word("w").unwrap(), b"end");
        assert!(c.at_end());
        assert!(c.word("more").is_err());
        assert!(Cursor::new(b"\"open").quoted("q").unwrap_err().contains("no closing"));
    }
}
