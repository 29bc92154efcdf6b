//! A throwaway nginx for tests: one `server {}` block on a free loopback port, in a temp dir of
//! its own (pid, access and error logs, temp paths), in the foreground (`daemon off`, no master), killed and
//! reaped on drop. Start-up waits a bounded time and retries on another port if the one picked
//! was taken meanwhile.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const READY_WITHIN: Duration = Duration::from_secs(10);

/// nginx on `PATH` or in /usr/sbin (scripts/setup.sh installs nginx-light).
pub fn bin() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|p| p.is_file())
        .expect("nginx is needed: run scripts/setup.sh (installs nginx-light)")
}

pub struct Nginx {
    child: Child,
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Nginx {
    /// nginx serving `server` (the inside of a `server {}` block), where `$PORT` stands for the
    /// port picked and `$HOST` for 127.0.0.1. Panics with nginx's error log if it does not come up.
    pub fn start(server: &str) -> Nginx {
        Nginx::start_at("127.0.0.1", server)
    }

    /// [`Nginx::start`] with `$HOST` another loopback address (e.g. 127.0.0.2).
    pub fn start_at(host: &str, server: &str) -> Nginx {
        let mut last = String::new();
        for _ in 0..3 {
            match Nginx::try_start(host, server) {
                Ok(n) => return n,
                Err(e) => last = e,
            }
        }
        panic!("nginx did not start:\n{last}");
    }

    fn try_start(host: &str, server: &str) -> Result<Nginx, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = super::weir::free_port();
        let prefix = dir.path().display().to_string();
        let conf = format!(
            r#"daemon off;
master_process off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
{server}
    }}
}}
"#,
            server = server.replace("$PORT", &port.to_string()).replace("$HOST", host)
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("write nginx.conf");
        let child = Command::new(bin())
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn nginx: {e}"))?;
        let addr: SocketAddr = format!("{host}:{port}").parse().expect("an IPv4 loopback address");
        let mut nginx = Nginx { child, addr, dir };
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Ok(Some(status)) = nginx.child.try_wait() {
                return Err(format!("nginx exited ({status}):\n{}", nginx.error_log()));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(nginx);
            }
            if Instant::now() >= deadline {
                return Err(format!("nginx not listening on {addr} after {READY_WITHIN:?}:\n{}", nginx.error_log()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The requests nginx answered so far, in its `combined` format.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
