//! JSON log lines formatted outside `tracing` (for the per-request access log): into a buffer that
//! each thread reuses, then written to stderr with one `write(2)` before the caller goes on (or
//! gathered with the thread's other lines, with `[log] access_log_buffer`: `buffer.rs`). The object has the
//! shape of `tracing_subscriber`'s flattened JSON events: `timestamp`, `level`, `message`, the
//! fields, `target`.

use std::cell::RefCell;
use std::time::SystemTime;

use super::json::JsonObject;
use super::timestamp::Timestamps;

/// A buffer that grew past this (a huge path) is given back after its line.
const KEEP_CAPACITY: usize = 16 * 1024;

#[derive(Default)]
struct LineWriter {
    buf: Vec<u8>,
    timestamps: Timestamps,
}

thread_local! {
    static WRITER: RefCell<LineWriter> = RefCell::new(LineWriter::default());
}

/// Writes one event as a JSON line to stderr; `fields` adds the event's fields in order.
pub fn write_json(level: tracing::Level, target: &str, message: &str, fields: impl FnOnce(&mut JsonObject<'_>)) {
    let mut fields = Some(fields);
    let _ = WRITER.try_with(|cell| {
        // Busy only if re-entered from inside `fields` (a Display that logs): then a writer of its
        // own below, as when the thread's storage is already gone (thread exit).
        if let Ok(mut writer) = cell.try_borrow_mut() {
            if let Some(fields) = fields.take() {
                writer.write(level, target, message, fields);
            }
        }
    });
    if let Some(fields) = fields {
        LineWriter::default().write(level, target, message, fields);
    }
}

impl LineWriter {
    fn write(&mut self, level: tracing::Level, target: &str, message: &str, fields: impl FnOnce(&mut JsonObject<'_>)) {
        self.buf.clear();
        let mut obj = JsonObject::new(&mut self.buf);
        obj.str("timestamp", self.timestamps.at(SystemTime::now()));
        obj.str("level", level.as_str());
        obj.str("message", message);
        fields(&mut obj);
        obj.str("target", target);
        obj.end();
        // One write(2) for the whole line, or a place in the thread's buffer (`buffer`).
        super::buffer::write_line(&self.buf);
        if self.buf.capacity() > KEEP_CAPACITY {
            self.buf = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_written_from_inside_another_is_still_written() {
        // Nothing to read back from stderr here: this checks that the re-entered call neither
        // panics (RefCell) nor loses its fields closure.
        let mut inner_ran = false;
        write_json(tracing::Level::INFO, "weir::test", "outer", |o| {
            write_json(tracing::Level::INFO, "weir::test", "inner", |o| {
                inner_ran = true;
                o.u64("n", 2);
            });
            o.u64("n", 1);
        });
        assert!(inner_ran);
    }
}
