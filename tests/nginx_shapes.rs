//! Issue 48, item 1: what nginx configs say, said in Weir's own config and shown on live traffic
//! through the real binary: nginx's location order (`route_order = "nginx"`, `skip_regex`),
//! `path_prefix = "/."` denying dot files only, limits and statuses inherited from `[defaults]`
//! and `[[host_defaults]]`, a 444 that closes the connection, host lists and `www.*`.

use crate::support;

use std::time::Duration;

use support::access_log::wait_for_access_lines;
use support::config::{line_of, memory_with_app, with_app};
use support::http;
use support::upstream::Upstream;
use support::weir::{check_config, Weir};

const TIMEOUT: Duration = Duration::from_secs(15);

/// `weir check` on `text`, with the listener Weir::start would fill in.
fn check(name: &str, text: &str) -> support::weir::RunOutput {
    check_config(name, &text.replace("$LISTEN", "127.0.0.1:8080"), TIMEOUT)
}

/// One request a minute per client, no burst: the second request of a test is over the limit.
const ZONE: &str = "[[limit_req_zone]]\nname = \"z\"\nkey = \"ip\"\nrate = \"1r/m\"\n";

const REGEX_BEHIND_ROOT: &str = r#"
[[route]]
name = "all"
path_prefix = "/"
upstream = "app"

[[route]]
name = "v1"
path_regex = "^/v1/"
upstream = "app"
limit_req = [ { zone = "z" } ]

[[route]]
name = "static"
path_prefix = "/v1/static/"
upstream = "app"
"#;

#[test]
fn nginx_order_lets_a_regex_beat_the_root_prefix_and_check_names_the_dead_route() {
    let up = Upstream::start();
    let routes = format!("{ZONE}{REGEX_BEHIND_ROOT}");
    // The default order: the root prefix shadows the regex, and `weir check` says so on its line.
    let specific = memory_with_app(up.addr(), &routes);
    let out = check("specific.toml", &specific);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let line = line_of(&specific, "name = \"v1\"") - 1;
    assert!(
        out.stderr.contains(&format!("specific.toml:{line}: route \"v1\": can never match: route \"all\"")),
        "{}",
        out.describe()
    );
    let w = Weir::start(&specific);
    for _ in 0..2 {
        assert_eq!(http::get(w.addr, "/v1/users").status, 200, "the regex route never runs");
    }
    drop(w);

    // nginx's order: the regex is tried before the remembered prefix.
    let nginx = format!("route_order = \"nginx\"\n{specific}");
    let out = check("nginx.toml", &nginx);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    // Now the regex wins, and the longer prefix without skip_regex is the dead route.
    assert!(!out.stderr.contains("route \"v1\": can never match"), "{}", out.describe());
    assert!(out.stderr.contains("route \"static\": can never match: route \"v1\""), "{}", out.describe());
    let w = Weir::start(&nginx);
    assert_eq!(http::get(w.addr, "/v1/users").status, 200);
    assert_eq!(http::get(w.addr, "/v1/users").status, 429);
    // A longer prefix without skip_regex still loses to the regex (nginx checks regexes after it).
    assert_eq!(http::get(w.addr, "/v1/static/a.css").status, 429);
    assert_eq!(http::get(w.addr, "/other").status, 200);
    drop(w);

    // `^~`: the longest prefix skips the regexes.
    let skipping = nginx.replace("path_prefix = \"/v1/static/\"", "path_prefix = \"/v1/static/\"\nskip_regex = true");
    assert!(!check("skipping.toml", &skipping).stderr.contains("can never match"));
    let w = Weir::start(&skipping);
    assert_eq!(http::get(w.addr, "/v1/users").status, 200);
    for _ in 0..3 {
        assert_eq!(http::get(w.addr, "/v1/static/a.css").status, 200);
    }
    assert_eq!(http::get(w.addr, "/v1/users").status, 429);
}

#[test]
fn a_dot_prefix_denies_dot_files_not_the_site() {
    let up = Upstream::start();
    let routes = r#"
[[route]]
name = "dotfiles"
path_prefix = "/."
upstream = "app"
deny = ["all"]

[[route]]
name = "site"
path_prefix = "/"
upstream = "app"
"#;
    let conf = memory_with_app(up.addr(), routes);
    let out = check("dot.toml", &conf);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(!out.stderr.contains("matched as"), "nothing is rewritten: {}", out.describe());
    let w = Weir::start(&conf);
    for path in ["/.git/config", "/.env", "/%2eenv"] {
        assert_eq!(http::get(w.addr, path).status, 403, "{path}");
    }
    for path in ["/", "/index.html", "/a/.b"] {
        assert_eq!(http::get(w.addr, path).status, 200, "{path}");
    }
}

#[test]
fn routes_without_limits_inherit_the_hosts_then_the_defaults() {
    let up = Upstream::start();
    let routes = format!(
        r#"{ZONE}
[[limit_req_zone]]
name = "per_host_ip"
key = "ip"
rate = "1r/m"

[defaults]
limit_req = [ {{ zone = "z" }} ]
limit_req_status = 503

[[host_defaults]]
hosts = ["api.example.com"]
limit_req = [ {{ zone = "per_host_ip" }} ]
limit_req_status = 444

[[route]]
name = "site"
path_prefix = "/"
upstream = "app"

[[route]]
name = "api"
host = "api.example.com"
path_prefix = "/"
upstream = "app"

[[route]]
name = "open"
path = "/health"
upstream = "app"
limit_req = []
"#
    );
    let conf = with_app("", "[store]\nkind = \"memory\"\n[log]\nformat = \"json\"\n", up.addr(), &routes);
    let w = Weir::start(&conf);
    let get = |host: &str, path: &str| {
        let bytes = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n");
        http::send_raw(w.addr, bytes.as_bytes()).expect("the connection").map(|r| r.status)
    };
    assert_eq!(get("www.example.com", "/"), Some(200));
    assert_eq!(get("www.example.com", "/"), Some(503), "[defaults]' limit and status");
    for _ in 0..3 {
        assert_eq!(get("www.example.com", "/health"), Some(200), "limit_req = [] inherits none");
    }
    assert_eq!(get("api.example.com", "/"), Some(200), "the host's own zone, not [defaults]'");
    // limit_req_status 444: the connection is closed without a response, as nginx does.
    assert_eq!(get("api.example.com", "/"), None);
    let lines = wait_for_access_lines(&w, 7);
    let statuses: Vec<u64> = lines.iter().filter_map(|l| l["status"].as_u64()).collect();
    assert_eq!(statuses, [200, 503, 200, 200, 200, 200, 444], "{lines:#?}");
    assert!(!w.stderr().contains("ERROR"), "a 444 is a decision, not an error: {}", w.stderr());
}

#[test]
fn host_lists_and_trailing_wildcards_match_live_requests() {
    let up = Upstream::start();
    let routes = r#"
[[route]]
name = "www"
host = ["www.*", "example.com"]
path_prefix = "/"
upstream = "app"
"#;
    let w = Weir::start(&memory_with_app(up.addr(), routes));
    let status = |host: &str| {
        let bytes = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
        http::send_raw(w.addr, bytes.as_bytes()).expect("an answer").expect("a response").status
    };
    assert_eq!(status("www.example.org"), 200);
    assert_eq!(status("EXAMPLE.com:8080"), 200);
    assert_eq!(status("api.example.com"), 404);
}

#[test]
fn a_bypass_token_exempts_and_a_made_up_one_shares_the_clients_bucket() {
    let up = Upstream::start();
    let routes = format!(
        r#"{ZONE}
[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
limit_req = [
  {{ zone = "z", unless = [ {{ header = "X-Bypass", equals = "s3cret-token" }} ] }},
]

[[route]]
name = "forms"
path_prefix = "/forms/"
upstream = "app"
limit_req = [ {{ zone = "z", when = [ {{ method = ["POST"] }} ] }} ]
"#
    );
    let w = Weir::start(&memory_with_app(up.addr(), &routes));
    let send = |method: &str, path: &str, token: Option<&str>| {
        let mut req = http::Request::new(method, path);
        if let Some(t) = token {
            req = req.header("X-Bypass", t);
        }
        if method == "POST" {
            req = req.body(b"x");
        }
        http::must_send(w.addr, &req).status
    };
    for _ in 0..3 {
        assert_eq!(send("GET", "/forms/a", None), 200, "GET is not limited on /forms/");
    }
    assert_eq!(send("POST", "/forms/a", None), 200);
    assert_eq!(send("POST", "/forms/a", None), 429);
    // The client's one request a minute is spent: a made-up token is limited like no token.
    for guess in [None, Some("guess-1"), Some("guess-2"), Some("s3cret-tokeN")] {
        assert_eq!(send("GET", "/x", guess), 429, "{guess:?}");
    }
    for _ in 0..3 {
        assert_eq!(send("GET", "/x", Some("s3cret-token")), 200);
    }
}

#[test]
fn a_routes_own_rejection_body_and_real_ip_without_recursion() {
    let up = Upstream::start();
    // The peer (127.0.0.1) is trusted, and so is 10.0.0.0/8: without recursion the header's last
    // address is the client even though it is a trusted one (nginx `real_ip_recursive off`).
    let sections =
        "[store]\nkind = \"memory\"\n[real_ip]\ntrusted = [\"127.0.0.1\", \"10.0.0.0/8\"]\nrecursive = false\n";
    let routes = format!(
        r#"{ZONE}
[defaults]
rejection_body = "<h1>Slow down</h1>"
rejection_content_type = "text/html"

[[route]]
name = "site"
path_prefix = "/"
upstream = "app"
limit_req = [ {{ zone = "z" }} ]
limit_req_status = 503
"#
    );
    let w = Weir::start(&with_app("", sections, up.addr(), &routes));
    let from = |xff: &str| http::get_with(w.addr, "/", &[("X-Forwarded-For", xff)]);
    assert_eq!(from("203.0.113.9, 10.1.1.1").status, 200);
    // Same last hop: the same client, although the first address differs.
    let refused = from("198.51.100.4, 10.1.1.1");
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("content-type").as_deref(), Some("text/html"));
    assert_eq!(refused.text(), "<h1>Slow down</h1>");
    assert!(refused.has_header("retry-after"));
    // Another last hop is another client.
    assert_eq!(from("203.0.113.9, 10.1.1.2").status, 200);
}
