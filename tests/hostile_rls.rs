//! Issue 34, item 1: the rate limit service's port lives under the same edge discipline as the
//! proxy's. Under `nofile = 512`, a flood of idle connections and of calls whose message never
//! comes leaves the proxy and the admin answering, the CPU idle and the memory within the bound
//! docs/edge-bounds.md states; a connection that never speaks is closed at `header_timeout`.
//! The real binary, a real upstream, raw sockets and HTTP/2 frames.

use crate::support;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::admin;
use support::h2::H2Conn;
use support::http;
use support::metrics::scrape;
use support::poll::wait_until;
use support::upstream::Upstream;
use support::weir::{free_port, Weir};

/// What the service's floods may add to Weir's resident memory (docs/edge-bounds.md).
const RSS_BOUND_KIB: u64 = 64 * 1024;

/// A proxy on `$LISTEN`, the admin on `$LISTEN2`, the rate limit service on `rls`; memory store;
/// the header (preface) deadline at 2 s (`[server] header_timeout`).
fn config(up: SocketAddr, rls: SocketAddr) -> String {
    format!(
        r#"[server]
listen = ["$LISTEN"]
admin = "$LISTEN2"
threads = 2
header_timeout = "2s"

[log]
access_log = false

[store]
kind = "memory"

[[upstream]]
name = "app"
servers = ["{up}"]

[[limit_req_zone]]
name = "per_client"
rate = "100r/s"

[[route]]
name = "all"
path_prefix = "/"
upstream = "app"

[rls]
listen = ["{rls}"]

[[rls.domain]]
name = "edge"

[[rls.domain.descriptor]]
key = "client"
zone = "per_client"
burst = 10
nodelay = true
"#
    )
}

fn raise_own_fd_limit() {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain getrlimit/setrlimit on this process with a valid struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl), 0);
        rl.rlim_cur = rl.rlim_max.min(8192);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &rl), 0);
    }
}

fn proc_field(pid: u32, file: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).expect("/proc");
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/{file}"))
}

/// User + system CPU seconds of `pid` so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // Fields after the command name (which may hold spaces) start after its closing parenthesis.
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// A ShouldRateLimit call whose message never comes: HEADERS without END_STREAM, no DATA.
fn bodiless_calls(conn: &mut H2Conn, calls: u32) {
    for i in 0..calls {
        let headers = [("content-type", "application/grpc"), ("te", "trailers")];
        conn.request(
            2 * i + 1,
            "POST",
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            &headers,
            false,
        )
        .expect("HEADERS");
    }
}

#[test]
fn floods_on_the_rls_port_leave_the_proxy_and_admin_answering_within_the_bounds() {
    raise_own_fd_limit();
    let up = Upstream::start();
    let rls: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let w = Weir::start_with_nofile(&config(up.addr(), rls), 512);
    let (proxy, admin_addr) = (w.addrs[0], admin::addr(&w));
    let pid = w.pid().expect("pid");
    let rss_before = proc_field(pid, "status", "VmRSS:");

    // 1. Calls whose message never comes: 40 connections × 100 streams = 4000 calls open at once.
    let mut bodiless: Vec<H2Conn> = (0..40).map(|_| H2Conn::connect(rls, &[]).expect("h2 connect")).collect();
    for conn in &mut bodiless {
        bodiless_calls(conn, 100);
    }
    let shed = |w: &Weir| scrape(admin::addr(w)).value_or_zero("weir_rls_calls_shed_total", &[]);
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || shed(&w) >= 4000.0 - 1024.0).is_some(),
        "calls past the 1024 in flight are answered at once: {} shed",
        shed(&w)
    );

    // 2. 600 idle TCP connections that never speak: more than the descriptors left. The first
    // ones find a place under the service's cap; the rest are closed at once.
    let opened = Instant::now();
    let mut idle: Vec<TcpStream> = (0..600).filter_map(|_| TcpStream::connect(rls).ok()).collect();
    assert!(idle.len() >= 500, "the kernel accepted {} connections", idle.len());
    let refused = |w: &Weir| {
        scrape(admin::addr(w)).value_or_zero("weir_connections_refused_total", &[("cap", "rls_max_connections")])
    };
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || refused(&w) > 0.0).is_some(),
        "connections past the service's share are closed at once"
    );

    // While flooded the proxy and the admin answer.
    let cpu_before = cpu_seconds(pid);
    assert_eq!(http::get(proxy, "/").status, 200, "the proxy answers");
    assert_eq!(admin::request(admin_addr, "GET", "/healthz", None).status, 200, "the admin answers");

    // 3. A connection that never sends the HTTP/2 preface is closed at header_timeout (2 s),
    // and while the flood waits for it the CPU stays idle (no accept loop spinning on EMFILE).
    let silent = &mut idle[0];
    silent.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let mut buf = [0u8; 1];
    let read = silent.read(&mut buf);
    let waited = opened.elapsed();
    assert!(matches!(read, Ok(0) | Err(_)), "closed, not answered: {read:?}");
    assert!(waited >= Duration::from_secs(2), "closed after {waited:?}, before the 2 s deadline");
    assert!(waited < Duration::from_secs(15), "still open after {waited:?}");
    let busy = (cpu_seconds(pid) - cpu_before) / waited.as_secs_f64();
    assert!(busy < 0.5, "weir used {:.0} % of a core while flooded", busy * 100.0);
    let rss_after = proc_field(pid, "status", "VmRSS:");
    assert!(
        rss_after < rss_before + RSS_BOUND_KIB,
        "RSS grew from {rss_before} KiB to {rss_after} KiB (bound: +{RSS_BOUND_KIB} KiB)"
    );
    drop(idle);
    drop(bodiless);

    // And the service itself answers again once the flood is gone.
    assert!(H2Conn::connect(rls, &[]).is_ok(), "a new client connects");
}

mod wire {
    //! Issue 34, item 5: the service's wire and logs. `hits_addend` is read at Envoy's 64 bits
    //! (2^32 is refused as over the bound, never truncated to 0 and free), a descriptor value
    //! holding the key separator lands on its own counter, and a caller's domain is escaped and
    //! cut in log lines, text and JSON.

    use std::time::Duration;

    use weir::rls::proto::rate_limit_descriptor::Entry;
    use weir::rls::proto::rate_limit_response::Code;
    use weir::rls::proto::{RateLimitDescriptor, RateLimitRequest};

    use super::support::poll::wait_until;
    use super::support::rls_client::client;
    use super::support::weir::Weir;

    fn request(domain: &str, entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitRequest {
        let entries = entries.iter().map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() }).collect();
        RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor { entries, limit: None, hits_addend: hits }],
            hits_addend: 0,
        }
    }

    /// One call a minute per counter; rule `a` alone and rule `a` → `b` share the zone.
    fn config(format: &str) -> String {
        format!(
            r#"[log]
format = "{format}"

[store]
kind = "memory"

[[limit_req_zone]]
name = "one"
rate = "1r/m"

[rls]
listen = ["$LISTEN"]

[[rls.domain]]
name = "d"

[[rls.domain.descriptor]]
key = "a"
zone = "one"

[[rls.domain.descriptor]]
key = "a"
value = "x"

[[rls.domain.descriptor.descriptor]]
key = "b"
zone = "one"
"#
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hits_addend_is_read_at_64_bits_and_a_separator_in_a_value_is_not_a_second_entry() {
        let w = Weir::start(&config("json"));
        let mut c = client(w.addr).await;
        // 2^32: truncated to 32 bits it would be 0, a free call. It is over the bound instead.
        let s = c.should_rate_limit(request("d", &[("a", "k")], Some(1 << 32))).await.expect_err("over the bound");
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
        assert!(s.message().contains("4294967296"), "{s:?}");

        // ("a", "x\x1fy") and ("a", "x"), ("b", "y") are two counters of one zone.
        let code = |r: weir::rls::proto::RateLimitResponse| Code::try_from(r.overall_code).expect("a code");
        let joined = request("d", &[("a", "x\u{1f}y")], None);
        let nested = request("d", &[("a", "x"), ("b", "y")], None);
        assert_eq!(code(c.should_rate_limit(joined.clone()).await.expect("call").into_inner()), Code::Ok);
        assert_eq!(code(c.should_rate_limit(nested.clone()).await.expect("call").into_inner()), Code::Ok);
        // Each counter is spent: the same calls again are over.
        assert_eq!(code(c.should_rate_limit(joined).await.expect("call").into_inner()), Code::OverLimit);
        assert_eq!(code(c.should_rate_limit(nested).await.expect("call").into_inner()), Code::OverLimit);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_callers_domain_is_escaped_and_cut_in_log_lines_of_both_formats() {
        let forged = format!("d\nINFO weir::access: forged line \u{202e}gnp\u{1b}[2J{}", "z".repeat(1000));
        for format in ["text", "json"] {
            let w = Weir::start(&config(format));
            let mut c = client(w.addr).await;
            c.should_rate_limit(request(&forged, &[("a", "k")], None)).await.expect("an unknown domain is OK");
            let logged = |w: &Weir| w.stderr().lines().any(|l| l.contains("forged line"));
            assert!(
                wait_until(Duration::from_secs(10), Duration::from_millis(20), || logged(&w)).is_some(),
                "{format}: the call is logged:\n{}",
                w.stderr()
            );
            let stderr = w.stderr();
            let line = stderr.lines().find(|l| l.contains("forged line")).expect("logged");
            assert!(!line.starts_with("INFO weir::access: forged"), "{format}: a forged line: {stderr}");
            for raw in ['\u{202e}', '\u{1b}'] {
                assert!(!stderr.contains(raw), "{format}: {raw:?} written raw: {line}");
            }
            assert!(line.contains("\\u{202e}gnp"), "{format}: {line}");
            assert!(!line.contains(&"z".repeat(300)), "{format}: the domain is cut: {} bytes", line.len());
        }
    }
}
