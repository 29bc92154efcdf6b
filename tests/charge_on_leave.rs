//! Issue 34, item 2: a charge decided by the response cannot be dodged by leaving. Once a request
//! was forwarded, its charge is made whatever the client does: a client that leaves before the
//! response head of a `count_statuses` zone is charged as if its status counted, and one that
//! leaves an answer charged from its trailer before the trailer came is charged the zone's `max`
//! (docs/charges.md, "A client that leaves"). `weir replay` of the access log decides the same.
//! Real weir processes, real Redis, real upstreams (an HTTP one and a gRPC one), real sockets.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use support::access_log::access_lines;
use support::config::with_app;
use support::grpc_server::GrpcServer;
use support::http::{self, Request};
use support::poll::wait_until;
use support::redis_server::RedisServer;
use support::replay::replay_own_log;
use support::upstream::Upstream;
use support::weir::Weir;

/// A "send an SMS" route whose zone counts only 200s: 3 sends an hour per client address.
const SMS: &str = r#"[[limit_req_zone]]
name = "sms"
key = "ip"
rate = "1r/h"
count_statuses = [200]

[[route]]
name = "sms"
path_prefix = "/sms"
upstream = "app"
limit_req = [ { zone = "sms", burst = 2, nodelay = true } ]
"#;

/// Sends a request on its own connection, waits until the upstream has it (`hits` reached), and
/// closes the connection before the (slow) upstream answers.
fn send_and_leave(addr: SocketAddr, up: &Upstream, hits: usize) {
    let mut conn = http::Conn::connect(addr).expect("connect");
    conn.send_raw(&Request::get("/sms").to_bytes()).expect("send");
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(5), || up.hits() >= hits).is_some(),
        "the request reached the upstream"
    );
    conn.stream().shutdown(std::net::Shutdown::Both).expect("close");
}

/// Waits until `w` wrote `n` access lines (each written after the request's charges).
fn wait_for_lines(w: &Weir, n: usize) -> Vec<serde_json::Value> {
    wait_until(Duration::from_secs(10), Duration::from_millis(10), || access_lines(w).len() >= n);
    let lines = access_lines(w);
    assert_eq!(lines.len(), n, "one access line per request:\n{}", w.stderr());
    lines
}

/// Three sends reach the slow upstream over `fleet` (alternating), each client leaving before
/// the head; then a fourth is refused on every instance and never reaches the upstream.
fn leave_three_times_then_refused(fleet: &[Weir], up: &Upstream) {
    // Slow enough that every client is gone before the answer (the test never waits for it).
    up.set_sleep(Duration::from_secs(30));
    for i in 0..3 {
        let w = &fleet[i % fleet.len()];
        let before = access_lines(w).len();
        send_and_leave(w.addr, up, i + 1);
        let lines = wait_for_lines(w, before + 1);
        let line = &lines[before];
        assert_eq!(line["client_left"], true, "the access log says the client left owing: {line}");
        assert_eq!(line["status"], 0, "no answer was written: {line}");
    }
    // The three were charged although no status was ever seen.
    up.set_sleep(Duration::ZERO);
    for w in fleet {
        let r = http::must_send(w.addr, &Request::get("/sms"));
        assert_eq!(r.status, 429, "{}", r.summary());
    }
    assert_eq!(up.hits(), 3, "refused sends never reach the upstream");
}

#[test]
fn clients_that_leave_before_the_head_are_charged_as_counted_across_a_fleet() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let sections = format!("[log]\nformat = \"json\"\n\n[store]\nkind = \"redis\"\nurl = \"{}\"\n", redis.url());
    let fleet: Vec<Weir> = (0..2).map(|_| Weir::start(&with_app("", &sections, up.addr(), SMS))).collect();
    leave_three_times_then_refused(&fleet, &up);
}

#[test]
fn on_the_memory_store_too_and_replay_of_the_log_agrees() {
    let up = Upstream::start();
    let w = Weir::start(&with_app("", "[log]\nformat = \"json\"\n\n[store]\nkind = \"memory\"\n", up.addr(), SMS));
    leave_three_times_then_refused(std::slice::from_ref(&w), &up);
    wait_for_lines(&w, 4);
    let decisions = replay_own_log(&w, 4);
    let words: Vec<&str> = decisions.lines().filter_map(|l| l.split('\t').nth(1)).filter(|w| *w != "-").collect();
    assert_eq!(words, ["PASSED", "PASSED", "PASSED", "REJECTED"], "{decisions}");
}

/// Handlers of a gRPC service whose streamed answers report their tokens in the trailers, at the
/// end, after a pause a client may use to leave.
const LLM_HANDLERS: &str = r#"
import time
def answer(req, ctx):
    yield b"first part"
    time.sleep(0.5)
    ctx.set_trailing_metadata((("x-tokens-used", "50000"),))
    yield b"second part"
METHODS = {"Answer": grpc.unary_stream_rpc_method_handler(answer)}
"#;

/// One call: `leave` reads the first message and cancels; otherwise it reads to the end. Prints
/// the messages read, then `done`, `left` or the status code.
const GRPC_CLIENT: &str = r#"
import sys, grpc
channel = grpc.insecure_channel(sys.argv[1])
call = channel.unary_stream("/demo.Llm/Answer")(b"weir", timeout=10)
try:
    for part in call:
        print(part.decode(), flush=True)
        if sys.argv[2] == "leave":
            call.cancel()
            print("left")
            break
    else:
        print("done")
except grpc.RpcError as e:
    print(e.code().name)
"#;

fn call(w: &Weir, how: &str) -> Vec<String> {
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", GRPC_CLIENT, &w.addr.to_string(), how])
        .output()
        .expect("/usr/bin/python3 with grpcio");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// A weir (memory store, JSON log) in front of `grpc` whose zone "tokens" holds 100000 tokens and
/// is charged from the answers' trailers, at most `max` an answer.
fn llm_weir(grpc: &GrpcServer, max: u64) -> Weir {
    let rest = format!(
        r#"[store]
kind = "memory"

[log]
format = "json"

[[upstream]]
name = "llm"
servers = ["127.0.0.1:{port}"]
protocol = "h2c"

[[limit_req_zone]]
name = "tokens"
key = "ip"
rate = "1r/h"
cost_from_response = {{ header = "x-tokens-used", trailer = true, max = {max} }}

[[route]]
name = "llm"
path_prefix = "/demo.Llm/"
upstream = "llm"
limit_req = [ {{ zone = "tokens", burst = 99999, nodelay = true }} ]
"#,
        port = grpc.port
    );
    Weir::start(&support::config::with_server("h2c = true", &rest))
}

#[test]
fn a_client_that_leaves_before_the_trailer_is_charged_the_zones_max_and_replay_agrees() {
    let grpc = GrpcServer::start("demo.Llm", LLM_HANDLERS);
    let w = llm_weir(&grpc, 50_000);
    // Two clients read the first part and leave before the trailer (which would say 50000).
    for i in 0..2 {
        assert_eq!(call(&w, "leave"), ["first part", "left"], "{}", w.stderr());
        let lines = wait_for_lines(&w, i + 1);
        assert_eq!(lines[i]["client_left"], true, "{}", lines[i]);
    }
    // Charged 50000 each (not the default 1): the budget is spent, the third call is refused.
    assert_eq!(call(&w, "stay"), ["RESOURCE_EXHAUSTED"], "{}", w.stderr());
    wait_for_lines(&w, 3);
    let decisions = replay_own_log(&w, 3);
    let words: Vec<&str> = decisions.lines().filter_map(|l| l.split('\t').nth(1)).filter(|w| *w != "-").collect();
    assert_eq!(words, ["PASSED", "PASSED", "REJECTED"], "{decisions}");
}

#[test]
fn a_client_that_stays_is_charged_what_the_trailer_reports() {
    let grpc = GrpcServer::start("demo.Llm", LLM_HANDLERS);
    let w = llm_weir(&grpc, 100_000);
    // Two whole answers cost 2 × 50000 (the trailer's count): the budget is spent exactly, so the
    // third is refused. Had a finished answer been charged `max` (the whole budget), the second
    // would have been refused.
    assert_eq!(call(&w, "stay"), ["first part", "second part", "done"], "{}", w.stderr());
    assert_eq!(call(&w, "stay"), ["first part", "second part", "done"], "{}", w.stderr());
    assert_eq!(call(&w, "stay"), ["RESOURCE_EXHAUSTED"], "{}", w.stderr());
}
