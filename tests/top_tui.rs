//! `weir top` in a real terminal: tmux runs it against a real weir's admin address; the test reads
//! the screen (`capture-pane`) and types keys (`send-keys`). Needs tmux (scripts/setup.sh).

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::admin;
use support::config::with_app;
use support::http::{KeepAlive, Request};
use support::poll::poll;
use support::upstream::Upstream;
use support::weir::{self, Weir};

const TOKEN: &str = "tui-secret-token-0123";

/// A tmux server of its own (`-L`), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// A socket per test (the tests of this file run in parallel).
    fn new() -> Tmux {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Tmux { socket: format!("weir-top-test-{}-{n}", std::process::id()) }
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("tmux {args:?}: {e} (install it with scripts/setup.sh)"));
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }

    /// Polls the screen until `want` holds (5 s), returning it; panics with the screen if not.
    fn wait_for(&self, what: &str, want: impl Fn(&str) -> bool) -> String {
        poll(Duration::from_secs(5), Duration::from_millis(100), || self.screen(), |s| want(s))
            .unwrap_or_else(|s| panic!("the screen never showed {what}:\n{s}"))
    }

    fn keys(&self, keys: &str) {
        self.run(&["send-keys", "-t", "top", keys]);
    }

    fn alive(&self) -> bool {
        Command::new("tmux")
            .args(["-L", &self.socket, "has-session", "-t", "top"])
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.socket, "kill-server"]).output();
    }
}

#[test]
fn weir_top_shows_rates_and_keys_sorts_and_resets_with_confirmation() {
    let up = Upstream::start();
    let w = Weir::start(&with_app(
        &format!("{}\nadmin_token = \"{TOKEN}\"", admin::LISTEN),
        "[store]\nkind = \"memory\"\n\n[top]\nreveal_keys = true",
        up.addr(),
        r#"[[limit_req_zone]]
name = "per_client"
key = "header:X-Client"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_client", burst = 0, nodelay = true } ]
"#,
    ));
    let mut client = KeepAlive::new(w.addr, Duration::from_secs(5));
    let mut hit = |key: &str, n: usize| {
        for _ in 0..n {
            client.send(&Request::get("/api/").header("X-Client", key)).expect("request");
        }
    };
    // "greedy" rejected 29 times, "modest" 2 times: greedy leads by rejections.
    hit("greedy", 30);
    hit("modest", 3);

    let tmux = Tmux::new();
    let command = format!("{} top --admin {} --token {TOKEN}", weir::bin(), admin::addr(&w));
    tmux.run(&["new-session", "-d", "-s", "top", "-x", "150", "-y", "40", &command]);
    let screen = tmux.wait_for("the routes, zones and keys", |s| {
        s.contains("weir top") && s.contains("api") && s.contains("per_client") && s.contains("greedy")
    });
    let line_of = |s: &str, needle: &str| s.lines().position(|l| l.contains(needle) && l.contains("per_client"));
    assert!(line_of(&screen, "greedy") < line_of(&screen, "modest"), "greedy first by rejections:\n{screen}");
    assert!(screen.contains("by rejected/s"), "{screen}");

    // Rates come from two readings a second apart: traffic now shows as rejected/s.
    hit("greedy", 20);
    tmux.wait_for("a rejected rate on the route", |s| {
        s.lines().any(|l| l.contains("api") && l.contains("per_client") && !l.trim_end().ends_with("0.0"))
    });

    // `s` sorts by req/s, then by fill.
    tmux.keys("s");
    tmux.wait_for("the req/s order", |s| s.contains("by req/s"));
    tmux.keys("s");
    tmux.wait_for("the fill order", |s| s.contains("by fill"));
    tmux.keys("s");
    tmux.wait_for("the rejections order", |s| s.contains("by rejected/s"));

    // Select the first row (greedy), ask for a reset, cancel, ask again, confirm.
    tmux.keys("r");
    tmux.wait_for("the confirmation", |s| s.contains("Reset greedy in zone per_client? y to confirm"));
    tmux.keys("n");
    tmux.wait_for("the cancellation", |s| s.contains("reset cancelled"));
    let state = |key: &str| {
        let r = admin::request(
            admin::addr(&w),
            "GET",
            &format!("/limits?zone=per_client&key={key}"),
            Some(&format!("Bearer {TOKEN}")),
        );
        r.json()["state"].clone()
    };
    assert!(!state("greedy").is_null(), "cancelled: greedy still limited");
    tmux.keys("r");
    tmux.wait_for("the confirmation", |s| s.contains("Reset greedy in zone per_client?"));
    tmux.keys("y");
    tmux.wait_for("the reset's result", |s| s.contains("reset greedy in zone per_client"));
    assert!(state("greedy").is_null(), "greedy's state is gone");
    assert!(!state("modest").is_null(), "only the selected key was reset");
    hit("greedy", 1);
    assert_eq!(up.hits(), 3, "greedy passes again after the reset (1 + 1 + modest's 1)");

    tmux.keys("q");
    assert!(
        poll(Duration::from_secs(5), Duration::from_millis(50), || tmux.alive(), |alive| !alive).is_ok(),
        "q quits"
    );
}

#[test]
fn weir_top_without_the_token_says_so_and_shows_nothing() {
    let up = Upstream::start();
    let w = Weir::start(&with_app(
        &format!("{}\nadmin_token = \"{TOKEN}\"", admin::LISTEN),
        "[store]\nkind = \"memory\"",
        up.addr(),
        "",
    ));
    let out = weir::run(["top", "--admin", &admin::addr(&w).to_string()], Duration::from_secs(10));
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stderr.contains("401") && out.stderr.contains("token"), "{}", out.describe());
}

#[test]
fn weir_top_shows_each_adaptive_upstreams_limit_in_flight_ideal_latency_and_shed() {
    let up = Upstream::start();
    let w = Weir::start(&support::config::with_server(
        admin::LISTEN,
        &format!(
            r#"[store]
kind = "memory"

[[upstream]]
name = "app"
servers = ["{}"]
adaptive = {{}}

[[upstream]]
name = "plain"
servers = ["{}"]

[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
"#,
            up.addr(),
            up.addr()
        ),
    ));
    // Traffic until the first window is judged (32 answers over at least 250 ms): the ideal
    // latency is learned and shows.
    let mut client = KeepAlive::new(w.addr, Duration::from_secs(5));
    let status = || admin::request(admin::addr(&w), "GET", "/upstreams", None).json();
    let learned = poll(
        Duration::from_secs(10),
        Duration::from_millis(10),
        || {
            client.send(&Request::get("/")).expect("request");
            status()
        },
        |s| !s["upstreams"][0]["adaptive"]["ideal_ms"].is_null(),
    )
    .unwrap_or_else(|s| panic!("no ideal latency learned: {s}"));
    let limit = learned["upstreams"][0]["adaptive"]["limit"].as_u64().expect("a limit");

    let tmux = Tmux::new();
    let command = format!("{} top --admin {}", weir::bin(), admin::addr(&w));
    tmux.run(&["new-session", "-d", "-s", "top", "-x", "150", "-y", "40", &command]);
    let screen = tmux.wait_for("the adaptive panel", |s| s.contains("adaptive concurrency"));
    let header = screen.lines().find(|l| l.contains("in flight")).unwrap_or_default();
    for column in ["upstream", "limit", "in flight", "waiting", "ideal ms", "shed"] {
        assert!(header.contains(column), "no {column} column:\n{screen}");
    }
    // The row of `app`: its limit (an idle upstream keeps it), nothing in flight, a learned
    // ideal latency in ms, nothing shed. `plain` has no adaptive limit and no row.
    let row = screen
        .lines()
        .skip_while(|l| !l.contains("adaptive concurrency"))
        .find(|l| l.contains("app"))
        .unwrap_or_else(|| panic!("no row for app:\n{screen}"));
    let cells: Vec<&str> = row.split(|c: char| c == '│' || c.is_whitespace()).filter(|c| !c.is_empty()).collect();
    assert_eq!(cells.first(), Some(&"app"), "{row}");
    assert_eq!(cells.get(1), Some(&limit.to_string().as_str()), "{row}");
    assert_eq!(cells.get(2), Some(&"0"), "in flight: {row}");
    assert!(cells.get(4).and_then(|c| c.parse::<f64>().ok()).is_some_and(|ms| ms > 0.0), "ideal ms: {row}");
    assert_eq!(cells.get(5), Some(&"0"), "shed: {row}");
    assert!(
        !screen.lines().skip_while(|l| !l.contains("adaptive concurrency")).take(4).any(|l| l.contains("plain")),
        "{screen}"
    );
    tmux.keys("q");
}
