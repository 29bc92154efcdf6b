//! Issue 24, charge from the response: a zone with `cost_from_response` checks a request without
//! charging it, then charges the cost the upstream reports in a response header, in one atomic
//! store call, into debt up to a cap. An upstream that reports 5000 tokens per response spends a
//! 20000-token budget after the 4th response fleet-wide (two weir processes on one redis-server),
//! and the 5th request is refused — or waits, with a `delay` below the budget; bad, negative and
//! huge values count as the default or the cap; a client cannot set its own cost; `weir replay`
//! of the access log decides the same. Real weir processes, real Redis, real upstream, sockets.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use support::access_log::wait_for_access_lines;
use support::config::{memory_with_app, with_app};
use support::grpc_server::GrpcServer;
use support::http::{self, Request, Response};
use support::redis_server::RedisServer;
use support::replay::replay_own_log;
use support::upstream::Upstream;
use support::weir::{run, ConfigDir, Weir};

const TOKENS: &str = "x-tokens-used";

/// A route "llm" whose zone "tokens" (keyed per client address) is charged the tokens each
/// response reports; `reference` is the route's `limit_req` entry, `spec` the zone's
/// `cost_from_response`.
fn llm(rate: &str, reference: &str, spec: &str) -> String {
    format!(
        r#"[[limit_req_zone]]
name = "tokens"
key = "ip"
rate = "{rate}"
cost_from_response = {spec}

[[route]]
name = "llm"
path_prefix = "/v1"
upstream = "app"
limit_req = [ {reference} ]
"#
    )
}

fn ask(addr: SocketAddr) -> Response {
    // The client claims to have used nothing: it must not matter.
    http::must_send(addr, &Request::get("/v1/chat").header(TOKENS, "0"))
}

/// `r=` of the zone in a `RateLimit` header (`"tokens";r=N;t=S`).
fn remaining(r: &Response) -> u64 {
    let field = r.header("ratelimit").unwrap_or_else(|| panic!("no RateLimit header: {}", r.summary()));
    let r_part = field.split(';').find_map(|p| p.strip_prefix("r=")).unwrap_or_else(|| panic!("no r= in {field:?}"));
    r_part.parse().unwrap_or_else(|_| panic!("r= of {field:?}"))
}

#[test]
fn a_fleet_on_one_redis_spends_a_20000_token_budget_in_4_responses_then_refuses() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    up.set_response_header(TOKENS, Some("5000"));
    let sections =
        format!("[log]\naccess_log = false\n\n[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"", redis.url());
    // 20000 tokens, refilled at one an hour (nothing a test could notice).
    let conf = llm("1r/h", "{ zone = \"tokens\", burst = 19999, nodelay = true }", "{ header = \"x-tokens-used\" }");
    let fleet: Vec<Weir> = (0..2).map(|_| Weir::start(&with_app("", &sections, up.addr(), &conf))).collect();
    let mut answers = Vec::new();
    for i in 0..6 {
        answers.push(ask(fleet[i % 2].addr));
    }
    let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429], "exhausted after the 4th response over both instances");
    assert_eq!(up.hits(), 4, "refused requests never reach the upstream");
    // Each check shows what the earlier responses spent (one token of room is what a request needs).
    let left: Vec<u64> = answers[..4].iter().map(remaining).collect();
    assert_eq!(left, [19_999, 14_999, 9_999, 4_999]);
    for refused in &answers[4..] {
        assert_eq!(remaining(refused), 0);
        // One token must drain at 1r/h; Retry-After counts down from an hour (generous on timing).
        let retry: u64 = refused.header("retry-after").and_then(|v| v.parse().ok()).expect("Retry-After");
        assert!((3590..=3600).contains(&retry), "Retry-After {retry}");
    }
    // The upstream's header reaches the client unchanged (it is the upstream's to send).
    assert_eq!(answers[0].header(TOKENS).as_deref(), Some("5000"));

    // The upstream reports more than the budget holds: the charge goes into debt, capped at one
    // more budget (the default), so the client waits for the debt to drain, not forever.
    up.set_response_header(TOKENS, Some("900000"));
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.connection()).expect("FLUSHALL");
    assert_eq!(ask(fleet[0].addr).status, 200);
    let refused = ask(fleet[1].addr);
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.header("retry-after").and_then(|v| v.parse().ok()).expect("Retry-After");
    // Level 40000 (20000 past the burst): 20001 tokens to drain at one an hour.
    assert!((20_001 * 3600 - 10..=20_001 * 3600).contains(&retry), "Retry-After {retry}");
}

#[test]
fn past_its_delay_the_5th_request_waits_for_the_tokens_to_drain_and_replay_agrees() {
    let up = Upstream::start();
    up.set_response_header(TOKENS, Some("5000"));
    // 100 tokens a second; requests past 19500 tokens in the bucket wait for the excess to drain,
    // so after 20000 tokens the next one waits 5 s (less what drained meanwhile).
    let conf = llm(
        "100r/s",
        "{ zone = \"tokens\", burst = 29999, delay = 19500 }",
        "{ header = \"x-tokens-used\", max_debt = 0 }",
    );
    let w = Weir::start(&with_app("", "[store]\nkind = \"memory\"\n[log]\nformat = \"json\"\n", up.addr(), &conf));
    let quick: Vec<u16> = (0..4).map(|_| ask(w.addr).status).collect();
    assert_eq!(quick, [200; 4]);
    let fifth = ask(w.addr);
    assert_eq!(fifth.status, 200, "delayed, not refused");
    // The bucket held 20000 tokens from the first charge on, less 100 a second since: the 5th
    // can pass when 500 have drained since the first response, 5 s after it at the earliest
    // (the access log below shows the first four were not delayed).
    let seen = up.seen();
    assert_eq!(seen.len(), 5);
    let waited = seen[4].at.duration_since(seen[0].at);
    assert!(waited >= Duration::from_secs(5), "the 5th reached the upstream after {waited:?}");
    assert!(waited < Duration::from_secs(15), "the 5th waited {waited:?}");

    let total = 5;
    let lines = wait_for_access_lines(&w, total);
    assert_eq!(lines.len(), total, "one access line per request");
    let live: Vec<&str> = lines.iter().map(|l| l["limit_req"].as_str().unwrap_or("?")).collect();
    assert_eq!(live, ["PASSED", "PASSED", "PASSED", "PASSED", "DELAYED"]);
    assert!(lines.iter().all(|l| l["upstream_http_x_tokens_used"] == "5000"), "{lines:?}");
    replay_own_log(&w, total);
}

#[test]
fn bad_negative_and_huge_reports_cost_the_default_or_the_cap_and_the_client_sets_nothing() {
    let up = Upstream::start();
    let conf = llm(
        "1r/h",
        "{ zone = \"tokens\", burst = 9999, nodelay = true }",
        "{ header = \"x-tokens-used\", default = 100, max = 1000 }",
    );
    let w = Weir::start(&with_app("", "[store]\nkind = \"memory\"\n[log]\nformat = \"json\"\n", up.addr(), &conf));
    // (what the upstream reports, what it must cost)
    let reports: [(Option<&str>, u64); 8] = [
        (Some("-5"), 100),
        (Some("abc"), 100),
        (Some("1.5"), 100),
        (Some("99999999999999999999999"), 1000),
        (None, 100),
        (Some("0"), 0),
        (Some(" 42 "), 42),
        (Some("7"), 7),
    ];
    let mut spent = 0;
    for (report, cost) in reports {
        up.set_response_header(TOKENS, report);
        // The client says it spent a million: only the upstream's response counts.
        let r = http::must_send(w.addr, &Request::get("/v1/chat").header(TOKENS, "1000000"));
        assert_eq!(r.status, 200, "{report:?}");
        assert_eq!(remaining(&r), 10_000 - 1 - spent, "before the response reporting {report:?}");
        spent += cost;
    }
    assert_eq!(remaining(&ask(w.addr)), 10_000 - 1 - spent);
    let total = reports.len() + 1;
    wait_for_access_lines(&w, total);
    replay_own_log(&w, total);
}

#[test]
fn weir_check_accepts_the_example_and_refuses_a_window_zone() {
    let up = Upstream::start();
    let window = "[[limit_req_zone]]\nname = \"tokens\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nwindow = \"1m\"\nlimit = 10\n\
        cost_from_response = { header = \"x-tokens-used\" }\n\
        [[route]]\nname = \"llm\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_req = [ { zone = \"tokens\" } ]\n";
    let dir = ConfigDir::new();
    let path = dir.write("window.toml", &memory_with_app(up.addr(), window).replace("$LISTEN", "127.0.0.1:1"));
    let out = run(["check", "-c", path.to_str().unwrap()], Duration::from_secs(30));
    assert_ne!(out.code, Some(0), "{}", out.describe());
    assert!(out.stderr.contains("only leaky_bucket"), "{}", out.describe());
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/charges.toml");
    let out = run(["check", "-c", example], Duration::from_secs(30));
    assert_eq!(out.code, Some(0), "{}", out.describe());
}

/// Handlers of a gRPC service whose calls report their tokens in the trailers (trailing
/// metadata), as LLM gateways do when the count is known only once the answer is streamed.
const LLM_HANDLERS: &str = r#"
def say(req, ctx):
    ctx.set_trailing_metadata((("x-tokens-used", "5000"),))
    return b"hello " + req
METHODS = {"Ask": grpc.unary_unary_rpc_method_handler(say)}
"#;

/// Six sequential calls through `target`; one line per call: the reply, or the status code.
const GRPC_CLIENT: &str = r#"
import sys, grpc
channel = grpc.insecure_channel(sys.argv[1])
ask = channel.unary_unary("/demo.Llm/Ask")
for i in range(6):
    try:
        print(ask(b"weir", timeout=5).decode())
    except grpc.RpcError as e:
        print(e.code().name)
"#;

#[test]
fn a_grpc_upstream_reports_tokens_in_its_trailers_and_the_fifth_call_is_refused() {
    let grpc = GrpcServer::start("demo.Llm", LLM_HANDLERS);
    let rest = format!(
        r#"[store]
kind = "memory"

[[upstream]]
name = "llm"
servers = ["127.0.0.1:{port}"]
protocol = "h2c"

[[limit_req_zone]]
name = "tokens"
key = "ip"
rate = "1r/h"
cost_from_response = {{ header = "x-tokens-used", trailer = true }}

[[route]]
name = "llm"
path_prefix = "/demo.Llm/"
upstream = "llm"
limit_req = [ {{ zone = "tokens", burst = 19999, nodelay = true }} ]
"#,
        port = grpc.port
    );
    let w = Weir::start(&support::config::with_server("h2c = true", &rest));
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", GRPC_CLIENT, &w.addr.to_string()])
        .output()
        .expect("/usr/bin/python3 with grpcio");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        ["hello weir", "hello weir", "hello weir", "hello weir", "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"],
        "{out:?}\n--- weir ---\n{}",
        w.stderr()
    );
}
