//! Watching a directory for finished changes of the files in it: the config watcher
//! (`reload.rs`) and the certificate watcher (`tls/watch.rs`) both watch their files' directories
//! rather than the files, so that rename-into-place editors, `certbot` and Kubernetes
//! ConfigMap/Secret symlink swaps are seen.
//!
//! On Linux this is inotify with a mask of the events that complete or replace a file (see
//! `linux.rs`): writes in progress, opens and reads are never queued by the kernel, so another
//! file of the same directory — a log written line by line — does not wake the watcher at all.
//! Elsewhere it is `notify`'s recommended watcher, which reports every write.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub use linux::DirWatcher;

#[cfg(not(target_os = "linux"))]
mod portable;
#[cfg(not(target_os = "linux"))]
pub use portable::DirWatcher;

/// What happened to a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Its data was written: a writer may still have it open. Only for a file watched with
    /// [`DirWatcher::watch_writes`] (on Linux; elsewhere for every file).
    Written,
    /// A writer closed it after writing.
    Closed,
    /// Anything else that may change what its path holds: it was created, renamed, removed, or
    /// its permissions or owner changed. These are atomic.
    Replaced,
}

/// What a [`DirWatcher`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `change` happened to the entry `name` of a watched directory (or to the file watched with
    /// [`DirWatcher::watch_writes`], under the name its path has).
    Entry { name: OsString, change: Change },
    /// Events may have been lost (the kernel's queue overflowed), or a watched directory itself
    /// was moved, deleted or unmounted: look at every file again.
    Rescan,
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot start watching files: {0}")]
    Init(#[source] std::io::Error),
    #[error("cannot watch {}: {source}{}", .path.display(), limit_hint(.source))]
    Path {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the thread {thread}: {source}")]
    Thread {
        thread: String,
        #[source]
        source: std::io::Error,
    },
}

/// inotify says "no space left on device" when the user's watch limit is reached.
fn limit_hint(e: &std::io::Error) -> &'static str {
    if e.kind() == std::io::ErrorKind::StorageFull {
        " (the limit of inotify watches: sysctl fs.inotify.max_user_watches)"
    } else {
        ""
    }
}

/// An entry through which Kubernetes swaps a mounted ConfigMap's or Secret's files (`..data`,
/// `..data_tmp`, `..<timestamp>`): the file's own name sees no event when its content changes.
pub fn is_kubernetes_swap(name: &OsStr) -> bool {
    name.as_encoded_bytes().starts_with(b"..")
}

/// The directory a file is watched through.
pub fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::fs::{self, OpenOptions};
    use std::io::Write;
    use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
    use std::time::{Duration, Instant};

    use super::*;

    /// Long enough for a loaded machine; only a failing test waits this long.
    const TIMEOUT: Duration = Duration::from_secs(10);

    /// A watcher of `dir` (and of writes to `file`) whose events all arrive on the receiver.
    fn watch(dir: &Path, file: &Path) -> (DirWatcher, Receiver<Event>) {
        let (tx, rx) = mpsc::channel();
        let mut watcher = DirWatcher::start("weir-test-fs", move |event| {
            let _ = tx.send(event);
        })
        .expect("start the watcher");
        watcher.watch_dir(dir).expect("watch the directory");
        watcher.watch_writes(file).expect("watch the file's writes");
        (watcher, rx)
    }

    /// Every event up to and including the first one `wanted` accepts.
    fn events_until(rx: &Receiver<Event>, wanted: impl Fn(&Event) -> bool) -> Vec<Event> {
        let deadline = Instant::now() + TIMEOUT;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(event) => {
                    let done = wanted(&event);
                    seen.push(event);
                    if done {
                        return seen;
                    }
                }
                Err(e) => panic!("{e:?} before the expected event; seen {seen:?}"),
            }
        }
    }

    /// Writes `text` to `weir.toml.tmp` beside `config` and renames it over `config`, as editors
    /// and `mv` do.
    fn rename_over(config: &Path, text: &str) {
        let new = config.with_file_name("weir.toml.tmp");
        fs::write(&new, text).expect("write the new config");
        fs::rename(&new, config).expect("rename it over the config");
    }

    fn entry(name: &str, change: Change) -> Event {
        Event::Entry { name: name.into(), change }
    }

    #[test]
    fn appends_to_a_neighbour_file_and_reads_are_not_reported_but_a_rename_over_the_file_is() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("weir.toml");
        fs::write(&config, "old = true\n").expect("write the config");
        let mut log = OpenOptions::new().create(true).append(true).open(dir.path().join("app.log")).expect("open log");
        let (_watcher, rx) = watch(dir.path(), &config);

        for i in 0..1000 {
            writeln!(log, "{{\"line\":{i},\"msg\":\"a request was proxied\"}}").expect("append a line");
        }
        log.sync_data().expect("sync the log");
        for _ in 0..10 {
            assert_eq!(fs::read_to_string(&config).expect("read the config"), "old = true\n");
        }
        // The rename comes after the appends and reads: the kernel queues events in order, so
        // once it is seen, anything the appends or reads had queued was seen before it.
        rename_over(&config, "new = true\n");
        let seen = events_until(&rx, |e| *e == entry("weir.toml", Change::Replaced));
        assert_eq!(
            seen,
            [
                entry("weir.toml.tmp", Change::Replaced), // created
                entry("weir.toml.tmp", Change::Closed),
                entry("weir.toml.tmp", Change::Replaced), // moved from
                entry("weir.toml", Change::Replaced),     // moved to
            ],
            "only the new file's creation, close and rename"
        );
    }

    #[test]
    fn a_file_written_in_place_is_written_until_closed_and_followed_across_a_rename() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("weir.toml");
        fs::write(&config, "old = true\n").expect("write the config");
        let (_watcher, rx) = watch(dir.path(), &config);

        // Truncated and written, still open: a write in progress.
        let mut file = OpenOptions::new().write(true).truncate(true).open(&config).expect("open the config");
        file.write_all(b"half = ").expect("write half");
        events_until(&rx, |e| *e == entry("weir.toml", Change::Written));
        file.write_all(b"true\n").expect("write the rest");
        drop(file);
        events_until(&rx, |e| *e == entry("weir.toml", Change::Closed));

        // Renamed over: the new file's writes are the ones reported.
        rename_over(&config, "new = true\n");
        events_until(&rx, |e| *e == entry("weir.toml", Change::Replaced));
        let mut file = OpenOptions::new().append(true).open(&config).expect("open the new config");
        file.write_all(b"more = true\n").expect("append");
        let seen = events_until(&rx, |e| *e == entry("weir.toml", Change::Written));
        assert!(!seen.contains(&Event::Rescan), "{seen:?}");
    }

    #[test]
    fn dropping_the_watcher_ends_its_thread() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("weir.toml");
        fs::write(&config, "old = true\n").expect("write the config");
        let (watcher, rx) = watch(dir.path(), &config);
        drop(watcher);
        // The callback (and its sender) goes with the thread.
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(_) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => panic!("the watcher's thread is still running"),
            }
        }
    }

    #[test]
    fn a_directory_that_does_not_exist_is_named_in_the_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("nope");
        let mut watcher = DirWatcher::start("weir-test-fs", |_| {}).expect("start the watcher");
        let e = watcher.watch_dir(&missing).expect_err("a missing directory").to_string();
        assert!(e.starts_with(&format!("cannot watch {}: ", missing.display())), "{e}");
    }
}
