//! Request framing that a proxy must not pass on as it came: requests an upstream could read
//! differently from Weir (RFC 9112 §6.3, §3.2) are refused before any limit is charged, so no
//! request can hide inside another one that Weir never counted.

use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, Version};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("Content-Length must be one decimal number")]
    AmbiguousContentLength,
    #[error("Content-Length and Transfer-Encoding must not both be present")]
    LengthAndChunked,
    #[error("HTTP/1.1 requests need exactly one Host header")]
    Host,
    #[error("an HTTP/2 request's Host header must name its :authority")]
    HostNotAuthority,
}

/// Checks the framing headers of a request; `authority` is the target's authority (absolute form
/// in HTTP/1.1, `:authority` in HTTP/2). HTTP/2 carries no Content-Length ambiguity of this kind
/// and names its host in `:authority`, so only the checks that apply are made.
pub fn check(version: Version, headers: &HeaderMap, authority: Option<&str>) -> Result<(), FramingError> {
    let mut lengths = headers.get_all(CONTENT_LENGTH).iter();
    if let Some(first) = lengths.next() {
        // `5,5` or two `Content-Length` lines: refused rather than rewritten; a client that sends
        // them is broken or probing.
        let digits = !first.is_empty() && first.as_bytes().iter().all(u8::is_ascii_digit);
        if !digits || lengths.next().is_some() {
            return Err(FramingError::AmbiguousContentLength);
        }
        if headers.contains_key(TRANSFER_ENCODING) {
            return Err(FramingError::LengthAndChunked);
        }
    }
    if version == Version::HTTP_11 {
        let hosts = headers.get_all(HOST).iter().count();
        if hosts > 1 || (hosts == 0 && authority.is_none()) {
            return Err(FramingError::Host);
        }
    }
    if version == Version::HTTP_2 {
        return check_h2_authority(headers, authority);
    }
    Ok(())
}

/// HTTP/2 names the target in `:authority`; a `Host` header beside it that names another host
/// would let routing (or an upstream) read a different target than the other: refused, as
/// RFC 9113 §8.3.1 advises.
fn check_h2_authority(headers: &HeaderMap, authority: Option<&str>) -> Result<(), FramingError> {
    let mut hosts = headers.get_all(HOST).iter();
    match (hosts.next(), authority) {
        (None, _) => Ok(()),
        (Some(host), Some(authority))
            if hosts.next().is_none() && host.as_bytes().eq_ignore_ascii_case(authority.as_bytes()) =>
        {
            Ok(())
        }
        (Some(_), None) if hosts.next().is_none() => Ok(()),
        _ => Err(FramingError::HostNotAuthority),
    }
}

/// Whether the request carries a body that would have to be read (or drained) after an answer.
pub fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(TRANSFER_ENCODING)
        || headers.get(CONTENT_LENGTH).is_some_and(|v| v.as_bytes().iter().any(|&b| b != b'0'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn content_length_must_be_one_number() {
        let host = ("host", "a");
        assert_eq!(check(Version::HTTP_11, &headers(&[host, ("content-length", "5")]), None), Ok(()));
        for bad in [vec![host, ("content-length", "5,5")], vec![host, ("content-length", "5"), ("content-length", "5")]]
        {
            assert_eq!(check(Version::HTTP_11, &headers(&bad), None), Err(FramingError::AmbiguousContentLength));
        }
        for bad in ["-1", "+5", " 5", "0x5", ""] {
            let h = headers(&[host, ("content-length", bad)]);
            assert_eq!(check(Version::HTTP_11, &h, None), Err(FramingError::AmbiguousContentLength), "{bad:?}");
        }
        let both = headers(&[host, ("content-length", "5"), ("transfer-encoding", "chunked")]);
        assert_eq!(check(Version::HTTP_11, &both, None), Err(FramingError::LengthAndChunked));
    }

    #[test]
    fn http11_needs_one_host() {
        assert_eq!(check(Version::HTTP_11, &headers(&[]), None), Err(FramingError::Host));
        assert_eq!(check(Version::HTTP_11, &headers(&[("host", "a"), ("host", "b")]), None), Err(FramingError::Host));
        assert_eq!(check(Version::HTTP_11, &headers(&[]), Some("a")), Ok(()), "absolute-form target");
        assert_eq!(check(Version::HTTP_10, &headers(&[]), None), Ok(()));
    }

    #[test]
    fn h2_host_must_match_authority() {
        assert_eq!(check_h2_authority(&headers(&[]), Some("a.test")), Ok(()));
        assert_eq!(check_h2_authority(&headers(&[("host", "A.test")]), Some("a.test")), Ok(()));
        assert_eq!(check_h2_authority(&headers(&[("host", "a.test")]), None), Ok(()));
        assert_eq!(
            check_h2_authority(&headers(&[("host", "b.test")]), Some("a.test")),
            Err(FramingError::HostNotAuthority)
        );
        let two = headers(&[("host", "a.test"), ("host", "a.test")]);
        assert_eq!(check_h2_authority(&two, Some("a.test")), Err(FramingError::HostNotAuthority));
    }

    #[test]
    fn body_detection() {
        assert!(!has_body(&headers(&[])));
        assert!(!has_body(&headers(&[("content-length", "0")])));
        assert!(has_body(&headers(&[("content-length", "10")])));
        assert!(has_body(&headers(&[("transfer-encoding", "chunked")])));
    }
}
