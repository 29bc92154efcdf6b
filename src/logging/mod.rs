//! Weir's logs: everything goes to stderr through `tracing` (level from `[log] level` unless
//! `RUST_LOG` says otherwise; text or JSON lines from `[log] format`), except the JSON access log
//! line, which is formatted by hand ([`line`]) because it is written once per request:
//! `tracing`'s JSON formatter cost several µs of CPU a line (bench/results/levers-2026-11.md, "Levers, A/B").
//! Which lines are written is still `tracing`'s filter's choice, for those lines too. Access lines,
//! in either format, go out through [`buffer`] (at once, or buffered with `[log] access_log_buffer`).

pub mod buffer;
pub mod caller;
pub mod json;
pub mod line;
mod timestamp;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::fmt::MakeWriter;

use crate::config::LogSettings;

/// Set once by [`init`]: the subscriber writes JSON lines, so the access log writes its own.
static JSON_LINES: AtomicBool = AtomicBool::new(false);

/// Installs the `tracing` subscriber that writes to stderr. Called once, at start-up: the format
/// and the level are not reloaded.
pub fn init(settings: &LogSettings) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&settings.level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(Stderr);
    if settings.json {
        builder.json().flatten_event(true).init();
    } else {
        builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init();
    }
    JSON_LINES.store(settings.json, Ordering::Relaxed);
    if let Some(access_buffer) = settings.access_buffer {
        if let Err(e) = buffer::start(access_buffer) {
            tracing::warn!("{e}; access lines are written one at a time");
        }
    }
}

/// `tracing`'s writer: stderr, with access lines (text format) through [`buffer`] when buffered.
struct Stderr;

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = EventWriter;

    fn make_writer(&'a self) -> EventWriter {
        EventWriter::Stderr(std::io::stderr())
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> EventWriter {
        if meta.target() == "weir::access" && buffer::is_on() {
            EventWriter::Access(Vec::new())
        } else {
            self.make_writer()
        }
    }
}

/// One event's line: written to stderr as `tracing` hands it over, or gathered and given to the
/// access-line buffer whole when dropped (`tracing` writes one formatted event per writer).
enum EventWriter {
    Stderr(std::io::Stderr),
    Access(Vec<u8>),
}

impl Write for EventWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match self {
            EventWriter::Stderr(out) => out.write(bytes),
            EventWriter::Access(line) => {
                line.extend_from_slice(bytes);
                Ok(bytes.len())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            EventWriter::Stderr(out) => out.flush(),
            EventWriter::Access(_) => Ok(()),
        }
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        if let EventWriter::Access(line) = self {
            if !line.is_empty() {
                buffer::write_line(line);
            }
        }
    }
}

/// Whether log lines are JSON (`[log] format = "json"` at start-up). False until [`init`] ran.
pub fn json_lines() -> bool {
    JSON_LINES.load(Ordering::Relaxed)
}
