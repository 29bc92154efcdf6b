//! A gRPC server for tests of gRPC upstreams: a Python grpcio script of the caller's that prints
//! its port once it serves (h2c), stopped (stdin closed, then killed) when dropped.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

pub struct GrpcServer {
    child: Child,
    pub port: u16,
}

impl GrpcServer {
    /// Runs `script` with /usr/bin/python3 and reads the port it prints.
    pub fn start(script: &str) -> GrpcServer {
        let mut child = Command::new("/usr/bin/python3")
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("/usr/bin/python3 with grpcio (scripts/setup.sh installs python3-grpcio)");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        std::io::BufReader::new(stdout).read_line(&mut line).expect("the gRPC server's port");
        let port = line.trim().parse().unwrap_or_else(|_| panic!("the gRPC server printed {line:?}"));
        GrpcServer { child, port }
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
