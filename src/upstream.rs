//! Upstream pools: addresses resolved once at config load, picked round robin per request.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    pub servers: Vec<SocketAddr>,
    next: AtomicUsize,
}

impl Upstream {
    /// `servers` must not be empty (config validation guarantees it).
    pub fn new(name: String, servers: Vec<SocketAddr>) -> Self {
        Self {
            name,
            servers,
            next: AtomicUsize::new(0),
        }
    }

    pub fn pick(&self) -> Option<SocketAddr> {
        if self.servers.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.servers.len();
        Some(self.servers[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let u = Upstream::new("app".into(), vec![a, b]);
        assert_eq!([u.pick(), u.pick(), u.pick()], [Some(a), Some(b), Some(a)]);
        assert_eq!(Upstream::new("none".into(), vec![]).pick(), None);
    }
}
