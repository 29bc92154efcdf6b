//! [`DirWatcher`] on `notify`'s recommended watcher (kqueue, FSEvents, …), for systems without
//! inotify. It reports every write, so a neighbour file's writes do wake it.

use std::path::Path;

use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};

use super::{Change, Event, WatchError};

/// Watching stops when it is dropped.
pub struct DirWatcher {
    watcher: RecommendedWatcher,
}

impl DirWatcher {
    /// Calls `on_event` with each event of the directories then added with
    /// [`DirWatcher::watch_dir`], on `notify`'s own thread (`thread` is not used).
    pub fn start(thread: &str, mut on_event: impl FnMut(Event) + Send + 'static) -> Result<Self, WatchError> {
        let _ = thread;
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else {
                on_event(Event::Rescan);
                return;
            };
            let change = match event.kind {
                EventKind::Access(AccessKind::Close(AccessMode::Write)) => Change::Closed,
                // Reads, Weir's own included, change nothing.
                EventKind::Access(_) => return,
                EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any) => Change::Written,
                _ => Change::Replaced,
            };
            for name in event.paths.iter().filter_map(|p| p.file_name()) {
                on_event(Event::Entry { name: name.to_os_string(), change });
            }
        })
        .map_err(|e| WatchError::Init(std::io::Error::other(e)))?;
        Ok(Self { watcher })
    }

    /// Reports the changes of `dir`'s entries.
    pub fn watch_dir(&mut self, dir: &Path) -> Result<(), WatchError> {
        self.watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|e| WatchError::Path { path: dir.to_path_buf(), source: std::io::Error::other(e) })
    }

    /// The directory's watch already reports every write to its files.
    pub fn watch_writes(&mut self, file: &Path) -> Result<(), WatchError> {
        let _ = file;
        Ok(())
    }
}
