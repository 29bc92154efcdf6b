//! Issue 23: the proxy and `weir replay` decide through one engine, so the same requests get the
//! same decisions through both front doors — including hostile spellings of a limited path,
//! encoded query and cookie keys, duplicated key headers and request shapes that are refused.
//! The requests are sent to a live Weir, then written as JSON lines (as a log would hold them,
//! raw targets and every header line) and replayed with the same config.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::access_log::wait_for_access_lines;
use support::config::with_app;
use support::http;
use support::upstream::Upstream;
use support::weir::{ConfigDir, Weir};

const ZONES_AND_ROUTES: &str = r#"
[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[limit_req_zone]]
name = "per_key"
key = "header:X-Api-Key"
rate = "1r/m"

[[limit_req_zone]]
name = "per_token"
key = "query:token"
rate = "1r/m"

[[limit_req_zone]]
name = "per_session"
key = "cookie:sid"
rate = "1r/m"

[[route]]
name = "login"
path = "/login"
upstream = "app"
limit_req = [ { zone = "per_ip", nodelay = true } ]

[[route]]
name = "keyed"
path = "/keyed"
upstream = "app"
limit_req = [ { zone = "per_key", nodelay = true } ]

[[route]]
name = "token"
path = "/token"
upstream = "app"
limit_req = [ { zone = "per_token", nodelay = true } ]

[[route]]
name = "session"
path = "/session"
upstream = "app"
limit_req = [ { zone = "per_session", nodelay = true } ]

[[route]]
name = "open"
path_prefix = "/"
upstream = "app"
"#;

/// One request: method, raw target, Host, X-Api-Key lines, Cookie lines.
struct Sent {
    method: &'static str,
    target: &'static str,
    host: &'static str,
    keys: &'static [&'static str],
    cookies: &'static [&'static str],
}

const fn get(target: &'static str) -> Sent {
    Sent { method: "GET", target, host: "localhost", keys: &[], cookies: &[] }
}

const REQUESTS: &[Sent] = &[
    get("/login"),
    get("//login"),
    get("/%6cogin"),
    get("/./login"),
    get("/x/../login"),
    get("/%6C%6F%67%69%6E"),
    get("///login"),
    get("/a/b/../../login"),
    get("login"),
    get("/x\\..\\login"),
    Sent { method: "put", ..get("/login") },
    Sent { host: "api.example.com:1:1", ..get("/open") },
    Sent { keys: &["k1"], ..get("/keyed") },
    Sent { keys: &["k1"], ..get("/%6beyed") },
    Sent { keys: &["k2", "k1"], ..get("/keyed") },
    Sent { keys: &["k2"], ..get("/keyed") },
    get("/token?token=a"),
    get("/token?%74oken=%61"),
    get("/token?token=a+b"),
    get("/token?token=a%20b"),
    get("/token?token=c&token=d"),
    Sent { cookies: &["sid=s1"], ..get("/session") },
    Sent { cookies: &["sid=\"s1\""], ..get("/session") },
    Sent { cookies: &["a=1; sid=%73%31"], ..get("/session") },
    Sent { cookies: &["sid=s2", "sid=s3"], ..get("/session") },
    get("/open/x"),
];

fn wire(r: &Sent) -> Vec<u8> {
    let mut out = format!("{} {} HTTP/1.1\r\nHost: {}\r\n", r.method, r.target, r.host);
    for k in r.keys {
        out += &format!("X-Api-Key: {k}\r\n");
    }
    for c in r.cookies {
        out += &format!("Cookie: {c}\r\n");
    }
    (out + "\r\n").into_bytes()
}

#[test]
fn replay_decides_every_hostile_request_as_the_live_proxy_did() {
    let up = Upstream::start();
    let w = Weir::start(&with_app(
        "",
        "[store]\nkind = \"memory\"\n[log]\nformat = \"json\"\n",
        up.addr(),
        ZONES_AND_ROUTES,
    ));
    let started = Instant::now();
    let mut statuses = Vec::new();
    for (i, r) in REQUESTS.iter().enumerate() {
        let resp = http::send_raw(w.addr, &wire(r)).expect("an answer").expect("a response");
        statuses.push(resp.status);
        // A line is written as its request ends, after the response: wait for it, so the log's
        // order is the order sent.
        assert_eq!(wait_for_access_lines(&w, i + 1).len(), i + 1, "request {i} was logged");
    }
    // 1r/m with no burst: the whole run must fit in the minute for the live words to be the
    // model's, as the replay's timestamps are.
    assert!(started.elapsed() < Duration::from_secs(50), "the live run took {:?}", started.elapsed());
    let lines = wait_for_access_lines(&w, REQUESTS.len());
    assert_eq!(lines.len(), REQUESTS.len(), "one access line per request: {lines:?}");
    let live: Vec<String> = lines.iter().map(|l| l["limit_req"].as_str().unwrap_or("?").to_string()).collect();
    // The run exercises what it claims to: every spelling of /login after the first is limited,
    // and the malformed or ambiguous requests were refused.
    assert_eq!(&statuses[..8], [200, 429, 429, 429, 429, 429, 429, 429], "{statuses:?}");
    let refused = statuses.iter().filter(|s| **s == 400).count();
    assert_eq!(refused, 7, "{statuses:?}");
    for word in ["PASSED", "REJECTED", "-"] {
        assert!(live.iter().any(|l| l == word), "{word}: {live:?}");
    }

    let dir = ConfigDir::new();
    let log: String = REQUESTS
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let line = json!({
                "ts": 1_800_000_000.0 + i as f64 * 0.01,
                "ip": "127.0.0.1",
                "method": r.method,
                "path": r.target,
                "host": r.host,
                "key": r.keys,
                "cookie": r.cookies,
            });
            line.to_string() + "\n"
        })
        .collect();
    let log_path = dir.write("requests.jsonl", &log);
    let decisions = dir.path().join("decisions.tsv");
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["replay", "-c"])
        .arg(&w.config_path)
        .args(["--json", "--quiet", "--format", "json"])
        .args(["--field", "ts=ts,ip=ip,method=method,path=path,host=host,header.X-Api-Key=key,header.Cookie=cookie"])
        .arg("--decisions")
        .arg(&decisions)
        .arg(&log_path)
        .output()
        .expect("weir replay runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "weir replay failed: {stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    let text = std::fs::read_to_string(&decisions).expect("decisions written");
    let replayed: Vec<&str> = text.lines().filter_map(|l| l.split('\t').nth(1)).collect();
    assert_eq!(replayed.len(), REQUESTS.len(), "{text}");
    for (i, (live, replayed)) in live.iter().zip(&replayed).enumerate() {
        assert_eq!(
            live, replayed,
            "request {i} ({} {}): live {live}, replayed {replayed}",
            REQUESTS[i].method, REQUESTS[i].target
        );
    }
    let run = find_key(&report, "bad_request").unwrap_or_else(|| panic!("no bad_request in {report}"));
    let routed: u64 = find_key(&report, "routes")
        .and_then(Value::as_array)
        .map(|routes| routes.iter().filter_map(|r| r["bad_request"].as_u64()).sum())
        .unwrap_or(0);
    assert_eq!(run.as_u64().unwrap_or(0) + routed, refused as u64, "replay refuses what the proxy refused: {report}");
}

/// The first value under `key` anywhere in `v` (the report nests its run).
fn find_key<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    match v {
        Value::Object(map) => map.get(key).or_else(|| map.values().find_map(|x| find_key(x, key))),
        Value::Array(items) => items.iter().find_map(|x| find_key(x, key)),
        _ => None,
    }
}
