//! `weir replay` of a running Weir's own JSON access log, as a user checks that replay agrees.

use std::time::Duration;

use serde_json::Value;

use super::weir::{run, ConfigDir, Weir};

/// Replays `w`'s access log so far with its own config and requires that all `total` requests
/// were compared and each decided as it was live; returns the `--decisions` file (one line per
/// request: time, then nginx's status word).
pub fn replay_own_log(w: &Weir, total: usize) -> String {
    let dir = ConfigDir::new();
    let log = dir.write("weir.log", &w.stderr());
    let decisions = dir.path().join("decisions.tsv");
    let out = run(
        [
            "replay",
            "-c",
            w.config_path.to_str().expect("a UTF-8 config path"),
            "--json",
            "--quiet",
            "--format",
            "weir",
            "--decisions",
            decisions.to_str().expect("a UTF-8 temp path"),
            log.to_str().expect("a UTF-8 temp path"),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "weir replay failed: {}", out.describe());
    let report: Value = serde_json::from_str(&out.stdout).expect("a JSON report");
    let agreement = &report["agreement"];
    assert_eq!(agreement["compared"].as_u64(), Some(total as u64), "{report}");
    assert_eq!(agreement["matched"], agreement["compared"], "{}", agreement["examples"]);
    std::fs::read_to_string(&decisions).expect("decisions written")
}
