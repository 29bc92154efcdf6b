//! [`DirWatcher`] on inotify, with a mask that leaves out every event of a write in progress.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use tracing::{error, warn};

use super::{Change, Event, WatchError};

/// What a directory is watched for: the events that complete or replace one of its entries.
/// - `CLOSE_WRITE`: a file written in place (`cp` over it, `echo >`, an editor saving in place)
///   is complete once its writer closes it.
/// - `MOVED_TO`, `MOVED_FROM`: rename into place (editors, `certbot`, the `..data` symlink swap of
///   a Kubernetes ConfigMap or Secret), and a file renamed away.
/// - `CREATE`, `DELETE`: a file (or symlink) that appears or goes.
/// - `ATTRIB`: permissions or owner changed — a file Weir could not read may now be readable.
///   Writes do not raise it (their time stamps are not reported), and reads do not either.
/// - `DELETE_SELF`, `MOVE_SELF`: the directory itself went, so its files must be looked at again.
/// - `ONLYDIR`: refuse a path that is not a directory.
///
/// Not `MODIFY` (every `write(2)`), `OPEN`, `ACCESS` (every `read(2)`) or `CLOSE_NOWRITE`: those
/// made each line appended to a log in the same directory wake the watcher, and Weir's own reads
/// of its config would be reported too.
const DIR_MASK: WatchMask = WatchMask::CLOSE_WRITE
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::CREATE)
    .union(WatchMask::DELETE)
    .union(WatchMask::ATTRIB)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::ONLYDIR);

/// What a file watched with [`DirWatcher::watch_writes`] is watched for, on its own inode: each
/// write, so that a file written in place is known to be incomplete until `CLOSE_WRITE`. Writes
/// to other files of the directory are not reported by this watch.
const WRITES_MASK: WatchMask = WatchMask::MODIFY;

/// inotify's events, read by a thread of its own and passed to a callback. Dropping it removes
/// the watches, which wakes the thread to end (one that never watched anything stays blocked).
pub struct DirWatcher {
    watches: Watches,
    shared: Arc<Shared>,
}

struct Shared {
    stop: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    dirs: HashMap<WatchDescriptor, PathBuf>,
    writes: Option<Writes>,
}

/// The file whose writes are reported, and the watch on the inode its path currently leads to.
struct Writes {
    path: PathBuf,
    name: OsString,
    wd: Option<WatchDescriptor>,
}

impl DirWatcher {
    /// Starts the thread `thread`, which calls `on_event` with each event of the directories then
    /// added with [`DirWatcher::watch_dir`], until the watcher is dropped.
    pub fn start(thread: &str, on_event: impl FnMut(Event) + Send + 'static) -> Result<Self, WatchError> {
        let inotify = Inotify::init().map_err(WatchError::Init)?;
        let watches = inotify.watches();
        let shared = Arc::new(Shared { stop: AtomicBool::new(false), state: Mutex::default() });
        let reader = Arc::clone(&shared);
        let name = thread.to_string();
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || read_events(inotify, &name, &reader, on_event))
            .map_err(|source| WatchError::Thread { thread: thread.to_string(), source })?;
        Ok(Self { watches, shared })
    }

    /// Reports the changes of `dir`'s entries.
    pub fn watch_dir(&mut self, dir: &Path) -> Result<(), WatchError> {
        let mut state = self.shared.lock();
        let wd =
            self.watches.add(dir, DIR_MASK).map_err(|source| WatchError::Path { path: dir.to_path_buf(), source })?;
        state.dirs.insert(wd, dir.to_path_buf());
        Ok(())
    }

    /// Also reports each write to `file` ([`Change::Written`]; its directory's watch reports the
    /// close). The watch follows the path: after any entry of a watched directory is replaced,
    /// it moves to the file the path then leads to (through symlinks). One file per watcher.
    pub fn watch_writes(&mut self, file: &Path) -> Result<(), WatchError> {
        let mut state = self.shared.lock();
        let wd = self
            .watches
            .add(file, WRITES_MASK)
            .map_err(|source| WatchError::Path { path: file.to_path_buf(), source })?;
        let name = file.file_name().map(OsStr::to_os_string).unwrap_or_default();
        if let Some(old) = state.writes.replace(Writes { path: file.to_path_buf(), name, wd: Some(wd.clone()) }) {
            forget(&mut self.watches, old.wd, Some(&wd));
        }
        Ok(())
    }
}

impl Drop for DirWatcher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let mut state = self.shared.lock();
        let writes = state.writes.take().and_then(|w| w.wd);
        for wd in state.dirs.drain().map(|(wd, _)| wd).chain(writes) {
            // Each removal queues IN_IGNORED, which wakes the thread.
            let _ = self.watches.remove(wd);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The watcher's thread: blocks on inotify, turns its events into [`Event`]s, and follows the
/// file of [`DirWatcher::watch_writes`] when the directory changes.
fn read_events(mut inotify: Inotify, thread: &str, shared: &Shared, mut on_event: impl FnMut(Event)) {
    let mut watches = inotify.watches();
    // Room for many events of the longest name (NAME_MAX is 255).
    let mut buffer = [0u8; 8192];
    let mut batch = Vec::new();
    loop {
        let events = match inotify.read_events_blocking(&mut buffer) {
            Ok(events) => events,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                error!(thread, error = %e, "cannot read file-system events; file changes are no longer seen");
                return;
            }
        };
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let mut state = shared.lock();
        batch.extend(events.filter_map(|e| translate(&mut state, thread, e.wd, e.mask, e.name)));
        if batch.iter().any(|e| matches!(e, Event::Entry { change: Change::Replaced, .. } | Event::Rescan)) {
            follow_writes(&mut state, &mut watches);
        }
        drop(state);
        // After following: a write the callback's reaction might wait for is reported.
        for event in batch.drain(..) {
            on_event(event);
        }
    }
}

fn translate(
    state: &mut State,
    thread: &str,
    wd: WatchDescriptor,
    mask: EventMask,
    name: Option<&OsStr>,
) -> Option<Event> {
    if mask.contains(EventMask::Q_OVERFLOW) {
        warn!(thread, "the kernel's queue of file events overflowed: looking at every file again");
        return Some(Event::Rescan);
    }
    if let Some(writes) = state.writes.as_mut().filter(|w| w.wd.as_ref() == Some(&wd)) {
        if mask.contains(EventMask::IGNORED) {
            // The file was deleted (or the watch moved): a later replacement brings a new one.
            writes.wd = None;
            return None;
        }
        return Some(Event::Entry { name: writes.name.clone(), change: Change::Written });
    }
    if mask.contains(EventMask::IGNORED) {
        state.dirs.remove(&wd);
        return None;
    }
    if mask.intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::UNMOUNT) {
        let dir = state.dirs.get(&wd).map_or_else(|| "a directory".to_string(), |d| d.display().to_string());
        warn!(
            thread,
            dir, "the watched directory was moved, deleted or unmounted: changes of its files are no longer seen"
        );
        return Some(Event::Rescan);
    }
    // Without a name, the event is about the directory itself (its own ATTRIB).
    let name = name?.to_os_string();
    let change = if mask.contains(EventMask::CLOSE_WRITE) { Change::Closed } else { Change::Replaced };
    Some(Event::Entry { name, change })
}

/// Points the writes watch at the file its path now leads to (a rename or symlink swap may have
/// replaced it), and removes the watch on the file it led to before: writes to a file renamed
/// away are not the config's.
fn follow_writes(state: &mut State, watches: &mut Watches) {
    let Some(writes) = state.writes.as_mut() else { return };
    let next = watches.add(&writes.path, WRITES_MASK);
    forget(watches, writes.wd.take(), next.as_ref().ok());
    match next {
        Ok(wd) => writes.wd = Some(wd),
        // Gone for now (deleted, or mid-swap): its creation is a replacement and brings us back.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => warn!(
            path = %writes.path.display(),
            error = %e,
            "cannot watch the file's writes: a write in progress is not told apart from a finished one"
        ),
    }
}

/// Removes the watch `old` unless it is `current` (inotify gives an inode one descriptor).
fn forget(watches: &mut Watches, old: Option<WatchDescriptor>, current: Option<&WatchDescriptor>) {
    if let Some(old) = old.filter(|old| Some(old) != current) {
        // Fails when the kernel already dropped it (its file was deleted): nothing to do.
        let _ = watches.remove(old);
    }
}
