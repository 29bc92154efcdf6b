//! Access-log lines into [`Record`]s: what the proxy would have seen of each request. One module
//! per input format; each turns a line into a record, `Ok(None)` for a line that is not a request
//! (a blank line, another target's log event), or an error saying what is wrong with it.

mod combined;
mod fields;
mod json;
pub mod time;
mod weir;

use std::net::IpAddr;

use http::header::HeaderName;
use http::{HeaderMap, Method};

pub use json::JsonFields;

/// One request as the log tells it.
#[derive(Debug, Clone)]
pub struct Record {
    /// When the request started (µs since the epoch): when the proxy decided its limits.
    pub start_us: u64,
    /// How long it took (`$request_time`), when the log says.
    pub duration_us: Option<u64>,
    /// The log only knows the second (nginx `$time_local`).
    pub whole_second: bool,
    pub client: Client,
    pub method: Method,
    /// Path with the query string, as in the request line.
    pub target: String,
    pub host: Option<String>,
    /// Only the headers the config reads (keys, overrides, cost, real IP).
    pub headers: HeaderMap,
    /// The route named by the log (Weir's own log), used when the config has it.
    pub route: Option<String>,
    /// The `$limit_req_status` the log recorded, to compare with the replay.
    pub logged_status: Option<String>,
    /// The HTTP status of the response (Weir's log: `status`), for zones counted by response.
    pub response_status: Option<u16>,
    /// The upstream response headers Weir's log wrote (`upstream_http_<name>`, `-` as `_`, as
    /// nginx names them): field name after the prefix and value, for zones charged from the
    /// response (`cost_from_response`).
    pub response_fields: Vec<(String, String)>,
    /// The client left after the request was forwarded, before its answer was complete (Weir's
    /// log: `client_left`): response-decided zones are charged as the proxy charged them.
    pub client_left: bool,
    /// The response body bytes sent to the client (Weir's log: `body_bytes_sent`, nginx's name),
    /// for byte quotas (`cost_from_response = { body_bytes = true }`).
    pub body_bytes: u64,
    /// Orders requests that started in the same millisecond (nginx's `$connection` serial);
    /// without it they go in log order.
    pub order: Option<u64>,
}

/// Who sent the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// The TCP peer (`$remote_addr`): the real IP comes from it and the forwarding header, like live.
    Peer(IpAddr),
    /// Already the real client address (Weir's log writes the resolved address).
    Resolved(IpAddr),
    Unknown,
}

/// The input formats.
#[derive(Debug, Clone)]
pub enum Format {
    /// nginx `combined` (whole seconds), optionally followed by `"$http_x_forwarded_for"` and `"$host"`.
    Combined,
    /// `$msec $request_time` followed by the combined fields: exact start times.
    Msec,
    /// Weir's own JSON access log (`[log] format = "json"`).
    Weir,
    /// JSON lines with a field mapping (`--field ts=...,ip=...`).
    Json(Box<JsonFields>),
}

impl Format {
    pub fn parse(name: &str, fields: &[String]) -> Result<Format, String> {
        let format = match name {
            "combined" => Format::Combined,
            "msec" => Format::Msec,
            "weir" => Format::Weir,
            "json" => Format::Json(Box::new(JsonFields::parse(fields)?)),
            other => {
                return Err(format!("unknown --format {other:?}: expected combined, msec, weir or json"));
            }
        };
        if !fields.is_empty() && !matches!(format, Format::Json(_)) {
            return Err("--field applies to --format json only".to_string());
        }
        Ok(format)
    }

    pub fn name(&self) -> &'static str {
        match self {
            Format::Combined => "combined",
            Format::Msec => "msec",
            Format::Weir => "weir",
            Format::Json(_) => "json",
        }
    }

    /// A parser for one input file; `wanted` are the headers the config reads.
    pub fn parser(&self, wanted: &Wanted) -> Box<dyn LineParser> {
        match self {
            Format::Combined => Box::new(combined::Parser::new(wanted.clone(), false)),
            Format::Msec => Box::new(combined::Parser::new(wanted.clone(), true)),
            Format::Weir => Box::new(weir::Parser),
            Format::Json(fields) => Box::new(json::Parser::new((**fields).clone(), wanted.clone())),
        }
    }
}

pub trait LineParser {
    fn parse(&mut self, line: &[u8]) -> Result<Option<Record>, String>;
}

/// The request headers the config reads; a parser keeps only these (fast, and memory stays small).
#[derive(Debug, Clone, Default)]
pub struct Wanted(pub Vec<HeaderName>);

impl Wanted {
    pub fn has(&self, name: &HeaderName) -> bool {
        self.0.contains(name)
    }

    /// Adds `value` as header `name` if the config reads it and the log has it (`-` is nginx's "none").
    pub fn insert(&self, headers: &mut HeaderMap, name: &HeaderName, value: &[u8]) -> Result<(), String> {
        if value.is_empty() || value == b"-" || !self.has(name) {
            return Ok(());
        }
        let value = http::HeaderValue::from_bytes(value).map_err(|_| format!("{name}: not a valid header value"))?;
        headers.append(name.clone(), value);
        Ok(())
    }
}

/// `GET /path?q HTTP/1.1` into method and target.
pub fn request_line(text: &[u8]) -> Result<(Method, String), String> {
    let mut parts = text.split(|&b| b == b' ').filter(|p| !p.is_empty());
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(format!("request line {:?} is not \"METHOD /path HTTP/x\"", String::from_utf8_lossy(text)));
    };
    let method = Method::from_bytes(method)
        .map_err(|_| format!("request line: bad method {:?}", String::from_utf8_lossy(method)))?;
    Ok((method, target_path(target)?))
}

/// A request target as the client sent it (origin or absolute form, or malformed): the engine
/// reads it as the live proxy does — an absolute-form host wins, a target without a leading `/`
/// is refused — so a logged request is decided as it was live.
pub fn target_path(target: &[u8]) -> Result<String, String> {
    std::str::from_utf8(target)
        .map(str::to_string)
        .map_err(|_| format!("target {:?} is not UTF-8", String::from_utf8_lossy(target)))
}

/// nginx's `$limit_req_status` words (and `-`, unset), as a log may carry them.
pub fn is_status_word(word: &[u8]) -> bool {
    matches!(word, b"PASSED" | b"DELAYED" | b"REJECTED" | b"DELAYED_DRY_RUN" | b"REJECTED_DRY_RUN" | b"-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_and_targets() {
        assert_eq!(request_line(b"GET /a?b=1 HTTP/1.1").unwrap(), (Method::GET, "/a?b=1".to_string()));
        // Targets are kept as sent: the engine reads absolute form and refuses the rest.
        let absolute = request_line(b"POST http://x.com/login HTTP/1.0").unwrap();
        assert_eq!(absolute, (Method::POST, "http://x.com/login".to_string()));
        assert_eq!(request_line(b"GET nopath HTTP/1.1").unwrap().1, "nopath");
        assert!(request_line(b"-").is_err());
        assert!(request_line(b"\x16\x03\x01 garbage").is_err());
        assert!(request_line(b"GET /caf\xc3 HTTP/1.1").is_err());
    }

    #[test]
    fn unknown_format_is_a_clear_error() {
        let err = Format::parse("apache", &[]).unwrap_err();
        assert!(err.contains("unknown --format \"apache\""), "{err}");
        assert!(Format::parse("combined", &["ts=t".into()]).is_err());
    }
}
