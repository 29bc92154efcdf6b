//! Weir's logs with `[log] format = "json"`, read back from its stderr: one JSON object a line;
//! the access log lines are those whose `target` is [`ACCESS_TARGET`].

use serde_json::Value;

use super::weir::Weir;

/// The `target` of access log lines.
pub const ACCESS_TARGET: &str = "weir::access";

/// Every non-empty stderr line of `w` as JSON; panics on a line that is not JSON.
pub fn json_lines(w: &Weir) -> Vec<Value> {
    w.stderr()
        .lines()
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
    w.stderr()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == ACCESS_TARGET)
        .collect()
}
