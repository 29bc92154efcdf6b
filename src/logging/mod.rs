//! Weir's logs: everything goes to stderr through `tracing` (level from `[log] level` unless
//! `RUST_LOG` says otherwise; text or JSON lines from `[log] format`), except the JSON access log
//! line, which is formatted by hand ([`line`]) because it is written once per request:
//! `tracing`'s JSON formatter cost several µs of CPU a line (bench/results/levers-2026-11.md, "Levers, A/B").
//! Which lines are written is still `tracing`'s filter's choice, for those lines too.

pub mod json;
pub mod line;
mod timestamp;

use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::LogSettings;

/// Set once by [`init`]: the subscriber writes JSON lines, so the access log writes its own.
static JSON_LINES: AtomicBool = AtomicBool::new(false);

/// Installs the `tracing` subscriber that writes to stderr. Called once, at start-up: the format
/// and the level are not reloaded.
pub fn init(settings: &LogSettings) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&settings.level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if settings.json {
        builder.json().flatten_event(true).init();
    } else {
        builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init();
    }
    JSON_LINES.store(settings.json, Ordering::Relaxed);
}

/// Whether log lines are JSON (`[log] format = "json"` at start-up). False until [`init`] ran.
pub fn json_lines() -> bool {
    JSON_LINES.load(Ordering::Relaxed)
}
