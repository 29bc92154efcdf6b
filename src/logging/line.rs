//! JSON log lines formatted outside `tracing` (for the per-request access log): into a buffer that
//! each thread reuses, then written to stderr with one `write(2)` before the caller goes on, so a
//! line is on its way before the next request of the same connection starts. The object has the
//! shape of `tracing_subscriber`'s flattened JSON events: `timestamp`, `level`, `message`, the
//! fields, `target`.

use std::cell::RefCell;
use std::io::Write;
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
    let wrote = WRITER.try_with(|cell| match cell.try_borrow_mut() {
        Ok(mut writer) => writer.write(level, target, message, &mut fields),
        Err(_) => false, // re-entered from inside `fields`: a writer of its own below
    });
    if !matches!(wrote, Ok(true)) {
        LineWriter::default().write(level, target, message, &mut fields);
    }
}

impl LineWriter {
    /// Formats and writes the line; false if `fields` was already taken (nothing written).
    fn write<F: FnOnce(&mut JsonObject<'_>)>(
        &mut self,
        level: tracing::Level,
        target: &str,
        message: &str,
        fields: &mut Option<F>,
    ) -> bool {
        let Some(fields) = fields.take() else { return false };
        self.buf.clear();
        let mut obj = JsonObject::new(&mut self.buf);
        obj.str("timestamp", self.timestamps.at(SystemTime::now()));
        obj.str("level", level.as_str());
        obj.str("message", message);
        fields(&mut obj);
        obj.str("target", target);
        obj.end();
        // stderr is unbuffered: one write(2) for the whole line. Its lock keeps the lines of other
        // threads (and `tracing`'s, written through the same handle) from interleaving with this
        // one should the kernel take it in parts. A failed write is dropped, as `tracing` drops
        // it: logging never fails a request.
        let _ = std::io::stderr().lock().write_all(&self.buf);
        if self.buf.capacity() > KEEP_CAPACITY {
            self.buf = Vec::new();
        }
        true
    }
}
