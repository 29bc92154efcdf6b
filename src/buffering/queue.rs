//! The bytes one client connection has been given but could not send yet, in order: first in
//! memory (up to the connection's share, taken from the process's memory budget), then in an
//! unlinked temp file (up to `max_temp_file_size`, taken from the process's disk budget). When
//! neither has room, `push` takes nothing and the writer waits for the client (back-pressure):
//! buffering never fails a response, it only stops helping.
//!
//! Order is kept by one rule: once a byte went to the file, every later byte goes there too
//! until the file has been sent whole; then the file is closed (its descriptor and disk given
//! back) and memory is used again.
//!
//! Synchronous file I/O: a temp-file write lands in the page cache (nginx writes its
//! `proxy_temp_path` files the same way); a read of at most [`STAGE`] bytes happens only when
//! the client has taken everything before it.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{Budgets, ResponseBuffering};

/// Bytes read back from the temp file at once: what a spilling connection holds in memory
/// beyond its share while it sends the file.
pub const STAGE: usize = 16 * 1024;

pub struct SpillQueue {
    settings: Arc<ResponseBuffering>,
    budgets: Arc<Budgets>,
    memory: VecDeque<Vec<u8>>,
    /// Bytes of `memory.front()` already sent.
    head: usize,
    /// Bytes held in `memory` (all of each chunk, sent part included), taken from the budget.
    memory_held: u64,
    spill: Option<Spill>,
}

struct Spill {
    file: File,
    written: u64,
    read: u64,
    staged: Vec<u8>,
    staged_at: usize,
}

impl SpillQueue {
    pub fn new(settings: Arc<ResponseBuffering>, budgets: Arc<Budgets>) -> Self {
        Self { settings, budgets, memory: VecDeque::new(), head: 0, memory_held: 0, spill: None }
    }

    /// Bytes given and not yet sent.
    pub fn pending(&self) -> u64 {
        let memory = self.memory_held - self.head as u64;
        let spilled = self.spill.as_ref().map_or(0, |s| s.written - s.read + (s.staged.len() - s.staged_at) as u64);
        memory + spilled
    }

    pub fn is_empty(&self) -> bool {
        self.pending() == 0
    }

    /// Bytes of the temp file's current content (what this connection holds on disk).
    pub fn spilled(&self) -> u64 {
        self.spill.as_ref().map_or(0, |s| s.written)
    }

    /// Takes a prefix of `buf` (possibly empty: no room, wait for the client). An error is the
    /// temp file's only (a read back failing); a file that cannot be created or written to just
    /// means no room.
    pub fn push(&mut self, buf: &[u8]) -> usize {
        if buf.is_empty() {
            return 0;
        }
        if self.spill.is_none() {
            let room = self.settings.memory_per_connection.saturating_sub(self.memory_held);
            let got = self.budgets.memory.take_up_to(room.min(buf.len() as u64)) as usize;
            if got > 0 {
                self.memory.push_back(buf[..got].to_vec());
                self.memory_held += got as u64;
                return got;
            }
        }
        self.push_to_file(buf)
    }

    fn push_to_file(&mut self, buf: &[u8]) -> usize {
        let max = self.settings.max_temp_file_size;
        let written = self.spill.as_ref().map_or(0, |s| s.written);
        let want = max.saturating_sub(written).min(buf.len() as u64);
        if want == 0 {
            return 0;
        }
        let got = self.budgets.disk.take_up_to(want);
        if got == 0 {
            return 0;
        }
        if self.spill.is_none() {
            match open_unlinked(&self.settings.temp_path) {
                Ok(file) => self.spill = Some(Spill { file, written: 0, read: 0, staged: Vec::new(), staged_at: 0 }),
                Err(e) => {
                    self.budgets.disk.give_back(got);
                    tracing::warn!(dir = %self.settings.temp_path.display(), error = %e,
                        "response buffering: cannot create a temp file; streaming instead");
                    return 0;
                }
            }
        }
        let Some(spill) = self.spill.as_mut() else { return 0 };
        let got_len = got as usize;
        if let Err(e) = spill.file.write_all_at(&buf[..got_len], spill.written) {
            self.budgets.disk.give_back(got);
            tracing::warn!(dir = %self.settings.temp_path.display(), error = %e,
                "response buffering: cannot write the temp file; streaming instead");
            self.close_spill_if_sent();
            return 0;
        }
        spill.written += got;
        got_len
    }

    /// The next bytes to send (empty: nothing pending). Reads the temp file when memory is sent.
    pub fn front(&mut self) -> io::Result<&[u8]> {
        if let Some(chunk) = self.memory.front() {
            return Ok(&chunk[self.head..]);
        }
        let Some(spill) = self.spill.as_mut() else { return Ok(&[]) };
        if spill.staged_at == spill.staged.len() && spill.read < spill.written {
            let n = (spill.written - spill.read).min(STAGE as u64) as usize;
            spill.staged.resize(n, 0);
            spill.file.read_exact_at(&mut spill.staged, spill.read)?;
            spill.read += n as u64;
            spill.staged_at = 0;
        }
        Ok(&spill.staged[spill.staged_at..])
    }

    /// `n` bytes of [`front`](Self::front) were sent.
    pub fn consume(&mut self, n: usize) {
        if let Some(chunk) = self.memory.front() {
            self.head += n;
            if self.head >= chunk.len() {
                let len = chunk.len() as u64;
                self.memory.pop_front();
                self.head = 0;
                self.memory_held -= len;
                self.budgets.memory.give_back(len);
            }
            return;
        }
        if let Some(spill) = self.spill.as_mut() {
            spill.staged_at = (spill.staged_at + n).min(spill.staged.len());
        }
        self.close_spill_if_sent();
    }

    /// A temp file sent whole is closed: its descriptor and its disk go back at once.
    fn close_spill_if_sent(&mut self) {
        if let Some(spill) = &self.spill {
            if spill.read == spill.written && spill.staged_at == spill.staged.len() {
                self.budgets.disk.give_back(spill.written);
                self.spill = None;
            }
        }
    }
}

impl Drop for SpillQueue {
    fn drop(&mut self) {
        self.budgets.memory.give_back(self.memory_held);
        if let Some(spill) = self.spill.take() {
            self.budgets.disk.give_back(spill.written);
        }
    }
}

impl std::fmt::Debug for SpillQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillQueue")
            .field("pending", &self.pending())
            .field("spilled", &self.spilled())
            .finish_non_exhaustive()
    }
}

/// A new temp file that no other process can open and that nothing outlives: created `0600`
/// under a fresh name, unlinked at once, so a crash leaves no file behind.
fn open_unlinked(dir: &Path) -> io::Result<File> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!("weir-response-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let path = dir.join(name);
    let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::super::budget::Budget;
    use super::*;

    fn settings(memory: u64, temp: u64, dir: &Path) -> Arc<ResponseBuffering> {
        Arc::new(ResponseBuffering {
            memory_per_connection: memory,
            max_temp_file_size: temp,
            temp_path: dir.to_path_buf(),
            ..ResponseBuffering::default()
        })
    }

    fn budgets(memory: u64, disk: u64) -> Arc<Budgets> {
        Arc::new(Budgets { memory: Budget::new(memory), disk: Budget::new(disk) })
    }

    /// Sends everything pending, `step` bytes at a time, as a slow socket would take it.
    fn drain(q: &mut SpillQueue, step: usize) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let front = q.front().expect("temp file read back");
            if front.is_empty() {
                return out;
            }
            let n = front.len().min(step);
            out.extend_from_slice(&front[..n]);
            q.consume(n);
        }
    }

    /// Pushes all of `data`, draining `step` bytes whenever the queue is full.
    fn push_all(q: &mut SpillQueue, data: &[u8], step: usize, out: &mut Vec<u8>) {
        let mut at = 0;
        while at < data.len() {
            let n = q.push(&data[at..]);
            at += n;
            if n == 0 {
                let front = q.front().expect("read back");
                assert!(!front.is_empty(), "a full queue has something to send");
                let k = front.len().min(step);
                out.extend_from_slice(&front[..k]);
                q.consume(k);
            }
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn memory_first_then_the_file_then_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let b = budgets(1 << 20, 1 << 20);
        let mut q = SpillQueue::new(settings(100, 300, dir.path()), b.clone());
        assert_eq!(q.push(&[1; 60]), 60);
        assert_eq!(q.push(&[2; 60]), 40, "memory holds 100");
        assert_eq!(q.spilled(), 0);
        assert_eq!(q.push(&[3; 500]), 300, "then the file, up to max_temp_file_size");
        assert_eq!(q.push(&[4; 1]), 0, "then back-pressure");
        assert_eq!((q.pending(), b.memory.used(), b.disk.used()), (400, 100, 300));
        let out = drain(&mut q, 33);
        assert_eq!(out.len(), 400);
        assert_eq!((&out[..60], &out[60..100], &out[100..]), (&[1; 60][..], &[2; 40][..], &[3; 300][..]));
        assert_eq!((q.pending(), b.memory.used(), b.disk.used()), (0, 0, 0), "everything given back");
        assert_eq!(q.spilled(), 0, "the file is closed once sent");
    }

    #[test]
    fn order_holds_across_memory_and_file_whatever_the_steps() {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = pattern(200_000);
        for (memory, temp, step) in [(1000, 5000, 700), (64 * 1024, 0, 4096), (10, 1 << 20, 1), (4096, 4096, 9000)] {
            let b = budgets(1 << 30, 1 << 30);
            let mut q = SpillQueue::new(settings(memory, temp, dir.path()), b.clone());
            let mut out = Vec::new();
            push_all(&mut q, &data, step.max(1), &mut out);
            out.extend(drain(&mut q, step));
            assert!(out == data, "bytes out differ from bytes in (memory {memory}, temp {temp}, step {step})");
            assert_eq!((b.memory.used(), b.disk.used()), (0, 0));
        }
    }

    #[test]
    fn a_spent_memory_budget_goes_to_the_file_and_a_spent_disk_budget_to_back_pressure() {
        let dir = tempfile::tempdir().expect("temp dir");
        let b = budgets(50, 70);
        let mut first = SpillQueue::new(settings(1000, 1000, dir.path()), b.clone());
        let mut second = SpillQueue::new(settings(1000, 1000, dir.path()), b.clone());
        assert_eq!(first.push(&[1; 40]), 40);
        assert_eq!(second.push(&[2; 40]), 10, "the budget's last 10 bytes");
        assert_eq!(second.push(&[2; 30]), 30, "then its file");
        assert_eq!(first.push(&[1; 100]), 40, "the memory budget is spent: the file, up to the disk budget");
        assert_eq!(first.push(&[1; 1]), 0);
        assert_eq!(second.push(&[2; 1]), 0, "both budgets spent: back-pressure, not a failure");
        drop(first);
        assert_eq!((b.memory.used(), b.disk.used()), (10, 30), "a connection that leaves gives all back");
        drop(second);
        assert_eq!((b.memory.used(), b.disk.used()), (0, 0));
    }

    #[test]
    fn a_temp_dir_that_cannot_be_used_means_back_pressure() {
        let b = budgets(1 << 20, 1 << 20);
        let mut q = SpillQueue::new(settings(10, 1000, Path::new("/nonexistent/weir")), b.clone());
        assert_eq!(q.push(&[1; 20]), 10);
        assert_eq!(q.push(&[1; 20]), 0);
        assert_eq!(b.disk.used(), 0, "nothing held for the file that was not made");
        assert_eq!(drain(&mut q, 100), vec![1; 10]);
    }

    #[test]
    fn after_the_file_is_sent_memory_is_used_again() {
        let dir = tempfile::tempdir().expect("temp dir");
        let b = budgets(1 << 20, 1 << 20);
        let mut q = SpillQueue::new(settings(10, 100, dir.path()), b.clone());
        assert_eq!(q.push(&[1; 30]), 10);
        assert_eq!(q.push(&[2; 30]), 30);
        assert_eq!(drain(&mut q, 7).len(), 40);
        assert_eq!(q.push(&[3; 5]), 5);
        assert_eq!(q.spilled(), 0, "memory again, no file");
        assert_eq!(drain(&mut q, 7), vec![3; 5]);
    }
}
