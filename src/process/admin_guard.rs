//! What the admin listener trusts of a request and adds to each answer: the `Host` a loopback
//! listener answers (DNS rebinding), strict percent-decoding of paths and query values, and the
//! headers that keep its page from being framed or fed foreign scripts. Pure.

/// The policy of every answer but the page: nothing runs, nothing frames it.
pub const DATA_POLICY: &str = "default-src 'none'; frame-ancestors 'none'";

/// A page's policy: its inline script by hash (the first `<script>`), inline style (the status
/// page's fill bars' widths), fetches to this listener only, no framing, no forms sent anywhere, no
/// other source of anything.
pub fn page_policy(page: &str) -> String {
    use sha2::{Digest, Sha256};
    let script =
        page.split_once("<script>").and_then(|(_, rest)| rest.split_once("</script>")).map_or("", |(script, _)| script);
    format!(
        "default-src 'none'; script-src 'sha256-{}'; style-src 'unsafe-inline'; connect-src 'self'; \
         img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        base64(&Sha256::digest(script.as_bytes()))
    )
}

/// The headers of every admin answer: no framing (clickjacking the reset button), no sniffing, no
/// caching, no referrer, and `policy` as the content security policy.
pub fn protect(headers: &mut http::HeaderMap, policy: &'static str) {
    use http::{header, HeaderValue};
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    if let Ok(value) = HeaderValue::from_str(policy) {
        headers.insert(header::CONTENT_SECURITY_POLICY, value);
    }
}

/// Standard base64 with padding (RFC 4648 §4), for the script's hash.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A query parameter's value, decoded as a form value (`+` is a space); `None` when absent or
/// badly encoded (the caller then asks for it).
pub fn query_param(query: Option<&str>, name: &str) -> Option<Vec<u8>> {
    query.unwrap_or("").split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| percent_decode(v, true).ok()).flatten()
    })
}

/// A path segment, percent-decoded; `+` is itself (base64 keys hold it).
pub fn path_decode(segment: &str) -> Result<Vec<u8>, String> {
    percent_decode(segment, false)
}

/// Decodes `%XX` (keys may contain `:` or `/`, e.g. IPv6 addresses), and `+` as a space when
/// `plus_is_space` (a form value). A `%` not followed by two hex digits is an error: read
/// leniently, it would name another key than the one meant.
fn percent_decode(text: &str, plus_is_space: bool) -> Result<Vec<u8>, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).filter(|h| h.iter().all(u8::is_ascii_hexdigit));
                let Some(hex) = hex else {
                    return Err(format!("\"%\" at byte {i} is not followed by two hex digits"));
                };
                let digit = |h: u8| (h as char).to_digit(16).unwrap_or(0) as u8;
                out.push(digit(hex[0]) << 4 | digit(hex[1]));
                i += 3;
                continue;
            }
            b'+' if plus_is_space => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    Ok(out)
}

/// Where a request says it comes from: its `Host`, and from a browser its `Origin`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Provenance<'a> {
    pub host: Option<&'a [u8]>,
    pub origin: Option<&'a [u8]>,
}

/// Whether a loopback admin listener without a token serves the request: its `Host` names this
/// machine (else a page whose name was rebound to 127.0.0.1 is talking to it), and a request
/// that changes something (`POST /reload`), when a browser sent it, comes from a page of this
/// machine: a cross-site `POST` needs no preflight, so a page anywhere could send it blind. No
/// `Host` or `Origin` at all is not a browser's request.
pub fn is_local(from: Provenance<'_>, changes_state: bool, admin: Option<std::net::SocketAddr>) -> bool {
    from.host.is_none_or(|h| host_is_local(h, admin))
        && (!changes_state || from.origin.is_none_or(|o| origin_is_local(o, admin)))
}

/// Whether an `Origin` (`http://host:port`) is a page of this machine; `null` (a sandboxed or
/// local file's page) is not.
fn origin_is_local(origin: &[u8], admin: Option<std::net::SocketAddr>) -> bool {
    let Ok(origin) = std::str::from_utf8(origin) else { return false };
    let Some(authority) = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) else {
        return false;
    };
    !authority.contains(['/', '@']) && host_is_local(authority.as_bytes(), admin)
}

/// Whether `host` (a `Host` header: name or address, with or without a port) names this
/// machine's loopback or the admin address itself.
fn host_is_local(host: &[u8], admin: Option<std::net::SocketAddr>) -> bool {
    let Ok(host) = std::str::from_utf8(host) else { return false };
    let host = host.trim();
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((inside, "")) => (inside, None),
            Some((inside, after)) => match after.strip_prefix(':') {
                Some(port) => (inside, Some(port)),
                None => return false,
            },
            None => return false,
        },
        None => match host.rsplit_once(':') {
            // One colon: name and port; more: an IPv6 address without brackets, not a Host.
            Some((name, port)) if !name.contains(':') => (name, Some(port)),
            Some(_) => return false,
            None => (host, None),
        },
    };
    if port.is_some_and(|p| p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit())) {
        return false;
    }
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback() || admin.is_some_and(|a| a.ip() == ip),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_query_values_and_path_segments() {
        assert_eq!(percent_decode("2001%3Adb8%3A%3A1", true).unwrap(), b"2001:db8::1");
        assert_eq!(percent_decode("a+b%2b", true).unwrap(), b"a b+");
        assert_eq!(path_decode("ab+c/d%3D%3d").unwrap(), b"ab+c/d==");
        for bad in ["%zz", "a%2", "%", "%%41", "%+1"] {
            assert!(path_decode(bad).is_err(), "{bad}");
            assert!(percent_decode(bad, true).is_err(), "{bad}");
        }
        assert_eq!(query_param(Some("zone=z&key=%zz"), "key"), None);
        assert_eq!(query_param(Some("zone=z&key=a+b"), "key"), Some(b"a b".to_vec()));
    }

    #[test]
    fn hosts_that_name_this_machine() {
        let admin: std::net::SocketAddr = "127.0.0.1:9901".parse().unwrap();
        let local = |h: &str| host_is_local(h.as_bytes(), Some(admin));
        for ok in ["localhost", "LOCALHOST:9901", "127.0.0.1", "127.0.0.1:9901", "[::1]", "[::1]:80", "127.0.0.2:1"] {
            assert!(local(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:9901",
            "localhost.evil.example",
            "localhost.",
            "127.0.0.1.nip.io",
            "::1",
            "[::1",
            "[::1]x",
            "localhost:",
            "localhost:99999x",
            "10.0.0.5",
            "",
            "0.0.0.0",
        ] {
            assert!(!local(bad), "{bad}");
        }
        let exposed: std::net::SocketAddr = "10.0.0.5:9901".parse().unwrap();
        assert!(host_is_local(b"10.0.0.5:9901", Some(exposed)));
        assert!(!host_is_local(b"10.0.0.6:9901", Some(exposed)));
    }

    #[test]
    fn requests_that_change_state_come_from_pages_of_this_machine() {
        let admin: std::net::SocketAddr = "127.0.0.1:9901".parse().unwrap();
        let from = |host: &'static str, origin: Option<&'static str>| Provenance {
            host: Some(host.as_bytes()),
            origin: origin.map(str::as_bytes),
        };
        assert!(is_local(from("127.0.0.1:9901", None), true, Some(admin)), "curl: no Origin");
        assert!(is_local(from("127.0.0.1:9901", Some("http://127.0.0.1:9901")), true, Some(admin)), "the page");
        assert!(is_local(from("localhost:9901", Some("http://localhost:9901")), true, Some(admin)));
        for origin in [
            "http://evil.example",
            "null",
            "https://evil.example:9901",
            "http://localhost@evil.example",
            "http://127.0.0.1:9901/x",
            "file://",
        ] {
            assert!(!is_local(from("127.0.0.1:9901", Some(origin)), true, Some(admin)), "{origin}");
            assert!(is_local(from("127.0.0.1:9901", Some(origin)), false, Some(admin)), "reads: {origin}");
        }
        assert!(!is_local(from("evil.example", None), false, Some(admin)), "rebinding");
        assert!(is_local(Provenance::default(), true, Some(admin)), "not a browser");
    }

    #[test]
    fn the_page_policy_names_its_script_by_hash() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        // echo -n 'alert(1)' | openssl dgst -sha256 -binary | base64
        let policy = page_policy("<p><script>alert(1)</script>");
        assert!(policy.contains("script-src 'sha256-bhHHL3z2vDgxUt0W3dWQOrprscmda2Y5pLsLg4GF+pI='"), "{policy}");
        assert!(!policy.contains("script-src 'unsafe-inline'") && !policy.contains("http"), "{policy}");
    }
}
