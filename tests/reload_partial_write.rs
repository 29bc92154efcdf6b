//! The file watcher applies a config only once it is complete: a file written in place in pieces,
//! with its writer pausing in between, is applied once, whole, after the writer closes it — never
//! the half that fails to parse, nor the half that happens to be a valid config (a route without
//! its `limit_req` line). Real weir, real upstream, the file written by this test through one open
//! file handle. Also when the writer starts while the watcher is already settling another change
//! of the file: the watcher must still know that the file is being written.

use crate::support;

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};
use support::admin;
use support::config::with_app;
use support::http::{self, Request};
use support::metrics::scrape;
use support::poll::poll;
use support::upstream::Upstream;
use support::weir::Weir;

/// The writer's pause after the second piece: far longer than the watcher's debounce (200 ms)
/// and content-stability wait (300 ms), so that the old watcher applied it. Time must pass here:
/// a pause is what such a writer does, and what the watcher must sit through.
const PAUSE: Duration = Duration::from_secs(1);
const RELOAD_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(25);

fn config_status(weir: &Weir) -> Value {
    let r = admin::request(admin::addr(weir), "GET", "/config", None);
    assert_eq!(r.status, 200, "GET /config: {}", r.summary());
    r.json()
}

/// `GET /config` every [`POLL`] for `how_long`: every generation and failure count seen.
fn watch_for(weir: &Weir, how_long: Duration) -> Vec<(u64, u64)> {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    while t0.elapsed() < how_long {
        let s = config_status(weir);
        seen.push((s["generation"].as_u64().unwrap_or(0), s["reload_failures"].as_u64().unwrap_or(0)));
        std::thread::sleep(POLL);
    }
    seen
}

/// What the watcher logs when it has found the file stable but still open by its writer: it
/// looked at the partial file and chose to wait.
const STILL_OPEN: &str = "config file written but still open";

/// `GET /config` every [`POLL`] until the watcher has logged [`STILL_OPEN`] (bounded): every
/// generation and failure count seen meanwhile.
fn watch_until_still_open(weir: &Weir) -> Vec<(u64, u64)> {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    while !weir.stderr().contains(STILL_OPEN) {
        assert!(t0.elapsed() < RELOAD_TIMEOUT, "the watcher never found the file still open:\n{}", weir.stderr());
        seen.extend(watch_for(weir, POLL));
    }
    seen.extend(watch_for(weir, POLL));
    seen
}

fn fingerprint(text: &str) -> String {
    Sha256::digest(text.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_file_written_slowly_in_pieces_is_applied_once_whole_after_its_writer_closes_it() {
    written_in_pieces(|_| {});
}

#[test]
fn a_file_written_in_pieces_just_after_another_change_is_still_applied_once_whole() {
    // A change of the file's mode (same mode: still an event) sets the watcher settling; the
    // writer truncates the file before that settles. Only writes in progress tell it apart
    // from a finished file: no close, no rename.
    written_in_pieces(|path| {
        let mode = std::fs::metadata(path).expect("stat the config").permissions();
        std::fs::set_permissions(path, mode).expect("chmod the config");
    });
}

/// Writes a new config into the running Weir's file in three pieces, pausing after each, having
/// first called `before_writing` with the file's path.
fn written_in_pieces(before_writing: impl Fn(&Path)) {
    let up = Upstream::start();
    let head = with_app(
        admin::LISTEN,
        "[store]\nkind = \"memory\"",
        up.addr(),
        r#"
[[limit_req_zone]]
name = "per_client"
key = "header:X-Client"
rate = "1r/m"
"#,
    );
    let weir =
        Weir::start(&format!("{head}\n[[route]]\nname = \"old\"\npath_prefix = \"/old/\"\nupstream = \"app\"\n"));
    let head = head.replace("$LISTEN2", &admin::addr(&weir).to_string()).replace("$LISTEN", &weir.addr.to_string());
    assert_eq!(config_status(&weir)["generation"], 1);

    // The new file, in three pieces: the first ends mid-table (does not parse), the first two are
    // a valid config whose route has no limit, all three limit the route.
    let pieces = [
        format!("{head}\n[[route]]\nname = \"new\"\npath_prefix = "),
        "\"/new/\"\nupstream = \"app\"\n".to_string(),
        "limit_req = [ { zone = \"per_client\" } ]\n".to_string(),
    ];
    let full: String = pieces.concat();
    before_writing(&weir.config_path);
    let mut file = OpenOptions::new().write(true).truncate(true).open(&weir.config_path).expect("open the config");
    let mut seen = Vec::new();
    for (i, piece) in pieces[..2].iter().enumerate() {
        file.write_all(piece.as_bytes()).expect("write a piece");
        file.flush().expect("flush");
        // After the first piece, until the watcher says it waits for the writer (the positive
        // sign that it looked at the partial file); after the second, a pause.
        seen.extend(if i == 0 { watch_until_still_open(&weir) } else { watch_for(&weir, PAUSE) });
        // While the file is incomplete the old config serves (its route "old" is not in the new file).
        let old = http::get(weir.addr, "/old/x").status;
        assert_eq!(old, 200, "a partial file was applied: (generation, failures) seen {seen:?}\n{}", weir.stderr());
    }
    file.write_all(pieces[2].as_bytes()).expect("write the last piece");
    drop(file);
    assert!(
        seen.iter().all(|&(generation, failures)| generation == 1 && failures == 0),
        "a partial file was applied or refused while being written: (generation, failures) seen {seen:?}\n{}",
        weir.stderr()
    );

    // Once closed and stable, the whole file is applied: one generation, no failure.
    let status = poll(RELOAD_TIMEOUT, POLL, || config_status(&weir), |s| s["generation"] == 2)
        .unwrap_or_else(|s| panic!("the complete file was never applied: {s}\n{}", weir.stderr()));
    assert_eq!(status["hash"], fingerprint(&full), "{status}");
    assert_eq!(status["reload_failures"], 0, "{status}");
    let m = scrape(admin::addr(&weir));
    assert_eq!(m.must("weir_config_reloads_total", &[]), 1.0, "one reload, of the whole file");
    assert_eq!(m.value_or_zero("weir_config_reload_failures_total", &[]), 0.0);
    // And it behaves as the whole file says: /new/ is limited (1r/m, no burst).
    let get = |client: &str| http::must_send(weir.addr, &Request::get("/new/x").header("X-Client", client)).status;
    assert_eq!([get("c"), get("c")], [200, 429]);
    assert_eq!(config_status(&weir)["generation"], 2, "nothing applied after");
}
