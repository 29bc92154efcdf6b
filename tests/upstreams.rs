//! Upstreams end to end: real weir, real upstream servers over loopback. Weights, active HTTP
//! health checks, a server killed under load and brought back, `max_conns` across reloads, no
//! healthy server, read timeouts, retries on listed statuses, and the example config.

use crate::support;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use support::admin;
use support::config::with_server;
use support::http::{self, KeepAlive, Request};
use support::metrics::scrape;
use support::poll::{must_hold_within, poll, wait_until};
use support::upstream::Upstream;
use support::weir::{run, Weir};

/// A backend as the tests of this file use it: the shared upstream named `name` (its name in
/// `X-Upstream`), answering `/health` with 200 until told otherwise.
fn backend(name: &str) -> Upstream {
    backend_on(name, TcpListener::bind("127.0.0.1:0").expect("bind"))
}

fn backend_on(name: &str, listener: TcpListener) -> Upstream {
    let up = Upstream::start_on(name, listener);
    up.set_health(200);
    up
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn config(upstream: &str) -> String {
    with_server(
        admin::LISTEN,
        &format!(
            r#"[log]
access_log = false

[[upstream]]
name = "app"
{upstream}

[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
"#
        ),
    )
}

/// `GET /upstreams`: the servers of upstream "app" as (address, healthy, in_flight).
fn servers(w: &Weir) -> Vec<(String, bool, u64)> {
    let r = admin::request(admin::addr(w), "GET", "/upstreams", None);
    assert_eq!(r.status, 200, "{}", r.summary());
    let v = r.json();
    let app = v["upstreams"].as_array().and_then(|l| l.iter().find(|u| u["name"] == "app")).cloned();
    let app = app.unwrap_or_else(|| panic!("no upstream app in {v}"));
    app["servers"]
        .as_array()
        .unwrap_or_else(|| panic!("no servers in {app}"))
        .iter()
        .map(|s| {
            let up = s["healthy"].as_bool().unwrap_or(false) && s["passive_down_ms"].as_u64() == Some(0);
            (s["address"].as_str().unwrap_or("").to_string(), up, s["in_flight"].as_u64().unwrap_or(0))
        })
        .collect()
}

/// `GET /upstreams`: whether the active check (alone, passive health aside) has `addr` up.
fn actively_healthy(w: &Weir, addr: SocketAddr) -> Option<bool> {
    let r = admin::request(admin::addr(w), "GET", "/upstreams", None);
    let v = r.json();
    let app = v["upstreams"].as_array()?.iter().find(|u| u["name"] == "app")?.clone();
    let server = app["servers"].as_array()?.iter().find(|s| s["address"] == addr.to_string())?.clone();
    server["healthy"].as_bool()
}

fn is_up(w: &Weir, addr: SocketAddr) -> Option<bool> {
    servers(w).into_iter().find(|(a, _, _)| *a == addr.to_string()).map(|(_, up, _)| up)
}

/// Waits (bounded) until weir reports `addr` up or down; how long it took.
fn wait_health(w: &Weir, addr: SocketAddr, up: bool, timeout: Duration) -> Duration {
    let t0 = Instant::now();
    let last = poll(timeout, Duration::from_millis(10), || is_up(w, addr), |s| *s == Some(up));
    match last {
        Ok(_) => t0.elapsed(),
        Err(seen) => panic!("{addr} not reported up={up} within {timeout:?} (last: {seen:?}): {:?}", servers(w)),
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[test]
fn weights_split_traffic_3_to_1() {
    let a = backend("a");
    let b = backend("b");
    let w = Weir::start(&config(&format!(r#"servers = ["{} weight=3", "{} weight=1"]"#, a.addr(), b.addr())));
    let mut client = KeepAlive::new(w.addr, Duration::from_secs(5));
    let mut to_a = 0;
    for i in 0..4000 {
        let r = client.send(&Request::get(&format!("/w/{i}"))).expect("request");
        assert_eq!(r.status, 200, "request {i}: {}", r.summary());
        if r.header("x-upstream").as_deref() == Some("a") {
            to_a += 1;
        }
    }
    let share = to_a as f64 / 4000.0;
    println!("weight 3:1 → {to_a} of 4000 to a ({:.1}%), backend hits a={} b={}", share * 100.0, a.hits(), b.hits());
    assert!((share - 0.75).abs() <= 0.05, "a got {:.1}% of the traffic, expected 75 ± 5%", share * 100.0);
    assert_eq!(a.hits() + b.hits(), 4000);
}

#[test]
fn active_http_check_takes_a_server_out_on_500_and_back_on_200() {
    let a = backend("a");
    let b = backend("b");
    let w = Weir::start(&config(&format!(
        r#"servers = ["{}", "{}"]
[upstream.health_check]
path = "/health"
interval = "100ms"
rise = 1
fall = 1"#,
        a.addr(),
        b.addr()
    )));
    wait_health(&w, b.addr(), true, Duration::from_secs(3));
    b.set_health(500);
    let took = wait_health(&w, b.addr(), false, Duration::from_secs(3));
    println!("health path 500 → down after {took:?}");
    let before = b.hits();
    for i in 0..40 {
        let r = http::get(w.addr, &format!("/x/{i}"));
        assert_eq!(r.status, 200, "{}", r.summary());
        assert_eq!(r.header("x-upstream").as_deref(), Some("a"), "b is down: {}", r.summary());
    }
    assert_eq!(b.hits(), before, "no request reached the server whose health path says 500");
    let m = scrape(admin::addr(&w));
    assert_eq!(m.must("weir_upstream_server_up", &[("upstream", "app"), ("server", &b.addr().to_string())]), 0.0);
    assert_eq!(m.must("weir_upstream_server_up", &[("upstream", "app"), ("server", &a.addr().to_string())]), 1.0);
    assert!(m.sum("weir_upstream_health_changes_total", &[("server", &b.addr().to_string()), ("to", "down")]) >= 1.0);

    b.set_health(200);
    wait_health(&w, b.addr(), true, Duration::from_secs(3));
    let back = wait_until(Duration::from_secs(3), Duration::from_millis(5), || {
        http::get(w.addr, "/again").header("x-upstream").as_deref() == Some("b")
    });
    assert!(back.is_some(), "b gets traffic again once its health path says 200");
}

/// Steady load from 4 clients; one server is killed (listener and connections), then comes
/// back on the same port.
#[test]
fn a_killed_server_costs_no_client_errors_and_gets_traffic_back_within_interval_times_rise() {
    let a = backend("a");
    let mut b = backend("b");
    let b_addr = b.addr();
    let interval = Duration::from_millis(200);
    let rise = 2;
    let w = Weir::start(&config(&format!(
        r#"servers = ["{}", "{}"]
[upstream.health_check]
path = "/health"
interval = "200ms"
rise = {rise}
fall = 1"#,
        a.addr(),
        b.addr()
    )));
    wait_health(&w, b_addr, true, Duration::from_secs(3));

    // (sent, status, upstream) per request.
    let log: Arc<Mutex<Vec<(Instant, u16, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (log, stop, addr) = (log.clone(), stop.clone(), w.addr);
            thread::spawn(move || {
                let mut conn = KeepAlive::new(addr, Duration::from_secs(5));
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let sent = Instant::now();
                    let (status, who) = match conn.send(&Request::get(&format!("/load/{c}/{i}"))) {
                        Ok(r) => (r.status, r.header("x-upstream").unwrap_or_default()),
                        Err(_) => (0, String::new()),
                    };
                    log.lock().unwrap().push((sent, status, who));
                    thread::sleep(Duration::from_millis(2));
                }
            })
        })
        .collect();

    // b serves some of the load before it is killed (so "b back" below means back, not first).
    let served_by = |who: &str, since: Instant| {
        log.lock().unwrap().iter().filter(|(t, s, w)| *t >= since && *s == 200 && w == who).count()
    };
    let t_load = Instant::now();
    must_hold_within(Duration::from_secs(10), "b serves 20 requests of the load", || served_by("b", t_load) >= 20);
    let killed = Instant::now();
    b.kill();
    let detected = killed + wait_health(&w, b_addr, false, Duration::from_secs(5));
    println!("killed b; reported down {:?} after the kill", detected - killed);
    // The first failed request takes b out (passive health, at once); the active check sees it
    // down too within an interval (fall = 1). Only a check that saw it down can bring it back
    // before its fail_timeout (10 s by default): coming back clears its passive failures.
    must_hold_within(Duration::from_secs(5), "the active check reports b down", || {
        actively_healthy(&w, b_addr) == Some(false)
    });
    // The load meets the pool without b (what the "no errors after detection" assertion is about).
    must_hold_within(Duration::from_secs(10), "a serves 200 requests after b was reported down", || {
        served_by("a", detected) >= 200
    });
    let restarted = Instant::now();
    let b2 = Upstream::restart_at("b", b_addr);
    b2.set_health(200);
    let back = wait_until(Duration::from_secs(5), Duration::from_millis(5), || b2.hits() > 0)
        .unwrap_or_else(|| panic!("b never got traffic back: {:?}", servers(&w)));
    // The clients see b answer again (its answers are in the log, not only in its hit count).
    must_hold_within(Duration::from_secs(5), "a client is answered by b after its restart", || {
        served_by("b", restarted) > 0
    });
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().expect("client");
    }

    let log = log.lock().unwrap();
    let errors_total = log.iter().filter(|(_, s, _)| *s != 200).count();
    let after_detection: Vec<_> = log.iter().filter(|(t, s, _)| *t >= detected && *s != 200).collect();
    let served_by_b_while_down = log.iter().filter(|(t, _, who)| *t > detected && *t < restarted && who == "b").count();
    let m = scrape(admin::addr(&w));
    let retries = m.sum("weir_upstream_retries_total", &[("upstream", "app")]);
    println!(
        "{} requests, {errors_total} errors in all ({} after detection), {retries} retries; b back {back:?} after restart (interval × rise = {:?})",
        log.len(),
        after_detection.len(),
        interval * rise
    );
    assert!(log.len() > 200, "too little load: {}", log.len());
    assert!(after_detection.is_empty(), "client-visible errors after detection: {after_detection:?}");
    assert_eq!(served_by_b_while_down, 0);
    // The first passing check comes at most one interval after the restart, then rise - 1 more.
    let bound = interval * rise + Duration::from_millis(300);
    assert!(back <= bound, "traffic back to b after {back:?}, more than interval × rise + 300 ms slack = {bound:?}");
    assert!(log.iter().any(|(t, _, who)| *t > restarted && who == "b"));
}

/// The filed bug: max_conns counters lived in the config snapshot, so reloads under load let
/// more requests reach the server. The upstream counts its own concurrency.
#[test]
fn max_conns_holds_across_50_reloads() {
    let up = backend("slow");
    let text = |n: usize| {
        config(&format!(
            "servers = [\"{}\"]\nmax_conns = 2\nread_timeout = \"{}s\"\n# generation {n}\n",
            up.addr(),
            30 + n % 2
        ))
    };
    let w = Weir::start(&text(0));
    let stop = Arc::new(AtomicBool::new(false));
    let statuses: Arc<Mutex<Vec<u16>>> = Arc::default();
    let senders: Vec<_> = (0..6)
        .map(|c| {
            let (stop, statuses, addr) = (stop.clone(), statuses.clone(), w.addr);
            thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let s = http::send(addr, &Request::get(&format!("/sleep/1000/{c}/{i}"))).map_or(0, |r| r.status);
                    statuses.lock().unwrap().push(s);
                    thread::sleep(Duration::from_millis(20));
                }
            })
        })
        .collect();
    let admin_addr = admin::addr(&w);
    for n in 1..=50 {
        let file = text(n).replace("$LISTEN2", &admin_addr.to_string()).replace("$LISTEN", &w.addr.to_string());
        std::fs::write(&w.config_path, file).expect("write config");
        let r = admin::request(admin_addr, "POST", "/reload", None);
        assert_eq!(r.status, 200, "reload {n}: {}", r.summary());
        // Each generation meets traffic before the next: a request answered after this reload.
        let seen = statuses.lock().unwrap().len();
        must_hold_within(Duration::from_secs(10), &format!("a request answered after reload {n}"), || {
            statuses.lock().unwrap().len() > seen
        });
    }
    stop.store(true, Ordering::SeqCst);
    for s in senders {
        s.join().expect("sender");
    }
    let statuses = statuses.lock().unwrap();
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let busy = statuses.iter().filter(|s| **s == 503).count();
    println!(
        "50 reloads: {} requests, {ok} × 200, {busy} × 503; upstream max in flight {}",
        statuses.len(),
        up.max_in_flight()
    );
    assert!(up.max_in_flight() <= 2, "max_conns = 2 but the upstream saw {} at once", up.max_in_flight());
    assert_eq!(up.max_in_flight(), 2, "the cap was reached");
    assert_eq!(ok + busy, statuses.len(), "only 200 and 503: {statuses:?}");
}

#[test]
fn no_healthy_server_is_a_quick_502_naming_the_upstream() {
    let a = backend("a");
    let b = backend("b");
    a.set_health(500);
    b.set_health(503);
    let w = Weir::start(&config(&format!(
        "servers = [\"{}\", \"{}\"]\n[upstream.health_check]\npath = \"/health\"\ninterval = \"100ms\"\nfall = 1",
        a.addr(),
        b.addr()
    )));
    wait_health(&w, a.addr(), false, Duration::from_secs(3));
    wait_health(&w, b.addr(), false, Duration::from_secs(3));
    let t0 = Instant::now();
    let r = http::get(w.addr, "/anything");
    let took = t0.elapsed();
    assert_eq!(r.status, 502, "{}", r.summary());
    assert_eq!(r.json()["error"], "no_healthy_upstream", "{}", r.summary());
    assert_eq!(r.json()["upstream"], "app", "{}", r.summary());
    // At once, not after trying the servers (a connect attempt is bounded by 5 s); generous for
    // a loaded machine.
    assert!(took < Duration::from_millis(1500), "answered in {took:?}");
    assert_eq!(a.hits() + b.hits(), 0);
    let m = scrape(admin::addr(&w));
    assert!(m.must("weir_upstream_unavailable_total", &[("upstream", "app"), ("reason", "down")]) >= 1.0);
}

#[test]
fn a_hung_server_gets_504_after_read_timeout() {
    let up = backend("hung");
    let w = Weir::start(&config(&format!("servers = [\"{}\"]\nread_timeout = \"700ms\"", up.addr())));
    let t0 = Instant::now();
    let r = http::get(w.addr, "/hang");
    let took = t0.elapsed();
    println!("hung upstream: {} after {took:?}", r.status);
    assert_eq!(r.status, 504, "{}", r.summary());
    assert_eq!(r.json()["error"], "upstream_timeout", "{}", r.summary());
    assert_eq!(r.json()["upstream"], "app");
    assert!(took >= Duration::from_millis(700), "504 before read_timeout: {took:?}");
    assert!(took < Duration::from_millis(700) + Duration::from_secs(2), "504 too late: {took:?}");
}

#[test]
fn listed_statuses_go_to_the_next_server_for_idempotent_methods_only() {
    let good = backend("good");
    let bad = backend("bad");
    bad.force_status(503);
    let w = Weir::start(&config(&format!(
        "servers = [\"{}\", \"{}\"]\nnext_upstream = [\"error\", \"timeout\", \"http_503\"]\nmax_fails = 0",
        good.addr(),
        bad.addr()
    )));
    for i in 0..20 {
        let r = http::get(w.addr, &format!("/get/{i}"));
        assert_eq!(r.status, 200, "GET {i} goes to the next server: {}", r.summary());
        assert_eq!(r.header("x-upstream").as_deref(), Some("good"));
    }
    assert!(bad.hits() >= 5, "bad got its share first: {}", bad.hits());
    let posts: Vec<u16> = (0..20)
        .map(|i| http::must_send(w.addr, &Request::new("POST", &format!("/post/{i}")).body(b"x")).status)
        .collect();
    assert!(posts.contains(&503), "a POST is not sent twice: the 503 is passed on: {posts:?}");
    let m = scrape(admin::addr(&w));
    assert!(m.must("weir_upstream_retries_total", &[("upstream", "app"), ("reason", "http_503")]) >= 5.0);
}

#[test]
fn the_example_config_passes_check() {
    let out = run(["check", "-c", "conf/upstreams.toml"], Duration::from_secs(20));
    assert_eq!(out.code, Some(0), "{}", out.describe());
}

#[test]
fn bad_upstream_settings_are_refused_with_line_and_field() {
    let cases = [
        ("servers = [\"127.0.0.1:9 weight=0\"]", "weight must be 1..=1000"),
        ("servers = [\"127.0.0.1:9 heavy=2\"]", "unknown parameter \"heavy\""),
        ("servers = [\"127.0.0.1:9\"]\nread_timeout = \"soon\"", "read_timeout: expected a duration"),
        ("servers = [\"127.0.0.1:9\"]\ntries = 17", "tries: must be 1..=16"),
        (
            "servers = [\"127.0.0.1:9\"]\nnext_upstream = [\"http_404\"]",
            "next_upstream: unknown condition \"http_404\"",
        ),
        ("servers = [\"127.0.0.1:9\"]\n[upstream.health_check]\ntype = \"udp\"", "health_check.type"),
        (
            "servers = [\"127.0.0.1:9\"]\n[upstream.health_check]\npath = \"/h\"\nstatus = \"2xx\"",
            "health_check.status",
        ),
        ("servers = [\"127.0.0.1:9\"]\n[upstream.health_check]\ninterval = \"1ms\"", "health_check.interval"),
    ];
    for (upstream, needle) in cases {
        let text = config(upstream).replace("$LISTEN2", "127.0.0.1:9902").replace("$LISTEN", "127.0.0.1:9901");
        let line = upstream.lines().last().unwrap_or("");
        let expected_line = text.lines().position(|l| l == line).map(|i| i + 1);
        let l = expected_line.unwrap_or_else(|| panic!("{upstream}: its last line is not in the config:\n{text}"));
        let out = support::weir::check_config("bad.toml", &text, Duration::from_secs(20));
        assert_eq!(out.code, Some(1), "{upstream}: {}", out.describe());
        assert!(out.stderr.contains(needle), "{upstream}: stderr should mention {needle:?}: {}", out.stderr);
        assert!(out.stderr.contains("upstream \"app\""), "{upstream}: names the upstream: {}", out.stderr);
        assert!(out.stderr.contains(&format!("bad.toml:{l}:")), "{upstream}: line {l}: {}", out.stderr);
    }
}

/// A DNS server on loopback answering A queries for one name with a settable address (or
/// NXDOMAIN when set to `None`), AAAA queries with no records.
struct Dns {
    addr: SocketAddr,
    answer: Arc<Mutex<Option<[u8; 4]>>>,
    stop: Arc<AtomicBool>,
}

impl Dns {
    fn start(name: &'static str, ip: [u8; 4]) -> Dns {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind udp");
        socket.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        let addr = socket.local_addr().expect("addr");
        let answer = Arc::new(Mutex::new(Some(ip)));
        let stop = Arc::new(AtomicBool::new(false));
        let (current, stopped) = (answer.clone(), stop.clone());
        thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stopped.load(Ordering::SeqCst) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else { continue };
                let q = &buf[..n];
                // Header, then the question: labels, type, class.
                let mut at = 12;
                let mut labels = Vec::new();
                while at < n && q[at] != 0 {
                    let len = q[at] as usize;
                    labels.push(String::from_utf8_lossy(&q[at + 1..(at + 1 + len).min(n)]).into_owned());
                    at += 1 + len;
                }
                if at + 4 >= n {
                    continue;
                }
                let question_end = at + 5;
                let qtype = u16::from_be_bytes([q[at + 1], q[at + 2]]);
                let mut r = q[..question_end].to_vec();
                r[2] = 0x81;
                r[3] = 0x80;
                r[6] = 0;
                r[7] = 0;
                match *current.lock().unwrap() {
                    None => r[3] = 0x83,
                    Some(ip) if labels.join(".") == name && qtype == 1 => {
                        r[7] = 1;
                        r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
                        r.extend_from_slice(&ip);
                    }
                    Some(_) => {}
                }
                let _ = socket.send_to(&r, from);
            }
        });
        Dns { addr, answer, stop }
    }

    fn set(&self, ip: Option<[u8; 4]>) {
        *self.answer.lock().unwrap() = ip;
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Two backends on the same port of 127.0.0.2 and 127.0.0.3.
fn backends_on_two_loopback_ips() -> (Upstream, Upstream, u16) {
    for _ in 0..20 {
        let first = TcpListener::bind("127.0.0.2:0").expect("bind 127.0.0.2");
        let port = first.local_addr().expect("addr").port();
        if let Ok(second) = TcpListener::bind(("127.0.0.3", port)) {
            return (backend_on("two", first), backend_on("three", second), port);
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

#[test]
fn a_server_name_is_followed_when_its_address_changes_and_kept_when_it_stops_resolving() {
    let (two, three, port) = backends_on_two_loopback_ips();
    let dns = Dns::start("app.weir.test", [127, 0, 0, 2]);
    let interval = Duration::from_millis(300);
    let w = Weir::start(&config(&format!(
        "servers = [\"app.weir.test:{port}\"]\nresolver = \"{}\"\nresolve_interval = \"300ms\"",
        dns.addr
    )));
    let who = || http::get(w.addr, "/dns").header("x-upstream").unwrap_or_default();
    assert_eq!(who(), "two", "resolved at load through the resolver");

    dns.set(Some([127, 0, 0, 3]));
    let followed = wait_until(Duration::from_secs(5), Duration::from_millis(10), || who() == "three")
        .unwrap_or_else(|| panic!("the new address was not followed: {:?}", servers(&w)));
    println!("DNS change followed after {followed:?} (resolve_interval {interval:?})");
    assert!(followed <= interval + Duration::from_millis(500), "followed after {followed:?}");
    assert!(servers(&w).iter().all(|(a, _, _)| a.starts_with("127.0.0.3:")), "{:?}", servers(&w));

    // The name stops resolving: the failure is counted and the last good address keeps serving.
    dns.set(None);
    let admin_addr = admin::addr(&w);
    let failures = || {
        scrape(admin_addr).value_or_zero(
            "weir_upstream_resolve_failures_total",
            &[("upstream", "app"), ("server", &format!("app.weir.test:{port}"))],
        )
    };
    let counted = poll(Duration::from_secs(5), Duration::from_millis(20), failures, |n| *n >= 2.0);
    assert!(counted.is_ok(), "resolve failures not counted: {counted:?}");
    for i in 0..10 {
        let r = http::get(w.addr, &format!("/still/{i}"));
        assert_eq!(r.status, 200, "{}", r.summary());
        assert_eq!(r.header("x-upstream").as_deref(), Some("three"));
    }
    assert!(w.stderr().contains("keeping its last good addresses"), "logged: {}", w.stderr());
    drop(two);
    drop(three);
}

/// nginx: a request that never reached a server (connection refused) goes to the next one whatever
/// its method; the refusing server is then out for fail_timeout.
#[test]
fn a_refused_connection_goes_to_the_next_server_for_any_method() {
    let good = backend("good");
    let dead = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let w = Weir::start(&config(&format!("servers = [\"{dead}\", \"{}\"]", good.addr())));
    for i in 0..10 {
        let r = http::must_send(w.addr, &Request::new("POST", &format!("/p/{i}")).body(b"payload"));
        assert_eq!(r.status, 200, "POST {i}: {}", r.summary());
    }
    assert_eq!(good.hits(), 10);
    let m = scrape(admin::addr(&w));
    let dead_label = dead.to_string();
    assert_eq!(m.must("weir_upstream_connect_errors_total", &[("upstream", "app"), ("server", &dead_label)]), 1.0);
    assert_eq!(m.must("weir_upstream_retries_total", &[("upstream", "app"), ("reason", "error")]), 1.0);
    assert_eq!(m.must("weir_upstream_server_up", &[("upstream", "app"), ("server", &dead_label)]), 0.0);
    assert_eq!(is_up(&w, dead), Some(false), "out for fail_timeout after max_fails = 1");
}

/// `tries` bounds the servers one request may use; `non_idempotent` lets a POST go on too.
#[test]
fn tries_bounds_the_servers_per_request_and_non_idempotent_allows_post_retries() {
    let dead = |_: usize| TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let (d1, d2) = (dead(1), dead(2));
    let good = backend("good");
    // max_fails = 0: the dead servers stay in rotation, so every request meets them.
    let w =
        Weir::start(&config(&format!("servers = [\"{d1}\", \"{d2}\", \"{}\"]\ntries = 2\nmax_fails = 0", good.addr())));
    let mut failed = 0;
    for i in 0..30 {
        let r = http::get(w.addr, &format!("/t/{i}"));
        match r.status {
            200 => assert_eq!(r.header("x-upstream").as_deref(), Some("good")),
            502 => {
                failed += 1;
                assert_eq!(r.json()["error"], "upstream_error", "{}", r.summary());
                assert_eq!(r.json()["tries"], 2, "at most tries = 2 servers: {}", r.summary());
            }
            s => panic!("unexpected {s}: {}", r.summary()),
        }
    }
    let m = scrape(admin::addr(&w));
    let refused = m.sum("weir_upstream_connect_errors_total", &[("upstream", "app")]);
    println!("tries = 2 over [dead, dead, good]: {failed} of 30 failed, {refused} refused connections");
    assert!(failed > 0, "some requests met both dead servers first");
    assert!(good.hits() > 0);
    // Each 502 met two refusals, one of them followed by a retry; a success met at most one.
    let retries = m.sum("weir_upstream_retries_total", &[("upstream", "app"), ("reason", "error")]);
    assert_eq!(refused, failed as f64 + retries, "refused connections = 502s + retries");

    // A POST answered 503 goes to the next server only with non_idempotent.
    let a = backend("a");
    let b = backend("b");
    b.force_status(503);
    let w = Weir::start(&config(&format!(
        "servers = [\"{}\", \"{}\"]\nnext_upstream = [\"error\", \"http_503\", \"non_idempotent\"]\nmax_fails = 0",
        a.addr(),
        b.addr()
    )));
    for i in 0..10 {
        let r = http::must_send(w.addr, &Request::new("POST", &format!("/post/{i}")).body(b"x"));
        assert_eq!(r.status, 200, "POST {i} retried on a: {}", r.summary());
    }
    assert!(b.hits() >= 4, "b had its turns: {}", b.hits());
}
