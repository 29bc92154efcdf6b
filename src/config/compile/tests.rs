//! One case per config error: the message must name the line and the field to fix.

use super::*;
use crate::config::{FailurePolicy, StoreSettings};
use crate::limit::DelayPolicy;
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
