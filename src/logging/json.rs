//! A JSON object written by hand into a byte buffer: keys in the order they are added, strings
//! escaped as serde_json escapes them, numbers by `itoa` and `zmij` (serde_json's own float
//! formatter, so a float reads the same as in the lines `tracing`'s JSON formatter writes).
//! Nothing is allocated but the buffer's growth.

use std::fmt::{self, Write as _};
use std::net::{IpAddr, SocketAddr};

use crate::request::ip_text::IpText;

/// An object being written into `buf`: `{` on creation, `}` and a newline at [`JsonObject::end`].
pub struct JsonObject<'b> {
    buf: &'b mut Vec<u8>,
    empty: bool,
}

impl<'b> JsonObject<'b> {
    pub fn new(buf: &'b mut Vec<u8>) -> Self {
        buf.push(b'{');
        JsonObject { buf, empty: true }
    }

    /// `"name":`. Names are Weir's own constants, never escaped (`debug_assert`ed).
    fn key(&mut self, name: &str) {
        debug_assert!(name.bytes().all(|b| ESCAPE[usize::from(b)] == 0), "key {name:?} needs escaping");
        if !self.empty {
            self.buf.push(b',');
        }
        self.empty = false;
        self.buf.push(b'"');
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.extend_from_slice(b"\":");
    }

    pub fn str(&mut self, name: &str, value: &str) {
        self.string_with(name, |s| s.push_str(value));
    }

    /// A string value written in pieces by `write` (each piece escaped), e.g. a list joined
    /// without building it first.
    pub fn string_with(&mut self, name: &str, write: impl FnOnce(&mut JsonStr<'_>)) {
        self.key(name);
        self.buf.push(b'"');
        write(&mut JsonStr { buf: self.buf });
        self.buf.push(b'"');
    }

    /// A value's `Display` text as a string (for values rarely logged, e.g. errors).
    pub fn display(&mut self, name: &str, value: &dyn fmt::Display) {
        self.string_with(name, |s| {
            // JsonStr's fmt::Write never fails; a Display impl that does leaves what it wrote.
            let _ = fmt::Write::write_fmt(s, format_args!("{value}"));
        });
    }

    pub fn u64(&mut self, name: &str, value: u64) {
        self.key(name);
        self.buf.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }

    pub fn bool(&mut self, name: &str, value: bool) {
        self.key(name);
        self.buf.extend_from_slice(if value { b"true" } else { b"false" });
    }

    /// Shortest text that reads back as the same f64; `null` for NaN and infinities, as serde_json.
    pub fn f64(&mut self, name: &str, value: f64) {
        self.key(name);
        if value.is_finite() {
            self.buf.extend_from_slice(zmij::Buffer::new().format_finite(value).as_bytes());
        } else {
            self.buf.extend_from_slice(b"null");
        }
    }

    /// Closes the object and the line.
    pub fn end(self) {
        self.buf.extend_from_slice(b"}\n");
    }
}

/// The inside of a JSON string being written: everything pushed is escaped.
pub struct JsonStr<'b> {
    buf: &'b mut Vec<u8>,
}

impl JsonStr<'_> {
    pub fn push_str(&mut self, s: &str) {
        escape_into(self.buf, s.as_bytes());
    }

    /// Bytes that should be UTF-8 but may not be (a client's): invalid sequences become U+FFFD.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        for chunk in bytes.utf8_chunks() {
            escape_into(self.buf, chunk.valid().as_bytes());
            if !chunk.invalid().is_empty() {
                self.buf.extend_from_slice("\u{FFFD}".as_bytes());
            }
        }
    }

    pub fn push_u64(&mut self, n: u64) {
        self.buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    }

    /// The address as its `Display` writes it; IPv4 (the common case) without `fmt`.
    pub fn push_ip(&mut self, ip: IpAddr) {
        self.push_str(IpText::new(ip).as_str());
    }

    /// `ip:port` (`[ip]:port` for IPv6), as `SocketAddr`'s `Display` writes it.
    pub fn push_socket_addr(&mut self, addr: SocketAddr) {
        match addr {
            SocketAddr::V4(v4) => {
                self.push_ip(IpAddr::V4(*v4.ip()));
                self.buf.push(b':');
                self.push_u64(u64::from(v4.port()));
            }
            SocketAddr::V6(v6) => {
                let _ = write!(self, "{v6}");
            }
        }
    }
}

impl fmt::Write for JsonStr<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

/// Per byte: 0 if it stands for itself inside a JSON string, else the letter of its short escape
/// (`\n`), or `u` for `\u00XX`: `"`, `\` and the control characters below U+0020, as serde_json
/// escapes them.
static ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[b'\n' as usize] = b'n';
    table[b'\r' as usize] = b'r';
    table[b'\t' as usize] = b't';
    table[0x08] = b'b';
    table[0x0c] = b'f';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// Appends `text` (UTF-8) escaped for the inside of a JSON string. Runs that need no escape (all
/// of most values) are copied whole.
fn escape_into(buf: &mut Vec<u8>, text: &[u8]) {
    let mut start = 0;
    for (i, &b) in text.iter().enumerate() {
        let escape = ESCAPE[usize::from(b)];
        if escape == 0 {
            continue;
        }
        buf.extend_from_slice(&text[start..i]);
        start = i + 1;
        if escape == b'u' {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            buf.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
        } else {
            buf.extend_from_slice(&[b'\\', escape]);
        }
    }
    buf.extend_from_slice(&text[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn line(write: impl FnOnce(&mut JsonObject<'_>)) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut obj = JsonObject::new(&mut buf);
        write(&mut obj);
        obj.end();
        buf
    }

    #[test]
    fn strings_are_escaped_like_serde_json() {
        let every_ascii: String = (0u8..0x80).map(char::from).collect();
        for text in [every_ascii.as_str(), "plain", "", "q\"b\\s/é\u{2028}😀", "\u{7f}\u{0}"] {
            let out = line(|o| o.str("s", text));
            let expected = format!("{{\"s\":{}}}\n", serde_json::to_string(text).unwrap());
            assert_eq!(String::from_utf8(out).unwrap(), expected);
        }
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters_and_the_line_stays_json() {
        let hostile = b"/a\"b\\c\x01\x1f\xff\xfe\xc3(\xe2\x82/\"}\n{";
        let out = line(|o| o.string_with("path", |s| s.push_bytes(hostile)));
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1, "one line: {out:?}");
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["path"], String::from_utf8_lossy(hostile).as_ref());
    }

    #[test]
    fn numbers_read_back_as_written() {
        let floats = [0.0, -1.0, 0.050535000000000004, 1e-7, 123456.789, f64::MAX, 5e-324];
        for f in floats {
            let out = line(|o| o.f64("f", f));
            let expected = format!("{{\"f\":{}}}\n", serde_json::to_string(&f).unwrap());
            assert_eq!(String::from_utf8(out).unwrap(), expected);
        }
        let out = line(|o| {
            o.f64("nan", f64::NAN);
            o.u64("max", u64::MAX);
            o.u64("zero", 0);
        });
        assert_eq!(out, b"{\"nan\":null,\"max\":18446744073709551615,\"zero\":0}\n");
    }

    #[test]
    fn addresses_read_as_their_display() {
        let ips = ["0.0.0.0", "203.0.113.7", "255.255.255.255", "::1", "2001:db8::7", "::ffff:10.0.0.1"];
        let sockets = ["127.0.0.1:9000", "10.0.0.1:0", "[::1]:443", "[fe80::1%2]:80"];
        let out = line(|o| {
            for ip in ips {
                o.string_with(ip, |s| s.push_ip(ip.parse().unwrap()));
            }
            for addr in sockets {
                o.string_with(addr, |s| s.push_socket_addr(addr.parse().unwrap()));
            }
        });
        let v: Value = serde_json::from_slice(&out).unwrap();
        for ip in ips {
            assert_eq!(v[ip], ip.parse::<IpAddr>().unwrap().to_string());
        }
        for addr in sockets {
            assert_eq!(v[addr], addr.parse::<SocketAddr>().unwrap().to_string());
        }
    }

    #[test]
    fn display_values_and_pieces_are_escaped() {
        let out = line(|o| {
            o.display("error", &"upstream said \"no\"\n");
            o.string_with("zones", |s| {
                s.push_str("a\"=PASSED");
                s.push_str(",");
                s.push_u64(7);
            });
        });
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["error"], "upstream said \"no\"\n");
        assert_eq!(v["zones"], "a\"=PASSED,7");
    }
}
