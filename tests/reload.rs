//! Hot reload of the running `weir` binary: file changes (in place, write-and-rename, Kubernetes
//! ConfigMap symlink swaps), SIGHUP and `POST /reload`; refused files; settings that need a
//! restart; limit state across reloads. Real weir, real upstream, real sockets on loopback.

use crate::support;

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::config::line_of;
use support::http::{self, KeepAlive, Request};
use support::poll::{poll, wait_until};
use support::upstream::Upstream;
use support::weir::{free_port, Weir};

/// Upper bound for any reload to become visible (debounce is 200 ms; this is generous).
const RELOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// A weir with an admin listener, in front of one upstream "app".
struct Setup {
    // Field order: weir stops before the upstream does.
    w: Weir,
    up: Upstream,
    admin: SocketAddr,
}

impl Setup {
    /// Starts weir on `config(listen = ["$LISTEN"], rest)` and waits for the admin listener.
    fn start(rest: &str) -> Setup {
        let up = Upstream::start();
        // The admin address is picked by `Weir::start` ($LISTEN2), anew if a retry is needed.
        let w = Weir::start(&config(&up, "$LISTEN2", "\"$LISTEN\"", rest));
        let admin = w.addrs[1];
        let s = Setup { w, up, admin };
        s.wait_admin();
        s
    }

    /// The full config text with the rest of the file `rest`, as it must be written now.
    fn text(&self, rest: &str) -> String {
        self.text_with_listen(&format!("{:?}", self.w.addr.to_string()), rest)
    }

    /// Like [`Setup::text`] with `listen` as the inside of the `listen = [...]` array.
    fn text_with_listen(&self, listen: &str, rest: &str) -> String {
        config(&self.up, self.admin, listen, rest).replace("$LISTEN", &self.w.addr.to_string())
    }

    fn path(&self) -> &Path {
        &self.w.config_path
    }

    fn dir(&self) -> &Path {
        self.w.config_path.parent().unwrap()
    }

    /// Writes the config file in place (truncate + write, like `echo > file`).
    fn write(&self, text: &str) {
        fs::write(self.path(), text).expect("rewrite the config file");
    }

    fn wait_admin(&self) {
        let healthy = || http::send(self.admin, &Request::get("/healthz")).is_ok_and(|r| r.status == 200);
        if wait_until(Duration::from_secs(20), Duration::from_millis(50), healthy).is_none() {
            panic!("admin listener {} not ready\n{}", self.admin, self.log());
        }
    }

    /// `METHOD path` on the admin listener: status and JSON body.
    fn admin_call(&self, method: &str, path: &str) -> (u16, Value) {
        let r = http::send(self.admin, &Request::new(method, path))
            .unwrap_or_else(|e| panic!("{method} {path} on the admin listener failed: {e}\n{}", self.log()));
        let v: Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("admin {method} {path}: not JSON ({e}): {}", r.summary()));
        (r.status, v)
    }

    /// `GET /config`.
    fn status(&self) -> Value {
        let (code, v) = self.admin_call("GET", "/config");
        assert_eq!(code, 200, "GET /config: {v}");
        v
    }

    fn generation(&self) -> u64 {
        gen_of(&self.status())
    }

    fn failures(&self) -> u64 {
        self.status()["reload_failures"].as_u64().expect("reload_failures is a number")
    }

    /// Polls `GET /config` until `pred` holds or `timeout` passes.
    fn poll_status(&self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Result<Value, Value> {
        poll(timeout, Duration::from_millis(25), || self.status(), pred)
    }

    /// Polls `GET /config` (bounded) until `pred` holds; returns that status.
    fn wait_status(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.poll_status(RELOAD_TIMEOUT, pred).unwrap_or_else(|v| {
            panic!("timed out after {RELOAD_TIMEOUT:?} waiting for {what}; last GET /config: {v}\n{}", self.log())
        })
    }

    /// Weir's stderr for failure messages, without the access log lines.
    fn log(&self) -> String {
        let stderr = self.w.stderr();
        let (access, rest): (Vec<&str>, Vec<&str>) = stderr.lines().partition(|l| l.contains("weir::access"));
        format!("--- stderr ({} access log lines left out) ---\n{}", access.len(), rest.join("\n"))
    }

    fn wait_generation(&self, at_least: u64) -> Value {
        self.wait_status(&format!("generation >= {at_least}"), |v| gen_of(v) >= at_least)
    }

    fn wait_failures(&self, at_least: u64) -> Value {
        self.wait_status(&format!("reload_failures >= {at_least}"), |v| {
            v["reload_failures"].as_u64().unwrap_or(0) >= at_least
        })
    }

    /// Status of `GET path` with `X-Client: client` on a fresh connection.
    fn get(&self, path: &str, client: &str) -> u16 {
        http::get_with(self.w.addr, path, &[("X-Client", client)]).status
    }

    /// Sends `n` requests to `/api/…` as `client`, one after the other; their statuses.
    fn api_statuses(&self, client: &str, n: usize) -> Vec<u16> {
        (0..n).map(|i| self.get(&format!("/api/{i}"), client)).collect()
    }

    /// With a 1r/m zone and `burst` nodelay, a new client gets exactly `burst + 1` passes, then 429.
    fn assert_burst(&self, client: &str, burst: usize, context: &str) {
        let mut expected = vec![200; burst + 1];
        expected.push(429);
        assert_eq!(
            self.api_statuses(client, burst + 2),
            expected,
            "client {client:?} on a 1r/m zone with burst {burst} ({context})\n{}",
            self.log()
        );
    }
}

fn gen_of(v: &Value) -> u64 {
    v["generation"].as_u64().expect("generation is a number")
}

/// Counts the reads of one file by any process: inotify's `IN_CLOSE_NOWRITE` (a descriptor opened
/// without write access was closed), which the test's own writes never cause. Every reload reads
/// the config file, whatever its outcome, so this is how a test knows that a reload which changed
/// nothing (and so logged or counted nothing) has run. A reload holds the status lock from before
/// it reads the file until it is done, so a `GET /config` after the read answers only once that
/// reload is over. (`IN_OPEN` is also watched so that two reads in a row are never coalesced
/// into one event: the kernel merges only identical consecutive events. Reloads never read at
/// the same time: the status lock orders them.)
struct FileReads {
    fd: libc::c_int,
    reads: std::cell::Cell<usize>,
}

impl FileReads {
    fn watch(path: &Path) -> FileReads {
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: plain syscalls on a descriptor this struct owns; the path is NUL-terminated.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1: {}", std::io::Error::last_os_error());
        let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("a path without NUL");
        let wd = unsafe { libc::inotify_add_watch(fd, c_path.as_ptr(), libc::IN_OPEN | libc::IN_CLOSE_NOWRITE) };
        assert!(wd >= 0, "inotify_add_watch {}: {}", path.display(), std::io::Error::last_os_error());
        FileReads { fd, reads: std::cell::Cell::new(0) }
    }

    /// Reads since [`FileReads::watch`], counting the events that arrived so far.
    fn reads(&self) -> usize {
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reads into a buffer of the given length.
            let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return self.reads.get(); // EAGAIN: nothing more for now
            }
            let mut at = 0;
            while at + std::mem::size_of::<libc::inotify_event>() <= n as usize {
                // SAFETY: the kernel writes whole events; read_unaligned copies the header out.
                let event: libc::inotify_event = unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                if event.mask & libc::IN_CLOSE_NOWRITE != 0 {
                    self.reads.set(self.reads.get() + 1);
                }
                at += std::mem::size_of::<libc::inotify_event>() + event.len as usize;
            }
        }
    }

    /// Waits (bounded) until the file was read at least `n` times since [`FileReads::watch`].
    fn wait_for(&self, n: usize, what: &str, s: &Setup) {
        if wait_until(RELOAD_TIMEOUT, Duration::from_millis(10), || self.reads() >= n).is_none() {
            panic!(
                "the config file was read {} times in {RELOAD_TIMEOUT:?}, expected {n} ({what})\n{}",
                self.reads(),
                s.log()
            );
        }
    }
}

impl Drop for FileReads {
    fn drop(&mut self) {
        // SAFETY: closes the descriptor this struct owns, once.
        unsafe { libc::close(self.fd) };
    }
}

/// `[server]` with an admin listener, `[store]`, one upstream "app", then `rest`.
fn config(up: &Upstream, admin: impl std::fmt::Display, listen: &str, rest: &str) -> String {
    format!(
        r#"[server]
listen = [{listen}]
threads = 2
admin = "{admin}"

[store]
kind = "memory"

[[upstream]]
name = "app"
servers = ["{}"]

{rest}"#,
        up.addr_str()
    )
}

/// Asserts that a refusal names the config file and the line, and that stderr logged it at ERROR.
fn assert_refusal(s: &Setup, error: &str, line: usize, needle: &str) {
    let place = format!("{}:{line}:", s.path().display());
    assert!(error.starts_with(&place), "the error should start with {place:?}: {error:?}");
    assert!(error.contains(needle), "the error should mention {needle:?}: {error:?}");
    let stderr = s.w.stderr();
    assert!(
        stderr.lines().any(|l| l.contains("ERROR") && l.contains(&place) && l.contains(needle)),
        "stderr should log the refusal at ERROR with {place:?}\n{}",
        s.log()
    );
}

// ---------------------------------------------------------------------------------------------
// 1. A rate change under a steady stream of requests
// ---------------------------------------------------------------------------------------------

fn steady_zone(rate: &str, burst: u32) -> String {
    format!(
        r#"[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "{rate}"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ {{ zone = "per_ip", burst = {burst}, nodelay = true }} ]
"#
    )
}

/// One request of the stream: when it was sent and what came back (status, or the I/O error).
struct Sample {
    at: Instant,
    outcome: Result<u16, String>,
}

/// Sends `GET /api/…` every `every` until `stop`: over one keep-alive connection (reopened only
/// when the server says `Connection: close` or after a failure, see [`KeepAlive`]), or on a fresh
/// connection each time.
fn stream(
    addr: SocketAddr,
    keep_alive: bool,
    every: Duration,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
) -> thread::JoinHandle<Vec<Sample>> {
    thread::spawn(move || {
        let mut samples = Vec::new();
        let mut conn = KeepAlive::new(addr, Duration::from_secs(5));
        let mut i = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let at = Instant::now();
            let req = Request::get(&format!("/api/{}/{i}", if keep_alive { "ka" } else { "new" }));
            i += 1;
            let outcome = if keep_alive { conn.send(&req) } else { http::send(addr, &req) };
            let outcome = outcome.map(|r| r.status).map_err(|e| e.to_string());
            samples.push(Sample { at, outcome });
            done.fetch_add(1, Ordering::SeqCst);
            if let Some(rest) = every.checked_sub(at.elapsed()) {
                thread::sleep(rest);
            }
        }
        samples
    })
}

/// Stops the stream threads when the test ends, also by a panic.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// How test 1 makes weir re-read the rewritten file.
#[derive(Clone, Copy, Debug)]
enum Trigger {
    /// Only the file watcher.
    FileWatch,
    /// `POST /reload` right after the write (the watcher is active too).
    AdminApi,
}

/// Test 1: `1r/s` burst 0 under a steady stream from one IP, rewritten to `1000r/s` burst 100.
fn rate_change_under_a_steady_stream(trigger: Trigger) {
    let s = Setup::start(&steady_zone("1r/s", 0));
    assert_eq!(s.generation(), 1);

    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_panic = StopOnDrop(stop.clone());
    let t0 = Instant::now();
    let done = Arc::new(AtomicUsize::new(0));
    let streams = vec![
        stream(s.w.addr, true, Duration::from_millis(20), stop.clone(), done.clone()),
        stream(s.w.addr, false, Duration::from_millis(50), stop.clone(), done.clone()),
    ];
    let stop_streams = |streams: Vec<thread::JoinHandle<Vec<Sample>>>| -> Vec<Sample> {
        stop.store(true, Ordering::SeqCst);
        streams.into_iter().flat_map(|h| h.join().expect("stream thread")).collect()
    };

    // Phase 1: 1r/s, burst 0, until 40 requests were answered (the bound on the admitted below
    // follows the phase's real length, whatever it is).
    let phase1_done = wait_until(RELOAD_TIMEOUT, Duration::from_millis(10), || done.load(Ordering::SeqCst) >= 40);
    assert!(phase1_done.is_some(), "{trigger:?}: fewer than 40 requests answered within {RELOAD_TIMEOUT:?}");
    let t_write = Instant::now();
    s.write(&s.text(&steady_zone("1000r/s", 100)));
    if let Trigger::AdminApi = trigger {
        let (code, v) = s.admin_call("POST", "/reload");
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["generation"].as_u64(), Some(2), "{v}");
    }
    let st = match s.poll_status(RELOAD_TIMEOUT, |v| gen_of(v) == 2) {
        Ok(st) => st,
        Err(last) => {
            // Tell a reload that never comes from one that only waits for the traffic to stop.
            let samples = stop_streams(streams);
            let after = s.poll_status(Duration::from_secs(5), |v| gen_of(v) == 2);
            panic!(
                "{trigger:?}: no new generation {RELOAD_TIMEOUT:?} after the rewrite while {} \
                 requests were streaming (last GET /config: {last}); once the stream stopped: \
                 {after:?}\n{}",
                samples.len(),
                s.log()
            );
        }
    };
    let t_gen = Instant::now();
    assert_eq!(st["last_error"], Value::Null, "{st}");

    // Phase 2: 1000r/s, burst 100, for at least 40 more requests (a loaded machine answers
    // slower; bounded).
    let done_at_gen = done.load(Ordering::SeqCst);
    let enough =
        wait_until(RELOAD_TIMEOUT, Duration::from_millis(20), || done.load(Ordering::SeqCst) >= done_at_gen + 40);
    let samples = stop_streams(streams);
    assert!(enough.is_some(), "{trigger:?}: fewer than 40 requests within {RELOAD_TIMEOUT:?} after the reload");

    let failed: Vec<String> = samples
        .iter()
        .filter_map(|x| match &x.outcome {
            Ok(200 | 429) => None,
            Ok(other) => Some(format!("+{:?}: status {other}", x.at - t0)),
            Err(e) => Some(format!("+{:?}: {e}", x.at - t0)),
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{trigger:?}: {} of {} requests failed (reload at +{:?}..+{:?}): {failed:?}\n{}",
        failed.len(),
        samples.len(),
        t_write - t0,
        t_gen - t0,
        s.log()
    );

    let phase1: Vec<u16> = samples.iter().filter(|x| x.at < t_write).filter_map(|x| x.outcome.clone().ok()).collect();
    let passed1 = phase1.iter().filter(|&&c| c == 200).count();
    assert!(phase1.len() >= 40, "phase 1 sent only {} requests", phase1.len());
    // 1r/s, burst 0: one at the start, then at most one per whole second of phase 1 (it lasts
    // ~2 s, longer on a loaded machine), and one more for the edges of the second.
    let most1 = (t_write - t0).as_secs_f64().ceil() as usize + 1;
    assert!(
        (1..=most1).contains(&passed1),
        "phase 1 (1r/s, burst 0, {:?}): {passed1} of {} admitted, expected 1..={most1}",
        t_write - t0,
        phase1.len()
    );

    let phase2: Vec<u16> = samples.iter().filter(|x| x.at >= t_gen).filter_map(|x| x.outcome.clone().ok()).collect();
    let passed2 = phase2.iter().filter(|&&c| c == 200).count();
    assert!(phase2.len() >= 30, "phase 2 sent only {} requests", phase2.len());
    assert!(
        passed2 * 10 >= phase2.len() * 9,
        "phase 2 (1000r/s, burst 100): only {passed2} of {} admitted",
        phase2.len()
    );
}

#[test]
fn rate_change_under_a_steady_stream_is_picked_up_by_the_file_watcher() {
    rate_change_under_a_steady_stream(Trigger::FileWatch);
}

#[test]
fn rate_change_under_a_steady_stream_applied_by_post_reload() {
    rate_change_under_a_steady_stream(Trigger::AdminApi);
}

// ---------------------------------------------------------------------------------------------
// 2. Broken files are refused, the running config keeps serving, a fix is applied
// ---------------------------------------------------------------------------------------------

/// A 1r/m zone on header X-Client used by `/api/` with `burst` nodelay, plus a regex route.
fn limited(zone_ref: &str, burst: u32, regex: &str) -> String {
    format!(
        r#"[[limit_req_zone]]
name = "per_client"
key = "header:X-Client"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ {{ zone = "{zone_ref}", burst = {burst}, nodelay = true }} ]

[[route]]
name = "versioned"
path_regex = "{regex}"
upstream = "app"
"#
    )
}

const V_RE: &str = "^/v[0-9]+/";

#[test]
fn broken_files_are_refused_and_the_running_config_keeps_serving() {
    let s = Setup::start(&limited("per_client", 1, V_RE));
    s.assert_burst("gen1", 1, "generation 1");
    assert_eq!(s.get("/v1/x", "r"), 200);
    assert_eq!(s.get("/w1/x", "r"), 404);

    struct Case {
        name: &'static str,
        text: String,
        needle: &'static str,
        error_needle: &'static str,
    }
    let good = |burst: u32| s.text(&limited("per_client", burst, V_RE));
    let cases = [
        Case {
            name: "TOML syntax error",
            text: good(1).replace("rate = \"1r/m\"", "rate = \"1r/m"),
            needle: "rate = \"1r/m",
            error_needle: "string",
        },
        Case {
            name: "unknown zone",
            text: s.text(&limited("per_clnt", 2, V_RE)),
            needle: "zone = \"per_clnt\"",
            error_needle: "unknown zone \"per_clnt\"",
        },
        Case {
            name: "bad regex",
            text: s.text(&limited("per_client", 3, "^/v[0-9+/")),
            needle: "path_regex",
            error_needle: "path_regex",
        },
    ];

    let mut burst = 1usize; // the running config's burst
    for (i, case) in cases.iter().enumerate() {
        let ctx = case.name;
        let before = s.status();
        let (gen0, fails0) = (gen_of(&before), before["reload_failures"].as_u64().unwrap());

        s.write(&case.text);
        let st = s.wait_failures(fails0 + 1);
        assert_eq!(gen_of(&st), gen0, "{ctx}: refused, generation unchanged: {st}");
        let err = st["last_error"].as_str().unwrap_or_else(|| panic!("{ctx}: last_error set: {st}")).to_string();
        assert_refusal(&s, &err, line_of(&case.text, case.needle), case.error_needle);

        // The running config keeps serving, exactly as before.
        s.assert_burst(&format!("broken{i}"), burst, &format!("{ctx}: old config"));
        assert_eq!(s.get("/v1/x", "r"), 200, "{ctx}: the old regex route answers");
        assert_eq!(s.get("/w1/x", "r"), 404, "{ctx}");

        // Fix it with a real change: a bigger burst.
        burst += 1;
        s.write(&good(burst as u32));
        let st = s.wait_generation(gen0 + 1);
        assert_eq!(gen_of(&st), gen0 + 1, "{ctx}: fix applied once: {st}");
        // One bad save is counted once, however many file events it made: the watcher reloads
        // one after the other, so by the time it applied the fix it had run every reload that
        // read the bad text (a later one reads the fix).
        assert_eq!(st["reload_failures"].as_u64(), Some(fails0 + 1), "{ctx}: the bad save counted once: {st}");
        assert_eq!(st["last_error"], Value::Null, "{ctx}: fix clears last_error: {st}");
        s.assert_burst(&format!("fixed{i}"), burst, &format!("{ctx}: fixed"));
    }

    // Finally a fix that also changes the regex route: the new route answers, the old one is gone.
    let gen0 = s.generation();
    s.write(&s.text(&limited("per_client", burst as u32, "^/w[0-9]+/")));
    s.wait_generation(gen0 + 1);
    assert_eq!(s.get("/w1/x", "r"), 200);
    assert_eq!(s.get("/v1/x", "r"), 404);
    let stderr = s.w.stderr();
    assert!(stderr.contains("config reloaded"), "stderr logs the applied reloads\n{}", s.log());
}

// ---------------------------------------------------------------------------------------------
// 3. Write patterns: write-and-rename, Kubernetes ConfigMap symlink swap
// ---------------------------------------------------------------------------------------------

fn prefix_route(prefix: &str) -> String {
    format!(
        r#"[[route]]
name = "only"
path_prefix = "{prefix}"
upstream = "app"
"#
    )
}

/// Asserts that `/{live}/x` is proxied and `/{gone}/x` has no route.
fn assert_routes(s: &Setup, live: &str, gone: &str, ctx: &str) {
    assert_eq!(s.get(&format!("/{live}/x"), "c"), 200, "{ctx}: /{live}/ routed");
    assert_eq!(s.get(&format!("/{gone}/x"), "c"), 404, "{ctx}: /{gone}/ gone");
}

#[test]
fn write_to_temp_file_and_rename_over_the_config_is_picked_up() {
    let s = Setup::start(&prefix_route("/one/"));
    assert_routes(&s, "one", "two", "generation 1");

    for (round, (live, gone)) in [("two", "one"), ("three", "two")].into_iter().enumerate() {
        let gen0 = s.generation();
        let tmp = s.dir().join(format!(".weir.toml.tmp{round}"));
        fs::write(&tmp, s.text(&prefix_route(&format!("/{live}/")))).unwrap();
        fs::rename(&tmp, s.path()).unwrap();
        let st = s.wait_generation(gen0 + 1);
        assert_eq!(gen_of(&st), gen0 + 1, "{st}");
        assert_routes(&s, live, gone, &format!("after rename {round}"));
    }
}

/// Creates the symlink `link -> target` under a temporary name, then renames it over `link`
/// (atomic, as Kubernetes' AtomicWriter does).
fn swap_symlink(dir: &Path, link: &str, target: &str) {
    let tmp = dir.join(format!("{link}_tmp"));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    fs::rename(&tmp, dir.join(link)).unwrap();
}

#[test]
fn kubernetes_configmap_symlink_swap_is_picked_up() {
    let s = Setup::start(&prefix_route("/one/"));
    assert_routes(&s, "one", "two", "generation 1");
    let dir = s.dir().to_path_buf();
    let name = s.path().file_name().unwrap().to_str().unwrap().to_string();

    // Turn the config into the ConfigMap layout, same text:
    //   weir.toml -> ..data/weir.toml,  ..data -> ..2024_01_01_00_00_00.1
    let ts1 = "..2024_01_01_00_00_00.1";
    fs::create_dir(dir.join(ts1)).unwrap();
    fs::write(dir.join(ts1).join(&name), fs::read(s.path()).unwrap()).unwrap();
    swap_symlink(&dir, "..data", ts1);
    swap_symlink(&dir, &name, &format!("..data/{name}"));
    assert!(fs::symlink_metadata(s.path()).unwrap().file_type().is_symlink());
    let (code, v) = s.admin_call("POST", "/reload");
    assert_eq!((code, v["result"].as_str()), (200, Some("unchanged")), "{v}");
    assert_eq!(gen_of(&s.status()), 1, "same text through the symlinks: no new generation");

    // Two ConfigMap updates: new timestamped dir, `..data_tmp` renamed over `..data`, old dir
    // removed.
    let mut old = ts1.to_string();
    for (round, (live, gone)) in [("two", "one"), ("three", "two")].into_iter().enumerate() {
        let gen0 = s.generation();
        let ts = format!("..2024_01_01_00_00_0{}.{}", round + 1, round + 2);
        fs::create_dir(dir.join(&ts)).unwrap();
        fs::write(dir.join(&ts).join(&name), s.text(&prefix_route(&format!("/{live}/")))).unwrap();
        swap_symlink(&dir, "..data", &ts);
        fs::remove_dir_all(dir.join(&old)).unwrap();
        old = ts;
        let st = s.wait_generation(gen0 + 1);
        assert_eq!(gen_of(&st), gen0 + 1, "round {round}: {st}");
        assert_eq!(st["last_error"], Value::Null, "round {round}: {st}");
        assert_routes(&s, live, gone, &format!("after ConfigMap swap {round}"));
    }
}

#[test]
fn file_change_is_applied_while_another_file_in_the_directory_keeps_changing() {
    let s = Setup::start(&prefix_route("/one/"));
    // Something else in the config's directory (a log, a lock file, an editor's swap file)
    // written every 50 ms for the whole test.
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    let sibling = s.dir().join("other.log");
    let writer = {
        let stop = stop.clone();
        thread::spawn(move || {
            use std::io::Write;
            let mut f = fs::File::create(sibling).unwrap();
            while !stop.load(Ordering::SeqCst) {
                writeln!(f, "busy").unwrap();
                thread::sleep(Duration::from_millis(50));
            }
        })
    };
    // The sibling is being written (three writes seen) before the config changes.
    let sibling_written = wait_until(RELOAD_TIMEOUT, Duration::from_millis(10), || {
        fs::read_to_string(s.dir().join("other.log")).is_ok_and(|t| t.lines().count() >= 3)
    });
    assert!(sibling_written.is_some(), "other.log not written three times within {RELOAD_TIMEOUT:?}");
    let t_write = Instant::now();
    s.write(&s.text(&prefix_route("/two/")));
    let outcome = s.poll_status(RELOAD_TIMEOUT, |v| gen_of(v) == 2);
    let waited = t_write.elapsed();
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    if let Err(last) = outcome {
        let after = s.poll_status(Duration::from_secs(5), |v| gen_of(v) == 2);
        panic!(
            "the config change was not applied within {waited:?} while another file in its \
             directory kept changing (last GET /config: {last}); once that stopped: {after:?}\n{}",
            s.log()
        );
    }
    assert_routes(&s, "two", "one", "after the rewrite");
}

/// A refused reload names every error of the file, as `weir check` does: in the 422 answer of
/// `POST /reload`, in `last_error` and in the ERROR log line.
#[test]
fn a_refused_reload_names_every_error_of_the_file() {
    let s = Setup::start(&limited("per_client", 1, V_RE));
    s.assert_burst("a", 1, "generation 1");
    // A bad rate in the zone and an unknown upstream in a route that does not name the zone.
    let limited_text = limited("per_client", 1, V_RE).replace("rate = \"1r/m\"", "rate = \"1/m\"");
    let broken = s.text(&mutate_nth(&limited_text, "upstream = \"app\"", 1, "upstream = \"ghost\""));
    s.write(&broken);
    let (code, v) = s.admin_call("POST", "/reload");
    assert_eq!(code, 422, "{v}");
    let err = v["error"].as_str().unwrap_or_else(|| panic!("error: {v}"));
    let places = [
        format!("{}:{}: ", s.path().display(), line_of(&broken, "\"1/m\"")),
        format!("{}:{}: ", s.path().display(), line_of(&broken, "\"ghost\"")),
    ];
    assert!(err.starts_with(&places[0]), "the first error first: {err}");
    let second = err.find(&places[1]).unwrap_or_else(|| panic!("the second error: {err}"));
    assert!(err[second..].contains("unknown upstream \"ghost\""), "{err}");
    assert_eq!(s.status()["last_error"].as_str(), Some(err), "{}", s.status());
    let logged = s.w.stderr().lines().any(|l| l.contains("ERROR") && places.iter().all(|p| l.contains(p.as_str())));
    assert!(logged, "one ERROR line names both\n{}", s.log());
    s.assert_burst("b", 1, "the running config keeps serving");
}

/// `text` with its `nth` (0-based) `from` replaced by `to`.
fn mutate_nth(text: &str, from: &str, nth: usize, to: &str) -> String {
    let at = text.match_indices(from).nth(nth).unwrap_or_else(|| panic!("{from:?} #{nth}")).0;
    format!("{}{to}{}", &text[..at], &text[at + from.len()..])
}

// ---------------------------------------------------------------------------------------------
// 4. SIGHUP and POST /reload
// ---------------------------------------------------------------------------------------------

#[test]
fn sighup_and_post_reload() {
    let s = Setup::start(&limited("per_client", 1, V_RE));
    s.assert_burst("a", 1, "generation 1");

    // Edit, then SIGHUP at once: the watcher will see the same change; it is applied once.
    let reads = FileReads::watch(s.path());
    s.write(&s.text(&limited("per_client", 2, V_RE)));
    s.w.signal(libc::SIGHUP);
    s.wait_generation(2);
    let sighup_logged = || {
        s.w.stderr()
            .lines()
            .any(|l| l.contains("SIGHUP") && (l.contains("config reloaded") || l.contains("config unchanged")))
    };
    assert!(
        wait_until(RELOAD_TIMEOUT, Duration::from_millis(25), sighup_logged).is_some(),
        "stderr shows a SIGHUP-triggered reload\n{}",
        s.log()
    );
    // Two reads of the file: the SIGHUP reload's (logged, so done) and the watcher's (before or
    // after it; the second of the two finds the text unchanged).
    reads.wait_for(2, "the SIGHUP reload, the file watcher's reload", &s);
    let st = s.status();
    assert_eq!(gen_of(&st), 2, "one edit, one new generation: {st}");
    s.assert_burst("b", 2, "after SIGHUP");

    // POST /reload on an unchanged file.
    let (code, v) = s.admin_call("POST", "/reload");
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["result"], "unchanged", "{v}");
    assert_eq!(v["generation"].as_u64(), Some(2), "{v}");
    assert_eq!(s.generation(), 2);

    // POST /reload right after writing a broken file: 422 with the error; the old config serves.
    let fails0 = s.failures();
    let broken = s.text(&limited("per_nope", 5, V_RE));
    let reads = FileReads::watch(s.path());
    s.write(&broken);
    let (code, v) = s.admin_call("POST", "/reload");
    assert_eq!(code, 422, "{v}");
    assert_eq!(v["result"], "refused", "{v}");
    let err = v["error"].as_str().unwrap_or_else(|| panic!("error: {v}"));
    assert_refusal(&s, err, line_of(&broken, "zone = \"per_nope\""), "unknown zone \"per_nope\"");
    let st = s.status();
    assert_eq!(gen_of(&st), 2, "{st}");
    assert_eq!(st["last_error"].as_str(), Some(err), "{st}");
    assert!(st["reload_failures"].as_u64().unwrap() > fails0, "{st}");
    s.assert_burst("c", 2, "broken file refused by POST /reload");
    // Four reads: two per refused reload (to compile the file, then to fingerprint the refused
    // text), the API's and the watcher's, in either order.
    reads.wait_for(4, "the POST /reload, the file watcher's reload", &s);
    let st = s.status();
    assert_eq!(gen_of(&st), 2, "{st}");
    // The API refusal counts once; the watcher sees the same bad text at most once more (not at
    // all when the API's refusal came first: the same text is counted once).
    let failures = st["reload_failures"].as_u64().unwrap();
    assert!((fails0 + 1..=fails0 + 2).contains(&failures), "{st}");
    s.assert_burst("d", 2, "broken file, after the watcher saw it too");

    // Fix it and POST /reload: the fix is applied (by this call or by the watcher just before).
    s.write(&s.text(&limited("per_client", 3, V_RE)));
    let (code, v) = s.admin_call("POST", "/reload");
    assert_eq!(code, 200, "{v}");
    assert!(v["result"] == "applied" || v["result"] == "unchanged", "{v}");
    assert_eq!(v["generation"].as_u64(), Some(3), "{v}");
    s.assert_burst("e", 3, "fixed");
}

// ---------------------------------------------------------------------------------------------
// 5. Settings that need a restart
// ---------------------------------------------------------------------------------------------

const TWO_ROUTES: &str = r#"[[route]]
name = "a"
path_prefix = "/a/"
upstream = "app"
"#;

const THREE_ROUTES: &str = r#"[[route]]
name = "a"
path_prefix = "/a/"
upstream = "app"

[[route]]
name = "b"
path_prefix = "/b/"
upstream = "app"
"#;

/// Starts on `/a/` only, then adds a second listen address and route `/b/`: returns the setup
/// and the added address.
fn start_and_add_listen() -> (Setup, String) {
    let s = Setup::start(TWO_ROUTES);
    assert_eq!(s.get("/a/x", "c"), 200);
    assert_eq!(s.get("/b/x", "c"), 404);
    let st = s.status();
    assert_eq!(st["pending_restart"], serde_json::json!([]), "{st}");

    let extra = format!("127.0.0.1:{}", free_port());
    let listen = format!("{:?}, {:?}", s.w.addr.to_string(), extra);
    s.write(&s.text_with_listen(&listen, THREE_ROUTES));
    let st = s.wait_generation(2);
    let pending = pending(&st);
    assert!(pending.iter().any(|p| p.contains("server.listen")), "pending_restart names server.listen: {st}");
    // Everything else is applied; the proxy keeps serving on the old address.
    assert_eq!(s.get("/b/x", "c"), 200, "the new route is live");
    assert_eq!(s.get("/a/x", "c"), 200, "still served on {}", s.w.addr);
    let stderr = s.w.stderr();
    assert!(
        stderr.lines().any(|l| l.contains("WARN") && l.contains("server.listen")),
        "the restart-only change is logged as a warning\n{}",
        s.log()
    );
    (s, extra)
}

fn pending(st: &Value) -> Vec<String> {
    st["pending_restart"]
        .as_array()
        .unwrap_or_else(|| panic!("pending_restart is an array: {st}"))
        .iter()
        .map(|p| p.as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn listen_change_is_reported_as_pending_restart() {
    let (s, _) = start_and_add_listen();
    let (code, v) = s.admin_call("POST", "/reload");
    assert_eq!((code, v["result"].as_str()), (200, Some("unchanged")), "{v}");
    let st = s.status();
    assert!(pending(&st).iter().any(|p| p.contains("server.listen")), "still pending after an unchanged reload: {st}");
}

#[test]
fn pending_restart_survives_a_later_unrelated_reload() {
    let (s, extra) = start_and_add_listen();
    // Another edit that leaves the (still unapplied) listen change in the file.
    let listen = format!("{:?}, {:?}", s.w.addr.to_string(), extra);
    s.write(&s.text_with_listen(&listen, TWO_ROUTES));
    let st = s.wait_generation(3);
    assert_eq!(s.get("/b/x", "c"), 404, "the route removal is applied");
    assert!(
        pending(&st).iter().any(|p| p.contains("server.listen")),
        "the process still listens on {} only, so server.listen must still be pending a restart: {st}",
        s.w.addr
    );
}

#[test]
fn pending_restart_clears_when_the_setting_is_reverted() {
    let (s, _) = start_and_add_listen();
    // Back to the listen address the process really has.
    s.write(&s.text(TWO_ROUTES));
    let st = s.wait_generation(3);
    assert_eq!(s.get("/b/x", "c"), 404, "the route removal is applied");
    assert!(pending(&st).is_empty(), "the file's listen is again what the process listens on: nothing pending: {st}");
}

// ---------------------------------------------------------------------------------------------
// 6. Limit state across reloads
// ---------------------------------------------------------------------------------------------

fn stateful(zone: &str, burst: u32, extra_route: bool) -> String {
    let mut t = format!(
        r#"[[limit_req_zone]]
name = "{zone}"
key = "header:X-Client"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ {{ zone = "{zone}", burst = {burst}, nodelay = true }} ]
"#
    );
    if extra_route {
        t.push_str(
            r#"
[[route]]
name = "extra"
path_prefix = "/extra/"
upstream = "app"
"#,
        );
    }
    t
}

#[test]
fn limit_state_survives_reloads_and_a_renamed_zone_starts_fresh() {
    let s = Setup::start(&stateful("z1", 2, false));
    assert_eq!(s.api_statuses("k", 4), [200, 200, 200, 429]);

    // An unrelated change: the bucket of "k" is still full.
    s.write(&s.text(&stateful("z1", 2, true)));
    s.wait_generation(2);
    assert_eq!(s.get("/extra/x", "k"), 200, "the added route is live");
    assert_eq!(s.api_statuses("k", 2), [429, 429], "state kept across the reload");

    // A bigger burst on the same zone keeps the counters: exactly one more request fits.
    s.write(&s.text(&stateful("z1", 3, true)));
    s.wait_generation(3);
    assert_eq!(s.api_statuses("k", 3), [200, 429, 429], "burst 2 -> 3 keeps the level: one more pass");

    // A renamed zone is a new state space: "k" starts fresh.
    s.write(&s.text(&stateful("z2", 3, true)));
    s.wait_generation(4);
    assert_eq!(s.api_statuses("k", 5), [200, 200, 200, 200, 429], "zone renamed: fresh state");
}

#[test]
fn log_settings_read_at_start_are_reported_as_pending_restart() {
    let s = Setup::start(TWO_ROUTES);
    let listen = format!("{:?}", s.w.addr.to_string());
    s.write(&s.text_with_listen(&listen, &format!("[log]\naccess_log_buffer = 65536\n\n{THREE_ROUTES}")));
    let st = s.wait_generation(2);
    let pending = pending(&st);
    assert!(
        pending.iter().any(|p| p.contains("log.access_log_buffer") && p.contains("running off")),
        "pending_restart names the access-log buffer: {st}"
    );
    assert_eq!(s.get("/b/x", "c"), 200, "everything else is applied");
}
