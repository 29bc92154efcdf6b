//! Where access-log lines go: straight to stderr with one `write(2)` each (the default), or, with
//! `[log] access_log_buffer`, into a buffer of the writing thread that goes out in one write when
//! it is full, when its oldest line is `access_log_flush` old, and when the process stops — nginx's
//! `access_log … buffer=size flush=time`. A write(2) to a file or pipe costs more CPU than the line
//! it carries (bench/results/levers-2026-11-26-round3.md); buffered, a few hundred lines share one.
//!
//! A thread's lines stay in their order and are never split: a buffer is written out whole, under
//! its own lock and stderr's. Lines of other targets (warnings, errors) are not buffered, so an
//! access line may reach stderr up to `access_log_flush` after a later warning. Lines still
//! buffered when the process is killed (SIGKILL, a crash) are lost; a stop by signal writes them.

use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::config::AccessBuffer;

/// Set once, at start-up (`start`): without it every line is written at once.
static BUFFERING: OnceLock<AccessBuffer> = OnceLock::new();
/// Every thread's buffer, for the flusher and the final flush.
static BUFFERS: Mutex<Vec<Weak<Mutex<Pending>>>> = Mutex::new(Vec::new());

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    /// When the oldest line in `bytes` came.
    since: Option<Instant>,
}

impl Pending {
    /// Adds a line; writes out through `out` what must go now: the buffer before a line that would
    /// not fit, and the buffer once full (a line longer than `size` goes out alone).
    fn push(&mut self, line: &[u8], size: usize, out: &mut impl FnMut(&[u8])) {
        if self.bytes.len() + line.len() > size {
            self.write_out(out);
        }
        self.bytes.extend_from_slice(line);
        self.since.get_or_insert_with(Instant::now);
        if self.bytes.len() >= size {
            self.write_out(out);
        }
    }

    /// Writes everything gathered (one write, whole lines) and empties the buffer.
    fn write_out(&mut self, out: &mut impl FnMut(&[u8])) {
        if !self.bytes.is_empty() {
            out(&self.bytes);
            self.bytes.clear();
        }
        self.since = None;
    }
}

/// The thread's buffer; written out when the thread ends.
struct Local(Arc<Mutex<Pending>>);

impl Drop for Local {
    fn drop(&mut self) {
        lock(&self.0).write_out(&mut write_stderr);
    }
}

thread_local! {
    static LOCAL: Local = {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let mut all = lock(&BUFFERS);
        all.retain(|b| b.strong_count() > 0);
        all.push(Arc::downgrade(&pending));
        Local(pending)
    };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One write(2) for `bytes` (whole lines). stderr's lock keeps other threads' lines (and
/// `tracing`'s, written through the same handle) out of the middle should the kernel take it in
/// parts. A failed write is dropped, as `tracing` drops it: logging never fails a request.
fn write_stderr(bytes: &[u8]) {
    let _ = std::io::stderr().lock().write_all(bytes);
}

/// Turns buffering on for the life of the process and starts the thread that writes out lines
/// that waited `flush`. Called once, at start-up; a second call changes nothing.
pub fn start(buffering: AccessBuffer) -> Result<(), String> {
    if BUFFERING.get().is_some() {
        return Ok(());
    }
    // Half the flush time between looks: no line waits much more than `flush`.
    let tick = (buffering.flush / 2).max(Duration::from_millis(1));
    std::thread::Builder::new()
        .name("weir log flush".into())
        .spawn(move || loop {
            std::thread::sleep(tick);
            flush_older_than(buffering.flush);
        })
        .map_err(|e| format!("log.access_log_buffer: cannot start the thread that flushes it: {e}"))?;
    let _ = BUFFERING.set(buffering);
    Ok(())
}

/// Whether access lines are buffered (`start` ran).
pub fn is_on() -> bool {
    BUFFERING.get().is_some()
}

/// Writes one access line (ending in a newline): at once, or into the thread's buffer.
pub fn write_line(line: &[u8]) {
    let Some(buffering) = BUFFERING.get() else { return write_stderr(line) };
    let buffered = LOCAL.try_with(|local| lock(&local.0).push(line, buffering.size, &mut write_stderr));
    // The thread's storage is gone (the thread is ending): write it at once.
    if buffered.is_err() {
        write_stderr(line);
    }
}

/// Writes out every buffer whose oldest line waited `age` or more.
fn flush_older_than(age: Duration) {
    for pending in live_buffers() {
        let mut pending = lock(&pending);
        if pending.since.is_some_and(|t| t.elapsed() >= age) {
            pending.write_out(&mut write_stderr);
        }
    }
}

/// Writes out every thread's buffer: the process is about to exit.
pub fn flush_all() {
    for pending in live_buffers() {
        lock(&pending).write_out(&mut write_stderr);
    }
}

fn live_buffers() -> Vec<Arc<Mutex<Pending>>> {
    lock(&BUFFERS).iter().filter_map(Weak::upgrade).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes `lines` into a buffer of `size` bytes; returns each write it made.
    fn writes(size: usize, lines: &[&str]) -> (Vec<String>, Pending) {
        let mut pending = Pending::default();
        let mut written = Vec::new();
        for line in lines {
            pending.push(line.as_bytes(), size, &mut |b: &[u8]| written.push(String::from_utf8_lossy(b).into_owned()));
        }
        (written, pending)
    }

    #[test]
    fn lines_go_out_together_whole_and_in_order_when_the_buffer_fills() {
        let (written, pending) = writes(10, &["aaa\n", "bbb\n", "ccc\n", "dd\n"]);
        // "ccc\n" would not fit after 8 bytes: the first two go out before it, never split.
        assert_eq!(written, ["aaa\nbbb\n"]);
        assert_eq!(pending.bytes, b"ccc\ndd\n");
        assert!(pending.since.is_some());
        let (written, _) = writes(8, &["aaa\n", "bbb\n"]);
        assert_eq!(written, ["aaa\nbbb\n"], "a full buffer goes out at once");
    }

    #[test]
    fn a_line_longer_than_the_buffer_goes_out_alone_after_the_ones_before_it() {
        let (written, pending) = writes(4, &["a\n", "0123456789\n", "b\n"]);
        assert_eq!(written, ["a\n", "0123456789\n"]);
        assert_eq!(pending.bytes, b"b\n");
    }

    #[test]
    fn writing_out_empties_the_buffer_and_its_age() {
        let (_, mut pending) = writes(100, &["a\n"]);
        let mut written = Vec::new();
        pending.write_out(&mut |b: &[u8]| written.extend_from_slice(b));
        pending.write_out(&mut |b: &[u8]| written.extend_from_slice(b));
        assert_eq!(written, b"a\n", "written once");
        assert!(pending.bytes.is_empty() && pending.since.is_none());
    }
}
