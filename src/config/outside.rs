//! What compiling a config needs from outside its text: files (certificates, keys, JWKS,
//! secrets), environment variables (`${NAME}`), DNS answers (upstream names) and the time
//! (certificate expiry warnings). Compilation asks only through [`Outside`], so it is a function
//! of the text and these answers: [`Machine`] asks this machine, tests hand in fixed answers
//! ([`Fixed`]) and run no I/O at all.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub trait Outside {
    /// A file's bytes (`path` already resolved against the config file's directory).
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// A regular file's bytes if it holds at most `max`; an error saying so if it holds more (read
    /// no further: a secret path pointing at a log file must not fill memory) or is not a regular
    /// file (a FIFO would block the load, a device may never end).
    fn read_at_most(&self, path: &Path, max: u64) -> io::Result<Vec<u8>> {
        let bytes = self.read(path)?;
        too_long(bytes, max)
    }
    /// Whether every user of the machine may read the file (mode `o+r`).
    fn world_readable(&self, _path: &Path) -> bool {
        false
    }
    /// An environment variable, for `${NAME}`.
    fn var(&self, name: &str) -> Option<String>;
    /// The addresses of `host:port`, asked of `resolver` when one is configured.
    fn resolve(&self, target: &str, resolver: Option<SocketAddr>) -> io::Result<Vec<SocketAddr>>;
    /// Seconds since the Unix epoch.
    fn unix_now(&self) -> i64;
    /// Whether `path` is a unix socket now; `None` when this cannot be known (tests' fixed answers).
    fn is_socket(&self, _path: &Path) -> Option<bool> {
        None
    }
}

/// This machine: its files, environment, resolver and clock.
pub struct Machine;

impl Outside for Machine {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn read_at_most(&self, path: &Path, max: u64) -> io::Result<Vec<u8>> {
        use std::io::Read;
        // A FIFO would block the load until someone writes to it; a device may never end.
        if !std::fs::metadata(path)?.is_file() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "it is not a regular file"));
        }
        let mut bytes = Vec::new();
        std::fs::File::open(path)?.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
        too_long(bytes, max)
    }

    #[cfg(unix)]
    fn world_readable(&self, path: &Path) -> bool {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o004 != 0)
    }

    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn resolve(&self, target: &str, resolver: Option<SocketAddr>) -> io::Result<Vec<SocketAddr>> {
        crate::upstream::resolve_now(target, resolver)
    }

    fn unix_now(&self) -> i64 {
        crate::tls::unix_now()
    }

    #[cfg(unix)]
    fn is_socket(&self, path: &Path) -> Option<bool> {
        use std::os::unix::fs::FileTypeExt;
        Some(std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket()))
    }
}

fn too_long(bytes: Vec<u8>, max: u64) -> io::Result<Vec<u8>> {
    if bytes.len() as u64 > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("it holds more than {max} bytes")));
    }
    Ok(bytes)
}

/// Fixed answers: what is not given is absent (a missing file, an unset variable, a name that
/// does not resolve).
#[derive(Debug, Default, Clone)]
pub struct Fixed {
    pub files: HashMap<PathBuf, Vec<u8>>,
    pub vars: HashMap<String, String>,
    pub names: HashMap<String, Vec<SocketAddr>>,
    pub now: i64,
}

impl Outside for Fixed {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.files.get(path).cloned().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))
    }

    fn var(&self, name: &str) -> Option<String> {
        self.vars.get(name).cloned()
    }

    fn resolve(&self, target: &str, _resolver: Option<SocketAddr>) -> io::Result<Vec<SocketAddr>> {
        self.names.get(target).cloned().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "unknown name"))
    }

    fn unix_now(&self) -> i64 {
        self.now
    }
}
