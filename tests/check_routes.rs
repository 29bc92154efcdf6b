//! Issue 22, row 9: routes that could never match a request passed `weir check` and were silently
//! dead at run time. Now a spelling Weir can repair is compiled in the form requests are compared
//! in, with a warning naming the line; what is certainly a mistake is refused. The repaired
//! routes are then shown to limit live traffic.

use crate::support;

use std::time::Duration;

use support::config::{line_of, memory_with_app};
use support::http;
use support::upstream::Upstream;
use support::weir::{check_config, RunOutput, Weir};

const TIMEOUT: Duration = Duration::from_secs(15);

fn config(routes: &str) -> String {
    format!(
        "[server]\nlisten = [\"127.0.0.1:8080\"]\n[store]\nkind = \"memory\"\n\
         [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:9000\"]\n\
         [[limit_req_zone]]\nname = \"z\"\nkey = \"ip\"\nrate = \"1r/m\"\n{routes}"
    )
}

fn check(name: &str, text: &str) -> RunOutput {
    let out = check_config(name, text, TIMEOUT);
    assert!(!out.timed_out, "{}", out.describe());
    out
}

fn route(name: &str, matching: &str) -> String {
    format!("[[route]]\nname = \"{name}\"\n{matching}\nupstream = \"app\"\nlimit_req = [ {{ zone = \"z\" }} ]\n")
}

#[test]
fn repairable_spellings_are_compiled_canonical_with_a_warning_on_their_line() {
    let cases = [
        ("path = \"/caf%c3%a9\"", "matched as \"/caf%C3%A9\""),
        ("path = \"/caf\u{e9}\"", "matched as \"/caf%C3%A9\""),
        ("path_prefix = \"/a//b/./c\"", "matched as \"/a/b/c\""),
        ("host = \"API.example.com.\"\npath_prefix = \"/\"", "matched as \"api.example.com\""),
        ("path = \"/api/.*\"", "use path_regex"),
    ];
    for (matching, warning) in cases {
        let text = config(&route("r", matching));
        let out = check("warned.toml", &text);
        let line = line_of(&text, matching.lines().next().unwrap_or(matching));
        assert_eq!(out.code, Some(0), "{matching}: {}", out.describe());
        assert!(out.stderr.contains(warning), "{matching}: {}", out.describe());
        assert!(out.stderr.contains(&format!("warned.toml:{line}:")), "{matching}: {}", out.describe());
    }
}

#[test]
fn routes_that_can_never_match_are_refused() {
    let unlimited_first = "[[route]]\nname = \"open\"\npath = \"/login\"\nupstream = \"app\"\n".to_string()
        + &route("limited", "path = \"/login\"\nmethods = [\"POST\"]");
    let cases = [
        (config(&route("r", "host = \"api.example.com:8080\"\npath = \"/x\"")), "has a port"),
        (config(&route("r", "path = \"/x\"\nmethods = []")), "empty list matches no request"),
        (config(&route("r", "path = \"/x?y=1\"")), "never part of a request's path"),
        (config(&route("r", "path = \"/../x\"")), "can never match a request"),
        (config(&unlimited_first), "route \"open\" comes first"),
        (config(&route("r", "path = \"/x\"")).replace("key = \"ip\"", "key = \"header:X_Api_Key\""), "underscore"),
    ];
    for (text, message) in cases {
        let out = check("never.toml", &text);
        assert_eq!(out.code, Some(1), "{message}: {}", out.describe());
        assert!(out.stderr.contains(message), "{message}: {}", out.describe());
        assert!(out.stderr.contains("never.toml"), "{}", out.describe());
    }
    // A later route that differs in methods, host or path kind is not shadowed.
    let distinct = "[[route]]\nname = \"posts\"\npath = \"/login\"\nmethods = [\"POST\"]\nupstream = \"app\"\n"
        .to_string()
        + &route("any", "path = \"/login\"");
    assert_eq!(check("distinct.toml", &config(&distinct)).code, Some(0));
}

#[test]
fn repaired_routes_limit_live_requests() {
    let up = Upstream::start();
    let routes = r#"
[[limit_req_zone]]
name = "z"
key = "ip"
rate = "1r/m"

[[route]]
name = "cafe"
path = "/caf%c3%a9"
upstream = "app"
limit_req = [ { zone = "z", nodelay = true } ]

[[route]]
name = "host"
host = "API.example.com."
path_prefix = "/"
upstream = "app"
limit_req = [ { zone = "z", nodelay = true } ]
"#;
    let w = Weir::start(&memory_with_app(up.addr(), routes));
    assert_eq!(http::get(w.addr, "/caf%C3%A9").status, 200);
    for spelling in ["/caf%c3%a9", "/caf%C3%A9"] {
        assert_eq!(http::get(w.addr, spelling).status, 429, "{spelling}");
    }
    let raw = |host: &str| {
        let bytes = format!("GET /x HTTP/1.1\r\nHost: {host}\r\n\r\n");
        http::send_raw(w.addr, bytes.as_bytes()).expect("an answer").expect("a response").status
    };
    // The first request (the limited path) used the client's one request a minute in zone z.
    assert_eq!(raw("api.example.com"), 429);
    assert_eq!(raw("other.example.com"), 404);
}
