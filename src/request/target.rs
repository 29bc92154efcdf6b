//! The request-target as sent (RFC 9112 §3.2), split the way nginx reads it: origin-form
//! (`/path?query`) or absolute-form (`http://host/path?query`, whose host wins over `Host`).
//! Anything else — `login`, `%2flogin`, an authority alone — has no one reading (Pingora routes
//! it as `/` and forwards it verbatim; Flask serves `login` as `/login`), so it is refused, as
//! nginx refuses it.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    /// The host (and port) of an absolute-form target.
    pub authority: Option<&'a str>,
    /// Starts with `/`.
    pub path: &'a str,
    pub query: Option<&'a str>,
    /// The target is already what Weir forwards: origin-form.
    pub origin_form: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("the request target must start with '/' or be an absolute http(s) URL")]
    NotOriginOrAbsolute,
    #[error("the request target is not valid UTF-8")]
    NotUtf8,
    #[error("an absolute-form target must not carry user information ('@')")]
    UserInfo,
    #[error("an absolute-form target must name a host")]
    NoHost,
}

/// Splits a raw target. The path of `http://host` or `http://host?q` is `/`.
pub fn parse(raw: &[u8]) -> Result<Target<'_>, TargetError> {
    let text = std::str::from_utf8(raw).map_err(|_| TargetError::NotUtf8)?;
    if text.starts_with('/') {
        let (path, query) = split_query(text);
        return Ok(Target { authority: None, path, query, origin_form: true });
    }
    let rest = strip_scheme(text).ok_or(TargetError::NotOriginOrAbsolute)?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path_and_query) = rest.split_at(end);
    if authority.contains('@') {
        return Err(TargetError::UserInfo);
    }
    if authority.is_empty() {
        return Err(TargetError::NoHost);
    }
    let path_and_query = path_and_query.split('#').next().unwrap_or("");
    let (path, query) = split_query(path_and_query);
    Ok(Target { authority: Some(authority), path: if path.is_empty() { "/" } else { path }, query, origin_form: false })
}

fn split_query(text: &str) -> (&str, Option<&str>) {
    match text.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (text, None),
    }
}

/// The part after `http://` or `https://` (scheme case-insensitive, RFC 3986 §3.1).
fn strip_scheme(text: &str) -> Option<&str> {
    ["http://", "https://"].iter().find_map(|scheme| {
        let head = text.get(..scheme.len())?;
        head.eq_ignore_ascii_case(scheme).then(|| &text[scheme.len()..])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_form() {
        let t = parse(b"/a/b?x=1").unwrap();
        assert_eq!((t.authority, t.path, t.query, t.origin_form), (None, "/a/b", Some("x=1"), true));
        assert_eq!(parse(b"/").unwrap().query, None);
    }

    #[test]
    fn absolute_form_names_the_host() {
        let t = parse(b"http://api.example.com/x?q=1").unwrap();
        assert_eq!((t.authority, t.path, t.query, t.origin_form), (Some("api.example.com"), "/x", Some("q=1"), false));
        let t = parse(b"HTTPS://h:8443").unwrap();
        assert_eq!((t.authority, t.path, t.query), (Some("h:8443"), "/", None));
        assert_eq!(parse(b"http://h?q").unwrap().path, "/");
        assert_eq!(parse(b"http://u:p@h/x"), Err(TargetError::UserInfo));
        assert_eq!(parse(b"http:///x"), Err(TargetError::NoHost));
    }

    #[test]
    fn other_forms_are_refused() {
        for bad in [&b"login"[..], b"%2flogin", b"*", b"h:80", b"ftp://h/x", b"", b"\\login"] {
            assert_eq!(parse(bad), Err(TargetError::NotOriginOrAbsolute), "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(parse(b"/caf\xc3"), Err(TargetError::NotUtf8));
    }
}
