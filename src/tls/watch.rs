//! Certificate files reloaded when they change, without a restart: the directories of every
//! `[[server.tls]]` cert and key are watched (so `certbot`'s rename-into-place and Kubernetes
//! Secret symlink swaps are seen, like the config watcher in `reload.rs`), for finished changes
//! only (`fswatch`): a file being written is looked at once its writer closes it. After a quiet
//! period each pair is read again; a pair that changed, parses and matches is swapped in for new
//! handshakes; one that does not is logged and the pair already served stays.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::{load_pair, unix_now, CertEntry, CertResolver};
use crate::fswatch::{self, DirWatcher, Event};

/// Wait for this much quiet after a change (a renewal writes the cert and the key separately).
const DEBOUNCE: Duration = Duration::from_millis(200);
/// A directory that never stops changing must not postpone a reload forever.
const MAX_DEBOUNCE: Duration = Duration::from_secs(1);

pub struct CertWatcher {
    resolver: Arc<CertResolver>,
    watched: Mutex<Watched>,
}

struct Watched {
    watcher: DirWatcher,
    dirs: HashSet<PathBuf>,
    /// File names of the current certs and keys: events on other files are ignored.
    names: Arc<Mutex<HashSet<OsString>>>,
}

impl CertWatcher {
    /// Starts watching the files of the resolver's entries.
    pub fn start(resolver: Arc<CertResolver>) -> Result<Arc<Self>, String> {
        let (tx, rx) = mpsc::channel::<()>();
        let names: Arc<Mutex<HashSet<OsString>>> = Arc::default();
        let filter = names.clone();
        let watcher = DirWatcher::start("weir-cert-fs", move |event| {
            let relevant = match event {
                Event::Entry { name, .. } => {
                    fswatch::is_kubernetes_swap(&name)
                        || filter.lock().unwrap_or_else(|p| p.into_inner()).contains(&name)
                }
                // Events were lost or a directory went: read every pair again.
                Event::Rescan => true,
            };
            if relevant {
                let _ = tx.send(());
            }
        })
        .map_err(|e| format!("cannot watch the TLS certificates: {e}"))?;
        let this = Arc::new(Self { resolver, watched: Mutex::new(Watched { watcher, dirs: HashSet::new(), names }) });
        this.watch_entries(&this.resolver.entries())?;
        let me = Arc::clone(&this);
        std::thread::Builder::new()
            .name("weir-cert-watch".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    let deadline = Instant::now() + MAX_DEBOUNCE;
                    loop {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() || rx.recv_timeout(DEBOUNCE.min(left)).is_err() {
                            break;
                        }
                    }
                    me.reload_files();
                }
            })
            .map_err(|e| format!("cannot start the certificate watcher: {e}"))?;
        Ok(this)
    }

    /// A reloaded config brings its own (already checked) pairs: serve them and watch their files.
    pub fn apply_config(&self, entries: Vec<CertEntry>) {
        if let Err(e) = self.watch_entries(&entries) {
            warn!(error = %e, "certificate files will not be reloaded on change");
        }
        self.resolver.store(entries);
    }

    /// Reads every pair again and swaps in those that changed and check out. Returns how many
    /// were replaced.
    pub fn reload_files(&self) -> usize {
        let current = self.resolver.entries();
        let mut next: Vec<CertEntry> = Vec::with_capacity(current.len());
        let mut replaced = 0;
        for entry in current.iter() {
            match load_pair(&entry.cert_path, &entry.key_path) {
                Ok(loaded) if loaded.fingerprint == entry.loaded.fingerprint => next.push(entry.clone()),
                Ok(loaded) => {
                    info!(
                        cert = %entry.cert_path.display(),
                        names = %loaded.names.join(","),
                        not_after = loaded.not_after,
                        "certificate reloaded; new connections get it"
                    );
                    if let Some(warning) = loaded.expiry_warning(&entry.cert_path, unix_now()) {
                        warn!("{warning}");
                    }
                    replaced += 1;
                    next.push(CertEntry { loaded: Arc::new(loaded), ..entry.clone() });
                }
                Err(e) => {
                    error!(cert = %entry.cert_path.display(), error = %e, "certificate reload refused; the pair already loaded keeps serving");
                    next.push(entry.clone());
                }
            }
        }
        if replaced > 0 {
            self.resolver.store(next);
        }
        replaced
    }

    fn watch_entries(&self, entries: &[CertEntry]) -> Result<(), String> {
        let mut watched = self.lock();
        let Watched { watcher, dirs, names } = &mut *watched;
        let mut file_names = names.lock().unwrap_or_else(|p| p.into_inner());
        for path in entries.iter().flat_map(|e| [&e.cert_path, &e.key_path]) {
            file_names.extend(path.file_name().map(|n| n.to_os_string()));
            let dir = fswatch::parent_dir(path);
            if dirs.contains(&dir) {
                continue;
            }
            watcher.watch_dir(&dir).map_err(|e| e.to_string())?;
            dirs.insert(dir);
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Watched> {
        self.watched.lock().unwrap_or_else(|p| p.into_inner())
    }
}
