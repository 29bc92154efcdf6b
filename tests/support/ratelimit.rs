//! The rate-limit fields of weir's responses: the `RateLimit` and `RateLimit-Policy` structured
//! fields and `Retry-After`.

use super::http::Response;

/// The integer value of `;name=INT` (or `name=INT` first) inside a structured-field value, e.g.
/// `r` of `"zone";r=0;t=60`.
pub fn sf_param(field: &str, name: &str) -> Option<i64> {
    let re = regex::Regex::new(&format!(r"(?:^|;)\s*{name}=(-?[0-9]+)")).unwrap();
    re.captures(field).map(|c| c[1].parse().unwrap())
}

/// `Retry-After` in whole seconds; panics (with the response) when it is absent or not a number
/// of seconds.
pub fn retry_after(r: &Response) -> u64 {
    let ra = r.header("retry-after").unwrap_or_else(|| panic!("no Retry-After: {}", r.summary()));
    ra.trim().parse().unwrap_or_else(|_| panic!("Retry-After not whole seconds: {ra:?}: {}", r.summary()))
}
