//! What Weir tells its operators and clients: Prometheus metrics (exact counts for known traffic),
//! the JSON access log, dry run (per route and per limit), the rate-limit header modes and the admin
//! API with its bearer token. Real weir process, real upstream, real sockets on loopback.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::access_log::{access_of, json_lines};
use support::admin;
use support::config::with_app;
use support::http::{self, statuses, summaries, Request, Response};
use support::metrics::{label_set, parse_sample, scrape, scrape_until, Scrape};
use support::poll::poll;
use support::upstream::Upstream;
use support::weir::Weir;

/// How long metrics and access-log lines may take to appear after the responses were read
/// (both are written in the `logging` phase, after the response).
const SETTLE: Duration = Duration::from_secs(10);
/// How often to look again while waiting for them.
const POLL: Duration = Duration::from_millis(25);

const TOKEN: &str = "0123456789abcdef-token";

/// `[server]` with the admin listener on `$LISTEN2`, `server_extra` lines, one upstream "app"
/// pointing at `up`, then `rest`.
fn config(up: &Upstream, server_extra: &str, rest: &str) -> String {
    with_app(&format!("{}\n{server_extra}", admin::LISTEN), "", up.addr(), rest)
}

// ---------------------------------------------------------------------------------------------
// Prometheus text format
// ---------------------------------------------------------------------------------------------

/// Expected series of one metric: [(labels, value)].
fn expect_series(scrape: &Scrape, name: &str, expected: &[(&[(&str, &str)], f64)]) -> Result<(), String> {
    let want: BTreeMap<BTreeMap<String, String>, f64> =
        expected.iter().map(|(labels, v)| (label_set(labels), *v)).collect();
    let got = scrape.series(name);
    if got == want {
        Ok(())
    } else {
        Err(format!("{name}: expected {want:?}\n got {got:?}"))
    }
}

#[test]
fn metrics_parser_reads_the_text_format() {
    let s = Scrape::parse(
        "# HELP a_total An \"example\".\n# TYPE a_total counter\n\
         a_total{b=\"x\",a=\"y\\\"z\\\\\"} 3\na_total{ a=\"1\" , b=\"2\" } 4 1700000000\n\
         h_bucket{le=\"+Inf\"} 2\nplain 1.5e-3\n",
    );
    assert_eq!(s.types["a_total"], "counter");
    assert_eq!(s.value("a_total", &[("a", "y\"z\\"), ("b", "x")]), Some(3.0));
    assert_eq!(s.value("a_total", &[("b", "2"), ("a", "1")]), Some(4.0));
    assert_eq!(s.value("h_bucket", &[("le", "+Inf")]), Some(2.0));
    assert_eq!(s.value("plain", &[]), Some(0.0015));
    assert_eq!(s.value("a_total", &[("a", "1")]), None, "label sets match exactly");
    assert!(parse_sample("x{a=\"1\" 2").is_err());
    assert!(parse_sample("x{a=1} 2").is_err());
}

/// What one metric must show: all of its series, exactly (no more, no less).
struct Expect<'a> {
    name: &'a str,
    series: &'a [(&'a [(&'a str, &'a str)], f64)],
}

fn mismatches(s: &Scrape, expect: &[Expect<'_>]) -> Vec<String> {
    expect.iter().filter_map(|e| expect_series(s, e.name, e.series).err()).collect()
}

/// Scrapes until every expectation holds, bounded by [`SETTLE`]: one request's metrics are
/// recorded one after the other in its `logging` phase, after its response was sent. Counters only
/// grow, so a count above the expected one never settles and fails here.
fn settle(admin: SocketAddr, expect: &[Expect<'_>]) -> Scrape {
    scrape_until(admin, SETTLE, POLL, |s| mismatches(s, expect).is_empty()).unwrap_or_else(|s| {
        panic!(
            "metrics differ from the traffic sent (after {SETTLE:?}):\n{}\n--- scrape ---\n{}",
            mismatches(&s, expect).join("\n"),
            s.filtered()
        )
    })
}

// ---------------------------------------------------------------------------------------------
// 1. Metrics: exact values for known traffic
// ---------------------------------------------------------------------------------------------

#[test]
fn metrics_count_exactly_the_traffic_sent() {
    let up = Upstream::start();
    let w = Weir::start(&config(
        &up,
        "",
        r#"
[real_ip]
trusted = ["127.0.0.1/32"]

[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[limit_req_zone]]
name = "per_k"
key = "header:X-K"
rate = "2r/s"

[[route]]
name = "limited"
path_prefix = "/limited/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 2, nodelay = true } ]

[[route]]
name = "open"
path_prefix = "/open/"
upstream = "app"

[[route]]
name = "slow"
path_prefix = "/slow/"
upstream = "app"
limit_req = [ { zone = "per_k", burst = 3 } ]
"#,
    ));
    let admin = admin::addr(&w);

    // Before any traffic: the gauge is set, no request was counted (the series the config
    // implies exist, at zero).
    let before = scrape(admin);
    assert_eq!(before.must("weir_config_generation", &[]), 1.0);
    assert_eq!(before.sum("weir_requests_total", &[]), 0.0, "{}", before.text);
    assert_eq!(before.must("weir_requests_total", &[("route", "limited"), ("outcome", "rejected")]), 0.0);

    // limited: 1r/m, burst 2, nodelay → 3 pass, 2 rejected; another client (X-Forwarded-For from
    // a trusted peer) has its own bucket and passes.
    let limited: Vec<Response> = (0..5).map(|i| http::get_logged(w.addr, &format!("/limited/{i}"), &[])).collect();
    assert_eq!(statuses(&limited), vec![200, 200, 200, 429, 429], "{:#?}", summaries(&limited));
    let other = http::get_logged(w.addr, "/limited/other", &[("X-Forwarded-For", "203.0.113.9")]);
    assert_eq!(other.status, 200, "{}", other.summary());
    // open: no limit.
    for i in 0..2 {
        let r = http::get_logged(w.addr, &format!("/open/{i}"), &[]);
        assert_eq!(r.status, 200, "{}", r.summary());
    }
    // No route: 404.
    let r = http::get_logged(w.addr, "/nowhere", &[]);
    assert_eq!(r.status, 404, "{}", r.summary());
    // slow: 2r/s, burst 3, no nodelay → the second back-to-back request waits ~500 ms.
    let r = http::get_logged(w.addr, "/slow/1", &[("X-K", "a")]);
    assert_eq!(r.status, 200, "{}", r.summary());
    let t = Instant::now();
    let r = http::get_logged(w.addr, "/slow/2", &[("X-K", "a")]);
    let waited = t.elapsed();
    assert_eq!(r.status, 200, "{}", r.summary());
    assert!(
        waited >= Duration::from_millis(250),
        "second request of the same key at 2r/s is delayed (~500 ms), took {waited:?}"
    );
    // slow without X-K: the key is empty, so per_k does not limit it.
    let r = http::get_logged(w.addr, "/slow/3", &[]);
    assert_eq!(r.status, 200, "{}", r.summary());

    let expect = [
        Expect {
            name: "weir_requests_total",
            series: &[
                (&[("route", "limited"), ("outcome", "passed")], 4.0),
                (&[("route", "limited"), ("outcome", "rejected")], 2.0),
                (&[("route", "open"), ("outcome", "unlimited")], 2.0),
                (&[("route", "-"), ("outcome", "no_route")], 1.0),
                (&[("route", "slow"), ("outcome", "passed")], 1.0),
                (&[("route", "slow"), ("outcome", "delayed")], 1.0),
                (&[("route", "slow"), ("outcome", "unlimited")], 1.0),
                // Implied by the config, there from the start.
                (&[("route", "slow"), ("outcome", "rejected")], 0.0),
            ],
        },
        Expect {
            name: "weir_limit_req_decisions_total",
            series: &[
                (&[("zone", "per_ip"), ("status", "passed")], 4.0),
                (&[("zone", "per_ip"), ("status", "rejected")], 2.0),
                (&[("zone", "per_k"), ("status", "passed")], 1.0),
                (&[("zone", "per_k"), ("status", "delayed")], 1.0),
                (&[("zone", "per_k"), ("status", "rejected")], 0.0),
            ],
        },
        Expect { name: "weir_limit_req_empty_key_total", series: &[(&[("zone", "per_k")], 1.0)] },
        Expect {
            name: "weir_upstream_responses_total",
            series: &[
                (&[("route", "limited"), ("code", "200")], 4.0),
                (&[("route", "open"), ("code", "200")], 2.0),
                (&[("route", "slow"), ("code", "200")], 3.0),
            ],
        },
        Expect {
            name: "weir_upstream_response_duration_seconds_count",
            series: &[(&[("route", "limited")], 4.0), (&[("route", "open")], 2.0), (&[("route", "slow")], 3.0)],
        },
        Expect { name: "weir_limit_req_delay_seconds_count", series: &[(&[("route", "slow")], 1.0)] },
        // Store calls: the 6 limited requests and the 2 keyed slow ones; an empty key needs none.
        Expect { name: "weir_store_request_duration_seconds_count", series: &[(&[("store", "memory")], 8.0)] },
        Expect { name: "weir_store_errors_total", series: &[] },
        Expect { name: "weir_config_generation", series: &[(&[], 1.0)] },
        Expect { name: "weir_config_reloads_total", series: &[(&[], 0.0)] },
        Expect { name: "weir_config_reload_failures_total", series: &[(&[], 0.0)] },
    ];
    // Every request above was read to the end of its connection, which weir closes only after
    // the request's logging phase (where its metrics are recorded): one scrape must show them all,
    // exactly. Nothing is missing, counted twice, or still to come.
    let s = scrape(admin);
    let wrong = mismatches(&s, &expect);
    assert!(
        wrong.is_empty(),
        "metrics differ from the traffic sent:\n{}\n--- scrape ---\n{}",
        wrong.join("\n"),
        s.filtered()
    );

    // The one delay, ~0.5 s minus the gap between the two requests, in the right bucket.
    let delay_sum = s.must("weir_limit_req_delay_seconds_sum", &[("route", "slow")]);
    assert!((0.2..=0.5).contains(&delay_sum), "delay sum {delay_sum} s for one ~0.5 s delay");
    assert_eq!(s.must("weir_limit_req_delay_seconds_bucket", &[("route", "slow"), ("le", "0.5")]), 1.0);
    assert_eq!(s.must("weir_limit_req_delay_seconds_bucket", &[("route", "slow"), ("le", "+Inf")]), 1.0);
    assert_eq!(s.must("weir_limit_req_delay_seconds_bucket", &[("route", "slow"), ("le", "0.1")]), 0.0);
    for (name, kind) in [
        ("weir_requests_total", "counter"),
        ("weir_limit_req_decisions_total", "counter"),
        ("weir_limit_req_empty_key_total", "counter"),
        ("weir_upstream_responses_total", "counter"),
        ("weir_limit_req_delay_seconds", "histogram"),
        ("weir_store_request_duration_seconds", "histogram"),
        ("weir_upstream_response_duration_seconds", "histogram"),
        ("weir_config_generation", "gauge"),
    ] {
        assert_eq!(s.types.get(name).map(String::as_str), Some(kind), "# TYPE of {name}");
    }
    // No client key ever becomes a label value (upstream server addresses are config, not keys).
    for sample in &s.samples {
        let upstream_server = |k: &str| sample.name.starts_with("weir_upstream_") && k == "server";
        for v in sample.labels.iter().filter(|(k, _)| !upstream_server(k)).map(|(_, v)| v) {
            assert!(
                !v.contains("127.0.0.1") && !v.contains("203.0.113.9") && v != "a",
                "client key in a label: {sample:?}"
            );
        }
    }

    assert_eq!(up.hits(), 9, "upstream saw the 4 + 2 + 3 forwarded requests");
}

// ---------------------------------------------------------------------------------------------
// Operator metrics: process, build, series from the start, store-specific families
// ---------------------------------------------------------------------------------------------

/// `promtool check metrics` (Prometheus's own linter, Debian's `prometheus` package, installed by
/// scripts/setup.sh) on a scrape: its complaints, empty when clean.
fn promtool_complaints(text: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("promtool: {e} (scripts/setup.sh installs Debian's prometheus package)"));
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write to promtool");
    let out = child.wait_with_output().expect("promtool output");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() && said.trim().is_empty() {
        String::new()
    } else {
        format!("exit {:?}: {said}", out.status.code())
    }
}

/// The families of a scrape whose names start with `prefix`.
fn families_with(s: &Scrape, prefix: &str) -> BTreeSet<String> {
    s.types.keys().filter(|n| n.starts_with(prefix)).cloned().collect()
}

const OPERATOR_ROUTES: &str = r#"
[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 1, nodelay = true } ]
"#;

#[test]
fn operator_metrics_exist_from_the_start_and_pass_promtool() {
    let up = Upstream::start();
    let w = Weir::start(&config(&up, "", &format!("[store]\nkind = \"memory\"\n{OPERATOR_ROUTES}")));
    let admin = admin::addr(&w);

    let s = scrape(admin);
    assert_eq!(promtool_complaints(&s.text), "", "promtool check metrics, before traffic");
    // Process metrics of the weir process itself.
    let pid = w.pid().expect("weir's pid");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("weir's fds").count() as f64;
    let open = s.must("process_open_fds", &[]);
    assert!(open >= 5.0 && (open - fds).abs() <= 10.0, "process_open_fds {open}, /proc says {fds}");
    assert!(s.must("process_max_fds", &[]) >= open);
    let rss = s.must("process_resident_memory_bytes", &[]);
    assert!((1e6..4e9).contains(&rss), "resident memory {rss}");
    assert!(s.must("process_virtual_memory_bytes", &[]) >= rss);
    assert!(s.must("process_cpu_seconds_total", &[]) >= 0.0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64();
    let started = s.must("process_start_time_seconds", &[]);
    assert!(started <= now + 1.0 && started >= now - 300.0, "started at {started}, now {now}");
    for (name, kind) in [("process_cpu_seconds_total", "counter"), ("process_start_time_seconds", "gauge")] {
        assert_eq!(s.types.get(name).map(String::as_str), Some(kind), "# TYPE of {name}");
    }
    // Build info: the version and commit `weir --version` shows.
    let build = s.series("weir_build_info");
    assert_eq!(build.len(), 1, "{build:?}");
    let (labels, value) = build.iter().next().expect("one series");
    assert_eq!(*value, 1.0);
    assert_eq!(labels.get("version").map(String::as_str), Some(env!("CARGO_PKG_VERSION")));
    let version = support::weir::run(["--version"], Duration::from_secs(10));
    let commit = labels.get("commit").expect("commit label");
    assert!(!commit.is_empty() && version.stdout.contains(&format!("(commit {commit})")), "{}", version.stdout);

    // The series the config implies, at zero before any request.
    for (route, outcome) in [("api", "passed"), ("api", "rejected"), ("-", "no_route")] {
        assert_eq!(
            s.value("weir_requests_total", &[("route", route), ("outcome", outcome)]),
            Some(0.0),
            "{route} {outcome}"
        );
    }
    for status in ["passed", "rejected"] {
        assert_eq!(s.value("weir_limit_req_decisions_total", &[("zone", "per_ip"), ("status", status)]), Some(0.0));
    }
    assert_eq!(s.value("weir_store_request_duration_seconds_count", &[("store", "memory")]), Some(0.0));
    assert_eq!(s.value("weir_memory_zone_full_total", &[("zone", "per_ip")]), Some(0.0));
    assert_eq!(s.value("weir_upstream_unavailable_total", &[("upstream", "app"), ("reason", "down")]), Some(0.0));
    // Store-specific: the memory store's families, none of Redis's.
    assert_eq!(families_with(&s, "weir_redis_"), BTreeSet::new(), "no Redis families on the memory store");
    assert!(!s.types.contains_key("weir_store_circuit_open") && !s.types.contains_key("weir_deny_cache_hits_total"));
    assert!(s.series("weir_store_errors_total").is_empty(), "the memory store has no store errors to count");

    // The scenario: 2 pass (1 + burst 1), 2 rejected, counted in the series that were there.
    let rs: Vec<Response> = (0..4).map(|i| http::get_logged(w.addr, &format!("/api/{i}"), &[])).collect();
    assert_eq!(statuses(&rs), vec![200, 200, 429, 429], "{:#?}", summaries(&rs));
    let s = scrape(admin);
    assert_eq!(s.must("weir_requests_total", &[("route", "api"), ("outcome", "passed")]), 2.0);
    assert_eq!(s.must("weir_requests_total", &[("route", "api"), ("outcome", "rejected")]), 2.0);
    assert_eq!(s.must("weir_limit_req_decisions_total", &[("zone", "per_ip"), ("status", "rejected")]), 2.0);
    assert_eq!(s.must("weir_store_request_duration_seconds_count", &[("store", "memory")]), 4.0);
    assert_eq!(promtool_complaints(&s.text), "", "promtool check metrics, after traffic");
}

#[test]
fn redis_store_errors_exist_at_zero_under_the_label_the_store_reports() {
    let mut redis = support::redis_server::RedisServer::start();
    let store = support::config::redis_store(&redis.url(), "timeout = \"200ms\"\non_error = \"allow\"");
    let up = Upstream::start();
    let w = Weir::start(&config(&up, "", &format!("{store}\n{OPERATOR_ROUTES}")));
    let admin = admin::addr(&w);

    let s = scrape(admin);
    assert_eq!(promtool_complaints(&s.text), "", "promtool check metrics on the Redis store");
    let causes = ["timeout", "redis", "reply", "circuit_open"];
    for cause in causes {
        assert_eq!(s.value("weir_store_errors_total", &[("store", "redis"), ("cause", cause)]), Some(0.0), "{cause}");
    }
    assert_eq!(s.value("weir_store_fallback_total", &[("policy", "allow")]), Some(0.0));
    assert_eq!(s.value("weir_requests_total", &[("route", "api"), ("outcome", "fail_open")]), Some(0.0));
    assert!(s.value("weir_redis_eviction_risk", &[]).is_some(), "Redis families are shown");
    assert_eq!(families_with(&s, "weir_memory_"), BTreeSet::new(), "no memory-store families on Redis");

    // Redis gone: the errors land in the series that were there (no second label set appears).
    redis.stop();
    let failed = scrape_until(admin, SETTLE, POLL, |s| {
        let _ = http::get_logged(w.addr, "/api/x", &[]);
        s.sum("weir_store_errors_total", &[]) >= 1.0
    })
    .unwrap_or_else(|s| panic!("no store error counted with Redis stopped:\n{}", s.filtered()));
    let series = failed.series("weir_store_errors_total");
    assert_eq!(series.len(), causes.len(), "the seeded label sets are the ones counted: {series:?}");
    assert!(failed.must("weir_store_fallback_total", &[("policy", "allow")]) >= 1.0);
}

/// The README's quick start shows a 429 of conf/routes.toml: its status line, rate headers and
/// body must be what Weir answers, byte for byte.
#[test]
fn readme_429_example_is_the_real_answer() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md");
    let shown: Vec<&str> = readme
        .lines()
        .skip_while(|l| l.trim() != "curl -i localhost:8080/api/hello")
        .skip(1)
        .map_while(|l| l.strip_prefix("# "))
        .collect();
    assert!(shown.len() >= 3, "README.md shows `curl -i localhost:8080/api/hello` and its answer: {shown:?}");
    let (status_line, rest) = shown.split_first().expect("a status line");
    let (body, headers) = rest.split_last().expect("a body");

    let up = Upstream::start();
    let conf = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/routes.toml")).expect("conf");
    let conf = conf
        .replace("127.0.0.1:8080", "$LISTEN")
        .replace("admin = \"127.0.0.1:9901\"", "admin = \"$LISTEN2\"")
        .replace("127.0.0.1:9000", &up.addr().to_string());
    let w = Weir::start(&conf);
    // "200 ×6 (1 + burst 5, nodelay), then 429": the first six pass whatever the pace.
    let first: Vec<u16> = (0..6).map(|_| http::get_logged(w.addr, "/api/hello", &[]).status).collect();
    assert_eq!(first, [200; 6]);
    let rejected = (0..20)
        .map(|_| http::get_logged(w.addr, "/api/hello", &[]))
        .find(|r| r.status == 429)
        .expect("a 429 within 20 more requests at 2r/s");
    assert_eq!(*status_line, format!("HTTP/1.1 {} {}", rejected.status, rejected.reason));
    for line in headers {
        let (name, value) = line.split_once(": ").unwrap_or_else(|| panic!("README header line {line:?}"));
        assert_eq!(rejected.header(name).as_deref(), Some(value), "{name} in {}", rejected.summary());
    }
    // The body ends with a newline, as a shell transcript shows it.
    assert_eq!(format!("{body}\n"), rejected.text(), "the README's body");
}

// ---------------------------------------------------------------------------------------------
// 2. Access log
// ---------------------------------------------------------------------------------------------

/// Waits (bounded by [`SETTLE`]) until at least `n` access lines were written; every stderr line
/// must be JSON.
fn access_lines(w: &Weir, n: usize) -> Vec<Value> {
    poll(SETTLE, POLL, || access_of(&json_lines(w)), |access| access.len() >= n).unwrap_or_else(|last| last)
}

/// The single access line for `path`.
fn line_for<'a>(lines: &'a [Value], path: &str) -> &'a Value {
    let found: Vec<&Value> = lines.iter().filter(|l| l["path"] == path).collect();
    assert_eq!(found.len(), 1, "exactly one access line for {path}, got {found:#?}");
    found[0]
}

/// The `zones` field as a set of `zone=STATUS` items.
fn zone_set(line: &Value) -> BTreeSet<String> {
    line["zones"]
        .as_str()
        .unwrap_or_else(|| panic!("zones is a string: {line}"))
        .split(',')
        .filter(|z| !z.is_empty())
        .map(str::to_string)
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn num(line: &Value, field: &str) -> f64 {
    line[field].as_f64().unwrap_or_else(|| panic!("{field} is a number: {line}"))
}

#[test]
fn json_access_log_has_one_line_per_request_with_the_limit_outcome() {
    let up = Upstream::start();
    let w = Weir::start(&config(
        &up,
        "",
        r#"
[log]
format = "json"

[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[limit_req_zone]]
name = "per_k"
key = "header:X-K"
rate = "2r/s"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 1, nodelay = true } ]

[[route]]
name = "open"
path_prefix = "/open/"
upstream = "app"

[[route]]
name = "slow"
path_prefix = "/slow/"
upstream = "app"
limit_req = [ { zone = "per_k", burst = 3 } ]
"#,
    ));

    // (method, path, X-K, expected status)
    let sequence: [(&str, &str, Option<&str>, u16); 8] = [
        ("GET", "/api/1", None, 200),
        ("POST", "/api/2", None, 200),
        ("GET", "/api/3", None, 429),
        ("GET", "/open/4", None, 200),
        ("GET", "/missing/5", None, 404),
        ("GET", "/slow/6", Some("k"), 200),
        ("GET", "/slow/7", Some("k"), 200),
        ("GET", "/slow/8", None, 200),
    ];
    for (method, path, key, status) in sequence {
        let mut req = Request::new(method, path);
        if method == "POST" {
            req = req.body(b"payload");
        }
        if let Some(k) = key {
            req = req.header("X-K", k);
        }
        let r = http::must_send(w.addr, &req);
        assert_eq!(r.status, status, "{method} {path}: {}", r.summary());
    }

    let lines = access_lines(&w, sequence.len());
    assert_eq!(lines.len(), sequence.len(), "one access line per request:\n{}", w.stderr());
    let all = json_lines(&w);
    for line in &all {
        assert_ne!(line["level"], "ERROR", "no ERROR line for normal traffic (429s included): {line}");
    }
    for line in &lines {
        assert_eq!(line["level"], "INFO", "access lines are INFO: {line}");
        assert_eq!(line["message"], "request", "{line}");
        assert_eq!(line["client"], "127.0.0.1", "{line}");
        assert!(num(line, "duration_ms") >= 0.0, "{line}");
        assert!(line["delay_ms"].is_u64(), "delay_ms is an integer: {line}");
        assert!(line["status"].is_u64(), "status is an integer: {line}");
        assert!(line["timestamp"].is_string(), "{line}");
    }

    // (path, method, route, status, limit_req, zones, proxied, delayed)
    /// (path, method, route, status, limit_req, zones, proxied, delayed)
    type Expected<'a> = (&'a str, &'a str, &'a str, u64, &'a str, &'a [&'a str], bool, bool);
    let expected: [Expected<'_>; 8] = [
        ("/api/1", "GET", "api", 200, "PASSED", &["per_ip=PASSED"], true, false),
        ("/api/2", "POST", "api", 200, "PASSED", &["per_ip=PASSED"], true, false),
        ("/api/3", "GET", "api", 429, "REJECTED", &["per_ip=REJECTED"], false, false),
        ("/open/4", "GET", "open", 200, "-", &[], true, false),
        ("/missing/5", "GET", "-", 404, "-", &[], false, false),
        ("/slow/6", "GET", "slow", 200, "PASSED", &["per_k=PASSED"], true, false),
        ("/slow/7", "GET", "slow", 200, "DELAYED", &["per_k=DELAYED"], true, true),
        ("/slow/8", "GET", "slow", 200, "-", &[], true, false),
    ];
    for (path, method, route, status, limit_req, zones, proxied, delayed) in expected {
        let line = line_for(&lines, path);
        assert_eq!(line["method"], method, "{line}");
        assert_eq!(line["route"], route, "{line}");
        assert_eq!(line["status"], status, "{line}");
        assert_eq!(line["limit_req"], limit_req, "{line}");
        assert_eq!(zone_set(line), set(zones), "{line}");
        let upstream_ms = num(line, "upstream_ms");
        if proxied {
            assert!(upstream_ms >= 0.0, "proxied: upstream_ms >= 0: {line}");
        } else {
            assert_eq!(upstream_ms, -1.0, "not proxied: upstream_ms = -1: {line}");
        }
        let delay_ms = num(line, "delay_ms");
        if delayed {
            assert!((200.0..=500.0).contains(&delay_ms), "2r/s back to back: delay ~500 ms: {line}");
            assert!(num(line, "duration_ms") >= delay_ms, "the duration includes the delay: {line}");
        } else {
            assert_eq!(delay_ms, 0.0, "{line}");
        }
    }
}

/// `GET target` on a connection of its own, read to its end (the access line is written then).
fn get_raw_logged(addr: SocketAddr, target: &[u8]) -> Option<u16> {
    let mut conn = http::Conn::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    conn.send_raw(&[b"GET ", target, b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"].concat()).expect("send");
    let status = conn.read_response(false).ok().flatten().map(|r| r.status);
    let _ = conn.read_to_close();
    status
}

#[test]
fn json_access_lines_stay_json_whatever_the_client_sends() {
    let up = Upstream::start();
    let (_reserved, dead) = support::weir::refusing_addr();
    let w = Weir::start(&config(
        &up,
        "",
        &format!(
            r#"
[log]
format = "json"

[[upstream]]
name = "dead"
servers = ["{dead}"]

[[route]]
name = "dead"
path_prefix = "/dead/"
upstream = "dead"

[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
"#
        ),
    ));
    // Paths as clients send them, bytes and all; what the proxy logs for each and its status.
    // Forwarded paths are logged as forwarded: canonical, so raw UTF-8 and control bytes come
    // back percent-encoded in upper-case hex. A raw backslash is refused (400) and logged as
    // sent, quotes, backslash and all.
    let logged: [(&[u8], &str, u16); 4] = [
        (b"/q\"b\\s\"}{", "/q\"b\\s\"}{", 400),
        (b"/caf\xc3\xa9/\xe2\x80\xa8", "/caf%C3%A9/%E2%80%A8", 200),
        (b"/ctl%01%1f%7f%22", "/ctl%01%1F%7F%22", 200),
        (b"/raw\x01", "/raw%01", 200),
    ];
    for (target, _, status) in logged {
        assert_eq!(get_raw_logged(w.addr, target), Some(status), "{}", String::from_utf8_lossy(target));
    }
    // Not UTF-8: refused before routing (no line, or a line that is still JSON).
    for target in [&b"/bad\xff\xfe\"x"[..], b"/half\xc3"] {
        let status = get_raw_logged(w.addr, target);
        assert!(status.is_none_or(|s| s == 400 || s == 200), "{}: {status:?}", String::from_utf8_lossy(target));
    }
    // An upstream that refuses: the error text is logged too.
    assert_eq!(get_raw_logged(w.addr, b"/dead/x"), Some(502));

    // json_lines panics on any stderr line that is not one JSON object.
    let lines = access_lines(&w, logged.len() + 1);
    for (target, path, status) in logged {
        let line = line_for(&lines, path);
        assert_eq!(line["status"], status, "{}: {line}", String::from_utf8_lossy(target));
    }
    let dead_line = line_for(&lines, "/dead/x");
    assert_eq!(dead_line["upstream_addr"], dead.to_string(), "{dead_line}");
    let error = dead_line["error"].as_str().unwrap_or_else(|| panic!("a 502 logs its error: {dead_line}"));
    assert!(!error.is_empty(), "{dead_line}");
    for line in &lines {
        assert!(line.get("decided_us").is_none(), "no limit, no decision time: {line}");
    }
}

#[test]
fn access_log_can_be_switched_off() {
    let up = Upstream::start();
    let w = Weir::start(&config(
        &up,
        "",
        r#"
[log]
format = "json"
access_log = false

[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 0, nodelay = true } ]
"#,
    ));
    // Each connection is read to its end: weir closes it after the request's logging phase, so
    // every access line these requests could have made is written by then.
    let statuses: Vec<u16> =
        ["/api/1", "/api/2", "/nothing"].iter().map(|p| http::get_logged(w.addr, p, &[]).status).collect();
    assert_eq!(statuses, vec![200, 429, 404]);
    let s = scrape(admin::addr(&w));
    assert_eq!(s.sum("weir_requests_total", &[]), 3.0, "the three requests were logged: {}", s.filtered());
    let all = json_lines(&w);
    let access = access_of(&all);
    assert!(access.is_empty(), "access_log = false: no access lines, got {access:#?}");
    assert!(
        all.iter().any(|l| l["target"] == "weir::process::server"),
        "other logs still go to stderr:\n{}",
        w.stderr()
    );
}

/// The paths of the access lines in `w`'s stderr, JSON or text format.
fn logged_paths(w: &Weir) -> Vec<String> {
    let stderr = w.stderr();
    let finished = &stderr[..stderr.rfind('\n').map_or(0, |i| i + 1)];
    finished
        .lines()
        .filter(|l| l.contains("weir::access"))
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(json) => json["path"].as_str().unwrap_or("?").to_string(),
            Err(_) => l.split(" path=").nth(1).and_then(|p| p.split(' ').next()).unwrap_or("?").to_string(),
        })
        .collect()
}

/// Weir with the `[log]` lines given and one catch-all route to `up`.
fn weir_with_log(up: &Upstream, log: &str) -> Weir {
    Weir::start(&config(
        up,
        "",
        &format!("[log]\n{log}\n\n[[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n"),
    ))
}

#[test]
fn a_buffered_access_log_writes_every_line_when_weir_stops() {
    for format in ["json", "text"] {
        let up = Upstream::start();
        let mut w =
            weir_with_log(&up, &format!("format = \"{format}\"\naccess_log_buffer = 65536\naccess_log_flush = \"1h\""));
        let paths: Vec<String> = (0..30).map(|i| format!("/buffered/{i}")).collect();
        for path in &paths {
            // Read to the connection's end: its logging phase has run (the line is in a buffer).
            assert_eq!(http::get_logged(w.addr, path, &[]).status, 200);
        }
        // 30 lines of ~400 bytes fill neither thread's 64 KiB, and none is an hour old.
        assert_eq!(logged_paths(&w), Vec::<String>::new(), "{format}: buffered, nothing written yet");
        let (status, _) = w.terminate(Duration::from_secs(20)).expect("weir stops on SIGTERM");
        assert!(status.success(), "{status:?}\n{}", w.stderr());
        let written = poll(SETTLE, POLL, || logged_paths(&w), |got| got.len() >= paths.len()).unwrap_or_else(|got| got);
        assert_eq!(written.len(), paths.len(), "{format}: no line lost or written twice:\n{}", w.stderr());
        let written: BTreeSet<String> = written.into_iter().collect();
        assert_eq!(written, paths.iter().cloned().collect::<BTreeSet<_>>(), "{format}: every line on the stop");
    }
}

#[test]
fn buffered_access_lines_wait_at_most_the_flush_time() {
    let up = Upstream::start();
    let w = weir_with_log(&up, "format = \"json\"\naccess_log_buffer = 65536\naccess_log_flush = \"300ms\"");
    let sent = Instant::now();
    assert_eq!(http::get_logged(w.addr, "/waits", &[]).status, 200);
    // No more traffic: only the flush time can write the line out.
    let written = poll(SETTLE, POLL, || logged_paths(&w), |got| !got.is_empty());
    let waited = sent.elapsed();
    assert_eq!(written, Ok(vec!["/waits".to_string()]), "the line is written within {SETTLE:?}");
    assert!(waited >= Duration::from_millis(300), "written after {waited:?}, before the flush time");
}

#[test]
fn a_full_access_buffer_is_written_at_once_in_the_text_format_too() {
    let up = Upstream::start();
    let mut w = weir_with_log(&up, "access_log_buffer = 512\naccess_log_flush = \"1h\"");
    let text_lines = |w: &Weir| logged_paths(w).len();
    for i in 0..20 {
        assert_eq!(http::get_logged(w.addr, &format!("/full/{i}"), &[]).status, 200);
    }
    // Text lines are ~300 bytes: a 512-byte buffer goes out every line or two, without a stop.
    let before_stop = poll(SETTLE, POLL, || text_lines(&w), |n| *n >= 10).unwrap_or_else(|n| n);
    assert!(before_stop >= 10, "full buffers are written without waiting: {before_stop} of 20\n{}", w.stderr());
    w.terminate(Duration::from_secs(20)).expect("weir stops on SIGTERM");
    let all = poll(SETTLE, POLL, || text_lines(&w), |n| *n >= 20).unwrap_or_else(|n| n);
    assert_eq!(all, 20, "every line once:\n{}", w.stderr());
    for line in w.stderr().lines().filter(|l| l.contains("weir::access")) {
        assert!(line.contains("route=") && line.contains("status=200"), "a whole line: {line:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Dry run
// ---------------------------------------------------------------------------------------------

/// The integer `r` of zone `zone`'s item in a `RateLimit` field value.
fn ratelimit_r(value: &str, zone: &str) -> Option<i64> {
    let item = value.split(',').map(str::trim).find(|i| i.starts_with(&format!("\"{zone}\";")))?;
    item.split(';').find_map(|p| p.trim().strip_prefix("r=")).and_then(|r| r.parse().ok())
}

#[test]
fn route_dry_run_decides_and_reports_but_never_rejects() {
    let up = Upstream::start();
    let w = Weir::start(&config(
        &up,
        "",
        r#"
[log]
format = "json"

[[limit_req_zone]]
name = "tight"
key = "ip"
rate = "1r/m"

[[route]]
name = "shadow"
path_prefix = "/shadow/"
upstream = "app"
dry_run = true
limit_req = [ { zone = "tight", burst = 0 } ]
"#,
    ));
    let rs: Vec<Response> = (0..5).map(|i| http::get(w.addr, &format!("/shadow/{i}"))).collect();
    for (i, r) in rs.iter().enumerate() {
        assert_eq!(r.status, 200, "dry run never rejects: {}", r.summary());
        assert_eq!(r.text(), format!("/shadow/{i}"), "{}", r.summary());
        assert!(
            !r.has_header("retry-after") && !r.has_header("ratelimit"),
            "shadow limits add no headers: {}",
            r.summary()
        );
    }
    assert_eq!(up.hits_with_prefix("/shadow/"), 5, "upstream saw all 5");

    let lines = access_lines(&w, 5);
    for i in 0..5 {
        let line = line_for(&lines, &format!("/shadow/{i}"));
        let (status, zone) =
            if i == 0 { ("PASSED", "tight=PASSED") } else { ("REJECTED_DRY_RUN", "tight=REJECTED_DRY_RUN") };
        assert_eq!(line["limit_req"], status, "{line}");
        assert_eq!(zone_set(line), set(&[zone]), "{line}");
        assert_eq!(line["status"], 200, "{line}");
        assert_eq!(line["delay_ms"], 0, "{line}");
    }

    settle(
        admin::addr(&w),
        &[
            Expect {
                name: "weir_requests_total",
                series: &[
                    (&[("route", "shadow"), ("outcome", "passed")], 1.0),
                    (&[("route", "shadow"), ("outcome", "rejected_dry_run")], 4.0),
                    (&[("route", "-"), ("outcome", "no_route")], 0.0),
                ],
            },
            Expect {
                name: "weir_limit_req_decisions_total",
                series: &[
                    (&[("zone", "tight"), ("status", "passed")], 1.0),
                    (&[("zone", "tight"), ("status", "rejected_dry_run")], 4.0),
                ],
            },
        ],
    );
}

#[test]
fn a_dry_run_limit_never_blocks_nor_shields_an_enforced_one() {
    let up = Upstream::start();
    let w = Weir::start(&config(
        &up,
        "",
        r#"
[log]
format = "json"

[[limit_req_zone]]
name = "generous"
key = "ip"
rate = "1r/m"

[[limit_req_zone]]
name = "tight"
key = "ip"
rate = "1r/m"

[[route]]
name = "mixed"
path_prefix = "/mixed/"
upstream = "app"
limit_req = [
  { zone = "generous", burst = 10, nodelay = true },
  { zone = "tight", burst = 0, nodelay = true, dry_run = true },
]
"#,
    ));
    // generous admits 11 (burst 10 + 1); tight alone would admit 1.
    let rs: Vec<Response> = (0..12).map(|i| http::get(w.addr, &format!("/mixed/{i}"))).collect();
    let mut want = vec![200; 11];
    want.push(429);
    assert_eq!(statuses(&rs), want, "{:#?}", summaries(&rs));
    // Every passed request charged the enforced zone, although the shadow zone "rejected" 10 of
    // them: its r= counts down 10, 9, …, 0.
    let remaining: Vec<Option<i64>> =
        rs[..11].iter().map(|r| ratelimit_r(&r.header("ratelimit").unwrap_or_default(), "generous")).collect();
    let expected: Vec<Option<i64>> = (0..=10).rev().map(Some).collect();
    assert_eq!(remaining, expected, "{:#?}", summaries(&rs));
    for r in &rs {
        let fields = format!("{:?} {:?}", r.header("ratelimit"), r.header("ratelimit-policy"));
        assert!(!fields.contains("tight"), "the shadow zone adds no header items: {}", r.summary());
    }
    let rejected: Value = serde_json::from_slice(&rs[11].body).expect("JSON rejection body");
    assert_eq!(rejected["zone"], "generous", "{}", rs[11].summary());
    assert_eq!(ratelimit_r(&rs[11].header("ratelimit").unwrap_or_default(), "generous"), Some(0));
    assert_eq!(up.hits_with_prefix("/mixed/"), 11);

    let lines = access_lines(&w, 12);
    let first = line_for(&lines, "/mixed/0");
    assert_eq!(first["limit_req"], "PASSED", "{first}");
    assert_eq!(zone_set(first), set(&["generous=PASSED", "tight=PASSED"]), "{first}");
    for i in 1..11 {
        let line = line_for(&lines, &format!("/mixed/{i}"));
        assert_eq!(line["limit_req"], "REJECTED_DRY_RUN", "{line}");
        assert_eq!(zone_set(line), set(&["generous=PASSED", "tight=REJECTED_DRY_RUN"]), "{line}");
        assert_eq!(line["status"], 200, "{line}");
    }
    let last = line_for(&lines, "/mixed/11");
    assert_eq!(last["limit_req"], "REJECTED", "{last}");
    assert_eq!(last["status"], 429, "{last}");
    assert!(zone_set(last).contains("generous=REJECTED"), "the enforced zone rejected: {last}");

    // Every passed request charged "generous"; "tight" (dry run) "rejected" 11 and never counts as
    // an enforced rejection.
    settle(
        admin::addr(&w),
        &[
            Expect {
                name: "weir_requests_total",
                series: &[
                    (&[("route", "mixed"), ("outcome", "passed")], 1.0),
                    (&[("route", "mixed"), ("outcome", "rejected_dry_run")], 10.0),
                    (&[("route", "mixed"), ("outcome", "rejected")], 1.0),
                    (&[("route", "-"), ("outcome", "no_route")], 0.0),
                ],
            },
            Expect {
                name: "weir_limit_req_decisions_total",
                series: &[
                    (&[("zone", "generous"), ("status", "passed")], 11.0),
                    (&[("zone", "generous"), ("status", "rejected")], 1.0),
                    (&[("zone", "tight"), ("status", "passed")], 1.0),
                    (&[("zone", "tight"), ("status", "rejected_dry_run")], 11.0),
                ],
            },
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Header modes
// ---------------------------------------------------------------------------------------------

const DRAFT_FIELDS: [&str; 2] = ["ratelimit", "ratelimit-policy"];
const LEGACY_FIELDS: [&str; 3] = ["x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"];

fn int_header(r: &Response, name: &str) -> i64 {
    r.header(name).and_then(|v| v.trim().parse().ok()).unwrap_or_else(|| panic!("integer {name}: {}", r.summary()))
}

#[test]
fn rate_limit_header_modes_draft_legacy_none() {
    let up = Upstream::start();
    let w = Weir::start(&config(
        &up,
        "",
        r#"
[[limit_req_zone]]
name = "zl"
key = "ip"
rate = "1r/m"

[[limit_req_zone]]
name = "zq"
key = "ip"
rate = "1r/m"

[[limit_req_zone]]
name = "zd"
key = "ip"
rate = "1r/m"

[[route]]
name = "legacy"
path_prefix = "/legacy/"
upstream = "app"
rate_limit_headers = "legacy"
limit_req = [ { zone = "zl", burst = 1, nodelay = true } ]

[[route]]
name = "quiet"
path_prefix = "/quiet/"
upstream = "app"
rate_limit_headers = "none"
limit_req = [ { zone = "zq", burst = 0, nodelay = true } ]

[[route]]
name = "draft"
path_prefix = "/draft/"
upstream = "app"
rate_limit_headers = "draft"
limit_req = [ { zone = "zd", burst = 0, nodelay = true } ]
"#,
    ));

    // legacy: X-RateLimit-* of the zone, no draft fields.
    let rs: Vec<Response> = (0..3).map(|i| http::get(w.addr, &format!("/legacy/{i}"))).collect();
    assert_eq!(statuses(&rs), vec![200, 200, 429], "{:#?}", summaries(&rs));
    for r in &rs {
        for f in DRAFT_FIELDS {
            assert!(!r.has_header(f), "legacy mode: no {f}: {}", r.summary());
        }
        assert_eq!(int_header(r, "x-ratelimit-limit"), 2, "burst + 1");
    }
    assert_eq!(int_header(&rs[0], "x-ratelimit-remaining"), 1);
    assert_eq!(int_header(&rs[1], "x-ratelimit-remaining"), 0);
    assert_eq!(int_header(&rs[2], "x-ratelimit-remaining"), 0);
    // 1r/m: one request in the bucket drains in 60 s, two in 120 s.
    assert_eq!(int_header(&rs[0], "x-ratelimit-reset"), 60, "{}", rs[0].summary());
    assert_eq!(int_header(&rs[1], "x-ratelimit-reset"), 120, "{}", rs[1].summary());
    let reset = int_header(&rs[2], "x-ratelimit-reset");
    assert!((59..=60).contains(&reset), "{}", rs[2].summary());
    let retry = int_header(&rs[2], "retry-after");
    assert!((59..=60).contains(&retry), "{}", rs[2].summary());

    // none: no rate-limit fields at all, but a rejection still says when to retry.
    let rs: Vec<Response> = (0..2).map(|i| http::get(w.addr, &format!("/quiet/{i}"))).collect();
    assert_eq!(rs[0].status, 200, "{}", rs[0].summary());
    assert_eq!(rs[1].status, 429, "{}", rs[1].summary());
    for r in &rs {
        for f in DRAFT_FIELDS.iter().chain(&LEGACY_FIELDS) {
            assert!(!r.has_header(f), "none mode: no {f}: {}", r.summary());
        }
    }
    assert!(!rs[0].has_header("retry-after"), "{}", rs[0].summary());
    let retry = int_header(&rs[1], "retry-after");
    assert!((59..=60).contains(&retry), "{}", rs[1].summary());
    let body: Value = serde_json::from_slice(&rs[1].body).expect("JSON rejection body");
    assert_eq!(body["error"], "rate_limited");
    assert_eq!(body["zone"], "zq");

    // draft: RateLimit-Policy and RateLimit, no X-RateLimit-*.
    let rs: Vec<Response> = (0..2).map(|i| http::get(w.addr, &format!("/draft/{i}"))).collect();
    assert_eq!(rs[0].status, 200, "{}", rs[0].summary());
    assert_eq!(rs[1].status, 429, "{}", rs[1].summary());
    for r in &rs {
        for f in DRAFT_FIELDS {
            assert!(r.has_header(f), "draft mode: {f}: {}", r.summary());
        }
        for f in LEGACY_FIELDS {
            assert!(!r.has_header(f), "draft mode: no {f}: {}", r.summary());
        }
    }
    assert_eq!(rs[0].header("ratelimit-policy").as_deref(), Some("\"zd\";q=1;w=60"));
    assert_eq!(rs[1].header("ratelimit").and_then(|v| ratelimit_r(&v, "zd")), Some(0));
}

// ---------------------------------------------------------------------------------------------
// 5. Admin API
// ---------------------------------------------------------------------------------------------

#[test]
fn admin_api_needs_the_token_except_for_probes() {
    let up = Upstream::start();
    let w = Weir::start(&config(
        &up,
        &format!("admin_token = \"{TOKEN}\""),
        r#"
[[limit_req_zone]]
name = "z"
key = "ip"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "z", burst = 5, nodelay = true } ]

[[route]]
name = "shadow"
path_prefix = "/shadow/"
upstream = "app"
limit_req = [ { zone = "z", burst = 2, dry_run = true } ]
"#,
    ));
    let admin = admin::addr(&w);
    for i in 0..3 {
        let r = http::get(w.addr, &format!("/api/{i}"));
        assert_eq!(r.status, 200, "{}", r.summary());
    }
    let good = format!("Bearer {TOKEN}");
    let wrong_auth = [
        None,
        Some("Bearer wrong-token-0123456789".to_string()),
        Some(format!("Bearer {TOKEN}x")),
        Some(format!("Bearer {}", &TOKEN[..TOKEN.len() - 1])),
        Some(format!("bearer{TOKEN}")),
        Some(TOKEN.to_string()),
        Some(format!("Basic {TOKEN}")),
    ];
    let protected =
        [("GET", "/metrics"), ("GET", "/config"), ("GET", "/limits?zone=z&key=127.0.0.1"), ("POST", "/reload")];
    for (method, target) in protected {
        for auth in &wrong_auth {
            let r = admin::request(admin, method, target, auth.as_deref());
            assert_eq!(r.status, 401, "{method} {target} with Authorization {auth:?}: {}", r.summary());
            assert_eq!(r.header("www-authenticate").as_deref(), Some("Bearer"), "{}", r.summary());
            assert!(
                !r.text().contains("weir_requests_total") && !r.text().contains("generation"),
                "a 401 leaks nothing: {}",
                r.summary()
            );
        }
        let r = admin::request(admin, method, target, Some(&good));
        assert_eq!(r.status, 200, "{method} {target} with the token: {}", r.summary());
    }
    // The probes need no token (kubelet sends none), and a wrong one does not hurt.
    for path in ["/healthz", "/readyz"] {
        for auth in [None, Some("Bearer nope-nope-nope-nope")] {
            let r = admin::request(admin, "GET", path, auth);
            assert_eq!(r.status, 200, "{path} with {auth:?}: {}", r.summary());
        }
    }
    let ready = admin::request(admin, "GET", "/readyz", None).json();
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["store"], "memory", "{ready}");

    let r = admin::request(admin, "GET", "/metrics", Some(&good));
    assert!(r.header("content-type").is_some_and(|c| c.starts_with("text/plain")), "{}", r.summary());
    let config = admin::request(admin, "GET", "/config", Some(&good)).json();
    assert_eq!(config["generation"], 1, "{config}");
    assert!(config["last_error"].is_null(), "{config}");
    let reload = admin::request(admin, "POST", "/reload", Some(&good)).json();
    assert_eq!(reload["result"], "unchanged", "{reload}");
    assert_eq!(reload["generation"], 1, "{reload}");

    // One key's state after 3 requests at 1r/m, burst 5: level ~3, 3 more could pass on "api";
    // the shadow reference (burst 2) reads the same bucket.
    let r = admin::request(admin, "GET", "/limits?zone=z&key=127.0.0.1", Some(&good));
    let limits = r.json();
    assert_eq!(limits["zone"], "z", "{limits}");
    assert_eq!(limits["key"], "127.0.0.1", "{limits}");
    assert_eq!(limits["rate"], "1r/m", "{limits}");
    let level = limits["state"]["level"].as_f64().unwrap_or_else(|| panic!("state.level: {limits}"));
    assert!((2.9..=3.0).contains(&level), "level ~3: {limits}");
    assert!(limits["state"]["last_us"].as_u64().is_some_and(|t| t > 0), "{limits}");
    let routes = limits["routes"].as_array().unwrap_or_else(|| panic!("routes: {limits}"));
    let by_route: BTreeMap<&str, &Value> = routes.iter().map(|r| (r["route"].as_str().unwrap_or(""), r)).collect();
    assert_eq!(by_route.len(), 2, "both routes use zone z: {limits}");
    assert_eq!(by_route["api"]["remaining"], 3, "{limits}");
    assert_eq!(by_route["api"]["burst"], 5, "{limits}");
    assert_eq!(by_route["api"]["dry_run"], false, "{limits}");
    assert_eq!(by_route["shadow"]["remaining"], 0, "{limits}");
    assert_eq!(by_route["shadow"]["dry_run"], true, "{limits}");

    // A key never seen: no state, the whole burst + 1 available.
    let fresh = admin::request(admin, "GET", "/limits?zone=z&key=198.51.100.1", Some(&good)).json();
    assert!(fresh["state"].is_null(), "{fresh}");
    assert_eq!(fresh["routes"][0]["remaining"], 6, "{fresh}");

    let r = admin::request(admin, "GET", "/limits?zone=nope&key=x", Some(&good));
    assert_eq!(r.status, 404, "unknown zone: {}", r.summary());
    let r = admin::request(admin, "GET", "/limits", Some(&good));
    assert_eq!(r.status, 400, "no parameters: {}", r.summary());
    let r = admin::request(admin, "GET", "/nope", Some(&good));
    assert_eq!(r.status, 404, "unknown admin path: {}", r.summary());
    let r = admin::request(admin, "GET", "/reload", Some(&good));
    assert_eq!(r.status, 405, "GET /reload: {}", r.summary());
}

#[test]
fn admin_without_token_is_open() {
    let up = Upstream::start();
    let w = Weir::start(&config(
        &up,
        "",
        r#"
[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
"#,
    ));
    let admin = admin::addr(&w);
    for (method, target) in
        [("GET", "/metrics"), ("GET", "/config"), ("GET", "/healthz"), ("GET", "/readyz"), ("POST", "/reload")]
    {
        let r = admin::request(admin, method, target, None);
        assert_eq!(r.status, 200, "{method} {target}: {}", r.summary());
    }
    let r = admin::request(admin, "GET", "/nope", None);
    assert_eq!(r.status, 404, "{}", r.summary());
}
