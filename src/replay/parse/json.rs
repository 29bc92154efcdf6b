//! JSON lines with a field mapping: `--field ts=time,ip=remote_addr,method=method,path=uri,...`.
//!
//! Names on the left: `ts` (required; seconds with a fraction like `$msec`, or RFC 3339), `ip`
//! (the peer address), `method`, `path` (may carry the query string), `request` (a whole
//! `GET /p HTTP/1.1` line, instead of method and path), `host`, `request_time` (seconds; when
//! given, `ts` is the end of the request, as nginx writes `$msec`), `route`, `limit_req_status`,
//! `order` (a number that orders requests started in the same millisecond, e.g. nginx's
//! `$connection`), and `header.NAME` for any request header (an array: the header sent once per element). On the right: a top-level field name, or a JSON
//! pointer (`/request/headers/x-api-key`) for nested objects.

use http::header::HeaderName;
use http::{HeaderMap, Method};
use serde_json::Value;

use super::time;
use super::{request_line, target_path, Client, LineParser, Record, Wanted};

#[derive(Debug, Clone, Default)]
pub struct JsonFields {
    ts: String,
    ip: Option<String>,
    method: Option<String>,
    path: Option<String>,
    request: Option<String>,
    host: Option<String>,
    request_time: Option<String>,
    route: Option<String>,
    status: Option<String>,
    order: Option<String>,
    headers: Vec<(HeaderName, String)>,
}

impl JsonFields {
    /// From `--field` values, each `NAME=FIELD` or several of them joined by commas.
    pub fn parse(args: &[String]) -> Result<JsonFields, String> {
        let mut f = JsonFields::default();
        let mut ts = None;
        for item in args.iter().flat_map(|a| a.split(',')).map(str::trim).filter(|s| !s.is_empty()) {
            let (name, field) =
                item.split_once('=').ok_or_else(|| format!("--field {item:?}: expected NAME=FIELD, e.g. ts=time"))?;
            let field = field.to_string();
            if field.is_empty() {
                return Err(format!("--field {item:?}: the JSON field name is empty"));
            }
            let slot = match name {
                "ts" => &mut ts,
                "ip" => &mut f.ip,
                "method" => &mut f.method,
                "path" => &mut f.path,
                "request" => &mut f.request,
                "host" => &mut f.host,
                "request_time" => &mut f.request_time,
                "route" => &mut f.route,
                "limit_req_status" => &mut f.status,
                "order" => &mut f.order,
                _ => {
                    let Some(header) = name.strip_prefix("header.") else {
                        return Err(format!(
                            "--field {item:?}: unknown name {name:?}: expected ts, ip, method, path, request, host, \
                             request_time, route, limit_req_status, order or header.NAME"
                        ));
                    };
                    let header = HeaderName::from_bytes(header.as_bytes())
                        .map_err(|_| format!("--field {item:?}: {header:?} is not a header name"))?;
                    f.headers.push((header, field));
                    continue;
                }
            };
            *slot = Some(field);
        }
        f.ts = ts.ok_or("--format json needs --field ts=FIELD (and path=FIELD or request=FIELD)")?;
        if f.path.is_none() && f.request.is_none() {
            return Err("--format json needs --field path=FIELD or request=FIELD".to_string());
        }
        Ok(f)
    }
}

pub struct Parser {
    fields: JsonFields,
    wanted: Wanted,
}

impl Parser {
    pub fn new(fields: JsonFields, wanted: Wanted) -> Self {
        Self { fields, wanted }
    }
}

/// A field by name or JSON pointer; `null` counts as absent.
fn lookup<'v>(doc: &'v Value, field: &str) -> Option<&'v Value> {
    let v = if field.starts_with('/') { doc.pointer(field) } else { doc.get(field) };
    v.filter(|v| !v.is_null())
}

/// A string or a number as text (`$msec` may be written either way).
fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn field_text(doc: &Value, field: Option<&String>) -> Option<String> {
    field.and_then(|f| lookup(doc, f)).and_then(text).filter(|s| !s.is_empty() && s != "-")
}

impl LineParser for Parser {
    fn parse(&mut self, line: &[u8]) -> Result<Option<Record>, String> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let doc: Value = serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
        let f = &self.fields;
        let ts_text = field_text(&doc, Some(&f.ts)).ok_or_else(|| format!("no timestamp in field {:?}", f.ts))?;
        let stamp = time::epoch_seconds(&ts_text)
            .or_else(|| time::rfc3339(&ts_text))
            .ok_or_else(|| format!("{}: {ts_text:?} is neither seconds since the epoch nor RFC 3339", f.ts))?;
        let duration_us = match field_text(&doc, f.request_time.as_ref()) {
            None => None,
            Some(t) => Some(time::seconds_to_us(&t).ok_or_else(|| format!("request_time {t:?} is not seconds"))?),
        };
        let (method, target) = match field_text(&doc, f.request.as_ref()) {
            Some(req) => request_line(req.as_bytes())?,
            None => {
                let path = field_text(&doc, f.path.as_ref()).ok_or_else(|| "no path in the line".to_string())?;
                let method = match field_text(&doc, f.method.as_ref()) {
                    None => Method::GET,
                    Some(m) => Method::from_bytes(m.as_bytes()).map_err(|_| format!("bad method {m:?}"))?,
                };
                (method, target_path(path.as_bytes())?)
            }
        };
        let client = match field_text(&doc, f.ip.as_ref()) {
            None => Client::Unknown,
            Some(ip) => Client::Peer(ip.parse().map_err(|_| format!("ip {ip:?} is not an IP address"))?),
        };
        let mut headers = HeaderMap::new();
        for (name, field) in &f.headers {
            // An array is the header sent several times, one field line per element.
            let lines: Vec<String> = match lookup(&doc, field) {
                Some(Value::Array(values)) => values.iter().filter_map(text).collect(),
                _ => field_text(&doc, Some(field)).into_iter().collect(),
            };
            for value in lines {
                self.wanted.insert(&mut headers, name, value.as_bytes())?;
            }
        }
        let order = match field_text(&doc, f.order.as_ref()) {
            None => None,
            Some(o) => Some(o.parse().map_err(|_| format!("order {o:?} is not a whole number"))?),
        };
        Ok(Some(Record {
            order,
            response_status: None,
            client_left: false,
            body_bytes: 0,
            response_fields: Vec::new(),
            start_us: stamp.us.saturating_sub(duration_us.unwrap_or(0)),
            duration_us,
            whole_second: stamp.whole_second,
            client,
            method,
            target,
            host: field_text(&doc, f.host.as_ref()),
            headers,
            route: field_text(&doc, f.route.as_ref()),
            // nginx writes an unset `$limit_req_status` as `-`, or as `""` with `escape=json`.
            logged_status: f
                .status
                .as_ref()
                .map(|_| field_text(&doc, f.status.as_ref()).unwrap_or_else(|| "-".to_string())),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parser(fields: &str) -> Parser {
        let wanted = Wanted(vec![HeaderName::from_static("x-api-key")]);
        Parser::new(JsonFields::parse(&[fields.to_string()]).unwrap(), wanted)
    }

    #[test]
    fn mapped_fields_make_a_record() {
        let mut p = parser("ts=t,ip=addr,method=m,path=uri,host=h,request_time=rt,header.X-Api-Key=/hdr/key");
        let line = br#"{"t":1700000000.5,"addr":"192.0.2.7","m":"POST","uri":"/api/x?a=1","h":"api","rt":"0.125","hdr":{"key":"k1"}}"#;
        let r = p.parse(line).unwrap().unwrap();
        assert_eq!(r.start_us, 1_700_000_000_375_000);
        assert!(!r.whole_second);
        assert_eq!(r.client, Client::Peer("192.0.2.7".parse().unwrap()));
        assert_eq!((r.method, r.target.as_str(), r.host.as_deref()), (Method::POST, "/api/x?a=1", Some("api")));
        assert_eq!(r.headers.get("x-api-key").unwrap(), "k1");
    }

    #[test]
    fn rfc3339_and_request_lines() {
        let mut p = parser("ts=time,request=req");
        let r = p.parse(br#"{"time":"2023-11-14T22:13:20Z","req":"GET /a HTTP/1.1"}"#).unwrap().unwrap();
        assert_eq!(r.start_us, 1_700_000_000_000_000);
        assert!(r.whole_second);
        assert_eq!(r.client, Client::Unknown);
        assert_eq!(r.target, "/a");
    }

    #[test]
    fn bad_lines_and_bad_mappings() {
        let mut p = parser("ts=t,path=p");
        assert!(p.parse(b"{not json").unwrap_err().contains("not JSON"));
        assert!(p.parse(br#"{"p":"/"}"#).unwrap_err().contains("no timestamp"));
        assert!(p.parse(br#"{"t":"soon","p":"/"}"#).unwrap_err().contains("neither"));
        assert!(p.parse(b"").unwrap().is_none());
        assert!(JsonFields::parse(&["ts=t".into()]).unwrap_err().contains("path=FIELD"));
        assert!(JsonFields::parse(&["path=p".into()]).unwrap_err().contains("ts=FIELD"));
        assert!(JsonFields::parse(&["ts=t,path=p,color=c".into()]).unwrap_err().contains("unknown name"));
        assert!(JsonFields::parse(&["ts".into()]).unwrap_err().contains("NAME=FIELD"));
    }
}
