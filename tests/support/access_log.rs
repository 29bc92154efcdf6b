//! Weir's logs with `[log] format = "json"`, read back from its stderr: one JSON object a line;
//! the access log lines are those whose `target` is [`ACCESS_TARGET`].

use serde_json::Value;

use super::weir::Weir;

/// The `target` of access log lines.
pub const ACCESS_TARGET: &str = "weir::access";

/// The lines of `w`'s stderr that are finished: a line still being written (no newline yet) is
/// left for the next read, so a poll never parses half an object.
fn finished_lines(w: &Weir) -> Vec<String> {
    let all = w.stderr();
    let end = all.rfind('\n').map_or(0, |i| i + 1);
    all[..end].lines().map(str::to_owned).collect()
}

/// Every non-empty finished stderr line of `w` as JSON; panics on a line that is not JSON.
pub fn json_lines(w: &Weir) -> Vec<Value> {
    finished_lines(w)
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("stderr line is not JSON with format = \"json\" ({e}): {l:?}"))
        })
        .collect()
}

/// The access log lines among `lines`.
pub fn access_of(lines: &[Value]) -> Vec<Value> {
    lines.iter().filter(|v| v["target"] == ACCESS_TARGET).cloned().collect()
}

/// The access log lines of `w`; other stderr lines, JSON or not, are skipped.
pub fn access_lines(w: &Weir) -> Vec<Value> {
    finished_lines(w)
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == ACCESS_TARGET)
        .collect()
}

/// The access log lines of `w` once there are at least `n` (a line is written as its request
/// ends, after the response), or after 10 s: the caller asserts how many it wanted.
pub fn wait_for_access_lines(w: &Weir, n: usize) -> Vec<Value> {
    let bound = std::time::Duration::from_secs(10);
    super::poll::poll(bound, std::time::Duration::from_millis(10), || access_lines(w), |l| l.len() >= n)
        .unwrap_or_else(|last| last)
}
