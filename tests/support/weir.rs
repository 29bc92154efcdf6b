//! Spawn the `weir` binary for tests.
//!
//! [`Weir::start`] writes a config into a temp dir, substituting `$LISTEN` (and `$LISTEN2`, and
//! `$LISTEN6` on `[::1]`) with free loopback addresses, picked anew when a start is retried;
//! starts `weir -c FILE`, and waits (bounded) until every listen address accepts TCP connections. Stdout and stderr go to files in the temp dir so
//! that a failure can show them. Dropping a [`Weir`] sends SIGTERM, waits a bounded time,
//! then SIGKILLs and reaps.
//!
//! [`run`] runs a short-lived command (`weir check …`, `weir --help`) with a timeout;
//! [`check_config`] runs `weir check` on a config text.

use std::ffi::OsStr;
use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How long to wait for weir to accept connections.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long Drop waits after SIGTERM before SIGKILL.
pub const TERM_GRACE: Duration = Duration::from_secs(5);

/// Path of the binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_weir")
}

/// A port that was free a moment ago on 127.0.0.1. Anyone may take it before the caller binds it:
/// whoever starts a server on it must retry on another port when the bind fails (as
/// [`Weir::start`] does for `$LISTEN`/`$LISTEN2`, and the Redis helpers do). For an address that
/// must refuse connections, use [`refusing_addr`].
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

/// A loopback address that refuses connections for as long as the returned socket lives: bound,
/// so no other process can take the port, but not listening.
pub fn refusing_addr() -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
    socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind 127.0.0.1:0");
    let addr = socket.local_addr().expect("local addr");
    (socket, addr)
}

/// A running weir process.
pub struct Weir {
    child: Option<Child>,
    /// The address that replaced `$LISTEN`.
    pub addr: SocketAddr,
    /// Every listen address substituted (`$LISTEN`, then `$LISTEN2` and `$LISTEN6` if used).
    pub addrs: Vec<SocketAddr>,
    pub config_path: PathBuf,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Weir {
    /// `weir -c FILE` with `config` (see module docs for placeholders). Panics, with weir's
    /// stderr, if it does not become ready.
    pub fn start(config: &str) -> Weir {
        Weir::start_with_args(&[], config)
    }

    /// Like [`Weir::start`] with `args` before `-c FILE` (e.g. `["run"]`).
    pub fn start_with_args(args: &[&str], config: &str) -> Weir {
        Weir::start_full(args, config, None, &[])
    }

    /// Like [`Weir::start`], with the process's file-descriptor limit (soft and hard) set to `nofile`.
    pub fn start_with_nofile(config: &str, nofile: u64) -> Weir {
        Weir::start_full(&[], config, Some(nofile), &[])
    }

    /// Like [`Weir::start`], with these environment variables set for the process.
    pub fn start_with_env(config: &str, env: &[(&str, &str)]) -> Weir {
        Weir::start_full(&[], config, None, env)
    }

    fn start_full(args: &[&str], config: &str, nofile: Option<u64>, env: &[(&str, &str)]) -> Weir {
        let mut last_err = String::new();
        // A port picked free may be taken before weir binds it: retry a few times.
        for _ in 0..3 {
            match Weir::try_start(args, config, nofile, env) {
                Ok(w) => return w,
                Err((msg, retry)) => {
                    if !retry {
                        panic!("{msg}");
                    }
                    last_err = msg;
                }
            }
        }
        panic!("{last_err}");
    }

    fn try_start(
        args: &[&str],
        config: &str,
        nofile: Option<u64>,
        env: &[(&str, &str)],
    ) -> Result<Weir, (String, bool)> {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut addrs = Vec::new();
        let mut text = config.to_string();
        // $LISTEN2 and $LISTEN6 first: "$LISTEN" is a prefix of both.
        let mut second = None;
        if text.contains("$LISTEN2") {
            let a: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            text = text.replace("$LISTEN2", &a.to_string());
            second = Some(a);
        }
        let mut v6 = None;
        if text.contains("$LISTEN6") {
            let l = TcpListener::bind("[::1]:0").expect("bind [::1]:0");
            let a = l.local_addr().unwrap();
            text = text.replace("$LISTEN6", &a.to_string());
            v6 = Some(a);
        }
        // Two quick free_port() calls can return the same port; weir would then get one of the
        // two listeners and the readiness check (a connect to each address) would still pass, so
        // requests for the admin listener reached the proxy. Never hand out a port twice.
        let mut port = free_port();
        while second.is_some_and(|a: SocketAddr| a.port() == port) {
            port = free_port();
        }
        let first: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        text = text.replace("$LISTEN", &first.to_string());
        addrs.push(first);
        addrs.extend(second);
        addrs.extend(v6);

        let config_path = dir.path().join("weir.toml");
        fs::write(&config_path, &text).expect("write config");
        let stdout_path = dir.path().join("stdout.log");
        let stderr_path = dir.path().join("stderr.log");
        let mut command = Command::new(bin());
        if let Some(limit) = nofile {
            use std::os::unix::process::CommandExt;
            let rlim = libc::rlimit { rlim_cur: limit as libc::rlim_t, rlim_max: limit as libc::rlim_t };
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &rlim) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let child = command
            .args(args)
            .arg("-c")
            .arg(&config_path)
            .env("RUST_BACKTRACE", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(fs::File::create(&stdout_path).unwrap())
            .stderr(fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin()));

        let mut w = Weir { child: Some(child), addr: first, addrs, config_path, stdout_path, stderr_path, _dir: dir };

        let deadline = Instant::now() + READY_TIMEOUT;
        let mut pending: Vec<SocketAddr> = w.addrs.clone();
        loop {
            pending.retain(|a| TcpStream::connect_timeout(a, Duration::from_millis(200)).is_err());
            // A port picked free may have been taken by another test's process, which then
            // answers the connect while this weir exits with "in use": ready is when the
            // kernel says this weir's own sockets listen on every address.
            if pending.is_empty() && w.pid().is_some_and(|pid| owns_listeners(pid, &w.addrs)) {
                return Ok(w);
            }
            if let Some(status) = w.try_wait() {
                let err = w.stderr();
                let retry = err.contains("in use") || err.contains("AddrInUse");
                return Err((
                    format!(
                        "weir exited ({status}) before listening on {pending:?}\nconfig:\n{text}\n--- stderr ---\n{err}\n--- stdout ---\n{}",
                        w.stdout()
                    ),
                    retry,
                ));
            }
            if Instant::now() >= deadline {
                let msg = format!(
                    "weir not listening on {pending:?} after {READY_TIMEOUT:?}\nconfig:\n{text}\n--- stderr ---\n{}\n--- stdout ---\n{}",
                    w.stderr(),
                    w.stdout()
                );
                return Err((msg, false));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Everything weir wrote on stderr so far.
    pub fn stderr(&self) -> String {
        fs::read(&self.stderr_path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }

    /// Everything weir wrote on stdout so far.
    pub fn stdout(&self) -> String {
        fs::read(&self.stdout_path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }

    /// The exit status if the process has exited (reaps it).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn is_alive(&mut self) -> bool {
        self.child.is_some() && self.try_wait().is_none()
    }

    /// Panic with weir's stderr unless the process is still running.
    pub fn assert_alive(&mut self, context: &str) {
        if let Some(st) = self.try_wait() {
            panic!("weir died ({st}) {context}\n--- stderr ---\n{}", self.stderr());
        }
    }

    /// Send `sig` to the process.
    pub fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe {
                libc::kill(pid as libc::pid_t, sig);
            }
        }
    }

    /// SIGTERM, then wait up to `timeout` for exit. Returns the status and how long the exit
    /// took, or None if it was still running at the deadline (it is then left running).
    pub fn terminate(&mut self, timeout: Duration) -> Option<(ExitStatus, Duration)> {
        if let Some(st) = self.try_wait() {
            return Some((st, Duration::ZERO));
        }
        let t0 = Instant::now();
        self.signal(libc::SIGTERM);
        let deadline = t0 + timeout;
        loop {
            if let Some(st) = self.try_wait() {
                return Some((st, t0.elapsed()));
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Weir {
    fn drop(&mut self) {
        if self.child.is_some() {
            if self.terminate(TERM_GRACE).is_none() {
                self.kill();
            }
            // Reap (already exited: returns at once).
            if let Some(mut c) = self.child.take() {
                let _ = c.wait();
            }
        }
    }
}

/// Result of a short-lived command.
#[derive(Debug)]
pub struct RunOutput {
    /// Exit code; None when killed by a signal or by the timeout.
    pub code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

impl RunOutput {
    pub fn describe(&self) -> String {
        format!(
            "code={:?} timed_out={}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.timed_out, self.stdout, self.stderr
        )
    }
}

/// Run `weir ARGS…` to completion, killing it after `timeout`.
pub fn run<I, S>(args: I, timeout: Duration) -> RunOutput
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let dir = tempfile::tempdir().expect("tempdir");
    let out_p = dir.path().join("stdout");
    let err_p = dir.path().join("stderr");
    let mut child = Command::new(bin())
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_p).unwrap())
        .stderr(fs::File::create(&err_p).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin()));
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break Some(st);
        }
        if Instant::now() >= deadline {
            timed_out = true;
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    RunOutput { code: status.and_then(|s| s.code()), timed_out, stdout: read(&out_p), stderr: read(&err_p) }
}

/// `weir check -c FILE` on `text` written as `name` into a temp dir of its own, killed after
/// `timeout`.
pub fn check_config(name: &str, text: &str, timeout: Duration) -> RunOutput {
    let dir = ConfigDir::new();
    let path = dir.write(name, text);
    run(["check".as_ref(), "-c".as_ref(), path.as_os_str()], timeout)
}

/// A temp dir to write config files into.
pub struct ConfigDir {
    dir: tempfile::TempDir,
}

impl ConfigDir {
    pub fn new() -> ConfigDir {
        ConfigDir { dir: tempfile::tempdir().expect("tempdir") }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Write `text` to `name` inside the dir; returns the full path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        fs::write(&p, text).expect("write config");
        p
    }
}

impl Default for ConfigDir {
    fn default() -> Self {
        ConfigDir::new()
    }
}

/// Whether process `pid` holds a listening TCP socket on each of `addrs`' ports (per address
/// family), read from `/proc`: the socket inodes among its open files, and the kernel's table of
/// TCP sockets with their state and inode.
fn owns_listeners(pid: u32, addrs: &[SocketAddr]) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    let inodes: std::collections::HashSet<String> = fds
        .filter_map(|fd| fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let listening = |table: &str| -> Vec<u16> {
        let text = fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        text.lines()
            .skip(1)
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                // local_address is field 1 (HEX_IP:HEX_PORT), st field 3 (0A: LISTEN), inode field 9.
                let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
                if *state != "0A" || !inodes.contains(*inode) {
                    return None;
                }
                u16::from_str_radix(local.rsplit(':').next()?, 16).ok()
            })
            .collect()
    };
    let (v4, v6) = (listening("tcp"), listening("tcp6"));
    addrs.iter().all(|a| if a.is_ipv4() { v4.contains(&a.port()) } else { v6.contains(&a.port()) })
}
