//! Hot reload: the compiled config lives in one `ArcSwap<Runtime>`; each request loads it once and
//! keeps that snapshot to its end. Triggers — a change of the file on disk, SIGHUP, `POST /reload`
//! — all call [`Reloader::reload`], which validates the whole file through the same path as
//! `weir check` before swapping. A bad file is refused and the running config keeps serving.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tracing::{error, info, warn};

use crate::config::{self, EnvUse, Runtime, SecretSource, ServerSettings, TraceSettings};
use crate::fswatch::{self, Change, DirWatcher, Event};
use crate::metrics::METRICS;
use settle::{Next, Settling, MAX_OPEN_WAIT};

mod settle;

const FILE_CHANGE: &str = "file change";

/// What `GET /config` reports about the running config.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigStatus {
    pub path: String,
    pub generation: u64,
    /// First 16 hex digits of the SHA-256 of the file text.
    pub hash: String,
    /// Unix seconds when this generation was applied.
    pub loaded_at: u64,
    pub reload_failures: u64,
    /// The error of the latest refused reload, cleared by the next successful one.
    pub last_error: Option<String>,
    /// Settings that changed in the file but only apply after a restart.
    pub pending_restart: Vec<String>,
    /// Where the secret settings came from (a file, the config file); never their values.
    pub secrets: Vec<SecretSource>,
    /// The settings that read environment variables (`${NAME}`), and which; never their values.
    pub environment: Vec<EnvUse>,
    /// Fingerprint of the text the latest refused reload read, so one bad save is counted and
    /// logged once, not once per file event.
    #[serde(skip)]
    refused_hash: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    Applied {
        generation: u64,
        hash: String,
    },
    /// The file's text is the one already running.
    Unchanged {
        generation: u64,
    },
    Refused(String),
}

pub struct Reloader {
    path: PathBuf,
    runtime: Arc<ArcSwap<Runtime>>,
    status: Mutex<ConfigStatus>,
    /// What the process really runs with for settings read once at start-up: later files are
    /// compared with this, not with the previous file, to report what awaits a restart.
    started: Startup,
    /// Called with every config applied after the first, just before it is published (what
    /// requests on it will look up must be there) and just after (the TLS certificates follow it).
    on_prepare: Hooks,
    on_apply: Hooks,
}

/// Functions called with each config a reload applies, in the order they were added.
#[derive(Default)]
struct Hooks(Mutex<Vec<Hook>>);

type Hook = Box<dyn Fn(&Runtime) + Send + Sync>;

impl Hooks {
    fn add(&self, hook: impl Fn(&Runtime) + Send + Sync + 'static) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(Box::new(hook));
    }

    fn run(&self, next: &Runtime) {
        for hook in self.0.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            hook(next);
        }
    }
}

struct Startup {
    server: ServerSettings,
    store: String,
    tracing: Option<TraceSettings>,
    /// `[rls] listen` and `listen_tls` (empty without `[rls]`).
    rls_listen: RlsListen,
    /// `[log]`: all but `access_log` are read once, at start.
    log: crate::config::LogSettings,
}

type RlsListen = (Vec<std::net::SocketAddr>, Vec<std::net::SocketAddr>);

fn rls_listen(runtime: &Runtime) -> RlsListen {
    runtime.rls.as_ref().map(|r| (r.listen.clone(), r.listen_tls.clone())).unwrap_or_default()
}

impl Reloader {
    pub fn new(path: &Path, runtime: Runtime, text: &str) -> Self {
        let status = ConfigStatus {
            path: path.display().to_string(),
            generation: 1,
            hash: config_hash(text, &runtime),
            loaded_at: unix_now(),
            reload_failures: 0,
            last_error: None,
            pending_restart: Vec::new(),
            secrets: runtime.secrets.sources.clone(),
            environment: runtime.secrets.env.clone(),
            refused_hash: None,
        };
        info!(generation = 1, hash = %status.hash, path = %status.path, "config loaded");
        METRICS.config_generation.set(1);
        METRICS.seed(&super::implied_series::implied(&runtime));
        let started = Startup {
            server: runtime.server.clone(),
            store: format!("{:?}", runtime.store),
            tracing: runtime.tracing.clone(),
            rls_listen: rls_listen(&runtime),
            log: runtime.log.clone(),
        };
        Self {
            path: path.to_path_buf(),
            runtime: Arc::new(ArcSwap::from_pointee(runtime)),
            status: Mutex::new(status),
            started,
            on_prepare: Hooks::default(),
            on_apply: Hooks::default(),
        }
    }

    /// Runs `hook` with each config a reload applies, before requests can see it.
    pub fn on_prepare(&self, hook: impl Fn(&Runtime) + Send + Sync + 'static) {
        self.on_prepare.add(hook);
    }

    /// Runs `hook` with each config a reload applies, once requests see it.
    pub fn on_apply(&self, hook: impl Fn(&Runtime) + Send + Sync + 'static) {
        self.on_apply.add(hook);
    }

    /// The live config, shared with the proxy.
    pub fn runtime(&self) -> Arc<ArcSwap<Runtime>> {
        self.runtime.clone()
    }

    pub fn status(&self) -> ConfigStatus {
        self.lock().clone()
    }

    /// Re-reads and validates the file, then swaps it in atomically; or refuses it and keeps the
    /// running config. Serialised: concurrent triggers apply one after the other.
    pub fn reload(&self, trigger: &str) -> ReloadOutcome {
        self.reload_text(trigger, None)
    }

    /// [`Reloader::reload`] of `text` when given (the content the file watcher saw stay the same),
    /// else of the file as it is now. Either the whole text is applied, or nothing.
    fn reload_text(&self, trigger: &str, text: Option<String>) -> ReloadOutcome {
        let mut status = self.lock();
        let loaded = match text {
            Some(text) => config::from_text_all(&text, &self.path.display().to_string()).map(|runtime| (runtime, text)),
            None => config::load_all_with_text(&self.path),
        };
        let (next, text) = match loaded {
            Ok(loaded) => loaded,
            Err(errors) => {
                // Every error the file has (the first 50), as `weir check` would print them.
                let error = config::one_line(&errors);
                let refused = std::fs::read(&self.path).ok().map(|t| fingerprint_bytes(&t));
                if trigger == FILE_CHANGE && refused.is_some() && refused == status.refused_hash {
                    return ReloadOutcome::Refused(error);
                }
                status.refused_hash = refused;
                status.reload_failures += 1;
                METRICS.config_reload_failures.inc();
                status.last_error = Some(error.clone());
                error!(trigger, %error, generation = status.generation, "config reload refused; the running config keeps serving");
                return ReloadOutcome::Refused(error);
            }
        };
        let hash = config_hash(&text, &next);
        status.refused_hash = None;
        if hash == status.hash {
            status.last_error = None;
            if trigger != FILE_CHANGE {
                info!(trigger, generation = status.generation, "config unchanged");
            }
            return ReloadOutcome::Unchanged { generation: status.generation };
        }
        status.pending_restart = restart_only_changes(&self.started, &next);
        for change in &status.pending_restart {
            warn!(trigger, "{change}: restart Weir to apply it; everything else is applied now");
        }
        for warning in &next.warnings {
            warn!(trigger, "{warning}");
        }
        let next = Arc::new(next);
        self.on_prepare.run(&next);
        self.runtime.store(next.clone());
        METRICS.seed(&super::implied_series::implied(&next));
        self.on_apply.run(&next);
        status.generation += 1;
        METRICS.config_generation.set(status.generation as i64);
        METRICS.config_reloads.inc();
        status.hash = hash.clone();
        status.secrets = next.secrets.sources.clone();
        status.environment = next.secrets.env.clone();
        status.loaded_at = unix_now();
        status.last_error = None;
        info!(trigger, generation = status.generation, hash = %hash, "config reloaded");
        ReloadOutcome::Applied { generation: status.generation, hash }
    }

    fn lock(&self) -> MutexGuard<'_, ConfigStatus> {
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches the file's directory (so write-and-rename editors and Kubernetes ConfigMap symlink
    /// swaps are seen) and reloads once the change is complete: events have been quiet for
    /// `DEBOUNCE`, a file written in place has been closed by its writer, and its content has
    /// read the same twice `STABLE_FOR` apart (see `settle`); that content is what is applied.
    /// So a file still being written — even one whose first half happens to be a valid config —
    /// is never applied.
    /// The directory is watched only for finished changes (`fswatch`), and the file itself for
    /// writes in progress: other files there (logs) and reads (Weir's own) wake nothing.
    /// The watcher lives as long as its thread, i.e. the process.
    pub fn watch(self: &Arc<Self>) -> Result<(), String> {
        let dir = fswatch::parent_dir(&self.path);
        let (tx, rx) = mpsc::channel::<Change>();
        let file_name = self.path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        // The secret files the config reads (`admin_token_file`, …): a rotated secret is applied
        // like a changed config. Those the config names at start are watched.
        let secret_files: Vec<PathBuf> = self.runtime.load().secrets.files().cloned().collect();
        let secret_names: Vec<std::ffi::OsString> =
            secret_files.iter().filter_map(|f| f.file_name().map(|n| n.to_os_string())).collect();
        let mut watcher = DirWatcher::start("weir-config-fs", move |event| {
            let change = match event {
                Event::Entry { name, change } if concerns_config(&name, &file_name) => change,
                Event::Entry { name, .. } if secret_names.contains(&name) => Change::Replaced,
                Event::Entry { .. } => return,
                // Events were lost or the directory went: look at the file again.
                Event::Rescan => Change::Replaced,
            };
            let _ = tx.send(change);
        })
        .map_err(|e| e.to_string())?;
        watcher.watch_dir(&dir).map_err(|e| e.to_string())?;
        let mut secret_dirs: Vec<PathBuf> = secret_files.iter().map(|f| fswatch::parent_dir(f)).collect();
        secret_dirs.sort();
        secret_dirs.dedup();
        for secret_dir in secret_dirs.iter().filter(|d| **d != dir) {
            watcher.watch_dir(secret_dir).map_err(|e| e.to_string())?;
        }
        watcher.watch_writes(&self.path).map_err(|e| e.to_string())?;
        let reloader = Arc::clone(self);
        std::thread::Builder::new()
            .name("weir-config-watch".into())
            .spawn(move || {
                let _watcher = watcher;
                // An event about the file or a ConfigMap swap may or may not change the config;
                // the content hash tells.
                while let Ok(first) = rx.recv() {
                    match settle(&rx, first, &reloader.path) {
                        Some(text) => {
                            reloader.reload_text(FILE_CHANGE, text);
                        }
                        None => return,
                    }
                }
            })
            .map_err(|e| format!("cannot start the config watcher: {e}"))?;
        Ok(())
    }

    /// Reloads on SIGHUP, as `systemctl reload` and `kill -HUP` expect.
    pub fn reload_on_sighup(self: &Arc<Self>) -> Result<(), String> {
        let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])
            .map_err(|e| format!("cannot handle SIGHUP: {e}"))?;
        let reloader = Arc::clone(self);
        std::thread::Builder::new()
            .name("weir-sighup".into())
            .spawn(move || {
                for _ in signals.forever() {
                    reloader.reload("SIGHUP");
                }
            })
            .map_err(|e| format!("cannot start the SIGHUP handler: {e}"))?;
        Ok(())
    }
}

/// Waits until a change of the file is complete (see [`Reloader::watch`]) and returns the content
/// to apply (`Some(None)`: the file could not be read as text, the reload will say why); `None`
/// when the watcher is shutting down. `first` is the event that started it. What to wait for is
/// [`Settling`]'s to decide; this feeds it the time, the events and the file.
fn settle(rx: &mpsc::Receiver<Change>, first: Change, path: &Path) -> Option<Option<String>> {
    let (mut settling, mut next) = Settling::start(first, Instant::now());
    loop {
        next = match next {
            Next::Wait(until) => wait(rx, until, &mut settling)?,
            Next::WaitForClose(until) => {
                info!(path = %path.display(), "config file written but still open: applying it once its writer closes it");
                wait(rx, until, &mut settling)?
            }
            Next::Read => settling.read(std::fs::read(path).ok(), Instant::now()),
            Next::Apply { content, closed } => {
                if !closed {
                    warn!(path = %path.display(), "config file unchanged for {MAX_OPEN_WAIT:?} but never closed by its writer; applying it");
                }
                // A missing, unreadable or non-UTF-8 file: the reload reads it again and says why.
                return Some(content.and_then(|bytes| String::from_utf8(bytes).ok()));
            }
        };
    }
}

/// The next event, or none until `until`, told to `settling`; `None` when the watcher is gone.
fn wait(rx: &mpsc::Receiver<Change>, until: Instant, settling: &mut Settling) -> Option<Next> {
    match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
        Ok(change) => Some(settling.event(change, Instant::now())),
        Err(mpsc::RecvTimeoutError::Timeout) => Some(settling.waited(Instant::now())),
        Err(mpsc::RecvTimeoutError::Disconnected) => None,
    }
}

/// The config file itself, or a Kubernetes ConfigMap's `..data` / `..data_tmp` / `..<timestamp>`
/// entries through which the mounted file is swapped.
fn concerns_config(name: &OsStr, file_name: &OsStr) -> bool {
    name == file_name || fswatch::is_kubernetes_swap(name)
}

/// Settings read once at start-up; a change is reported, not silently ignored.
fn restart_only_changes(current: &Startup, next: &Runtime) -> Vec<String> {
    let mut changes = Vec::new();
    if current.server.listen != next.server.listen {
        changes.push(format!(
            "server.listen: running {:?}, the file says {:?}",
            current.server.listen, next.server.listen
        ));
    }
    let next_rls = rls_listen(next);
    if current.rls_listen != next_rls {
        changes.push(format!(
            "rls.listen / rls.listen_tls: running {:?}, the file says {:?}",
            current.rls_listen, next_rls
        ));
    }
    if current.server.threads != next.server.threads {
        changes
            .push(format!("server.threads: running {}, the file says {}", current.server.threads, next.server.threads));
    }
    if current.server.listen_tls != next.server.listen_tls {
        changes.push(format!(
            "server.listen_tls: running {:?}, the file says {:?}",
            current.server.listen_tls, next.server.listen_tls
        ));
    }
    for (field, running, file) in [
        ("server.min_tls", current.server.min_tls.as_str(), next.server.min_tls.as_str()),
        ("server.http2", bool_str(current.server.http2), bool_str(next.server.http2)),
        ("server.h2c", bool_str(current.server.h2c), bool_str(next.server.h2c)),
    ] {
        if running != file {
            changes.push(format!("{field}: running {running}, the file says {file}"));
        }
    }
    if current.server.admin != next.server.admin {
        changes
            .push(format!("server.admin: running {:?}, the file says {:?}", current.server.admin, next.server.admin));
    }
    if current.tracing != next.tracing {
        changes.push("tracing: the file changes the [tracing] settings".to_string());
    }
    let (running, file) = (&current.log, &next.log);
    if running.level != file.level {
        changes.push(format!("log.level: running {:?}, the file says {:?}", running.level, file.level));
    }
    if running.json != file.json {
        let format = |json: bool| if json { "json" } else { "text" };
        changes.push(format!("log.format: running {}, the file says {}", format(running.json), format(file.json)));
    }
    if running.access_buffer != file.access_buffer {
        let text = |b: Option<crate::config::AccessBuffer>| {
            b.map_or("off".to_string(), |b| format!("{} bytes, flush {:?}", b.size, b.flush))
        };
        changes.push(format!(
            "log.access_log_buffer / access_log_flush: running {}, the file says {}",
            text(running.access_buffer),
            text(file.access_buffer)
        ));
    }
    // Debug output covers every store field; compared only, never logged (the URL may hold a password).
    if current.store != format!("{:?}", next.store) {
        changes.push("store: the file changes the store settings".to_string());
    }
    changes
}

fn bool_str(b: bool) -> &'static str {
    if b {
        "true"
    } else {
        "false"
    }
}

/// The config text's fingerprint; with upstream TLS files (`ca_file`, `client_cert`,
/// `client_key`), of the text and their content: a reload after one of them was replaced applies
/// it although the text did not change.
fn config_hash(text: &str, rt: &Runtime) -> String {
    let mut bytes = text.as_bytes().to_vec();
    // Secrets read from files or the environment (`${NAME}`): a rotated one is a change. Without
    // either, the hash is the text's alone (as documented for `GET /config`).
    if !rt.secrets.none_from_files() || text.contains("${") {
        bytes.extend_from_slice(&rt.secrets.fingerprint());
    }
    for tls in rt.upstreams.iter().filter_map(|u| u.tls.as_ref()) {
        if let Some(ca) = &tls.ca {
            bytes.extend_from_slice(ca.pem());
        }
        if let Some(client) = &tls.client {
            bytes.extend_from_slice(&client.loaded.fingerprint);
        }
    }
    if let Some(jwt) = &rt.jwt {
        bytes.extend_from_slice(jwt.fingerprint());
    }
    fingerprint_bytes(&bytes)
}

fn fingerprint_bytes(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    //! In process, no clock: a reload is decided by the text alone, so nothing here waits.

    use super::*;

    const GOOD: &str = "[server]\nlisten = [\"127.0.0.1:1\"]\n[store]\nkind = \"memory\"\n\
        [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:2\"]\n\
        [[limit_req_zone]]\nname = \"per_ip\"\nkey = \"ip\"\nrate = \"10r/s\"\n\
        [[route]]\nname = \"ROUTE\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_req = [ { zone = \"per_ip\" } ]\n";

    fn text(route: &str) -> String {
        GOOD.replace("ROUTE", route)
    }

    /// A reloader of `text("first")`, its file in a directory of its own.
    fn reloader() -> (tempfile::TempDir, Reloader) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("weir.toml");
        std::fs::write(&path, text("first")).expect("write config");
        let runtime = config::from_text(&text("first"), "weir.toml").expect("the test config compiles");
        let reloader = Reloader::new(&path, runtime, &text("first"));
        (dir, reloader)
    }

    fn route_name(r: &Reloader) -> String {
        r.runtime().load().routes[0].name.clone()
    }

    #[test]
    fn a_bad_text_is_refused_with_its_line_and_the_running_config_keeps_serving() {
        let (_dir, r) = reloader();
        let served = r.runtime().load_full();
        // Line 12 names a zone nobody declared.
        let bad = text("second").replace("zone = \"per_ip\" }", "zone = \"nope\" }");
        let outcome = r.reload_text("test", Some(bad));
        let ReloadOutcome::Refused(error) = outcome else { panic!("a bad config was not refused: {outcome:?}") };
        assert!(error.contains("nope"), "the error names what is wrong: {error}");
        assert!(Arc::ptr_eq(&served, &r.runtime().load_full()), "the running config is the one served before");
        assert_eq!(route_name(&r), "first");
        let st = r.status();
        assert_eq!((st.generation, st.reload_failures), (1, 1), "{st:?}");
        assert_eq!(st.last_error.as_deref(), Some(error.as_str()));

        // Not TOML at all: refused the same way.
        assert!(matches!(r.reload_text("test", Some("[[route]\n".into())), ReloadOutcome::Refused(_)));
        assert_eq!((route_name(&r), r.status().generation, r.status().reload_failures), ("first".into(), 1, 2));
    }

    #[test]
    fn a_refusal_names_every_error_of_the_text_in_line_order() {
        let (_dir, r) = reloader();
        // A bad rate (line 11) and, in the route, an unknown upstream (line 15).
        let bad = text("second").replace("10r/s", "10/s").replace("upstream = \"app\"", "upstream = \"ghost\"");
        let ReloadOutcome::Refused(error) = r.reload_text("test", Some(bad)) else { panic!("not refused") };
        let (rate, upstream) = (error.find("weir.toml:11: "), error.find("weir.toml:15: "));
        assert!(rate.is_some_and(|r| upstream.is_some_and(|u| r < u)), "both, in line order: {error}");
        assert!(error.contains("\"10/s\"") && error.contains("unknown upstream \"ghost\""), "{error}");
        assert_eq!(r.status().last_error.as_deref(), Some(error.as_str()));
    }

    #[test]
    fn a_good_text_is_applied_whole_and_clears_the_last_error() {
        let (_dir, r) = reloader();
        let applied_hook = Arc::new(Mutex::new(Vec::new()));
        let seen = applied_hook.clone();
        r.on_apply(move |rt| seen.lock().unwrap_or_else(|p| p.into_inner()).push(rt.routes[0].name.clone()));
        assert!(matches!(r.reload_text("test", Some("not toml".into())), ReloadOutcome::Refused(_)));

        let outcome = r.reload_text("test", Some(text("second")));
        let ReloadOutcome::Applied { generation, hash } = outcome else { panic!("not applied: {outcome:?}") };
        assert_eq!(generation, 2);
        assert_eq!(route_name(&r), "second");
        let st = r.status();
        assert_eq!((st.generation, st.hash.as_str(), st.last_error.as_deref()), (2, hash.as_str(), None));
        assert_eq!(
            *applied_hook.lock().unwrap_or_else(|p| p.into_inner()),
            ["second"],
            "hooks see each applied config"
        );

        // The same text again changes nothing; another one is generation 3.
        assert_eq!(r.reload_text("test", Some(text("second"))), ReloadOutcome::Unchanged { generation: 2 });
        assert!(matches!(r.reload_text("test", Some(text("third"))), ReloadOutcome::Applied { generation: 3, .. }));
        assert_eq!(route_name(&r), "third");
    }

    #[test]
    fn reload_reads_the_file_as_it_is_now() {
        let (dir, r) = reloader();
        let path = dir.path().join("weir.toml");
        std::fs::write(&path, text("from-disk")).expect("write config");
        assert!(matches!(r.reload("test"), ReloadOutcome::Applied { generation: 2, .. }));
        assert_eq!(route_name(&r), "from-disk");

        std::fs::write(&path, "[server\n").expect("write config");
        assert!(matches!(r.reload("test"), ReloadOutcome::Refused(_)));
        assert_eq!(route_name(&r), "from-disk", "a bad file keeps the running config");

        std::fs::remove_file(&path).expect("remove config");
        assert!(matches!(r.reload("test"), ReloadOutcome::Refused(_)), "a missing file is refused too");
        assert_eq!((route_name(&r), r.status().generation), ("from-disk".into(), 2));
    }

    #[test]
    fn a_restart_only_setting_is_reported_and_the_rest_applied() {
        let (_dir, r) = reloader();
        let moved = text("second").replace("127.0.0.1:1", "127.0.0.1:3");
        assert!(matches!(r.reload_text("test", Some(moved)), ReloadOutcome::Applied { generation: 2, .. }));
        assert_eq!(route_name(&r), "second");
        let pending = r.status().pending_restart;
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert!(pending[0].starts_with("server.listen"), "{pending:?}");
    }
}
