//! The admin status page (`GET /`) in a real headless Chromium (Debian's, scripts/setup.sh): with
//! the token it shows routes, zones, upstreams, the store and the keys being limited, updating by
//! itself; without it, nothing. `WEIR_SCREENSHOT=path.png` also keeps a screenshot (how
//! docs/status-page.png was made).

mod support;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use support::admin;
use support::config::with_app;
use support::http::{KeepAlive, Request};
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
