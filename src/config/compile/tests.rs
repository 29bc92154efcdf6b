//! One case per config error: the message must name the line and the field to fix.

use super::*;
use crate::config::{FailurePolicy, StoreSettings};
use crate::limit::DelayPolicy;
use crate::routes::PathMatch;
use crate::store::RedisClock;

/// These tables compile on this machine (their files are written by the tests).
fn compile(text: &str, file: &str) -> Result<Runtime, ConfigError> {
    super::compile(text, file, &crate::config::Machine)
}

const GOOD: &str = r#"
[server]
listen = ["127.0.0.1:8080"]
threads = 2

[real_ip]
trusted = ["10.0.0.0/8", "::1/128", "127.0.0.1"]

[[upstream]]
name = "app"
servers = ["127.0.0.1:9000", "localhost:9001"]

[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "10r/s"

[[limit_req_zone]]
name = "per_key"
key = ["header:X-Api-Key", "ip"]
rate = "600r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 20, nodelay = true }, { zone = "per_key", burst = 5, delay = 2 } ]
limit_req_status = 503

[[route]]
name = "rest"
path_prefix = "/"
upstream = "app"
"#;

fn compile_err(text: &str) -> ConfigError {
    compile(text, "t.toml").expect_err("config should be refused")
}

/// Replaces `from` in the good config and asserts the error's line and that it mentions `needle`.
fn assert_refused(from: &str, to: &str, line: usize, needle: &str) {
    assert!(GOOD.contains(from), "fixture lacks {from:?}");
    let err = compile_err(&GOOD.replacen(from, to, 1));
    assert_eq!(err.file, "t.toml");
    assert_eq!(err.line, Some(line), "{err}");
    assert!(err.to_string().contains(needle), "{err} should mention {needle:?}");
}

#[test]
fn good_config_compiles() {
    let rt = compile(GOOD, "t.toml").unwrap();
    assert_eq!(rt.server.threads, 2);
    assert_eq!(rt.upstreams[0].servers.len(), 2);
    assert_eq!(rt.routes[0].limits.len(), 2);
    assert_eq!(rt.routes[0].limits[1].limit.delay, DelayPolicy::After(2));
    assert_eq!(rt.routes[0].limits[0].limit.delay, DelayPolicy::NoDelay);
    assert_eq!(rt.routes[0].status, 503);
    assert_eq!(rt.routes[1].status, 429);
    assert!(matches!(rt.store, StoreSettings::Memory));
    assert_eq!(rt.real_ip.unwrap().trusted.len(), 3);
}

#[test]
fn refuses_with_file_line_and_field() {
    assert_refused("rate = \"10r/s\"", "rate = \"10/s\"", 16, "rate");
    assert_refused("zone = \"per_ip\", burst = 20", "zone = \"nope\", burst = 20", 27, "unknown zone \"nope\"");
    assert_refused(
        "upstream = \"app\"\nlimit_req",
        "upstream = \"ghost\"\nlimit_req",
        26,
        "unknown upstream \"ghost\"",
    );
    assert_refused("burst = 20", "burst = -1", 27, "burst");
    assert_refused("delay = 2", "delay = 9", 27, "delay");
    assert_refused("delay = 2", "delay = 2, nodelay = true", 27, "either delay or nodelay");
    assert_refused("path_prefix = \"/api/\"", "path_regex = \"^/v[0-9\"", 25, "path_regex");
    assert_refused("\"10.0.0.0/8\"", "\"10.0.0.0/33\"", 7, "real_ip.trusted");
    assert_refused("name = \"rest\"", "name = \"api\"", 31, "duplicate route name \"api\" (first defined on line 24)");
    assert_refused("name = \"per_key\"", "name = \"per_ip\"", 19, "duplicate limit_req_zone");
    assert_refused("limit_req_status = 503", "limit_req_status = 200", 28, "limit_req_status");
    assert_refused("threads = 2", "threads = 0", 4, "server.threads");
    assert_refused("\"127.0.0.1:8080\"", "\"localhost\"", 3, "server.listen");
    assert_refused("key = \"ip\"", "key = \"path\"", 15, "key");
    assert_refused("servers = [\"127.0.0.1:9000\"", "servers = [\"no-port\"", 11, "cannot resolve");
}

#[test]
fn refuses_unknown_fields_and_syntax_errors_with_lines() {
    let err = compile_err(&GOOD.replacen("limit_req_status = 503", "limit_req_stauts = 503", 1));
    assert_eq!(err.line, Some(28), "{err}");
    assert!(err.message.contains("limit_req_stauts"), "{err}");
    let err = compile_err(&GOOD.replacen("threads = 2", "threads = ", 1));
    assert_eq!(err.line, Some(4), "{err}");
    let err = compile_err(&GOOD.replacen("[[route]]\nname = \"rest\"", "[[route]]\nname = \"rest\"\nbogus = 1", 1));
    assert_eq!(err.line, Some(32), "{err}");
}

#[test]
fn store_settings() {
    let redis = GOOD.replacen("[real_ip]", "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"\ntimeout = \"40ms\"\nclock = \"local\"\n\n[real_ip]", 1);
    match compile(&redis, "t.toml").unwrap().store {
        StoreSettings::Redis(cfg, resilience) => {
            assert_eq!(resilience.on_error, FailurePolicy::Local);
            assert_eq!(resilience.fleet_size, 1);
            assert_eq!(cfg.timeout, Duration::from_millis(40));
            assert_eq!(cfg.clock, RedisClock::Local);
            assert_eq!(cfg.key_prefix, "weir:");
        }
        other => panic!("expected redis, got {other:?}"),
    }
    let err = compile_err(&GOOD.replacen("[real_ip]", "[store]\nkind = \"redis\"\n\n[real_ip]", 1));
    assert!(err.message.contains("store.url"), "{err}");
    let err =
        compile_err(&GOOD.replacen("[real_ip]", "[store]\nkind = \"memory\"\nurl = \"redis://x\"\n\n[real_ip]", 1));
    assert_eq!(err.line, Some(8));
    let err = compile_err(&GOOD.replacen("[real_ip]", "[store]\nkind = \"redis\"\nurl = \"http://x\"\n\n[real_ip]", 1));
    assert!(err.message.contains("store.url"), "{err}");
}

#[test]
fn exactly_one_path_kind() {
    let err = compile_err(&GOOD.replacen("path_prefix = \"/\"", "path_prefix = \"/\"\npath = \"/x\"", 1));
    assert!(err.message.contains("exactly one of path"), "{err}");
    let err = compile_err(&GOOD.replacen("path_prefix = \"/\"", "path_prefix = \"x\"", 1));
    assert!(err.message.contains("must start with '/'"), "{err}");
}

#[test]
fn durations() {
    assert_eq!(parse_duration("25ms"), Some(Duration::from_millis(25)));
    assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
    assert_eq!(parse_duration("100us"), Some(Duration::from_micros(100)));
    // Days, for windows as long as envoyproxy/ratelimit's week, month (30d) and year (365d).
    assert_eq!(parse_duration("30d"), Some(Duration::from_secs(30 * 86_400)));
    for bad in ["", "ms", "10", "1.5s", "10 ms", "5w"] {
        assert_eq!(parse_duration(bad), None, "{bad}");
    }
}

#[test]
fn max_keys_per_zone() {
    let rt = compile(GOOD, "t.toml").unwrap();
    assert_eq!(rt.zone_max_keys("per_ip"), crate::store::DEFAULT_MAX_KEYS);
    let text = GOOD.replacen("rate = \"10r/s\"", "rate = \"10r/s\"\nmax_keys = 5000", 1);
    let rt = compile(&text, "t.toml").unwrap();
    assert_eq!(rt.zone_max_keys("per_ip"), 5000);
    assert_eq!(rt.zone_max_keys("per_key"), crate::store::DEFAULT_MAX_KEYS);
    for bad in ["0", "-1", "100000001"] {
        assert_refused(
            "rate = \"10r/s\"",
            &format!("rate = \"10r/s\"\nmax_keys = {bad}"),
            17,
            "max_keys: must be 1..=",
        );
    }
    let conn = format!("{GOOD}\n[[limit_conn_zone]]\nname = \"c\"\nkey = \"ip\"\nmax_keys = 0\n");
    let err = compile_err(&conn);
    let line = conn.lines().position(|l| l == "max_keys = 0").map(|i| i + 1);
    assert_eq!(err.line, line, "{err}");
    assert!(err.to_string().contains("limit_conn_zone \"c\": max_keys: must be 1..="), "{err}");
    let conn = conn.replace("max_keys = 0", "max_keys = 7");
    assert_eq!(compile(&conn, "t.toml").unwrap().zone_max_keys("c"), 7);
}

/// Compiling asks the world only through `Outside`: with fixed answers (no such files on disk, no
/// such variable, no such DNS name) the config compiles from them alone, and an answer missing
/// from them is an error naming what was asked.
#[test]
fn compiles_from_fixed_answers_without_touching_the_machine() {
    use crate::config::{from_text_with, Fixed};
    use std::path::PathBuf;
    let text = r#"
[server]
listen = ["127.0.0.1:${WEIR_TEST_PORT_NOT_IN_ENV}"]
admin = "127.0.0.1:19901"
admin_token_file = "secrets/admin-token"

[jwt]
key_file = "jwt.key"
algorithm = "HS256"

[[upstream]]
name = "app"
servers = ["app.nowhere.invalid:9000"]

[[limit_req_zone]]
name = "per_user"
key = "jwt:sub"
rate = "10r/s"

[[route]]
name = "all"
path = "/"
upstream = "app"
limit_req = [{ zone = "per_user" }]
"#;
    let mut outside = Fixed::default();
    outside.vars.insert("WEIR_TEST_PORT_NOT_IN_ENV".into(), "18080".into());
    outside.files.insert(PathBuf::from("/cfg/secrets/admin-token"), b"0123456789abcdef-token\n".to_vec());
    outside.files.insert(PathBuf::from("/cfg/jwt.key"), b"a-shared-secret-of-32-bytes-long!\n".to_vec());
    outside.names.insert("app.nowhere.invalid:9000".into(), vec!["10.1.2.3:9000".parse().unwrap()]);
    let rt = from_text_with(text, "/cfg/weir.toml", &outside).expect("compiles from the fixed answers");
    assert_eq!(rt.server.listen, vec!["127.0.0.1:18080".parse::<SocketAddr>().unwrap()]);
    assert_eq!(rt.upstreams[0].spec.servers[0].addrs, vec!["10.1.2.3:9000".parse::<SocketAddr>().unwrap()]);
    assert!(rt.jwt.is_some());

    let mut no_key = outside.clone();
    no_key.files.remove(&PathBuf::from("/cfg/jwt.key"));
    let err = from_text_with(text, "/cfg/weir.toml", &no_key).expect_err("the key file is not among the answers");
    assert!(err.message.contains("/cfg/jwt.key"), "{err}");
}

#[test]
fn access_log_buffer() {
    let with_log = |log: &str| GOOD.replacen("[real_ip]", &format!("[log]\n{log}\n\n[real_ip]"), 1);
    let rt = compile(&with_log("access_log_buffer = 65536"), "t.toml").unwrap();
    assert_eq!(rt.log.access_buffer, Some(AccessBuffer { size: 65536, flush: Duration::from_secs(1) }));
    let rt = compile(&with_log("access_log_buffer = 4096\naccess_log_flush = \"250ms\""), "t.toml").unwrap();
    assert_eq!(rt.log.access_buffer, Some(AccessBuffer { size: 4096, flush: Duration::from_millis(250) }));
    assert_eq!(compile(&with_log("access_log_buffer = 0"), "t.toml").unwrap().log.access_buffer, None);
    assert_eq!(compile(GOOD, "t.toml").unwrap().log.access_buffer, None, "off by default");
    for (log, needle) in [
        ("access_log_buffer = 100", "log.access_log_buffer: bytes, 0 (off) or 512..=1048576"),
        ("access_log_buffer = 2000000", "log.access_log_buffer"),
        ("access_log_buffer = -1", "log.access_log_buffer"),
        ("access_log_flush = \"1s\"", "log.access_log_flush: only with log.access_log_buffer"),
        ("access_log_buffer = 4096\naccess_log_flush = \"0s\"", "log.access_log_flush: \"0s\" is not a duration"),
        ("access_log_buffer = 4096\naccess_log_flush = \"2h\"", "log.access_log_flush"),
        ("access_log_buffer = 4096\naccess_log_flush = \"soon\"", "log.access_log_flush"),
    ] {
        let err = compile_err(&with_log(log));
        assert!(err.line.is_some_and(|l| (6..=8).contains(&l)), "{log}: {err}");
        assert!(err.to_string().contains(needle), "{log}: {err} should mention {needle:?}");
    }
}

/// A config with one upstream, one zone and these routes (after the top-level `head`).
fn with_routes(head: &str, routes: &str) -> String {
    format!(
        "{head}\n[server]\nlisten = [\"127.0.0.1:8080\"]\n[[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:9000\"]\n\
         [[limit_req_zone]]\nname = \"z\"\nkey = \"ip\"\nrate = \"1r/s\"\n{routes}"
    )
}

fn route_toml(name: &str, matching: &str) -> String {
    format!("[[route]]\nname = \"{name}\"\n{matching}\nupstream = \"app\"\n")
}

#[test]
fn route_order_is_specific_unless_nginx_is_asked_for() {
    let routes = route_toml("all", "path_prefix = \"/\"") + &route_toml("v1", "path_regex = \"^/v1/\"");
    let rt = compile(&with_routes("", &routes), "t.toml").unwrap();
    assert_eq!(rt.route_order, RouteOrder::Specific);
    let rt = compile(&with_routes("route_order = \"nginx\"", &routes), "t.toml").unwrap();
    assert_eq!(rt.route_order, RouteOrder::Nginx);
    let find = |path| crate::routes::find(&rt.matchers, rt.route_order, None, &http::Method::GET, path);
    assert_eq!(find("/v1/x"), Some(1));
    assert_eq!(find("/v2/x"), Some(0));
    let err = compile_err(&with_routes("route_order = \"first\"", &routes));
    assert_eq!(err.to_string(), "t.toml:1: route_order: expected \"specific\" or \"nginx\", got \"first\"");
}

#[test]
fn skip_regex_needs_nginx_order_and_a_prefix() {
    let skipping = route_toml("img", "path_prefix = \"/img/\"\nskip_regex = true");
    let err = compile_err(&with_routes("", &skipping));
    assert_eq!(
        err.to_string(),
        "t.toml:14: route \"img\": skip_regex: only with route_order = \"nginx\" (under \"specific\" a prefix \
         already beats every regex)"
    );
    let rt = compile(&with_routes("route_order = \"nginx\"", &skipping), "t.toml").unwrap();
    assert!(rt.matchers[0].skip_regex);
    let exact = route_toml("img", "path = \"/img/\"\nskip_regex = true");
    let err = compile_err(&with_routes("route_order = \"nginx\"", &exact));
    assert_eq!(
        err.to_string(),
        "t.toml:14: route \"img\": skip_regex: only a path_prefix route can skip regexes (nginx `^~`)"
    );
}

#[test]
fn routes_a_broader_route_always_beats_are_named_in_either_order() {
    let routes = route_toml("all", "path_prefix = \"/\"")
        + &route_toml("v1", "path_regex = \"^/v1/\"")
        + &route_toml("api", "path_prefix = \"/api/\"")
        + &route_toml("any_api", "path_regex = \"^/api\"")
        + &route_toml("api_v2", "path_regex = \"^/api/v2/\"")
        + &route_toml("php", "path_regex = \"\\\\.php$\"");
    let specific = compile(&with_routes("", &routes), "t.toml").unwrap();
    let never: Vec<&String> = specific.warnings.iter().filter(|w| w.contains("can never match")).collect();
    assert_eq!(never.len(), 4, "{never:#?}");
    assert_eq!(
        never[0],
        "t.toml:15: route \"v1\": can never match: route \"all\" (line 11) always wins: a path_prefix beats every \
         path_regex under route_order = \"specific\""
    );
    let nginx = compile(&with_routes("route_order = \"nginx\"", &routes), "t.toml").unwrap();
    let never: Vec<&String> = nginx.warnings.iter().filter(|w| w.contains("can never match")).collect();
    assert_eq!(
        never,
        [
            "t.toml:19: route \"api\": can never match: route \"any_api\" (line 23) always wins: its path_regex \
             matches every path this route does, and regexes are tried first",
            "t.toml:27: route \"api_v2\": can never match: route \"any_api\" (line 23) always wins: its path_regex \
             matches every path this route does, and regexes are tried first",
        ],
        "{never:#?}"
    );
    // A route of another host, or with fewer methods, is not behind it.
    let routes = route_toml("any_api", "path_regex = \"^/api\"\nmethods = [\"GET\"]")
        + &route_toml("api", "path_prefix = \"/api/\"")
        + &route_toml("api_host", "host = \"a.example\"\npath_prefix = \"/api/\"");
    let nginx = compile(&with_routes("route_order = \"nginx\"", &routes), "t.toml").unwrap();
    assert!(!nginx.warnings.iter().any(|w| w.contains("can never match")), "{:#?}", nginx.warnings);
}

#[test]
fn a_prefix_keeps_its_partial_last_segment() {
    let routes = route_toml("dotfiles", "path_prefix = \"/.\"") + &route_toml("up", "path_prefix = \"/a/..\"");
    let rt = compile(&with_routes("", &routes), "t.toml").unwrap();
    assert!(matches!(&rt.matchers[0].path, PathMatch::Prefix(p) if p == "/."));
    assert!(matches!(&rt.matchers[1].path, PathMatch::Prefix(p) if p == "/a/.."));
    assert!(rt.warnings.iter().all(|w| !w.contains("matched as")), "{:#?}", rt.warnings);
    let find = |path| crate::routes::find(&rt.matchers, rt.route_order, None, &http::Method::GET, path);
    assert_eq!(find("/.git/config"), Some(0));
    assert_eq!(find("/index.html"), None);
    // The directory part is still repaired, with a warning; escapes of the last segment decoded.
    let routes = route_toml("dot", "path_prefix = \"/x//%2e\"");
    let rt = compile(&with_routes("", &routes), "t.toml").unwrap();
    assert!(matches!(&rt.matchers[0].path, PathMatch::Prefix(p) if p == "/x/."));
    assert_eq!(
        rt.warnings,
        ["t.toml:13: route \"dot\": path_prefix = \"/x//%2e\" is matched as \"/x/.\", the spelling requests are normalised to"]
    );
}

#[test]
fn hosts_take_lists_and_trailing_wildcards() {
    let routes = route_toml("www", "host = [\"www.*\", \"example.com\", \"*.example.org\"]\npath_prefix = \"/\"");
    let rt = compile(&with_routes("", &routes), "t.toml").unwrap();
    assert_eq!(rt.matchers[0].hosts.len(), 3);
    let find = |host| crate::routes::find(&rt.matchers, rt.route_order, Some(host), &http::Method::GET, "/");
    assert_eq!(find("www.example.net"), Some(0));
    assert_eq!(find("example.com"), Some(0));
    assert_eq!(find("a.example.org"), Some(0));
    assert_eq!(find("example.org"), None);
    for (host, message) in [
        ("[]", "t.toml:13: route \"r\": host: an empty list matches no request; remove `host` to match every host"),
        ("\"*.www.*\"", "t.toml:13: route \"r\": host: \"*.www.*\": a wildcard goes at one end only"),
        ("[\"a.com\", \"A.com\"]", "t.toml:13: route \"r\": host: \"A.com\" is listed twice"),
        ("\"w*w.com\"", "t.toml:13: route \"r\": host: \"w*w.com\" is not a host name"),
    ] {
        let err = compile_err(&with_routes("", &route_toml("r", &format!("host = {host}\npath_prefix = \"/\""))));
        assert_eq!(err.to_string(), message);
    }
}

#[test]
fn routes_inherit_what_they_do_not_set_from_host_defaults_then_defaults() {
    let head = "";
    let routes = r#"
[[limit_conn_zone]]
name = "c"
key = "ip"

[defaults]
limit_req = [ { zone = "z", burst = 20, nodelay = true } ]
limit_req_status = 503
deny = ["192.0.2.0/24"]

[[host_defaults]]
hosts = ["api.example.com", "www.example.com"]
limit_conn = [ { zone = "c", max = 10 } ]
limit_conn_status = 444
allow = ["10.0.0.0/8"]
deny = ["all"]

[[route]]
name = "plain"
path_prefix = "/"
upstream = "app"

[[route]]
name = "api"
host = "API.example.com"
path_prefix = "/"
upstream = "app"

[[route]]
name = "own"
host = ["api.example.com", "www.example.com"]
path = "/login"
upstream = "app"
limit_req = [ { zone = "z", burst = 5 } ]
limit_req_status = 429
allow = ["192.0.2.1"]

[[route]]
name = "none"
host = "www.example.com"
path = "/open"
upstream = "app"
limit_req = []
limit_conn = []
"#;
    let rt = compile(&with_routes(head, routes), "t.toml").unwrap();
    let [plain, api, own, none] = &rt.routes[..] else { panic!("four routes") };
    assert_eq!((plain.limits.len(), plain.limits[0].limit.burst, plain.status), (1, 20, 503));
    assert_eq!((plain.conn_limits.len(), plain.conn_status, plain.access.len()), (0, 503, 1));
    // The host entry inherits [defaults]' limit_req and status, and sets its own conn and access.
    assert_eq!((api.limits[0].limit.burst, api.status), (20, 503));
    assert_eq!((api.conn_limits.len(), api.conn_status, api.access.len()), (1, 444, 3));
    // A route that sets a field replaces it whole; allow alone replaces allow and deny.
    assert_eq!((own.limits.len(), own.limits[0].limit.burst, own.status), (1, 5, 429));
    assert_eq!((own.conn_limits.len(), own.access.len()), (1, 1));
    assert_eq!((none.limits.len(), none.conn_limits.len(), none.status), (0, 0, 503));
}

#[test]
fn host_defaults_refuse_what_would_give_a_route_two_servers() {
    let entries = "[[host_defaults]]\nhosts = [\"a.example\"]\nlimit_req_status = 503\n\
                   [[host_defaults]]\nhosts = [\"b.example\"]\nlimit_req_status = 444\n";
    let cases = [
        (
            route_toml("r", "host = [\"a.example\", \"b.example\"]\npath = \"/\""),
            "t.toml:17: route \"r\": hosts \"a.example\" (line 11) and \"b.example\" (line 14) are in different \
             [[host_defaults]] entries; a route inherits from one entry, so give it one",
        ),
        (
            route_toml("r", "host = [\"c.example\", \"a.example\"]\npath = \"/\""),
            "t.toml:17: route \"r\": host \"c.example\" is in no [[host_defaults]] entry but \"a.example\" is (line 11); \
             a route inherits from one entry, so give it one",
        ),
    ];
    for (route, message) in cases {
        assert_eq!(compile_err(&with_routes("", &(entries.to_string() + &route))).to_string(), message);
    }
    let twice = "[[host_defaults]]\nhosts = [\"a.example\"]\n[[host_defaults]]\nhosts = [\"A.example\"]\n";
    assert_eq!(
        compile_err(&with_routes("", twice)).to_string(),
        "t.toml:14: host_defaults.hosts: \"A.example\" is already in the entry on line 11"
    );
    // An inherited value's error names the line it was written on.
    let bad = "[defaults]\nlimit_req = [ { zone = \"nope\" } ]\n".to_string() + &route_toml("r", "path = \"/\"");
    assert_eq!(
        compile_err(&with_routes("", &bad)).to_string(),
        "t.toml:12: route \"r\": limit_req: unknown zone \"nope\" (defined: z)"
    );
}

#[test]
fn limit_conditions_decide_which_references_apply() {
    let routes = r#"
[[limit_conn_zone]]
name = "c"
key = "ip"

[[route]]
name = "r"
path_prefix = "/"
upstream = "app"
limit_req = [
  { zone = "z", unless = [ { header = "X-Bypass", equals = "s3cret" }, { ip = ["10.0.0.0/8", "192.0.2.7"] } ] },
  { zone = "z2", when = [ { method = ["post"] }, { cookie = "session", present = false } ] },
  { zone = "z3", when = [ { header = "User-Agent", matches = "(?i)bot" } ] },
]
limit_conn = [ { zone = "c", max = 1, when = [ { query = "heavy", present = true } ] } ]
"#;
    let zones = "[[limit_req_zone]]\nname = \"z2\"\nkey = \"ip\"\nrate = \"1r/s\"\n\
                 [[limit_req_zone]]\nname = \"z3\"\nkey = \"ip\"\nrate = \"1r/s\"\n";
    let rt = compile(&with_routes("", &(zones.to_string() + routes)), "t.toml").unwrap();
    let route = &rt.routes[0];
    let applies = |reference: usize, ip: &str, method: http::Method, headers: &[(&str, &str)], query: Option<&str>| {
        let mut map = http::HeaderMap::new();
        for (name, value) in headers {
            map.append(http::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
        }
        let mut facts = crate::keys::RequestFacts::new(ip.parse().ok(), &map, query);
        facts.method = Some(&method);
        match reference {
            3 => crate::engine::conditions_apply(&route.conn_limits[0].conditions, &facts),
            i => crate::engine::conditions_apply(&route.limits[i].conditions, &facts),
        }
    };
    use http::Method;
    assert!(applies(0, "203.0.113.1", Method::GET, &[], None));
    assert!(applies(0, "203.0.113.1", Method::GET, &[("x-bypass", "s3cre")], None), "a wrong token is limited");
    assert!(!applies(0, "203.0.113.1", Method::GET, &[("x-bypass", "s3cret")], None));
    assert!(!applies(0, "10.1.2.3", Method::GET, &[], None));
    assert!(!applies(0, "192.0.2.7", Method::GET, &[], None));
    assert!(applies(1, "203.0.113.1", Method::POST, &[], None));
    assert!(!applies(1, "203.0.113.1", Method::GET, &[], None));
    assert!(!applies(1, "203.0.113.1", Method::POST, &[("cookie", "session=abc")], None), "logged in");
    assert!(applies(2, "203.0.113.1", Method::GET, &[("user-agent", "GoogleBot/2.1")], None));
    assert!(!applies(2, "203.0.113.1", Method::GET, &[("user-agent", "Firefox")], None));
    assert!(!applies(2, "203.0.113.1", Method::GET, &[], None));
    assert!(applies(3, "203.0.113.1", Method::GET, &[], Some("heavy=1")));
    assert!(!applies(3, "203.0.113.1", Method::GET, &[], Some("light=1")));
    // The secret is never printed.
    assert!(!format!("{:?}", route.limits[0].conditions).contains("s3cret"));
}

#[test]
fn limit_conditions_are_refused_with_their_line() {
    let cases = [
        ("when = []", "t.toml:15: route \"r\": when: an empty list; remove it"),
        (
            "when = [ { header = \"X-A\", cookie = \"b\", present = true } ]",
            "t.toml:15: route \"r\": when: give exactly one of header, cookie, query, method or ip in each condition",
        ),
        (
            "unless = [ { header = \"X-A\" } ]",
            "t.toml:15: route \"r\": unless: give exactly one of present, equals or matches for the header",
        ),
        (
            "unless = [ { header = \"X-A\", equals = \"\" } ]",
            "t.toml:15: route \"r\": unless: equals: an empty value; use present = false",
        ),
        (
            "when = [ { header = \"X-A\", matches = \"(\" } ]",
            "t.toml:15: route \"r\": when: matches: invalid regex: regex parse error:\n    (\n    ^\nerror: unclosed group",
        ),
        (
            "unless = [ { ip = [\"10.0.0.0/33\"] } ]",
            "t.toml:15: route \"r\": unless: ip: \"10.0.0.0/33\" is not an IP address or a CIDR like \"10.0.0.0/8\"",
        ),
        ("when = [ { method = [\"GET\"], present = true } ]", "t.toml:15: route \"r\": when: method takes no present, equals or matches"),
        ("when = [ { method = [\"G T\"] } ]", "t.toml:15: route \"r\": when: method: \"G T\" is not an HTTP method"),
    ];
    for (conditions, message) in cases {
        let route = format!("[[route]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_req = [ {{ zone = \"z\", {conditions} }} ]\n");
        assert_eq!(compile_err(&with_routes("", &route)).to_string(), message, "{conditions}");
    }
}

#[test]
fn rejection_bodies_are_checked() {
    let cases = [
        (
            "rejection_content_type = \"text/html\"",
            "t.toml:15: route \"r\": rejection_content_type: only applies with rejection_body",
        ),
        (
            "rejection_body = \"x\"\nrejection_content_type = \"text/html\\n\"",
            "t.toml:16: route \"r\": rejection_content_type: \"text/html\\n\" is not a header value",
        ),
    ];
    for (fields, message) in cases {
        let route = format!("[[route]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\n{fields}\n");
        assert_eq!(compile_err(&with_routes("", &route)).to_string(), message, "{fields}");
    }
    let big = format!(
        "[[route]]\nname = \"r\"\npath = \"/\"\nupstream = \"app\"\nrejection_body = \"{}\"\n",
        "x".repeat(65537)
    );
    assert_eq!(
        compile_err(&with_routes("", &big)).to_string(),
        "t.toml:15: route \"r\": rejection_body: 65537 bytes; at most 65536"
    );
    let ok = "[[route]]\nname = \"r\"\npath = \"/\"\nupstream = \"app\"\nrejection_body = \"slow down\"\n";
    let rt = compile(&with_routes("", ok), "t.toml").unwrap();
    let own = rt.routes[0].rejection.as_ref().unwrap();
    assert_eq!((own.content_type.as_str(), own.body.as_str()), ("text/plain; charset=utf-8", "slow down"));
}

/// Every error of `text` (`compile_all`), as `line: message`, in the order found.
fn all_errors(text: &str) -> Vec<String> {
    let errors = compile_all(text, "t.toml", &crate::config::Machine).expect_err("config should be refused");
    errors.iter().map(|e| format!("{}: {}", e.line.map_or("-".to_string(), |l| l.to_string()), e.message)).collect()
}

fn line_of(text: &str, needle: &str) -> usize {
    text.find(needle).map(|i| text[..i].matches('\n').count() + 1).expect("needle in text")
}

#[test]
fn an_error_in_each_zone_and_route_is_reported_at_once() {
    // A bad rate in one zone, an unknown key part in another, an unknown upstream in a route
    // that names neither.
    let text = GOOD
        .replacen("rate = \"10r/s\"", "rate = \"10/s\"", 1)
        .replacen("\"header:X-Api-Key\"", "\"hedder:X-Api-Key\"", 1)
        .replacen("path_prefix = \"/\"\nupstream = \"app\"", "path_prefix = \"/\"\nupstream = \"ghost\"", 1);
    let found = all_errors(&text);
    assert_eq!(found.len(), 3, "{found:#?}");
    let expect = [
        (line_of(&text, "\"10/s\""), "limit_req_zone \"per_ip\": rate"),
        (line_of(&text, "hedder:"), "limit_req_zone \"per_key\": key"),
        (line_of(&text, "\"ghost\""), "route \"rest\": upstream: unknown upstream \"ghost\""),
    ];
    for ((line, start), got) in expect.iter().zip(&found) {
        assert!(got.starts_with(&format!("{line}: {start}")), "{got} should start with {line}: {start}");
    }
}

#[test]
fn a_route_naming_a_broken_item_gets_no_error_of_its_own() {
    // Route "api" names both zones, route "rest" the upstream: one error each for the zone and
    // the upstream, no "unknown zone" or "unknown upstream" after them.
    let text = GOOD.replacen("rate = \"600r/m\"", "rate = \"600\"", 1).replacen(
        "servers = [\"127.0.0.1:9000\", \"localhost:9001\"]",
        "servers = [\"127.0.0.1:9000\", \"nowhere\"]",
        1,
    );
    let found = all_errors(&text);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found.iter().all(|e| !e.contains("unknown")), "{found:#?}");
    assert!(found[0].starts_with("limit_req_zone ") || found[0].contains("upstream \"app\""), "{found:#?}");
}

#[test]
fn a_duplicate_name_still_names_the_first() {
    let text = with_routes(
        // `with_routes` defines a zone "z" of its own after this one.
        "[[limit_req_zone]]\nname = \"z\"\nkey = \"ip\"\nrate = \"2r/s\"\n",
        "[[route]]\nname = \"a\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_req = [ { zone = \"z\" } ]\n",
    );
    let found = all_errors(&text);
    assert_eq!(found.len(), 1, "only the duplicate, the route finds the first \"z\": {found:#?}");
    assert!(found[0].contains("duplicate limit_req_zone name \"z\""), "{found:#?}");
}

#[test]
fn a_failed_route_takes_its_matcher_with_it() {
    // "b" fails after its path was compiled; "c" has the same path and must not be told that
    // "b" shadows it (nor that any other route does).
    let routes = "[[route]]\nname = \"a\"\npath = \"/a\"\nupstream = \"app\"\n\
                  [[route]]\nname = \"b\"\npath = \"/b\"\nupstream = \"app\"\nlimit_req_status = 200\n\
                  [[route]]\nname = \"c\"\npath = \"/b\"\nupstream = \"app\"\ngrpc_status = 99\n";
    let text = with_routes("", routes);
    let found = all_errors(&text);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found[0].contains("route \"b\": limit_req_status"), "{found:#?}");
    assert!(found[1].contains("route \"c\": grpc_status"), "{found:#?}");
}

#[test]
fn an_error_in_each_limit_conn_zone_and_upstream() {
    let head = "[[upstream]]\nname = \"u1\"\nservers = [\"nowhere\"]\n\
                [[upstream]]\nname = \"u2\"\nservers = [\"127.0.0.1:1\"]\nmax_fails = -1\n\
                [[limit_conn_zone]]\nname = \"c1\"\nkey = \"nope:x\"\n\
                [[limit_conn_zone]]\nname = \"c2\"\nkey = \"ip\"\nmax_keys = 0\n";
    let text = with_routes(head, "");
    let found = all_errors(&text);
    assert_eq!(found.len(), 4, "{found:#?}");
    for (i, needle) in
        ["upstream \"u1\"", "upstream \"u2\"", "limit_conn_zone \"c1\"", "limit_conn_zone \"c2\""].iter().enumerate()
    {
        assert!(found[i].contains(needle), "{needle}: {found:#?}");
    }
}

#[test]
fn a_syntax_error_is_one_error() {
    let text = GOOD.replacen("threads = 2", "threads = = 2", 1);
    let found = all_errors(&format!("{text}\n[[limit_req_zone]]\nname = \"bad name!\"\n"));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].starts_with(&format!("{}: ", line_of(&text, "threads = = 2"))), "{found:#?}");
}
