//! Upstream pools: addresses resolved once at config load, picked round robin per request, with
//! an optional cap on requests in flight per server and Weir instance (nginx's `max_conns`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    pub servers: Vec<SocketAddr>,
    pub max_conns: Option<usize>,
    next: AtomicUsize,
    /// Requests in flight per server; shared with the slots that release them.
    in_flight: Arc<Vec<AtomicUsize>>,
}

/// A place on one server, given back when dropped (at the end of the request, however it ends).
#[derive(Debug)]
pub struct ServerSlot {
    pub addr: SocketAddr,
    counter: Option<(Arc<Vec<AtomicUsize>>, usize)>,
}

impl Drop for ServerSlot {
    fn drop(&mut self) {
        if let Some((counters, i)) = &self.counter {
            counters[*i].fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Upstream {
    /// `servers` must not be empty (config validation guarantees it).
    pub fn new(name: String, servers: Vec<SocketAddr>, max_conns: Option<usize>) -> Self {
        let in_flight = Arc::new(servers.iter().map(|_| AtomicUsize::new(0)).collect());
        Self { name, servers, max_conns, next: AtomicUsize::new(0), in_flight }
    }

    /// The next server in round robin that has room; `None` when every server is at `max_conns`.
    pub fn pick(&self) -> Option<ServerSlot> {
        let n = self.servers.len();
        if n == 0 {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let Some(max) = self.max_conns else {
            return Some(ServerSlot { addr: self.servers[start % n], counter: None });
        };
        (0..n).map(|k| (start + k) % n).find_map(|i| {
            let taken = self.in_flight[i]
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| (c < max).then_some(c + 1))
                .is_ok();
            taken.then(|| ServerSlot { addr: self.servers[i], counter: Some((self.in_flight.clone(), i)) })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(slot: Option<ServerSlot>) -> Option<SocketAddr> {
        slot.map(|s| s.addr)
    }

    #[test]
    fn round_robin() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let u = Upstream::new("app".into(), vec![a, b], None);
        assert_eq!([addr(u.pick()), addr(u.pick()), addr(u.pick())], [Some(a), Some(b), Some(a)]);
        assert!(Upstream::new("none".into(), vec![], None).pick().is_none());
    }

    #[test]
    fn max_conns_skips_full_servers_and_frees_slots_on_drop() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let u = Upstream::new("app".into(), vec![a, b], Some(1));
        let first = u.pick().unwrap();
        let second = u.pick().unwrap();
        assert_ne!(first.addr, second.addr);
        assert!(u.pick().is_none(), "both servers are full");
        drop(first);
        assert!(u.pick().is_some());
    }
}
