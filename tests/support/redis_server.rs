//! A throwaway `redis-server` on a free loopback port: no persistence, killed on drop.

use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// A loopback port nothing listens on right now (one for Redis, or one known to be closed).
pub use super::weir::free_port;

const BINARY: &str = "/usr/bin/redis-server";
/// How long a fresh server may take to answer PING.
const READY_WITHIN: Duration = Duration::from_secs(10);

pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    /// Extra `redis-server` arguments, e.g. `--maxmemory 2mb`.
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a port the kernel says is free. Another process may grab the port
    /// between our probe and redis' bind, so a server that exits at once is retried elsewhere.
    pub fn start() -> Self {
        Self::start_with_args(&[])
    }

    /// Like [`RedisServer::start`], with extra `redis-server` arguments (also on restarts).
    pub fn start_with_args(args: &[&str]) -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            let mut server =
                Self { port: free_port(), child: None, args: args.iter().map(|a| a.to_string()).collect() };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("could not start {BINARY}: {last_error}");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A fresh synchronous connection, for inspecting what the store wrote.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("redis url")
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect to the test redis")
    }

    /// Kills the server (all data is lost) and starts a new one on the same port.
    pub fn restart(&mut self) {
        self.stop();
        // The old listener is gone once the process is reaped; redis binds with SO_REUSEADDR.
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("restart on {}: {e}", self.port),
                Err(_) => sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Kills the server, leaving the port closed.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn spawn(&mut self) -> Result<(), String> {
        let mut child = Command::new(BINARY)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("exited with {status} (port {} taken?)", self.port));
            }
            if self.answers_ping(child.id()) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no PING answer within {READY_WITHIN:?}"));
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// True once the server answers PING and is our process (not another test's server that
    /// holds the port while ours fails to bind).
    fn answers_ping(&self, pid: u32) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        if redis::cmd("PING").query::<String>(&mut conn).is_err() {
            return false;
        }
        let info: String = redis::cmd("INFO").arg("server").query(&mut conn).unwrap_or_default();
        info.lines().any(|line| line.trim() == format!("process_id:{pid}"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
