//! Issue 24, count by response: a zone with `count_statuses` checks a request without charging it
//! and charges it only when its response has one of those statuses. A brute-forcer is locked out
//! after exactly N 401s, fleet-wide (two weir processes on one redis-server) and on the memory
//! store, while the requests that get 200 are not charged; `limit_conn` on the same key bounds the
//! check-then-charge race; `weir replay` of the access log decides the same.
//! Real weir processes, real Redis, real upstream, real sockets.

use crate::support;

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use support::access_log::wait_for_access_lines;
use support::config::{memory_with_app, with_app};
use support::http::{self, Request};
use support::redis_server::RedisServer;
use support::replay::replay_own_log;
use support::upstream::Upstream;
use support::weir::Weir;

/// Failed logins allowed per client address before the lockout.
const N: usize = 5;

/// A login route whose zone counts only 401s: N of them in an hour (a burst of N - 1 on top of
/// the first; 1r/h drains nothing a test could notice). `extra_route` adds to the route.
fn login(extra_route: &str, extra_zones: &str) -> String {
    format!(
        r#"[[limit_req_zone]]
name = "failed_logins"
key = "ip"
rate = "1r/h"
count_statuses = [401, 403]
{extra_zones}
[[route]]
name = "login"
path_prefix = "/login"
upstream = "app"
limit_req = [ {{ zone = "failed_logins", burst = {burst}, nodelay = true }} ]
{extra_route}
"#,
        burst = N - 1
    )
}

fn attempt(addr: SocketAddr, password: &str) -> u16 {
    http::must_send(addr, &Request::get("/login").header("X-Password", password)).status
}

/// Alternates an honest login (200, never charged) and a wrong password over `addrs` until the
/// wrong ones are refused; returns the statuses of the wrong ones.
fn brute_force(addrs: &[SocketAddr], up: &Upstream) -> Vec<u16> {
    let mut wrong = Vec::new();
    for i in 0..(3 * N) {
        let addr = addrs[i % addrs.len()];
        let honest_before = up.hits();
        let honest = attempt(addr, "right");
        if wrong.iter().filter(|s| **s == 401).count() < N {
            assert_eq!(honest, 200, "an honest login before the lockout passes (attempt {i})");
            assert_eq!(up.hits(), honest_before + 1);
        } else {
            assert_eq!(honest, 429, "the lockout is per address: the honest login is refused too");
        }
        wrong.push(attempt(addrs[(i + 1) % addrs.len()], "guess"));
    }
    wrong
}

fn expected_lockout() -> Vec<u16> {
    let mut want = vec![401; N];
    want.resize(3 * N, 429);
    want
}

#[test]
fn a_fleet_on_one_redis_locks_a_brute_forcer_out_after_exactly_n_401s() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    up.set_password("right");
    let sections =
        format!("[log]\naccess_log = false\n\n[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"", redis.url());
    let fleet: Vec<Weir> = (0..2).map(|_| Weir::start(&with_app("", &sections, up.addr(), &login("", "")))).collect();
    let addrs: Vec<SocketAddr> = fleet.iter().map(|w| w.addr).collect();
    let wrong = brute_force(&addrs, &up);
    assert_eq!(wrong, expected_lockout(), "exactly {N} 401s in total over both instances, then 429");
    // The upstream saw every honest login before the lockout and exactly N wrong ones.
    let seen = up.seen();
    let guesses = seen.iter().filter(|s| s.header("x-password").as_deref() == Some("guess")).count();
    assert_eq!(guesses, N, "refused guesses never reach the upstream");
}

#[test]
fn the_memory_store_locks_out_after_exactly_n_401s_and_replay_agrees() {
    let up = Upstream::start();
    up.set_password("right");
    let conf = with_app("", "[store]\nkind = \"memory\"\n[log]\nformat = \"json\"\n", up.addr(), &login("", ""));
    let w = Weir::start(&conf);
    let wrong = brute_force(&[w.addr], &up);
    assert_eq!(wrong, expected_lockout());

    let total = 2 * 3 * N;
    let lines = wait_for_access_lines(&w, total);
    assert_eq!(lines.len(), total, "one access line per request");
    let live: Vec<&str> = lines.iter().map(|l| l["limit_req"].as_str().unwrap_or("?")).collect();
    assert_eq!(live.iter().filter(|w| **w == "REJECTED").count(), total - 2 * N, "{live:?}");

    let text = replay_own_log(&w, total);
    let rejected = text.lines().filter(|l| l.split('\t').nth(1) == Some("REJECTED")).count();
    assert_eq!(rejected, total - 2 * N, "{text}");
}

/// Requests checked at once are all admitted before any is charged (the race, docs/charges.md);
/// a `limit_conn` of 1 on the same key keeps one in flight per client, and its lease is given
/// back only after the charge, so the count stays exact under concurrent guessing.
#[test]
fn limit_conn_on_the_same_key_bounds_the_race_to_exactly_n() {
    let up = Upstream::start();
    up.set_password("right");
    // Responses take a while, so concurrent guesses overlap.
    up.set_sleep(Duration::from_millis(100));
    let conns = "[[limit_conn_zone]]\nname = \"logins_in_flight\"\nkey = \"ip\"\n";
    let route = "limit_conn = [ { zone = \"logins_in_flight\", max = 1 } ]";
    let w = Weir::start(&memory_with_app(up.addr(), &login(route, conns)));
    let mut statuses = Vec::new();
    for _round in 0..(2 * N) {
        let barrier = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let barrier = barrier.clone();
                let addr = w.addr;
                thread::spawn(move || {
                    barrier.wait();
                    attempt(addr, "guess")
                })
            })
            .collect();
        statuses.extend(threads.into_iter().map(|t| t.join().expect("a client thread")));
    }
    let count = |s: u16| statuses.iter().filter(|x| **x == s).count();
    assert_eq!(count(401), N, "exactly N guesses reached the upstream: {statuses:?}");
    assert!(statuses.iter().all(|s| [401, 429, 503].contains(s)), "{statuses:?}");
    assert_eq!(&statuses[statuses.len() - 8..], [429; 8], "locked out at the end: {statuses:?}");
}
