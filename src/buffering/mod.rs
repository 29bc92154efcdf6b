//! Response buffering (nginx's `proxy_buffering`): a client that reads slowly, or not at all, no
//! longer holds the upstream. Below Pingora, each HTTP/1 client connection's writes are taken
//! at once into a bounded buffer ([`SpillQueue`]: memory, then a temp file) and sent as fast as
//! the client reads ([`WriteBehind`]). Pingora therefore writes the whole response without
//! waiting, reads the upstream's answer to its end, and gives the upstream connection back to
//! its pool — the upstream's worker is free while the client is still reading.
//!
//! A fast client sees no difference: bytes go straight to the socket while it takes them and
//! are only buffered when the socket is full. Every buffer is bounded twice, per connection
//! (`memory_per_connection`, `max_temp_file_size`) and per process ([`Budgets`]); when a bound
//! is reached the connection streams with back-pressure as it would without buffering.
//!
//! HTTP/2 clients are not buffered here: each stream is bounded by the client's own
//! flow-control window (h2 holds the data until the client grants room), so an HTTP/2 slow
//! reader still holds its upstream request (see docs/security.md).

mod budget;
mod queue;
mod stream;

use std::path::PathBuf;

pub use budget::Budget;
pub use queue::{SpillQueue, STAGE};
pub use stream::WriteBehind;

/// `[server.response_buffering]`, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseBuffering {
    /// Off: every write waits for the client (Pingora's own streaming).
    pub enabled: bool,
    /// Bytes of one connection's buffer held in memory (nginx `proxy_buffers`).
    pub memory_per_connection: u64,
    /// Bytes of one connection's temp file; 0: memory only (nginx `proxy_max_temp_file_size`).
    pub max_temp_file_size: u64,
    /// Where temp files are made (nginx `proxy_temp_path`); each is unlinked once open.
    pub temp_path: PathBuf,
    /// Bytes of every connection's memory buffers together.
    pub memory: u64,
    /// Bytes of every connection's temp files together.
    pub temp_files: u64,
}

impl Default for ResponseBuffering {
    fn default() -> Self {
        Self {
            enabled: true,
            memory_per_connection: 64 * 1024,
            max_temp_file_size: 1 << 30,
            temp_path: std::env::temp_dir(),
            memory: 64 << 20,
            temp_files: 4 << 30,
        }
    }
}

/// The process's two budgets, shared by every connection and kept across reloads.
#[derive(Debug)]
pub struct Budgets {
    pub memory: Budget,
    pub disk: Budget,
}

impl Budgets {
    pub fn new(settings: &ResponseBuffering) -> Self {
        Self { memory: Budget::new(settings.memory), disk: Budget::new(settings.temp_files) }
    }

    /// The serving process's budgets, shown as `weir_response_buffer_bytes{medium}`.
    pub fn metered(settings: &ResponseBuffering) -> Self {
        let held = |medium: &str| crate::metrics::METRICS.response_buffer_bytes.with_label_values(&[medium]);
        Self {
            memory: Budget::metered(settings.memory, held("memory")),
            disk: Budget::metered(settings.temp_files, held("temp_file")),
        }
    }

    /// A reload's new totals (what connections hold stays held).
    pub fn apply(&self, settings: &ResponseBuffering) {
        self.memory.set_limit(settings.memory);
        self.disk.set_limit(settings.temp_files);
    }
}
