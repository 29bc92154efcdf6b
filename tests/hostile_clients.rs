//! Issue 16, request side: every way a client was found to walk around a limit or knock Weir
//! over, tried against the real binary over real sockets. Each test failed on the build before
//! the fix.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use support::admin;
use support::config::{memory_with_app, with_app, with_server};
use support::http::{self, statuses, Conn, Request};
use support::metrics::scrape;
use support::poll::wait_until;
use support::upstream::Upstream;
use support::weir::{self, Weir};

const MEMORY: &str = "[store]\nkind = \"memory\"";

/// One request a minute per client on `/login`, nothing elsewhere.
fn login_limited(up: SocketAddr) -> String {
    memory_with_app(
        up,
        r#"
[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[route]]
name = "login"
path = "/login"
upstream = "app"
limit_req = [ { zone = "per_ip", nodelay = true } ]

[[route]]
name = "default"
path_prefix = "/"
upstream = "app"
"#,
    )
}

#[test]
fn every_spelling_of_a_limited_path_counts_against_it() {
    let up = Upstream::start();
    let w = Weir::start(&login_limited(up.addr()));
    assert_eq!(http::get(w.addr, "/login").status, 200);
    for variant in ["/login", "//login", "/%6cogin", "/%6C%6f%67in", "/./login", "/x/../login", "/login/."] {
        let expected = if variant.ends_with('.') { 200 } else { 429 };
        assert_eq!(http::get(w.addr, variant).status, expected, "{variant}");
    }
    // What is forwarded is what was matched.
    assert_eq!(up.seen()[0].path, "/login");
    assert_eq!(http::get(w.addr, "/a//b/./c/../d?x=%2F").status, 200);
    assert_eq!(up.seen().last().map(|s| s.path.clone()), Some("/a/b/d?x=%2F".to_string()), "query untouched");
}

#[test]
fn paths_without_one_meaning_are_refused() {
    let up = Upstream::start();
    let w = Weir::start(&login_limited(up.addr()));
    for bad in ["/%2Flogin", "/x%2f..%2flogin", "/login%00", "/..", "/x/../../login", "/%zz"] {
        let r = http::get(w.addr, bad);
        assert_eq!(r.status, 400, "{bad}: {}", r.summary());
        assert_eq!(r.json()["error"], "bad_path", "{bad}");
    }
    assert_eq!(up.hits(), 0, "nothing refused reached the upstream");
}

#[test]
fn encoded_slashes_can_be_kept_for_apis_that_use_them() {
    let up = Upstream::start();
    let config = with_app(
        "encoded_slashes = \"keep\"",
        MEMORY,
        up.addr(),
        "[[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n",
    );
    let w = Weir::start(&config);
    assert_eq!(http::get(w.addr, "/projects/group%2fproject").status, 200);
    assert_eq!(up.seen()[0].path, "/projects/group%2Fproject");
}

fn keyed(up: SocketAddr, key: &str) -> String {
    memory_with_app(
        up,
        &format!(
            r#"
[[limit_req_zone]]
name = "z"
key = "{key}"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
limit_req = [ {{ zone = "z", nodelay = true }} ]
"#
        ),
    )
}

#[test]
fn a_second_copy_of_a_key_header_is_refused_not_a_fresh_bucket() {
    let up = Upstream::start();
    let w = Weir::start(&keyed(up.addr(), "header:X-Api-Key"));
    assert_eq!(http::get_with(w.addr, "/", &[("X-Api-Key", "k1")]).status, 200);
    assert_eq!(http::get_with(w.addr, "/", &[("X-Api-Key", "k1")]).status, 429);
    for i in 0..5 {
        let random = format!("r{i}");
        let r = http::get_with(w.addr, "/", &[("X-Api-Key", "k1"), ("X-Api-Key", &random)]);
        assert_eq!(r.status, 400, "{}", r.summary());
        assert_eq!(r.json()["error"], "ambiguous_key");
    }
    assert_eq!(up.hits(), 1);
}

#[test]
fn query_keys_are_decoded_before_they_count() {
    let up = Upstream::start();
    let w = Weir::start(&keyed(up.addr(), "query:k"));
    assert_eq!(http::get(w.addr, "/?k=a").status, 200);
    for spelling in ["/?k=%61", "/?%6b=a", "/?%6B=%61", "/?x=1&k=a", "/?k=a&k=%61"] {
        assert_eq!(http::get(w.addr, spelling).status, 429, "{spelling}");
    }
    assert_eq!(http::get(w.addr, "/?k=a&k=b").status, 400, "two different values");
    assert_eq!(http::get(w.addr, "/?k=b").status, 200, "another key is another bucket");
}

#[test]
fn cookie_keys_are_parsed_like_browsers_and_frameworks() {
    let up = Upstream::start();
    let w = Weir::start(&keyed(up.addr(), "cookie:sid"));
    assert_eq!(http::get_with(w.addr, "/", &[("Cookie", "sid=s1")]).status, 200);
    for spelling in ["sid =s1", "sid= s1", "sid=\"s1\"", "a=1;sid=%73%31", "a=1; sid=s1; b=2"] {
        assert_eq!(http::get_with(w.addr, "/", &[("Cookie", spelling)]).status, 429, "{spelling}");
    }
    assert_eq!(http::get_with(w.addr, "/", &[("Cookie", "sid=s1"), ("Cookie", "sid=s2")]).status, 400);
}

#[test]
fn ambiguous_framing_is_refused_and_never_forwarded() {
    let up = Upstream::start();
    let w = Weir::start(&login_limited(up.addr()));
    let cases: [&[u8]; 3] = [
        b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5,5\r\n\r\nhello",
        b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        b"GET /x HTTP/1.1\r\nUser-Agent: no-host\r\n\r\n",
    ];
    for raw in cases {
        let r = http::send_raw(w.addr, raw).expect("an answer").expect("a response, not a silent close");
        assert_eq!(r.status, 400, "{}: {}", String::from_utf8_lossy(raw), r.summary());
        assert_eq!(r.header("connection").as_deref(), Some("close"));
    }
    assert_eq!(up.hits(), 0);
    // Both lengths: Pingora frames by Transfer-Encoding alone and drops Content-Length (RFC 9112
    // §6.1), so the upstream cannot read it another way, and the connection is closed after.
    let both = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    let r = http::send_raw(w.addr, both).expect("an answer").expect("a response");
    assert_eq!(r.header("connection").as_deref(), Some("close"), "{}", r.summary());
    assert!(up.seen().iter().all(|s| s.header("content-length").is_none()));
}

#[test]
fn untrusted_forwarding_headers_are_replaced_trusted_ones_extended() {
    let up = Upstream::start();
    let w = Weir::start(&login_limited(up.addr()));
    let spoofed = [("X-Forwarded-For", "1.2.3.4"), ("X-Real-IP", "1.2.3.4"), ("Forwarded", "for=1.2.3.4")];
    assert_eq!(http::get_with(w.addr, "/x", &spoofed).status, 200);
    let seen = &up.seen()[0];
    assert_eq!(seen.header("x-forwarded-for").as_deref(), Some("127.0.0.1"));
    assert_eq!(seen.header("x-real-ip").as_deref(), Some("127.0.0.1"));
    assert_eq!(seen.header("forwarded"), None);

    let trusting = memory_with_app(
        up.addr(),
        "[real_ip]\ntrusted = [\"127.0.0.1/32\"]\n\n[[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n",
    );
    let w2 = Weir::start(&trusting);
    up.reset();
    assert_eq!(http::get_with(w2.addr, "/x", &spoofed).status, 200);
    let seen = &up.seen()[0];
    assert_eq!(seen.header("x-forwarded-for").as_deref(), Some("1.2.3.4, 127.0.0.1"));
    assert_eq!(seen.header("x-real-ip").as_deref(), Some("1.2.3.4"));
    assert_eq!(seen.header("forwarded").as_deref(), Some("for=1.2.3.4"));
}

#[test]
fn a_zero_cost_header_is_not_a_free_pass() {
    let up = Upstream::start();
    let config = memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "z"
key = "ip"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
cost_header = "X-Cost"
limit_req = [ { zone = "z", nodelay = true } ]
"#,
    );
    let w = Weir::start(&config);
    let rs: Vec<_> = (0..3).map(|_| http::get_with(w.addr, "/", &[("X-Cost", "0")])).collect();
    assert_eq!(statuses(&rs), [200, 429, 429]);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let up = Upstream::start();
    let w = Weir::start(&login_limited(up.addr()));
    let mut c = Conn::connect(w.addr).unwrap();
    c.send_raw(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\nGET /second HTTP/1.1\r\nHost: a\r\n\r\nGET /login HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    let statuses: Vec<u16> =
        (0..3).map(|_| c.read_response(false).unwrap().expect("a response per request").status).collect();
    assert_eq!(statuses, [200, 200, 200]);
    let paths: Vec<String> = up.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(paths, ["/first", "/second", "/login"]);
}

#[test]
fn a_delayed_request_whose_client_left_is_not_forwarded() {
    let up = Upstream::start();
    let config = with_app(
        admin::LISTEN,
        MEMORY,
        up.addr(),
        r#"
[[limit_req_zone]]
name = "z"
key = "ip"
rate = "1r/s"

[[route]]
name = "slow"
path_prefix = "/"
upstream = "app"
limit_req = [ { zone = "z", burst = 5 } ]
"#,
    );
    let w = Weir::start(&config);
    assert_eq!(http::get(w.addr, "/").status, 200);
    // The next requests wait 1 s, 2 s, 3 s: leave while waiting.
    for _ in 0..3 {
        let mut c = TcpStream::connect(w.addr).unwrap();
        c.write_all(b"GET /gone HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        drop(c);
    }
    let admin = admin::addr(&w);
    let gone = || scrape(admin).value_or_zero("weir_requests_total", &[("route", "slow"), ("outcome", "client_gone")]);
    assert!(
        wait_until(Duration::from_secs(15), Duration::from_millis(50), || gone() >= 3.0).is_some(),
        "three delayed requests recorded as client_gone, got {}",
        gone()
    );
    // Recorded as gone means their request filter ended without forwarding.
    assert_eq!(up.hits_with_prefix("/gone"), 0);
}

fn edge_config(up: SocketAddr, server_extra: &str) -> String {
    with_app(
        &format!("{}\n{server_extra}", admin::LISTEN),
        MEMORY,
        up,
        "[[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n",
    )
}

/// Reads until the server closes the connection; how long that took from `since`.
fn time_until_closed(stream: &mut TcpStream, since: Instant, limit: Duration) -> Duration {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return since.elapsed(),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return since.elapsed(),
            Err(e) => panic!("connection still open after {:?}: {e}", since.elapsed()),
        }
    }
}

#[test]
fn a_header_trickled_byte_by_byte_is_cut_at_the_header_timeout() {
    let up = Upstream::start();
    let w = Weir::start(&edge_config(up.addr(), "header_timeout = \"1s\""));
    let mut s = TcpStream::connect(w.addr).unwrap();
    let start = Instant::now();
    let writer = {
        let mut s = s.try_clone().unwrap();
        thread::spawn(move || {
            for b in b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ".iter().chain([b'a'; 200].iter()) {
                if s.write_all(&[*b]).is_err() {
                    return;
                }
                thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let closed_after = time_until_closed(&mut s, start, Duration::from_secs(10));
    assert!(closed_after >= Duration::from_secs(1), "cut before the deadline: {closed_after:?}");
    let _ = writer.join();
    let cut = scrape(admin::addr(&w)).value_or_zero("weir_connections_cut_total", &[("cause", "header_timeout")]);
    assert_eq!(cut, 1.0);
    assert_eq!(up.hits(), 0);
}

#[test]
fn an_idle_keepalive_connection_is_closed_after_keepalive_timeout() {
    let up = Upstream::start();
    let w = Weir::start(&edge_config(up.addr(), "keepalive_timeout = \"1s\""));
    let mut c = Conn::connect(w.addr).unwrap();
    assert_eq!(c.send(&Request::get("/")).unwrap().status, 200);
    let answered = Instant::now();
    let mut s = c.stream().try_clone().unwrap();
    let closed_after = time_until_closed(&mut s, answered, Duration::from_secs(10));
    assert!(closed_after >= Duration::from_secs(1), "closed before keepalive_timeout: {closed_after:?}");
    let cut = scrape(admin::addr(&w)).value_or_zero("weir_connections_cut_total", &[("cause", "keepalive_timeout")]);
    assert_eq!(cut, 1.0);
}

#[test]
fn oversized_heads_are_cut_and_their_memory_returns() {
    let up = Upstream::start();
    let w = Weir::start(&edge_config(up.addr(), "max_header_size = 16384"));
    let pid = w.pid().expect("pid");
    let rss = || rss_kib(pid);
    // Warm up allocator arenas with ordinary traffic first.
    for _ in 0..20 {
        assert_eq!(http::get(w.addr, "/").status, 200);
    }
    let before = rss();
    let chunk = vec![b'a'; 64 * 1024];
    let mut conns = Vec::new();
    for _ in 0..300 {
        let mut s = TcpStream::connect(w.addr).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: ");
        // 1 MB of header that never ends: the server must stop reading long before.
        for _ in 0..16 {
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
        conns.push(s);
    }
    let admin = admin::addr(&w);
    let cut = || scrape(admin).value_or_zero("weir_connections_cut_total", &[("cause", "header_size")]);
    assert!(
        wait_until(Duration::from_secs(20), Duration::from_millis(50), || cut() == 300.0).is_some(),
        "every oversized head is cut: {}",
        cut()
    );
    let peak = rss();
    drop(conns);
    assert!(peak.saturating_sub(before) < 64 * 1024, "300 oversized heads grew RSS by {} KiB", peak - before);
    assert_eq!(http::get(w.addr, "/").status, 200);
    assert_eq!(up.hits(), 21);
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn thousands_of_held_connections_cannot_exhaust_file_descriptors() {
    let up = Upstream::start();
    // 256 descriptors: by default at most (256 - 128) / 2 = 64 client connections.
    let w = Weir::start_with_nofile(&edge_config(up.addr(), "header_timeout = \"30s\""), 256);
    let admin = admin::addr(&w);
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..400 {
        let Ok(mut s) = TcpStream::connect_timeout(&w.addr, Duration::from_secs(5)) else { continue };
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut buf = [0u8; 512];
        // Over the cap, the edge answers a 503 at once; under it, the connection just waits.
        match s.read(&mut buf) {
            Ok(n) if n > 0 && buf.starts_with(b"HTTP/1.1 503") => refused += 1,
            _ => held.push(s),
        }
    }
    assert!(refused >= 300, "connections over the cap are refused, not queued: {refused} refused");
    // The admin listener still answers, and so do the metrics.
    let health = http::get(admin, "/healthz");
    assert_eq!(health.status, 200, "{}", health.summary());
    let m = scrape(admin);
    assert!(m.value_or_zero("weir_connections_refused_total", &[("cap", "max_connections")]) >= 300.0);
    assert_eq!(m.value_or_zero("weir_connections_open", &[]), 64.0);
    drop(held);
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            scrape(admin).value_or_zero("weir_connections_open", &[]) == 0.0
        })
        .is_some(),
        "closed connections give their places back"
    );
    assert_eq!(http::get(w.addr, "/").status, 200);
}

#[test]
fn per_address_connection_cap() {
    let up = Upstream::start();
    let w = Weir::start(&edge_config(up.addr(), "max_connections_per_ip = 3"));
    let held: Vec<Conn> = (0..3).map(|_| Conn::connect(w.addr).unwrap()).collect();
    // The three are accepted in order; make sure the edge has counted them before the fourth.
    let admin = admin::addr(&w);
    assert!(wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
        scrape(admin).value_or_zero("weir_connections_open", &[]) == 3.0
    })
    .is_some());
    let r = http::get(w.addr, "/");
    assert_eq!(r.status, 503, "{}", r.summary());
    assert_eq!(r.json()["cap"], "max_connections_per_ip");
    drop(held);
    assert!(wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
        http::send(w.addr, &Request::get("/")).is_ok_and(|r| r.status == 200)
    })
    .is_some());
}

#[test]
fn a_busy_listen_address_is_a_clear_error_at_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let config = with_server("", &format!("{MEMORY}\n")).replace("$LISTEN", &addr.to_string());
    let dir = weir::ConfigDir::new();
    let path = dir.write("weir.toml", &config);
    let started = Instant::now();
    let out = weir::run(["-c", path.to_str().unwrap()], Duration::from_secs(20));
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stderr.contains(&addr.to_string()) && out.stderr.contains("in use"), "{}", out.describe());
}

#[test]
fn an_admin_listener_open_to_the_network_needs_a_token() {
    let open = with_server("admin = \"0.0.0.0:0\"", MEMORY);
    let out = weir::check_config("open.toml", &open.replace("$LISTEN", "127.0.0.1:1"), Duration::from_secs(20));
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stderr.contains("server.admin_token"), "{}", out.describe());
    let insecure = with_server("admin = \"0.0.0.0:0\"\nadmin_insecure = true", MEMORY);
    let out = weir::check_config("insecure.toml", &insecure.replace("$LISTEN", "127.0.0.1:1"), Duration::from_secs(20));
    assert_eq!(out.code, Some(0), "{}", out.describe());
}

#[test]
fn the_bearer_scheme_is_case_insensitive() {
    let up = Upstream::start();
    let token = "0123456789abcdef-token";
    let w = Weir::start(&edge_config(up.addr(), &format!("admin_token = \"{token}\"")));
    let admin = admin::addr(&w);
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let r = admin::request(admin, "GET", "/config", Some(&format!("{scheme} {token}")));
        assert_eq!(r.status, 200, "{scheme}: {}", r.summary());
    }
    assert_eq!(admin::request(admin, "GET", "/config", Some("Basic x")).status, 401);
}
