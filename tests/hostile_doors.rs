//! Issue 46, the small doors: each way a fourth probe found around a limit or a bound, tried
//! against the real binary over real sockets (and a real Redis where the door was on Redis). Each
//! test failed on the build before its fix.

use crate::support;

use std::ffi::OsString;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::admin;
use support::config::{line_of, memory_with_app, redis_store, with_app};
use support::http::{self, Request};
use support::redis_server::RedisServer;
use support::rls_client::{client, code, descriptor};
use support::upstream::Upstream;
use support::weir::{self as weir_proc, check_config, ConfigDir, RunOutput, Weir};
use weir::rls::proto::rate_limit_response::Code;
use weir::rls::proto::RateLimitRequest;

const CHECK_TIMEOUT: Duration = Duration::from_secs(15);

/// `methods = ["GET"]` with a limit: HEAD (which the upstream answers with its GET handler) used
/// to match no route and fall to the unlimited catch-all.
const GET_LIMITED: &str = r#"
[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[route]]
name = "report"
path = "/report"
methods = ["GET"]
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 2, nodelay = true } ]

[[route]]
name = "default"
path_prefix = "/"
upstream = "app"
"#;

#[test]
fn head_counts_against_a_limit_on_get() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(up.addr(), GET_LIMITED));
    let gets: Vec<u16> = (0..4).map(|_| http::get(w.addr, "/report").status).collect();
    assert_eq!(gets, [200, 200, 200, 429]);
    let heads: Vec<u16> = (0..6).map(|_| http::must_send(w.addr, &Request::new("HEAD", "/report")).status).collect();
    assert_eq!(heads, [429; 6], "HEAD is limited with GET");
    assert_eq!(up.hits(), 3, "no HEAD reached the upstream");
    // Other methods still go elsewhere.
    let post = http::must_send(w.addr, &Request::new("POST", "/report").body(b"x"));
    assert_eq!(post.status, 200, "{}", post.summary());
    assert_eq!(up.hits(), 4);
}

#[test]
fn weir_check_says_that_get_takes_head() {
    let text = memory_with_app("127.0.0.1:9".parse().unwrap(), GET_LIMITED).replace("$LISTEN", "127.0.0.1:8080");
    let out = check_config("get.toml", &text, CHECK_TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let line = line_of(&text, "methods = [\"GET\"]");
    assert!(
        out.stderr.contains(&format!("get.toml:{line}:")) && out.stderr.contains("HEAD requests match this route"),
        "{}",
        out.describe()
    );
    // Said outright, no warning.
    let explicit = text.replace("methods = [\"GET\"]", "methods = [\"GET\", \"HEAD\"]");
    let out = check_config("explicit.toml", &explicit, CHECK_TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(!out.stderr.contains("HEAD"), "{}", out.describe());
    // A route for HEAD alone after it could never match: refused, saying why.
    let head_after = text.replace(
        "[[route]]\nname = \"default\"",
        "[[route]]\nname = \"heads\"\npath = \"/report\"\nmethods = [\"HEAD\"]\nupstream = \"app\"\n\n[[route]]\nname = \"default\"",
    );
    let out = check_config("shadowed.toml", &head_after, CHECK_TIMEOUT);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stderr.contains("lists GET matches HEAD too"), "{}", out.describe());
    // Before it, it takes HEAD.
    let head_first = text.replace(
        "[[route]]\nname = \"report\"",
        "[[route]]\nname = \"heads\"\npath = \"/report\"\nmethods = [\"HEAD\"]\nupstream = \"app\"\n\n[[route]]\nname = \"report\"",
    );
    let out = check_config("first.toml", &head_first, CHECK_TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.describe());
}

// ---------------------------------------------------------------------------------------------
// weir import-rls
// ---------------------------------------------------------------------------------------------

const IMPORT_TIMEOUT: Duration = Duration::from_secs(60);

/// `weir import-rls --listen $LISTEN ARGS…`.
fn import_rls(args: &[&std::ffi::OsStr]) -> RunOutput {
    let mut argv: Vec<OsString> = vec!["import-rls".into(), "--listen".into(), "$LISTEN".into()];
    argv.extend(args.iter().map(|a| a.to_os_string()));
    weir_proc::run(argv, IMPORT_TIMEOUT)
}

/// envoyproxy/ratelimit's YAML library gives a string field its scalar's text: `+44` is "+44"
/// there, which is what Envoy sends; Weir's import used to write "44" (and "31", "15", "true"),
/// so the limit never matched. Three calls an hour per value, then over the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_rls_keeps_each_scalar_as_written() {
    // (A float is refused, as the peer's key check refuses it.)
    let scalars = ["+44", "0x1F", "0o17", "True", "1_000", "~x", "0b11"];
    let mut yaml = String::from("domain: phones\ndescriptors:\n");
    for s in scalars {
        yaml += &format!("  - key: country\n    value: {s}\n    rate_limit: {{unit: hour, requests_per_unit: 3}}\n");
    }
    let dir = ConfigDir::new();
    let file = dir.write("phones.yaml", &yaml);
    let out = import_rls(&[file.as_os_str()]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for s in scalars {
        assert!(out.stdout.contains(&format!("value = \"{s}\"")), "{s} kept as written:\n{}", out.stdout);
    }
    let w = Weir::start(&format!("[log]\naccess_log = false\n\n{}", out.stdout));
    let mut c = client(w.addr).await;
    // The peer's windows are fixed and aligned to the clock: four calls that straddle an hour's
    // end count in two windows (this failed once at a minute's end, with `unit: minute`). The
    // calls take well under a minute, so start them at least a minute before the hour turns.
    let into_hour = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_secs() % 3600;
    if into_hour >= 3540 {
        tokio::time::sleep(Duration::from_secs(3600 - into_hour + 1)).await;
    }
    for s in scalars {
        let mut codes = Vec::new();
        for _ in 0..4 {
            let req = RateLimitRequest {
                domain: "phones".into(),
                descriptors: vec![descriptor(&[("country", s)])],
                hits_addend: 0,
            };
            let answer = c.should_rate_limit(req).await.expect("ShouldRateLimit").into_inner();
            codes.push(code(&answer));
        }
        assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit], "(country, {s}) is limited");
    }
}

/// 40,000 descriptors at one level: the duplicate check was quadratic (24 s in release).
#[test]
fn import_rls_of_many_descriptors_is_quick() {
    let mut yaml = String::from("domain: many\ndescriptors:\n");
    for i in 0..40_000 {
        // Values sharing their first 56 characters also share a truncated zone name.
        yaml += &format!(
            "  - {{key: client, value: \"{}{i}\", rate_limit: {{unit: second, requests_per_unit: 5}}}}\n",
            "c".repeat(60)
        );
    }
    let dir = ConfigDir::new();
    let file = dir.write("many.yaml", &yaml);
    let (code, cpu, stdout) = import_rls_cpu_time(&file);
    assert_eq!(code, 0, "{}", stdout.chars().take(2000).collect::<String>());
    assert_eq!(stdout.matches("[[rls.domain.descriptor]]").count(), 40_000);
    // Its own CPU time, not the wall clock of a busy machine: 8 s measured in a debug build
    // (the import parses the YAML twice), where 10,000 took 108 s before.
    assert!(cpu < Duration::from_secs(30), "40,000 descriptors imported in {cpu:?} of CPU");
    // A duplicate among them is still found.
    let few: String = yaml.lines().take(1002).map(|l| format!("{l}\n")).collect();
    let dup = few + &format!("  - {{key: client, value: \"{}7\"}}\n", "c".repeat(60));
    let file = dir.write("dup.yaml", &dup);
    let out = import_rls(&[file.as_os_str()]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("duplicate descriptor composite key"), "{}", out.stderr);
}

/// `weir import-rls FILE` run to its end: its exit code, the CPU time it used (user + system,
/// from wait4(2) on its pid) and its stdout.
fn import_rls_cpu_time(file: &std::path::Path) -> (i32, Duration, String) {
    let dir = ConfigDir::new();
    let out_path = dir.path().join("stdout");
    let out = std::fs::File::create(&out_path).expect("stdout file");
    // Reaped below by wait4(2), which std's `wait` cannot do while returning the child's rusage.
    #[allow(clippy::zombie_processes)]
    let child = std::process::Command::new(weir_proc::bin())
        .args(["import-rls".as_ref(), file.as_os_str()])
        .stdout(out)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn weir import-rls");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter; wait4 reaps our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid, "wait4");
    let time = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    let cpu = time(usage.ru_utime) + time(usage.ru_stime);
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -1 };
    (code, cpu, std::fs::read_to_string(&out_path).unwrap_or_default())
}

/// 100,000 levels of nesting took 17 s to refuse: now refused unparsed, saying why.
#[test]
fn import_rls_refuses_a_nesting_bomb_at_once() {
    let dir = ConfigDir::new();
    let flow = format!("domain: d\ndescriptors: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    let block = format!("domain: d\ndescriptors:\n{}x\n", "- ".repeat(100_000));
    for (name, text) in [("flow.yaml", flow), ("block.yaml", block)] {
        let file = dir.write(name, &text);
        let started = Instant::now();
        let out = import_rls(&[file.as_os_str()]);
        let took = started.elapsed();
        assert_eq!(out.code, Some(1), "{name}: {}", out.describe().chars().take(2000).collect::<String>());
        assert!(out.stderr.contains("nested deeper than 1024 levels"), "{name}: {}", out.stderr);
        assert!(took < Duration::from_secs(10), "{name} refused in {took:?}");
    }
}

/// `/dev/zero` was read until memory ran out, a FIFO blocked; an oversized file was read whole.
#[test]
fn import_rls_reads_regular_files_of_bounded_size_only() {
    let out = import_rls(&["/dev/zero".as_ref()]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stderr.contains("/dev/zero") && out.stderr.contains("not a regular file"), "{}", out.stderr);

    let dir = ConfigDir::new();
    let fifo = dir.path().join("fifo.yaml");
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo(3) on a path we own, with a valid NUL-terminated string.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
    // Alone, and inside a directory of configs.
    for arg in [fifo.as_os_str(), dir.path().as_os_str()] {
        let started = Instant::now();
        let out = import_rls(&[arg]);
        assert_eq!(out.code, Some(1), "{}", out.describe());
        assert!(!out.timed_out && started.elapsed() < Duration::from_secs(10));
        assert!(out.stderr.contains("fifo.yaml") && out.stderr.contains("not a regular file"), "{}", out.stderr);
    }

    let big = ConfigDir::new();
    let file = big.write("big.yaml", &format!("domain: d\n# {}\n", "x".repeat(17 << 20)));
    let out = import_rls(&[file.as_os_str()]);
    assert_eq!(out.code, Some(1), "{}", out.describe().chars().take(2000).collect::<String>());
    assert!(out.stderr.contains("over 16 MiB"), "{}", out.stderr);
}

// ---------------------------------------------------------------------------------------------
// Overrides matched on a part given twice
// ---------------------------------------------------------------------------------------------

/// `limit_rate_override` on a header: with two lines (`partner`, then `free`) the first used to
/// win, so the body went unpaced while the upstream may read `free`. Key parts (and so a zone's
/// overrides, which match on a part of the key) refuse a header given twice: so does this.
#[test]
fn a_pace_override_header_given_twice_is_refused_like_a_key_part() {
    let up = Upstream::start();
    let config = memory_with_app(
        up.addr(),
        r#"
[[route]]
name = "downloads"
path_prefix = "/dl/"
upstream = "app"
limit_rate = "1m"
limit_rate_override = [ { match = "header:X-Tier=partner", rate = "unlimited" } ]
"#,
    );
    let w = Weir::start(&config);
    for (first, second) in [("partner", "free"), ("free", "partner"), ("partner", "partner")] {
        let r = http::must_send(w.addr, &Request::get("/dl/x").header("X-Tier", first).header("X-Tier", second));
        assert_eq!(r.status, 400, "{first}, {second}: {}", r.summary());
        assert_eq!(r.json()["error"], "ambiguous_key", "{}", r.summary());
        assert!(r.text().contains("x-tier"), "names the header: {}", r.summary());
    }
    assert_eq!(up.hits(), 0, "nothing ambiguous reached the upstream");
    // One line is read as before, and a request without it is paced at the route's rate.
    for tier in [Some("partner"), Some("free"), None] {
        let req = tier.map_or(Request::get("/dl/x"), |t| Request::get("/dl/x").header("X-Tier", t));
        let r = http::must_send(w.addr, &req);
        assert_eq!(r.status, 200, "{tier:?}: {}", r.summary());
    }
}

// ---------------------------------------------------------------------------------------------
// Leases at a graceful shutdown
// ---------------------------------------------------------------------------------------------

/// A lease held at SIGTERM (its request cut at the end of the grace period) was not given back:
/// a restarted instance found the key full for `lease_ttl` (28 s of 30). Now the exit gives it
/// back, and the new instance admits the key at once.
#[test]
fn a_lease_held_at_sigterm_is_given_back() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let store = redis_store(&redis.url(), "timeout = \"2s\"\nlease_ttl = \"30s\"");
    let config = with_app(
        "",
        &store,
        up.addr(),
        r#"
[[limit_conn_zone]]
name = "conn_per_ip"
key = "ip"

[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
limit_conn = [ { zone = "conn_per_ip", max = 1 } ]
"#,
    );
    let mut first = Weir::start(&config);
    let addr = first.addr;
    // Held by an upstream that never answers.
    let holder = std::thread::spawn(move || http::send(addr, &Request::get("/hang")));
    assert!(up.wait_in_flight(1, Duration::from_secs(10)), "the slow request reached the upstream");
    let r = http::get(first.addr, "/x");
    assert_eq!(r.status, 503, "the key is full while the lease is held: {}", r.summary());

    let (status, took) = first.terminate(Duration::from_secs(20)).expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}\n{}", first.stderr());
    let _ = holder.join();
    assert!(took < Duration::from_secs(10), "the exit waited {took:?}");

    let second = Weir::start(&config);
    let r = http::get(second.addr, "/x");
    assert_eq!(r.status, 200, "the key is free after the restart: {}\n{}", r.summary(), first.stderr());
}

// ---------------------------------------------------------------------------------------------
// Keys one client can mint on Redis
// ---------------------------------------------------------------------------------------------

/// One client minted ~23,000 keys a second with a fresh API key per request, and a zone's key
/// count on Redis was nowhere to be seen. `GET /zones` counts them; a per-client zone beside the
/// per-key one bounds what one client can mint, since a request refused by any zone of its route
/// charges (and writes) none.
#[test]
fn a_zones_keys_on_redis_are_counted_and_one_client_can_be_bounded() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let store = redis_store(&redis.url(), "timeout = \"2s\"");
    let config = with_app(
        admin::LISTEN,
        &store,
        up.addr(),
        r#"
[[limit_req_zone]]
name = "per_key"
key = "header:X-Api-Key"
rate = "1r/m"

[[limit_req_zone]]
name = "per_key_bounded"
key = "header:X-Api-Key"
rate = "1r/m"

[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[route]]
name = "open"
path_prefix = "/open/"
upstream = "app"
limit_req = [ { zone = "per_key", burst = 5, nodelay = true } ]

[[route]]
name = "bounded"
path_prefix = "/bounded/"
upstream = "app"
limit_req = [ { zone = "per_key_bounded", burst = 5, nodelay = true }, { zone = "per_ip", burst = 4, nodelay = true } ]
"#,
    );
    let w = Weir::start(&config);
    let mut bounded = Vec::new();
    for i in 0..30 {
        let key = format!("fresh-{i}");
        let r = http::must_send(w.addr, &Request::get("/open/x").header("X-Api-Key", &key));
        assert_eq!(r.status, 200, "{}", r.summary());
        bounded.push(http::must_send(w.addr, &Request::get("/bounded/x").header("X-Api-Key", &key)).status);
    }
    assert_eq!(bounded, [vec![200; 5], vec![429; 25]].concat(), "the client's own zone stops it after 5");

    let r = admin::request(admin::addr(&w), "GET", "/zones", None);
    assert_eq!(r.status, 200, "{}", r.summary());
    let zones = r.json();
    assert_eq!(zones["complete"], true, "{zones}");
    assert_eq!(zones["limit_req"]["per_key"], 30, "every fresh key is a key on Redis: {zones}");
    assert_eq!(zones["limit_req"]["per_key_bounded"], 5, "refused requests minted no key: {zones}");
    assert_eq!(zones["limit_req"]["per_ip"], 1, "{zones}");
    // A bounded scan says when it stopped short.
    let r = admin::request(admin::addr(&w), "GET", "/zones?scan=1", None);
    assert_eq!(r.status, 200, "{}", r.summary());
    assert!(r.json()["scanned"].as_u64().is_some_and(|n| n >= 1), "{}", r.summary());
    assert_eq!(admin::request(admin::addr(&w), "GET", "/zones?scan=0", None).status, 400);
}
