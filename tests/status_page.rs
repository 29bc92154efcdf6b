//! The admin status page (`GET /`) in a real headless Chromium (Debian's, scripts/setup.sh): with
//! the token it shows routes, zones, upstreams, the store and the keys being limited, updating by
//! itself; without it, nothing. `WEIR_SCREENSHOT=path.png` also keeps a screenshot (how
//! docs/status-page.png was made).

use crate::support;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use support::admin;
use support::config::with_app;
use support::http::{KeepAlive, Request};
use support::poll::poll;
use support::upstream::Upstream;
use support::weir::Weir;

const TOKEN: &str = "page-secret-token-0123";

/// Chromium's flags for a test: no sandbox (root in CI), nothing from the network but the page,
/// a fresh profile.
fn chromium(profile: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            &format!("--user-data-dir={}", profile.display()),
        ])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("chromium: {e} (install it with scripts/setup.sh)"));
    assert!(out.status.success(), "chromium {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The page's DOM after its scripts ran for `budget_ms` of virtual time.
/// The last cell of a route row of the page: its rejected requests per second.
fn rejected_rate(route_row: &str) -> Option<f64> {
    route_row
        .rsplit("<td class=\"n\">")
        .next()
        .map(|cell| cell.trim_start_matches("<span class=\"bad\">"))
        .and_then(|cell| cell.split('<').next())
        .and_then(|n| n.parse::<f64>().ok())
}

fn dom(url: &str, budget_ms: u32) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    chromium(profile.path(), &[&format!("--virtual-time-budget={budget_ms}"), "--dump-dom", url])
}

fn start() -> (Upstream, Weir) {
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
name = "checkout"
path_prefix = "/checkout/"
upstream = "app"
limit_req = [ { zone = "per_client", burst = 0, nodelay = true } ]
"#,
    ));
    (up, w)
}

#[test]
fn the_status_page_shows_the_instance_with_the_token() {
    let (up, w) = start();
    let mut client = KeepAlive::new(w.addr, Duration::from_secs(5));
    for _ in 0..5 {
        client.send(&Request::get("/checkout/").header("X-Client", "noisy-tenant")).expect("request");
    }
    // Traffic while the page runs: its rates come from two readings of /top, so a rejected rate
    // on the route shows that it updates by itself.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (stop, addr) = (stop.clone(), w.addr);
        thread::spawn(move || {
            let mut client = KeepAlive::new(addr, Duration::from_secs(5));
            while !stop.load(Ordering::Relaxed) {
                let _ = client.send(&Request::get("/checkout/").header("X-Client", "noisy-tenant"));
                thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let url = format!("http://{}/#token={TOKEN}", admin::addr(&w));
    // Chromium's virtual clock runs the page's 1 s refreshes faster than real time, so its last
    // two readings may fall between two requests of the traffic and show a rate of 0: a few page
    // loads (bounded) until one shows it.
    let mut attempts = Vec::new();
    let page = loop {
        let page = dom(&url, 4000);
        let route_row =
            page.split("<tr>").find(|row| row.contains("<td>checkout</td>")).unwrap_or_default().to_string();
        if rejected_rate(&route_row).is_some_and(|r| r > 0.0) {
            break page;
        }
        attempts.push(route_row);
        assert!(
            attempts.len() < 5,
            "no live rejected rate on the route in {} page loads: {attempts:#?}",
            attempts.len()
        );
    };
    for want in ["checkout", "per_client", "noisy-tenant", &up.addr().to_string(), "memory", "circuit breaker"] {
        assert!(page.contains(want), "the page lacks {want:?}:\n{page}");
    }
    assert!(page.contains(">up<"), "the upstream server shows as up:\n{page}");
    assert!(page.contains(">reset<"), "each key has a reset button:\n{page}");
    assert!(page.contains(r#"<form id="login" style="display: none;">"#), "no token asked:\n{page}");

    if let Ok(path) = std::env::var("WEIR_SCREENSHOT") {
        for (size, file) in [("1000,640", path.clone()), ("390,844", path.replace(".png", "-phone.png"))] {
            let profile = tempfile::tempdir().expect("profile dir");
            chromium(
                profile.path(),
                &[
                    "--virtual-time-budget=4000",
                    &format!("--window-size={size}"),
                    &format!("--screenshot={file}"),
                    &url,
                ],
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    traffic.join().expect("traffic");
}

#[test]
fn without_the_token_the_page_shows_nothing() {
    let (_up, w) = start();
    let mut client = KeepAlive::new(w.addr, Duration::from_secs(5));
    for _ in 0..3 {
        client.send(&Request::get("/checkout/").header("X-Client", "noisy-tenant")).expect("request");
    }
    for url in
        [format!("http://{}/", admin::addr(&w)), format!("http://{}/#token=wrong-token-00000000", admin::addr(&w))]
    {
        let page = dom(&url, 3000);
        assert!(page.contains(r#"<form id="login" style="display: block;">"#), "the page asks for the token:\n{page}");
        for secret in ["noisy-tenant", "checkout", "per_client"] {
            assert!(!page.contains(secret), "{secret:?} shown without the token:\n{page}");
        }
    }
    // The API behind it says nothing either.
    for (method, target) in [("GET", "/top"), ("GET", "/upstreams"), ("DELETE", "/limits/per_client/noisy-tenant")] {
        assert_eq!(admin::request(admin::addr(&w), method, target, None).status, 401, "{method} {target}");
    }
}

/// Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: commands on
/// fd 3, answers on fd 4, each a JSON text ended by NUL), for what `--dump-dom` cannot tell:
/// where things are on the screen. Killed on drop.
struct DevTools {
    child: std::process::Child,
    commands: std::fs::File,
    answers: std::sync::mpsc::Receiver<serde_json::Value>,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl DevTools {
    fn start() -> DevTools {
        use std::os::fd::{FromRawFd, RawFd};
        use std::os::unix::process::CommandExt;
        let pipe = || {
            let mut fds = [0 as RawFd; 2];
            // SAFETY: `fds` has room for the two descriptors pipe2 writes.
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
            fds
        };
        let (to_chromium, from_chromium) = (pipe(), pipe());
        let (child_reads, child_writes) = (to_chromium[0], from_chromium[1]);
        let profile = tempfile::tempdir().expect("profile dir");
        let mut command = Command::new("chromium");
        command.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--remote-debugging-pipe",
            &format!("--user-data-dir={}", profile.path().display()),
            "about:blank",
        ]);
        command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec. The ends are
        // first moved above 10, so that dup2 onto 3 and 4 never meets its own source (which would
        // leave close-on-exec set).
        unsafe {
            command.pre_exec(move || {
                let high_r = libc::fcntl(child_reads, libc::F_DUPFD, 10);
                let high_w = libc::fcntl(child_writes, libc::F_DUPFD, 10);
                if high_r < 0 || high_w < 0 || libc::dup2(high_r, 3) < 0 || libc::dup2(high_w, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().unwrap_or_else(|e| panic!("chromium: {e} (install it with scripts/setup.sh)"));
        // SAFETY: each descriptor is owned here and closed once (the child's ends by the drops).
        let (commands, answers_in) = unsafe {
            drop(std::fs::File::from_raw_fd(child_reads));
            drop(std::fs::File::from_raw_fd(child_writes));
            (std::fs::File::from_raw_fd(to_chromium[1]), std::fs::File::from_raw_fd(from_chromium[0]))
        };
        let (send, answers) = std::sync::mpsc::channel();
        thread::spawn(move || {
            use std::io::BufRead;
            let mut reader = std::io::BufReader::new(answers_in);
            let mut message = Vec::new();
            while reader.read_until(0, &mut message).is_ok_and(|n| n > 0) {
                message.pop();
                if let Ok(v) = serde_json::from_slice(&message) {
                    if send.send(v).is_err() {
                        return;
                    }
                }
                message.clear();
            }
        });
        DevTools { child, commands, answers, next_id: 0, _profile: profile }
    }

    /// Sends `method` (to `session` when given) and waits (10 s at most) for its answer's result.
    fn call(&mut self, session: Option<&str>, method: &str, params: serde_json::Value) -> serde_json::Value {
        use std::io::Write;
        self.next_id += 1;
        let id = self.next_id;
        let mut message = serde_json::json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            message["sessionId"] = s.into();
        }
        let mut bytes = message.to_string().into_bytes();
        bytes.push(0);
        self.commands.write_all(&bytes).expect("write to chromium");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let answer = self.answers.recv_timeout(left).unwrap_or_else(|_| panic!("no answer to {method} in 10 s"));
            if answer["id"] == id {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }
}

impl Drop for DevTools {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 38 item 4: on a phone-width screen (390 × 844) the reset button of a key is on the screen
/// and is what a tap at its centre reaches, without scrolling sideways.
#[test]
fn at_phone_width_the_reset_button_is_in_reach() {
    let (_up, w) = start();
    let mut client = KeepAlive::new(w.addr, Duration::from_secs(5));
    for _ in 0..3 {
        client
            .send(&Request::get("/checkout/").header("X-Client", "noisy-tenant-with-a-long-key-0123456789"))
            .expect("request");
    }
    let mut chromium = DevTools::start();
    let target = chromium.call(None, "Target.createTarget", serde_json::json!({ "url": "about:blank" }));
    let attached = chromium.call(
        None,
        "Target.attachToTarget",
        serde_json::json!({ "targetId": target["targetId"], "flatten": true }),
    );
    let session = attached["sessionId"].as_str().expect("a session").to_string();
    let session = Some(session.as_str());
    chromium.call(
        session,
        "Emulation.setDeviceMetricsOverride",
        serde_json::json!({ "width": 390, "height": 844, "deviceScaleFactor": 3, "mobile": true }),
    );
    let url = format!("http://{}/#token={TOKEN}", admin::addr(&w));
    chromium.call(session, "Page.navigate", serde_json::json!({ "url": url }));
    // Where the first reset button is, and what a tap at its centre hits.
    let probe = r#"(() => {
        const b = document.querySelector("button[data-id]");
        if (!b) return null;
        const r = b.getBoundingClientRect();
        const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
        return { left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: innerWidth,
                 height: innerHeight, hit: hit === b, page_width: document.documentElement.scrollWidth };
    })()"#;
    let found = poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        || {
            let r = chromium.call(
                session,
                "Runtime.evaluate",
                serde_json::json!({ "expression": probe, "returnByValue": true }),
            );
            r["result"]["value"].clone()
        },
        |v| !v.is_null(),
    )
    .unwrap_or_else(|v| panic!("no reset button on the page: {v}"));
    assert_eq!(found["width"], 390, "the phone's width: {found}");
    let (left, right) = (found["left"].as_f64().expect("left"), found["right"].as_f64().expect("right"));
    assert!(left >= 0.0 && right <= 390.0, "the reset button is off the screen sideways: {found}");
    assert!(found["hit"] == true, "a tap at the button's centre reaches something else: {found}");
    assert!(found["page_width"].as_f64().is_some_and(|p| p <= 390.0), "the page scrolls sideways: {found}");
}

#[test]
fn the_status_page_shows_each_adaptive_upstreams_limit_in_flight_ideal_latency_and_shed() {
    let up = Upstream::start();
    let w = Weir::start(&with_app(
        &format!("{}\nadmin_token = \"{TOKEN}\"", admin::LISTEN),
        "[store]\nkind = \"memory\"",
        up.addr(),
        r#"adaptive = {}

[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
"#,
    ));
    // Traffic until the first window is judged: the ideal latency is learned.
    let mut client = KeepAlive::new(w.addr, Duration::from_secs(5));
    let learned = poll(
        Duration::from_secs(10),
        Duration::from_millis(10),
        || {
            client.send(&Request::get("/")).expect("request");
            admin::request(admin::addr(&w), "GET", "/upstreams", Some(&format!("Bearer {TOKEN}"))).json()
        },
        |s| !s["upstreams"][0]["adaptive"]["ideal_ms"].is_null(),
    )
    .unwrap_or_else(|s| panic!("no ideal latency learned: {s}"));
    let a = &learned["upstreams"][0]["adaptive"];
    let page = dom(&format!("http://{}/#token={TOKEN}", admin::addr(&w)), 3000);
    assert!(page.contains("<h2>Adaptive concurrency</h2>"), "{page}");
    let section = page.split("<h2>Adaptive concurrency</h2>").nth(1).unwrap_or_default();
    let row = section.split("<tr>").find(|r| r.contains("<td>app</td>")).unwrap_or_else(|| panic!("{section}"));
    let cells: Vec<&str> = row
        .split("<td")
        .skip(1)
        .map(|c| c.split_once('>').map_or("", |(_, v)| v).trim_end_matches("</td></tr>"))
        .collect();
    let cells: Vec<String> = cells.iter().map(|c| c.split("</td>").next().unwrap_or_default().to_string()).collect();
    // upstream, limit, in flight, waiting, ideal ms, shed.
    assert_eq!(cells.len(), 6, "{row}");
    assert_eq!(cells[1], a["limit"].to_string(), "{row}");
    assert_eq!(cells[2], "0", "in flight: {row}");
    assert_eq!(cells[3], "0", "waiting: {row}");
    assert!(cells[4].parse::<f64>().is_ok_and(|ms| ms > 0.0), "ideal ms: {row}");
    assert_eq!(cells[5], "0", "shed: {row}");
}
