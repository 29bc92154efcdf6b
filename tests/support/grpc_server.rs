//! A gRPC server for tests of gRPC upstreams: Python grpcio (h2c) serving the caller's handlers
//! for one service, on a free port it prints once it serves; stopped (stdin closed, then killed)
//! when dropped.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

pub struct GrpcServer {
    child: Child,
    pub port: u16,
}

impl GrpcServer {
    /// Serves `service` (e.g. `demo.Llm`) with `handlers`: Python that imports what it needs and
    /// defines `METHODS`, a dict of method name to grpcio method handler.
    pub fn start(service: &str, handlers: &str) -> GrpcServer {
        let script = format!(
            "import sys, grpc\nfrom concurrent import futures\n{handlers}\n\
             server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))\n\
             server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler({service:?}, METHODS),))\n\
             port = server.add_insecure_port(\"127.0.0.1:0\")\nserver.start()\nprint(port, flush=True)\n\
             sys.stdin.read()\nserver.stop(0)\n"
        );
        let mut child = Command::new("/usr/bin/python3")
            .args(["-c", &script])
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
