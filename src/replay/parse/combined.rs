//! nginx `combined` and the `msec` variant.
//!
//! `combined`: `$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent
//! "$http_referer" "$http_user_agent"`, optionally followed by `"$http_x_forwarded_for"`, then
//! `"$host"`, then a bare `$limit_req_status`. nginx writes `$time_local` when the request ends,
//! to the second.
//!
//! `msec`: the same with `$msec $request_time ` in front. `$msec` is also the end of the request;
//! the request started (and its limits were decided) `$request_time` earlier.

use http::header::{HeaderName, REFERER, USER_AGENT};
use http::HeaderMap;

use super::fields::Cursor;
use super::time::{self, LocalTimeCache};
use super::{is_status_word, request_line, Client, LineParser, Record, Wanted};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

pub struct Parser {
    wanted: Wanted,
    msec: bool,
    times: LocalTimeCache,
}

impl Parser {
    pub fn new(wanted: Wanted, msec: bool) -> Self {
        Self { wanted, msec, times: LocalTimeCache::default() }
    }
}

impl LineParser for Parser {
    fn parse(&mut self, line: &[u8]) -> Result<Option<Record>, String> {
        let mut c = Cursor::new(line);
        if c.at_end() {
            return Ok(None);
        }
        let exact = if self.msec {
            let msec = c.word("$msec")?;
            let end = std::str::from_utf8(msec)
                .ok()
                .and_then(time::epoch_seconds)
                .ok_or_else(|| format!("$msec {:?} is not seconds.millis", String::from_utf8_lossy(msec)))?;
            let rt = c.word("$request_time")?;
            let took = match rt {
                b"-" => 0,
                _ => std::str::from_utf8(rt)
                    .ok()
                    .and_then(time::seconds_to_us)
                    .ok_or_else(|| format!("$request_time {:?} is not seconds.millis", String::from_utf8_lossy(rt)))?,
            };
            Some((end.us.saturating_sub(took), took))
        } else {
            None
        };
        let addr = c.word("$remote_addr")?;
        let client = std::str::from_utf8(addr)
            .ok()
            .and_then(|a| a.parse().ok())
            .map(Client::Peer)
            .ok_or_else(|| format!("$remote_addr {:?} is not an IP address", String::from_utf8_lossy(addr)))?;
        c.word("ident")?;
        c.word("$remote_user")?;
        let local = c.bracketed("[$time_local]")?;
        let end_us = self.times.parse(local).ok_or_else(|| {
            format!("[$time_local] {:?} is not like 10/Oct/2000:13:55:36 -0700", String::from_utf8_lossy(local))
        })?;
        let (method, target) = request_line(c.quoted("\"$request\"")?)?;
        c.word("$status")?;
        c.word("$body_bytes_sent")?;
        let mut headers = HeaderMap::new();
        self.wanted.insert(&mut headers, &REFERER, c.quoted("\"$http_referer\"")?)?;
        self.wanted.insert(&mut headers, &USER_AGENT, c.quoted("\"$http_user_agent\"")?)?;
        let mut host = None;
        let mut logged_status = None;
        let mut quoted_seen = 0;
        while !c.at_end() {
            if c.peek() == Some(b'"') {
                let value = c.quoted("extra field")?;
                match quoted_seen {
                    0 => self.wanted.insert(&mut headers, &X_FORWARDED_FOR, value)?,
                    1 if !value.is_empty() && value != b"-" => host = Some(String::from_utf8_lossy(value).into_owned()),
                    _ => {}
                }
                quoted_seen += 1;
            } else {
                let word = c.word("extra field")?;
                if is_status_word(word) {
                    logged_status = Some(String::from_utf8_lossy(word).into_owned());
                }
            }
        }
        let (start_us, duration_us, whole_second) = match exact {
            Some((start, took)) => (start, Some(took), false),
            None => (end_us, None, true),
        };
        Ok(Some(Record {
            start_us,
            duration_us,
            whole_second,
            client,
            method,
            target,
            host,
            headers,
            route: None,
            logged_status,
            response_status: None,
            client_left: false,
            body_bytes: 0,
            response_fields: Vec::new(),
            order: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn wanted() -> Wanted {
        Wanted(vec![X_FORWARDED_FOR.clone(), USER_AGENT])
    }

    #[test]
    fn combined_line_with_forwarded_for_and_host() {
        let line = br#"10.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /api/x?k=1 HTTP/1.1" 200 2326 "http://r/" "curl/8" "203.0.113.9" "api.example.com""#;
        let r = Parser::new(wanted(), false).parse(line).unwrap().unwrap();
        assert_eq!(r.start_us, 971_211_336_000_000);
        assert!(r.whole_second);
        assert_eq!(r.client, Client::Peer("10.0.0.1".parse().unwrap()));
        assert_eq!(r.method, Method::GET);
        assert_eq!(r.target, "/api/x?k=1");
        assert_eq!(r.host.as_deref(), Some("api.example.com"));
        assert_eq!(r.headers.get("x-forwarded-for").unwrap(), "203.0.113.9");
        assert_eq!(r.headers.get("user-agent").unwrap(), "curl/8");
        // Not read by the config: not kept.
        assert!(r.headers.get("referer").is_none());
    }

    #[test]
    fn plain_combined_and_blank_lines() {
        let line = br#"::1 - - [10/Oct/2000:13:55:36 +0000] "POST /login HTTP/1.1" 429 0 "-" "-""#;
        let r = Parser::new(wanted(), false).parse(line).unwrap().unwrap();
        assert_eq!(r.client, Client::Peer("::1".parse().unwrap()));
        assert!(r.headers.is_empty() && r.host.is_none());
        assert!(Parser::new(wanted(), false).parse(b"   ").unwrap().is_none());
    }

    #[test]
    fn msec_start_is_end_minus_request_time() {
        let line = br#"1700000000.500 0.250 192.0.2.1 - - [14/Nov/2023:22:13:20 +0000] "GET / HTTP/1.1" 200 5 "-" "-" "-" "h" DELAYED"#;
        let r = Parser::new(wanted(), true).parse(line).unwrap().unwrap();
        assert_eq!(r.start_us, 1_700_000_000_250_000);
        assert_eq!(r.duration_us, Some(250_000));
        assert!(!r.whole_second);
        assert_eq!(r.logged_status.as_deref(), Some("DELAYED"));
        assert!(r.headers.get("x-forwarded-for").is_none());
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        let mut p = Parser::new(wanted(), false);
        let e = p.parse(br#"nonsense - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1 "-" "-""#).unwrap_err();
        assert!(e.contains("$remote_addr"), "{e}");
        let e = p.parse(br#"1.2.3.4 - - [yesterday] "GET / HTTP/1.1" 200 1 "-" "-""#).unwrap_err();
        assert!(e.contains("$time_local"), "{e}");
        let e = p.parse(br#"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "-" 400 0 "-" "-""#).unwrap_err();
        assert!(e.contains("request line"), "{e}");
        let e = p.parse(br#"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200"#).unwrap_err();
        assert!(e.contains("$body_bytes_sent"), "{e}");
        let e = Parser::new(wanted(), true).parse(b"abc 0.1 1.2.3.4").unwrap_err();
        assert!(e.contains("$msec"), "{e}");
    }
}
