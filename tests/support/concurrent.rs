//! Requests sent all at once, for what weir does with concurrency: every connection is opened
//! first, then one thread per request is released, all together.

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use super::http::{Conn, Request, Response};

/// Requests on their way (see [`start`]).
pub struct Burst {
    released: Instant,
    threads: Vec<thread::JoinHandle<(Response, Instant)>>,
}

/// Opens one connection per request (all of them before anything is sent), then releases one
/// thread per request at the same moment, each sending its request on its connection. Panics on
/// an I/O error.
pub fn start(reqs: Vec<(SocketAddr, Request)>) -> Burst {
    let gate = Arc::new(Barrier::new(reqs.len() + 1));
    let threads = reqs
        .into_iter()
        .map(|(addr, req)| {
            let gate = gate.clone();
            let mut c = Conn::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
            thread::spawn(move || {
                gate.wait();
                let r = c.send(&req).unwrap_or_else(|e| panic!("{} {} to {addr}: {e}", req.method, req.target));
                (r, Instant::now())
            })
        })
        .collect();
    let released = Instant::now();
    gate.wait();
    Burst { released, threads }
}

impl Burst {
    /// An instant no request of the burst was sent before.
    pub fn released(&self) -> Instant {
        self.released
    }

    /// Every response, in the order of the requests, with how long after [`Burst::released`] it
    /// had been read.
    pub fn join(self) -> Vec<(Response, Duration)> {
        let released = self.released;
        self.threads
            .into_iter()
            .map(|h| {
                let (r, at) = h.join().expect("request thread");
                (r, at.duration_since(released))
            })
            .collect()
    }
}

/// Sends every request at once (see [`start`]); the responses in the order of the requests.
pub fn fire(reqs: Vec<(SocketAddr, Request)>) -> Vec<Response> {
    start(reqs).join().into_iter().map(|(r, _)| r).collect()
}
