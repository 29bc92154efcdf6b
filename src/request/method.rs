//! The method a request is routed on. nginx treats methods as case-sensitive and accepts only
//! `A-Z`, `_` and `-` in them; a framework that upper-cases `put` would otherwise run the PUT
//! handler of a route Weir never matched. Method-override headers (Express's method-override,
//! Rails' Rack::MethodOverride, Symfony) let a POST run another handler: Weir strips them,
//! routes on them, or refuses them, as configured — it never forwards one it did not decide on.

use http::header::{HeaderMap, HeaderName};
use http::Method;

/// The override headers in common use.
pub static OVERRIDE_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// Whether a (lower-case) header name is one of [`OVERRIDE_HEADERS`]; no hashing, for the one
/// pass over a request's header names.
pub fn is_override_header(name: &str) -> bool {
    name.starts_with("x-") && OVERRIDE_HEADERS.iter().any(|h| h.as_str() == name)
}

/// `[server] method_override`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MethodOverride {
    /// Removed before forwarding: the upstream runs the method Weir decided on.
    #[default]
    Strip,
    /// On a POST, routed and limited as the overriding method and forwarded with the header (for
    /// upstreams that honour it); on other methods removed, as those upstreams ignore it there.
    Honour,
    /// A request that carries one is refused (400).
    Reject,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MethodError {
    #[error("the method must be upper-case letters, '_' or '-' (methods are case-sensitive)")]
    Invalid,
    #[error("method-override headers are not accepted here")]
    OverrideRefused,
    #[error("the method-override header must name one method, in letters")]
    BadOverride,
}

/// Whether `method` is a method nginx would accept.
pub fn is_valid(method: &Method) -> bool {
    let m = method.as_str();
    !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase() || b == b'_' || b == b'-')
}

/// What the method-override policy makes of a request: the method to route on when it is not the
/// request's own, and whether override headers are present (to strip before forwarding).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Override {
    pub method: Option<Method>,
    pub strip: bool,
}

pub fn resolve(policy: MethodOverride, method: &Method, headers: &HeaderMap) -> Result<Override, MethodError> {
    let mut values = OVERRIDE_HEADERS.iter().flat_map(|name| headers.get_all(name).iter());
    let Some(first) = values.next() else { return Ok(Override::default()) };
    match policy {
        MethodOverride::Reject => Err(MethodError::OverrideRefused),
        MethodOverride::Strip => Ok(Override { method: None, strip: true }),
        MethodOverride::Honour if method != Method::POST => Ok(Override { method: None, strip: true }),
        MethodOverride::Honour => {
            // Several values could be read either way by the upstream: one or none.
            if values.any(|v| !v.as_bytes().eq_ignore_ascii_case(first.as_bytes())) {
                return Err(MethodError::BadOverride);
            }
            let upper = first.to_str().map_err(|_| MethodError::BadOverride)?.trim().to_ascii_uppercase();
            let method = Method::from_bytes(upper.as_bytes()).map_err(|_| MethodError::BadOverride)?;
            if !is_valid(&method) {
                return Err(MethodError::BadOverride);
            }
            Ok(Override { method: Some(method), strip: false })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn with(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn methods_are_upper_case_tokens() {
        for ok in ["GET", "PUT", "PROPFIND", "VERSION-CONTROL", "X_Y"] {
            assert!(is_valid(&Method::from_bytes(ok.as_bytes()).unwrap()), "{ok}");
        }
        for bad in ["get", "Put", "P1", "GE.T"] {
            assert!(!is_valid(&Method::from_bytes(bad.as_bytes()).unwrap()), "{bad}");
        }
    }

    #[test]
    fn overrides_by_policy() {
        let put = with(&[("x-http-method-override", "put")]);
        assert_eq!(resolve(MethodOverride::Strip, &Method::POST, &HeaderMap::new()), Ok(Override::default()));
        assert_eq!(resolve(MethodOverride::Strip, &Method::POST, &put), Ok(Override { method: None, strip: true }));
        assert_eq!(resolve(MethodOverride::Reject, &Method::GET, &put), Err(MethodError::OverrideRefused));
        assert_eq!(
            resolve(MethodOverride::Honour, &Method::POST, &put),
            Ok(Override { method: Some(Method::PUT), strip: false })
        );
        assert_eq!(resolve(MethodOverride::Honour, &Method::GET, &put), Ok(Override { method: None, strip: true }));
        let two = with(&[("x-http-method-override", "PUT"), ("x-http-method", "DELETE")]);
        assert_eq!(resolve(MethodOverride::Honour, &Method::POST, &two), Err(MethodError::BadOverride));
        let bad = with(&[("x-method-override", "P T")]);
        assert_eq!(resolve(MethodOverride::Honour, &Method::POST, &bad), Err(MethodError::BadOverride));
    }
}
