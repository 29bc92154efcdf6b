//! nginx's config grammar (`ngx_conf_read_token`): words separated by blanks, `;` ends a
//! directive, `{ … }` a block, `#` a comment at the start of a word, `"…"`/`'…'` quoted with `\`
//! escapes, `${name}` a variable inside a word. Every directive keeps its file:line. The bodies
//! of `*_by_lua_block` directives are Lua, not nginx: they are skipped whole (and refused later).

use std::fmt;
use std::rc::Rc;

/// Where a directive starts: `file:line`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    pub file: Rc<str>,
    pub line: usize,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// One directive: `name args… ;` or `name args… { block }`.
#[derive(Debug, Clone)]
pub struct Directive {
    pub name: String,
    pub args: Vec<String>,
    pub at: At,
    /// `Some` for a block directive; a Lua block's body is skipped (empty here).
    pub block: Option<Vec<Directive>>,
}

impl Directive {
    /// The first argument, or "" (nginx has already refused a wrong argument count).
    pub fn arg(&self, i: usize) -> &str {
        self.args.get(i).map_or("", String::as_str)
    }
}

#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    Semicolon,
    Open,
    Close,
}

struct Lexer<'a> {
    src: &'a [u8],
    pos: usize,
    line: usize,
    file: Rc<str>,
    /// The line of the last word read.
    word_line: usize,
}

/// Parses one file's text into its directives (includes are left as `include` directives).
pub fn parse(file: &str, text: &str) -> Result<Vec<Directive>, String> {
    refuse_templates(file, text)?;
    let mut lx = Lexer { src: text.as_bytes(), pos: 0, line: 1, file: Rc::from(file), word_line: 1 };
    let list = lx.block(false)?;
    Ok(list)
}

/// Template syntax (Helm/Go `{{`, envsubst `${UPPER}`) is not nginx: the file was meant to be
/// rendered first. nginx's own `${name}` variables are lower case by convention and pass.
fn refuse_templates(file: &str, text: &str) -> Result<(), String> {
    for (n, line) in text.lines().enumerate() {
        let code = strip_comment(line);
        let env_var = code.match_indices("${").any(|(i, _)| {
            code[i + 2..].chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && code[i + 2..]
                    .chars()
                    .take_while(|c| *c != '}')
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        });
        if code.contains("{{") || code.contains("{%") || env_var {
            return Err(format!(
                "{file}:{}: template syntax ({}): this file is rendered before nginx reads it; run `nginx -T` \
                 on the rendered config and import its output",
                n + 1,
                code.trim()
            ));
        }
    }
    Ok(())
}

/// A line without its `#` comment (a `#` at the start of a word, outside quotes).
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    let mut prev_blank = true;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '"' | '\'') if prev_blank => quote = Some(c),
            (None, '#') if prev_blank => return &line[..i],
            _ => {}
        }
        prev_blank = c.is_whitespace() || c == ';' || c == '{' || c == '}';
    }
    line
}

impl Lexer<'_> {
    fn err(&self, msg: &str) -> String {
        format!("{}:{}: {msg}", self.file, self.line)
    }

    /// Directives until `}` (`inner`) or the end of the file.
    fn block(&mut self, inner: bool) -> Result<Vec<Directive>, String> {
        let mut out = Vec::new();
        loop {
            let Some(tok) = self.token()? else {
                if inner {
                    return Err(self.err("unexpected end of file, expecting \"}\""));
                }
                return Ok(out);
            };
            let name = match tok {
                Token::Close if inner => return Ok(out),
                Token::Close => return Err(self.err("unexpected \"}\"")),
                Token::Semicolon => return Err(self.err("unexpected \";\"")),
                Token::Open => return Err(self.err("unexpected \"{\"")),
                Token::Word(w) => w,
            };
            let at = At { file: self.file.clone(), line: self.word_line };
            let mut args = Vec::new();
            loop {
                match self.token()? {
                    Some(Token::Word(w)) => args.push(w),
                    Some(Token::Semicolon) => {
                        out.push(Directive { name, args, at, block: None });
                        break;
                    }
                    Some(Token::Open) => {
                        let block = if name.ends_with("_by_lua_block") {
                            self.skip_raw_block()?;
                            Vec::new()
                        } else {
                            self.block(true)?
                        };
                        out.push(Directive { name, args, at, block: Some(block) });
                        break;
                    }
                    Some(Token::Close) => return Err(self.err("unexpected \"}\"")),
                    None => return Err(self.err("unexpected end of file, expecting \";\" or \"}\"")),
                }
            }
        }
    }

    /// Skips a Lua body up to its matching `}` (braces in Lua strings are rare enough in
    /// rate-limit configs; such a file is refused anyway).
    fn skip_raw_block(&mut self) -> Result<(), String> {
        let mut depth = 1usize;
        while let Some(&b) = self.src.get(self.pos) {
            self.pos += 1;
            match b {
                b'\n' => self.line += 1,
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Err(self.err("unexpected end of file in a Lua block"))
    }

    fn token(&mut self) -> Result<Option<Token>, String> {
        // Blanks and comments.
        loop {
            match self.src.get(self.pos) {
                None => return Ok(None),
                Some(b'\n') => {
                    self.line += 1;
                    self.pos += 1;
                }
                Some(b' ' | b'\t' | b'\r') => self.pos += 1,
                Some(b'#') => {
                    while self.src.get(self.pos).is_some_and(|b| *b != b'\n') {
                        self.pos += 1;
                    }
                }
                Some(_) => break,
            }
        }
        self.word_line = self.line;
        let b = self.src[self.pos];
        match b {
            b';' => {
                self.pos += 1;
                return Ok(Some(Token::Semicolon));
            }
            b'{' => {
                self.pos += 1;
                return Ok(Some(Token::Open));
            }
            b'}' => {
                self.pos += 1;
                return Ok(Some(Token::Close));
            }
            b'"' | b'\'' => {
                self.pos += 1;
                let mut word = Vec::new();
                loop {
                    let Some(&c) = self.src.get(self.pos) else {
                        return Err(self.err("unexpected end of file in a quoted string"));
                    };
                    self.pos += 1;
                    match c {
                        c if c == b => break,
                        b'\\' => {
                            if let Some(&n) = self.src.get(self.pos) {
                                self.pos += 1;
                                // nginx keeps the backslash except before the quote, `\` and t/r/n.
                                match n {
                                    b'"' | b'\'' | b'\\' => word.push(n),
                                    b't' => word.push(b'\t'),
                                    b'r' => word.push(b'\r'),
                                    b'n' => word.push(b'\n'),
                                    _ => {
                                        word.push(b'\\');
                                        word.push(n);
                                    }
                                }
                                if n == b'\n' {
                                    self.line += 1;
                                }
                            }
                        }
                        b'\n' => {
                            self.line += 1;
                            word.push(c);
                        }
                        c => word.push(c),
                    }
                }
                // A quoted word must be followed by a blank, `;`, `{` or `}` (nginx: "unexpected").
                if let Some(&n) = self.src.get(self.pos) {
                    if !matches!(n, b' ' | b'\t' | b'\r' | b'\n' | b';' | b'{' | b'}') {
                        return Err(self.err(&format!("unexpected \"{}\" after a quoted string", n as char)));
                    }
                }
                return Ok(Some(Token::Word(String::from_utf8_lossy(&word).into_owned())));
            }
            _ => {}
        }
        let mut word = Vec::new();
        let mut in_var_brace = false;
        while let Some(&c) = self.src.get(self.pos) {
            match c {
                b' ' | b'\t' | b'\r' | b'\n' | b';' => break,
                b'{' if word.last() == Some(&b'$') => in_var_brace = true,
                b'}' if in_var_brace => in_var_brace = false,
                b'{' | b'}' => break,
                b'\\' => {
                    self.pos += 1;
                    if let Some(&n) = self.src.get(self.pos) {
                        word.push(b'\\');
                        word.push(n);
                        self.pos += 1;
                    }
                    continue;
                }
                _ => {}
            }
            word.push(c);
            self.pos += 1;
        }
        Ok(Some(Token::Word(String::from_utf8_lossy(&word).into_owned())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_blocks_quotes_comments_and_lines() {
        let text = "user nginx; # who\nhttp {\n  limit_req_zone $binary_remote_addr zone=one:10m rate=1r/s;\n\n  server {\n    location ~ \"^/a b{2}$\" { proxy_pass http://x; }\n    set $v \"${host}x\";\n  }\n}\n";
        let d = parse("n.conf", text).unwrap();
        assert_eq!(d[0].name, "user");
        assert_eq!(d[0].at.line, 1);
        let http = d[1].block.as_ref().unwrap();
        assert_eq!(http[0].args, ["$binary_remote_addr", "zone=one:10m", "rate=1r/s"]);
        assert_eq!(http[0].at.to_string(), "n.conf:3");
        let server = http[1].block.as_ref().unwrap();
        assert_eq!(http[1].at.line, 5);
        assert_eq!(server[0].args, ["~", "^/a b{2}$"]);
        assert_eq!(server[0].at.line, 6);
        assert_eq!(server[0].block.as_ref().unwrap()[0].args, ["http://x"]);
        assert_eq!(server[1].args, ["$v", "${host}x"]);
    }

    #[test]
    fn lua_blocks_are_skipped_whole() {
        let d = parse(
            "l.conf",
            "location / {\n access_by_lua_block {\n if x then y() end local t = {}\n }\n proxy_pass http://a;\n}\n",
        )
        .unwrap();
        let loc = d[0].block.as_ref().unwrap();
        assert_eq!(loc[0].name, "access_by_lua_block");
        assert_eq!(loc[1].name, "proxy_pass");
        assert_eq!(loc[1].at.line, 5);
    }

    #[test]
    fn broken_files_and_templates_are_refused_with_their_line() {
        assert!(parse("b.conf", "http {\n server {\n").unwrap_err().starts_with("b.conf:3: unexpected end of file"));
        assert!(parse("b.conf", "a b;\n}\n").unwrap_err().starts_with("b.conf:2: unexpected \"}\""));
        let e = parse("t.conf", "server {\n listen {{ .Values.port }};\n}\n").unwrap_err();
        assert!(e.starts_with("t.conf:2: template syntax") && e.contains("nginx -T"), "{e}");
        let e = parse("t.conf", "# ${PORT} in a comment is fine\nlisten ${PORT};\n").unwrap_err();
        assert!(e.starts_with("t.conf:2:"), "{e}");
        assert!(parse("t.conf", "set $a \"${host}\";\n").is_ok());
    }
}
