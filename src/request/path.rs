//! The path routes are matched on, and that is forwarded: one canonical spelling per resource, so
//! `//login`, `/%6cogin`, `/./login` and `/x/../login` all count as `/login`, as nginx and the
//! upstream frameworks behind it read them.
//!
//! Rules, in order (RFC 3986 §6.2.2 plus nginx's `merge_slashes`):
//! 1. percent-escapes of unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded; other escapes
//!    are kept, with upper-case hex;
//! 2. an escaped NUL is refused, and so is an escaped `/` or `\` unless configured otherwise,
//!    because upstreams disagree on whether it separates segments;
//! 3. runs of `/` are merged;
//! 4. `.` and `..` segments are resolved; a `..` above the root is refused;
//! 5. bytes that may not stand raw in a path (RFC 3986 `pchar`: non-ASCII, `"`, `<`, `{`, …) are
//!    percent-encoded, so `/café` and `/caf%C3%A9` are one path; a raw `\` is read as `%5C`
//!    (Node's `new URL()` turns it into `/`, other upstreams keep it), under rule 2.

use std::borrow::Cow;

/// What to do with `%2F` (and `%5C`) in a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EncodedSlash {
    /// 400: the safe default, since some upstreams decode it into a separator and some do not.
    #[default]
    Reject,
    /// Keep it escaped: matched and forwarded as `%2F`, for APIs that put slashes in a segment.
    Keep,
    /// Decode it into a separator before matching (what nginx does).
    Decode,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path must start with '/'")]
    NotAbsolute,
    #[error("the path contains an encoded NUL (%00)")]
    EncodedNul,
    #[error("the path contains an encoded slash (%2F or %5C)")]
    EncodedSlash,
    #[error("the path contains a malformed percent-escape")]
    BadEscape,
    #[error("the path climbs above the root with '..'")]
    AboveRoot,
    #[error("the path contains a backslash, which some upstreams read as '/'")]
    Backslash,
}

/// The canonical form of `path` (without query). Borrowed when it already is canonical, which is
/// the common case and costs one scan.
pub fn normalize(path: &str, slashes: EncodedSlash) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        // `*` (OPTIONS) and absolute-form targets never reach here with a path of another shape.
        return Err(PathError::NotAbsolute);
    }
    if is_canonical(path) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode_unreserved(path, slashes)?;
    resolve_segments(&decoded).map(Cow::Owned)
}

fn is_canonical(path: &str) -> bool {
    let bytes = path.as_bytes();
    bytes.iter().all(|&b| may_stand_raw(b))
        && !path.contains("//")
        && !bytes.split(|&b| b == b'/').any(|segment| segment == b"." || segment == b"..")
}

fn decode_unreserved(path: &str, slashes: EncodedSlash) -> Result<String, PathError> {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            match slashes {
                EncodedSlash::Reject => return Err(PathError::Backslash),
                EncodedSlash::Keep | EncodedSlash::Decode => out.push_str("%5C"),
            }
            i += 1;
            continue;
        }
        if bytes[i] != b'%' {
            if !may_stand_raw(bytes[i]) {
                push_escape(&mut out, bytes[i]);
                i += 1;
                continue;
            }
            // Raw-safe bytes are ASCII, so copying a run of them keeps `out` UTF-8.
            let next = bytes[i..].iter().position(|&b| b == b'%' || !may_stand_raw(b)).map_or(bytes.len(), |p| i + p);
            out.push_str(&path[i..next]);
            i = next;
            continue;
        }
        let hex = bytes.get(i + 1..i + 3).ok_or(PathError::BadEscape)?;
        let value =
            (hex_digit(hex[0]).ok_or(PathError::BadEscape)? << 4) | hex_digit(hex[1]).ok_or(PathError::BadEscape)?;
        match value {
            0 => return Err(PathError::EncodedNul),
            b'/' | b'\\' => match slashes {
                EncodedSlash::Reject => return Err(PathError::EncodedSlash),
                EncodedSlash::Decode if value == b'/' => out.push('/'),
                _ => out.push_str(if value == b'/' { "%2F" } else { "%5C" }),
            },
            v if v.is_ascii_alphanumeric() || matches!(v, b'-' | b'.' | b'_' | b'~') => out.push(v as char),
            v => push_escape(&mut out, v),
        }
        i += 3;
    }
    Ok(out)
}

/// RFC 3986 `pchar` less `%`, plus `/`: what stands raw in a canonical path.
fn may_stand_raw(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&b)
}

fn push_escape(out: &mut String, v: u8) {
    out.push('%');
    out.push(char::from(b"0123456789ABCDEF"[usize::from(v >> 4)]));
    out.push(char::from(b"0123456789ABCDEF"[usize::from(v & 15)]));
}

fn hex_digit(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Merges slashes and resolves dot segments; a trailing `/`, `/.` or `/..` leaves a trailing `/`.
fn resolve_segments(path: &str) -> Result<String, PathError> {
    let mut kept: Vec<&str> = Vec::new();
    let mut trailing_slash = false;
    for segment in path.split('/').skip(1) {
        trailing_slash = true;
        match segment {
            "" | "." => {}
            ".." => {
                kept.pop().ok_or(PathError::AboveRoot)?;
            }
            s => {
                kept.push(s);
                trailing_slash = false;
            }
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &kept {
        out.push('/');
        out.push_str(segment);
    }
    if trailing_slash || out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(path: &str) -> Result<String, PathError> {
        normalize(path, EncodedSlash::Reject).map(Cow::into_owned)
    }

    #[test]
    fn every_spelling_of_login_is_login() {
        for p in [
            "/login",
            "//login",
            "/%6cogin",
            "/%6C%6F%67%69%6E",
            "/./login",
            "/x/../login",
            "///x//..//login",
            "/login/.",
        ] {
            let want = if p.ends_with('.') { "/login/" } else { "/login" };
            assert_eq!(norm(p).as_deref(), Ok(want), "{p}");
        }
    }

    #[test]
    fn canonical_paths_are_borrowed() {
        assert!(matches!(normalize("/api/v1/users", EncodedSlash::Reject), Ok(Cow::Borrowed(_))));
        assert!(matches!(normalize("/", EncodedSlash::Reject), Ok(Cow::Borrowed(_))));
    }

    #[test]
    fn dot_segments_and_trailing_slashes() {
        assert_eq!(norm("/a/b/../c/./d").as_deref(), Ok("/a/c/d"));
        assert_eq!(norm("/a/b/..").as_deref(), Ok("/a/"));
        assert_eq!(norm("/a/").as_deref(), Ok("/a/"));
        assert_eq!(norm("/..a/.b").as_deref(), Ok("/..a/.b"), "dots inside names are names");
        assert_eq!(norm("/%2e%2e/x"), Err(PathError::AboveRoot), "encoded dots are dots");
        assert_eq!(norm("/a/%2E%2E/b").as_deref(), Ok("/b"));
        assert_eq!(norm("/.."), Err(PathError::AboveRoot));
        assert_eq!(norm("/a/../.."), Err(PathError::AboveRoot));
    }

    #[test]
    fn reserved_escapes_stay_escaped_with_upper_case_hex() {
        assert_eq!(norm("/a%3fb").as_deref(), Ok("/a%3Fb"));
        assert_eq!(norm("/caf%c3%a9").as_deref(), Ok("/caf%C3%A9"));
        assert_eq!(norm("/a%20b").as_deref(), Ok("/a%20b"));
    }

    #[test]
    fn raw_bytes_that_cannot_stand_in_a_path_are_escaped() {
        assert_eq!(norm("/café").as_deref(), Ok("/caf%C3%A9"));
        assert_eq!(norm("/a\"b<c>{d}").as_deref(), Ok("/a%22b%3Cc%3E%7Bd%7D"));
        assert_eq!(norm("/a:b@c!$&'()*+,;=").as_deref(), Ok("/a:b@c!$&'()*+,;="));
        assert!(matches!(normalize("/a:b@c", EncodedSlash::Reject), Ok(Cow::Borrowed(_))));
        assert_eq!(norm("/x\\..\\login"), Err(PathError::Backslash));
        assert_eq!(normalize("/x\\..\\login", EncodedSlash::Keep).as_deref(), Ok("/x%5C..%5Clogin"));
        assert_eq!(normalize("/a\\b", EncodedSlash::Decode).as_deref(), Ok("/a%5Cb"));
    }

    #[test]
    fn unsafe_paths_are_refused() {
        assert_eq!(norm("/a%00b"), Err(PathError::EncodedNul));
        assert_eq!(norm("/a%2Fb"), Err(PathError::EncodedSlash));
        assert_eq!(norm("/a%5cb"), Err(PathError::EncodedSlash));
        assert_eq!(norm("/a%zz"), Err(PathError::BadEscape));
        assert_eq!(norm("/a%4"), Err(PathError::BadEscape));
        assert_eq!(norm("*"), Err(PathError::NotAbsolute));
    }

    #[test]
    fn encoded_slashes_when_allowed() {
        assert_eq!(normalize("/p/a%2fb", EncodedSlash::Keep).as_deref(), Ok("/p/a%2Fb"));
        assert_eq!(normalize("/p/a%2fb/../c", EncodedSlash::Keep).as_deref(), Ok("/p/c"));
        assert_eq!(normalize("/p/a%2fb", EncodedSlash::Decode).as_deref(), Ok("/p/a/b"));
        assert_eq!(normalize("/%2F%2Flogin", EncodedSlash::Decode).as_deref(), Ok("/login"));
        assert_eq!(normalize("/a%00", EncodedSlash::Decode), Err(PathError::EncodedNul));
    }
}
