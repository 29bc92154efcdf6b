//! Weir's own JSON access log (`[log] format = "json"`): one `weir::access` event per request
//! with the RFC 3339 time it was written (its end), `duration_ms`, the resolved client address,
//! the route and the `limit_req` status, and for limited requests `decided_us`, the store's time
//! (µs) of the decision, which replay uses as the decision time. Other events of the
//! same stream are skipped.

use http::{HeaderMap, Method};
use serde_json::Value;

use super::{target_path, time, Client, LineParser, Record};

pub struct Parser;

fn str_field<'v>(doc: &'v Value, name: &str) -> Option<&'v str> {
    doc.get(name).and_then(Value::as_str)
}

/// The line's `upstream_http_<name>` string fields (the response headers a zone charges from).
fn response_fields(doc: &Value) -> Vec<(String, String)> {
    let Some(object) = doc.as_object() else { return Vec::new() };
    object
        .iter()
        .filter_map(|(name, value)| {
            let header = name.strip_prefix(crate::config::RESPONSE_FIELD_PREFIX)?;
            Some((header.to_string(), value.as_str()?.to_string()))
        })
        .collect()
}

impl LineParser for Parser {
    fn parse(&mut self, line: &[u8]) -> Result<Option<Record>, String> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let doc: Value = serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
        // The rate limit service's lines (`front_door = "rls"`) share the target but are calls,
        // not HTTP requests: not replayed (docs/rls.md), and not an error in a mixed log.
        if str_field(&doc, "target") != Some("weir::access") || str_field(&doc, "front_door") == Some("rls") {
            return Ok(None);
        }
        let ts = str_field(&doc, "timestamp").ok_or("no \"timestamp\"")?;
        let end = time::rfc3339(ts).ok_or_else(|| format!("timestamp {ts:?} is not RFC 3339"))?;
        let duration_ms = doc.get("duration_ms").and_then(Value::as_f64).unwrap_or(0.0);
        let duration_us = (duration_ms * 1000.0).round().max(0.0) as u64;
        let method = str_field(&doc, "method").ok_or("no \"method\"")?;
        let method = Method::from_bytes(method.as_bytes()).map_err(|_| format!("bad method {method:?}"))?;
        let path = str_field(&doc, "path").ok_or("no \"path\"")?;
        let client = match str_field(&doc, "client") {
            None | Some("-") => Client::Unknown,
            Some(ip) => Client::Resolved(ip.parse().map_err(|_| format!("client {ip:?} is not an IP address"))?),
        };
        // The decision's own time when the line has it (limited requests); else the start.
        let decided = doc.get("decided_us").and_then(Value::as_u64);
        Ok(Some(Record {
            start_us: decided.unwrap_or(end.us.saturating_sub(duration_us)),
            duration_us: Some(duration_us),
            whole_second: false,
            client,
            method,
            target: target_path(path.as_bytes())?,
            host: None,
            headers: HeaderMap::new(),
            route: str_field(&doc, "route").filter(|r| *r != "-").map(str::to_string),
            logged_status: str_field(&doc, "limit_req").map(str::to_string),
            response_status: doc.get("status").and_then(Value::as_u64).and_then(|s| u16::try_from(s).ok()),
            response_fields: response_fields(&doc),
            client_left: doc.get("client_left").and_then(Value::as_bool).unwrap_or(false),
            body_bytes: doc.get(crate::config::BODY_BYTES_FIELD).and_then(Value::as_u64).unwrap_or(0),
            order: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_events_become_records_and_others_are_skipped() {
        let line = br#"{"timestamp":"2023-11-14T22:13:20.250000Z","level":"INFO","target":"weir::access","route":"api","client":"192.0.2.1","method":"GET","path":"/api/x","status":200,"limit_req":"PASSED","duration_ms":250.0,"message":"request"}"#;
        let r = Parser.parse(line).unwrap().unwrap();
        assert_eq!(r.start_us, 1_700_000_000_000_000);
        assert_eq!(r.client, Client::Resolved("192.0.2.1".parse().unwrap()));
        assert_eq!(r.route.as_deref(), Some("api"));
        assert_eq!(r.logged_status.as_deref(), Some("PASSED"));
        let other = br#"{"timestamp":"2023-11-14T22:13:20Z","level":"INFO","target":"weir::server","message":"up"}"#;
        assert!(Parser.parse(other).unwrap().is_none());
        assert!(Parser.parse(b"plain text").unwrap_err().contains("not JSON"));
        let rls = br#"{"timestamp":"2026-11-25T22:13:45.049812Z","level":"INFO","message":"rls","front_door":"rls","domain":"api","descriptors":1,"code":"OK","limit_req":"PASSED","target":"weir::access"}"#;
        assert!(Parser.parse(rls).unwrap().is_none(), "a rate limit service line is skipped, not an error");
        let decided = br#"{"timestamp":"2023-11-14T22:13:21Z","target":"weir::access","method":"GET","path":"/","client":"-","duration_ms":900.0,"decided_us":1700000000000123}"#;
        assert_eq!(Parser.parse(decided).unwrap().unwrap().start_us, 1_700_000_000_000_123);
    }
}
