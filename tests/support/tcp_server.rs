//! A loopback TCP server for test upstreams: it accepts on a thread of its own and serves each
//! connection on a new thread, until it is dropped.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// A running server; stops accepting when dropped.
pub struct TcpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<thread::JoinHandle<()>>,
}

impl TcpServer {
    /// Binds a free port on 127.0.0.1 and serves every connection with `serve(conn, stop)` on a
    /// thread of its own. `stop` turns true when the server is dropped: a connection that lives
    /// long may check it. `name` names the threads (`<name>-accept`, `<name>-conn`).
    pub fn start<F>(name: &str, serve: F) -> TcpServer
    where
        F: Fn(TcpStream, &AtomicBool) + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind {name} on 127.0.0.1:0: {e}"));
        TcpServer::start_on(name, listener, serve)
    }

    /// [`TcpServer::start`] on a listener bound by the caller (another loopback address, a port
    /// reused after [`TcpServer::shutdown`]).
    pub fn start_on<F>(name: &str, listener: TcpListener, serve: F) -> TcpServer
    where
        F: Fn(TcpStream, &AtomicBool) + Send + Sync + 'static,
    {
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{name}: local address of the listener: {e}"));
        let stop = Arc::new(AtomicBool::new(false));
        let serve = Arc::new(serve);
        let accept_stop = stop.clone();
        let conn_thread = format!("{name}-conn");
        let accept = thread::Builder::new()
            .name(format!("{name}-accept"))
            .spawn(move || {
                for conn in listener.incoming() {
                    if accept_stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (serve, stop) = (serve.clone(), accept_stop.clone());
                    let _ = thread::Builder::new().name(conn_thread.clone()).spawn(move || serve(conn, &stop));
                }
            })
            .unwrap_or_else(|e| panic!("spawn {name} accept thread: {e}"));
        TcpServer { addr, stop, accept: Some(accept) }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and returns once the listener is closed (the port refuses connections and
    /// may be bound again). Connections already open are the caller's to end.
    pub fn shutdown(&mut self) {
        self.stop_accepting();
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }

    fn stop_accepting(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(500));
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        if self.accept.is_some() {
            self.stop_accepting();
        }
    }
}
