//! `weir check -c FILE`, `weir -c BAD`, `--help`: exit codes and error messages that name the
//! file, the line and the offending field or name.

use crate::support;

use std::time::Duration;

use support::config::{line_of, nth_line_of};
use support::weir::{check_config, run, ConfigDir, RunOutput};

const TIMEOUT: Duration = Duration::from_secs(15);

/// A valid config using every section. Line numbers in the tests are computed from the text,
/// not hard-coded.
const GOOD: &str = r#"[server]
listen = ["127.0.0.1:8080"]
threads = 2

[store]
kind = "memory"

[real_ip]
trusted = ["10.0.0.0/8", "127.0.0.1/32", "::1/128"]
header = "X-Forwarded-For"

[[upstream]]
name = "app"
servers = ["127.0.0.1:9000", "127.0.0.1:9001"]

[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "10r/s"

[[limit_req_zone]]
name = "per_key"
key = ["ip", "header:X-Api-Key"]
rate = "100r/m"

[[limit_req_zone]]
name = "hourly"
key = "query:token"
rate = "500r/h"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 20, nodelay = true } ]
limit_req_status = 429
dry_run = false

[[route]]
name = "versioned"
path_regex = "^/v[0-9]+/"
methods = ["GET", "HEAD"]
upstream = "app"
limit_req = [ { zone = "per_key", burst = 5, delay = 2 }, { zone = "hourly", burst = 0 } ]

[[route]]
name = "health"
path = "/health"
host = "example.com"
upstream = "app"
"#;

fn good() -> String {
    GOOD.to_string()
}

/// Replace exactly one occurrence of `from` (the `nth`) by `to`.
fn mutate(text: &str, from: &str, nth: usize, to: &str) -> String {
    let idx = text.match_indices(from).nth(nth).unwrap_or_else(|| panic!("{from:?} (#{nth}) not in config")).0;
    format!("{}{}{}", &text[..idx], to, &text[idx + from.len()..])
}

fn check(name: &str, text: &str) -> RunOutput {
    check_config(name, text, TIMEOUT)
}

/// Does `stderr` mention line `n` (as `:N` like `file.toml:N:`, or `line N`)?
fn mentions_line(stderr: &str, n: usize) -> bool {
    let re = regex::Regex::new(&format!(r"(?i)(?::|\bline\s+){n}\b")).unwrap();
    re.is_match(stderr)
}

/// `weir check` must fail with exit 1 and a message naming the file, one of `lines` and one
/// of `names`.
fn expect_error(case: &str, text: &str, lines: &[usize], names: &[&str]) {
    let file = format!("{case}.toml");
    let out = check(&file, text);
    let ctx = format!("case {case}: expected line {lines:?} naming one of {names:?}\n{}", out.describe());
    assert!(!out.timed_out, "{ctx}");
    assert_eq!(out.code, Some(1), "exit code 1 for an invalid config: {ctx}");
    assert!(!out.stderr.trim().is_empty(), "error on stderr: {ctx}");
    assert!(out.stderr.contains(&file), "stderr names the file: {ctx}");
    assert!(lines.iter().any(|&l| mentions_line(&out.stderr, l)), "stderr names the line: {ctx}");
    if !names.is_empty() {
        assert!(names.iter().any(|n| out.stderr.contains(n)), "stderr names the offending field/name: {ctx}");
    }
}

#[test]
fn good_file_is_ok() {
    let out = check("good.toml", &good());
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.to_lowercase().contains("ok"), "stdout says ok: {}", out.describe());
}

#[test]
fn minimal_file_is_ok() {
    let text = r#"[server]
listen = ["127.0.0.1:8080"]

[[upstream]]
name = "app"
servers = ["127.0.0.1:9000"]

[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
"#;
    let out = check("minimal.toml", text);
    assert_eq!(out.code, Some(0), "{}", out.describe());
}

#[test]
fn syntax_error() {
    let t = mutate(&good(), "threads = 2", 0, "threads = = 2");
    expect_error("syntax", &t, &[line_of(&t, "threads = = 2")], &[]);
}

#[test]
fn unknown_field_in_route() {
    let t = mutate(&good(), "dry_run = false", 0, "dry_runn = false");
    expect_error("unknown_field", &t, &[line_of(&t, "dry_runn")], &["dry_runn"]);
}

#[test]
fn unknown_field_in_section() {
    let t = mutate(&good(), r#"kind = "memory""#, 0, "kind = \"memory\"\nkindd = 1");
    expect_error("unknown_store_field", &t, &[line_of(&t, "kindd")], &["kindd"]);
}

#[test]
fn unknown_field_in_limit_req_entry() {
    let t = mutate(&good(), "nodelay = true }", 0, "nodelay = true, bursts = 3 }");
    expect_error("unknown_limit_field", &t, &[line_of(&t, "bursts")], &["bursts"]);
}

#[test]
fn unknown_zone() {
    let t = mutate(&good(), r#"zone = "per_ip""#, 0, r#"zone = "nope""#);
    expect_error("unknown_zone", &t, &[line_of(&t, r#""nope""#)], &["nope"]);
}

#[test]
fn unknown_upstream() {
    // The third route's upstream.
    let t = mutate(&good(), r#"upstream = "app""#, 2, r#"upstream = "ghost-free""#);
    expect_error("unknown_upstream", &t, &[line_of(&t, "ghost-free")], &["ghost-free"]);
}

#[test]
fn bad_rate() {
    let t = mutate(&good(), r#"rate = "10r/s""#, 0, r#"rate = "10/s""#);
    expect_error("bad_rate", &t, &[line_of(&t, r#""10/s""#)], &["rate", "10/s"]);
}

#[test]
fn negative_burst() {
    let t = mutate(&good(), "burst = 20", 0, "burst = -1");
    expect_error("negative_burst", &t, &[line_of(&t, "burst = -1")], &["burst"]);
}

#[test]
fn bad_regex() {
    let t = mutate(&good(), r#""^/v[0-9]+/""#, 0, r#""^/v[0-9+/""#);
    expect_error("bad_regex", &t, &[line_of(&t, "path_regex")], &["path_regex", "^/v[0-9+/"]);
}

#[test]
fn bad_cidr() {
    let t = mutate(&good(), r#""10.0.0.0/8""#, 0, r#""10.0.0.0/33""#);
    expect_error("bad_cidr", &t, &[line_of(&t, "10.0.0.0/33")], &["trusted", "10.0.0.0/33"]);
}

#[test]
fn duplicate_route_name() {
    let t = mutate(&good(), r#"name = "health""#, 0, r#"name = "api""#);
    // The duplicate is the second route named "api": its name line (or its [[route]] line).
    let name_line = nth_line_of(&t, r#"name = "api""#, 1);
    expect_error("dup_route", &t, &[name_line, name_line - 1], &["api"]);
}

#[test]
fn duplicate_zone_name() {
    let t = mutate(&good(), r#"name = "per_key""#, 0, r#"name = "per_ip""#);
    let t = mutate(&t, r#"zone = "per_key""#, 0, r#"zone = "per_ip""#);
    let name_line = nth_line_of(&t, r#"name = "per_ip""#, 1);
    expect_error("dup_zone", &t, &[name_line, name_line - 1], &["per_ip"]);
}

#[test]
fn missing_file() {
    let dir = ConfigDir::new();
    let p = dir.path().join("does_not_exist.toml");
    let out = run(["check".as_ref(), "-c".as_ref(), p.as_os_str()], TIMEOUT);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stderr.contains("does_not_exist.toml"), "{}", out.describe());
}

#[test]
fn run_with_bad_config_exits_1() {
    let dir = ConfigDir::new();
    let t = mutate(&good(), r#"zone = "per_ip""#, 0, r#"zone = "nope""#);
    let p = dir.write("bad_run.toml", &t);
    for args in [vec!["-c"], vec!["run", "-c"]] {
        let mut a: Vec<&std::ffi::OsStr> = args.iter().map(|s| s.as_ref()).collect();
        a.push(p.as_os_str());
        let out = run(a, TIMEOUT);
        assert!(!out.timed_out, "weir {args:?} with a bad config must exit: {}", out.describe());
        assert_eq!(out.code, Some(1), "weir {args:?}: {}", out.describe());
        assert!(out.stderr.contains("bad_run.toml"), "names the file: {}", out.describe());
        assert!(out.stderr.contains("nope"), "names the zone: {}", out.describe());
    }
}

#[test]
fn help() {
    let out = run(["--help"], TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(all.contains("check"), "weir --help mentions check: {}", out.describe());

    let out = run(["check", "--help"], TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(all.contains("-c"), "weir check --help mentions -c: {}", out.describe());
}

/// `weir check` stderr lines of the form `weir: FILE:LINE: message`, as (line, message).
fn reported(out: &RunOutput, file: &str) -> Vec<(usize, String)> {
    let prefix = format!("{file}:");
    out.stderr
        .lines()
        .filter_map(|l| l.strip_prefix("weir: "))
        .filter_map(|l| l.split_once(&prefix).map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_once(": ").and_then(|(n, m)| Some((n.parse().ok()?, m.to_string()))))
        .collect()
}

#[test]
fn every_value_of_the_wrong_shape_is_reported_at_once() {
    let mut t = good();
    for (from, to) in [
        ("threads = 2", "threads = \"2\""),
        ("header = \"X-Forwarded-For\"", "headr = \"X-Forwarded-For\""),
        ("rate = \"100r/m\"", "rate = 100"),
        ("burst = 20, nodelay", "brst = 20, nodelay"),
        ("dry_run = false", "dry_rn = false"),
        ("host = \"example.com\"", "hots = \"example.com\""),
    ] {
        t = mutate(&t, from, 0, to);
    }
    let expected = [
        (line_of(&t, "threads = \"2\""), "server.threads"),
        (line_of(&t, "headr = "), "real_ip.headr"),
        (line_of(&t, "rate = 100"), "limit_req_zone[2].rate"),
        (line_of(&t, "brst = 20"), "route[1].limit_req[1].brst"),
        (line_of(&t, "dry_rn = "), "route[1].dry_rn"),
        (line_of(&t, "hots = "), "route[3].hots"),
    ];
    let out = check("shapes.toml", &t);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let got = reported(&out, "shapes.toml");
    assert_eq!(got.len(), expected.len(), "one line per error:\n{}", out.describe());
    for ((line, setting), (got_line, message)) in expected.iter().zip(&got) {
        assert_eq!((line, true), (got_line, message.starts_with(setting)), "{setting}:\n{}", out.describe());
    }
    assert!(out.stderr.contains("weir: 6 errors in "), "{}", out.describe());

    // The same six as the JSON Schema editors use (docs/weir.schema.json).
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/weir.schema.json")).expect("schema"),
    )
    .expect("schema JSON");
    let instance = serde_json::to_value(toml::from_str::<toml::Value>(&t).expect("TOML")).expect("JSON");
    let validator = jsonschema::draft7::new(&schema).expect("draft-07 schema");
    assert_eq!(validator.iter_errors(&instance).count(), expected.len());
}

#[test]
fn errors_in_several_sections_are_reported_at_once() {
    let mut t = good();
    t = mutate(&t, "threads = 2", 0, "threads = 0\nadmin = \"no-port\"");
    t = mutate(&t, "\"10.0.0.0/8\"", 0, "\"10.0.0.0/99\"");
    t = mutate(&t, "\"127.0.0.1:9001\"", 0, "\"nowhere\"");
    t.push_str("\n[log]\nlevel = \"loud\"\n\n[tracing]\nendpoint = \"ftp://collector\"\n");
    let expected = [
        line_of(&t, "threads = 0"),
        line_of(&t, "admin = \"no-port\""),
        line_of(&t, "10.0.0.0/99"),
        line_of(&t, "\"nowhere\""),
        line_of(&t, "level = \"loud\""),
        line_of(&t, "ftp://collector"),
    ];
    let out = check("sections.toml", &t);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let lines: Vec<usize> = reported(&out, "sections.toml").into_iter().map(|(l, _)| l).collect();
    assert_eq!(lines, expected, "every error, two in [server], in line order:\n{}", out.describe());
}

#[test]
fn an_error_in_a_value_from_a_variable_names_the_variable() {
    let dir = ConfigDir::new();
    let mut t = mutate(&good(), "rate = \"10r/s\"", 0, "rate = \"${ZONE_RATE}\"");
    t.push_str("\n[log]\nlevel = \"${LOG_LEVEL}\"\n");
    let path = dir.write("from_env.toml", &t);
    let out = std::process::Command::new(support::weir::bin())
        .args(["check".as_ref(), "-c".as_ref(), path.as_os_str()])
        .env("ZONE_RATE", "10r/x")
        .env("LOG_LEVEL", "xx")
        .output()
        .expect("weir check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let rate_line = format!("from_env.toml:{}: ", line_of(&t, "${ZONE_RATE}"));
    let level_line = format!("from_env.toml:{}: ", line_of(&t, "${LOG_LEVEL}"));
    for (line, variable) in [(rate_line, "${ZONE_RATE}"), (level_line, "${LOG_LEVEL}")] {
        let said = stderr.lines().find(|l| l.contains(&line)).unwrap_or_else(|| panic!("no {line}:\n{stderr}"));
        assert!(said.contains(variable), "the error names {variable}: {said}");
    }
    assert!(!stderr.contains("10r/x"), "the value stays hidden behind its name: {stderr}");
}

#[test]
fn schema_has_an_id_and_what_a_schema_store_lists() {
    let out = run(["schema"], TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let schema: serde_json::Value = serde_json::from_str(&out.stdout).expect("weir schema prints JSON");
    assert_eq!(schema["$id"], "urn:weir:config:v1");
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    for field in ["title", "description"] {
        assert!(schema[field].as_str().is_some_and(|s| !s.is_empty()), "{field}");
    }
}

#[test]
fn an_error_in_each_zone_and_route_is_reported_at_once() {
    // A bad rate in one zone, an unknown key part in another, an unknown upstream in a route
    // (the other routes name the two broken zones: no second error for them). Before each zone
    // and route was compiled on its own, `weir check` named the first of these only.
    let mut t = good();
    t = mutate(&t, "rate = \"10r/s\"", 0, "rate = \"10/s\"");
    t = mutate(&t, "\"header:X-Api-Key\"", 0, "\"hedder:X-Api-Key\"");
    t = mutate(&t, "upstream = \"app\"", 2, "upstream = \"ghost\"");
    let expected = [
        (line_of(&t, "\"10/s\""), "limit_req_zone \"per_ip\": rate: "),
        (line_of(&t, "hedder:"), "limit_req_zone \"per_key\": key: "),
        (line_of(&t, "\"ghost\""), "route \"health\": upstream: unknown upstream \"ghost\""),
    ];
    let out = check("several.toml", &t);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let got = reported(&out, "several.toml");
    assert_eq!(got.len(), expected.len(), "one line per error:\n{}", out.describe());
    for ((line, start), (got_line, message)) in expected.iter().zip(&got) {
        assert_eq!((line, true), (got_line, message.starts_with(start)), "{start}:\n{}", out.describe());
    }
    assert!(out.stderr.contains("weir: 3 errors in "), "{}", out.describe());
}

#[test]
fn a_file_of_many_errors_names_the_first_fifty() {
    let mut t = good();
    for i in 0..60 {
        t.push_str(&format!("\n[[limit_req_zone]]\nname = \"bad{i}\"\nkey = \"ip\"\nrate = \"{i}/s\"\n"));
    }
    let out = check("many.toml", &t);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let got = reported(&out, "many.toml");
    assert_eq!(got.len(), 50, "{}", out.describe());
    assert_eq!(got[0].0, line_of(&t, "rate = \"0/s\""), "{}", out.describe());
    assert_eq!(got[49].0, line_of(&t, "rate = \"49/s\""), "{}", out.describe());
    assert!(out.stderr.contains("weir: and 10 more errors\n"), "{}", out.describe());
    assert!(out.stderr.contains("weir: 60 errors in "), "{}", out.describe());
}
