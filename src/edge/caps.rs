//! Caps on open client connections, per instance and per peer address. A permit is held for the
//! connection's whole life and gives its place back when dropped, however the connection ends.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
pub struct ConnectionCaps {
    open: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
}

/// Which cap refused a connection; also its metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapFull {
    Instance,
    PerIp,
}

impl CapFull {
    pub fn label(self) -> &'static str {
        match self {
            CapFull::Instance => "max_connections",
            CapFull::PerIp => "max_connections_per_ip",
        }
    }
}

/// A place among the open connections; `ip` is set when it also holds a per-address place.
#[derive(Debug)]
pub struct ConnPermit {
    caps: Arc<ConnectionCaps>,
    ip: Option<IpAddr>,
}

impl ConnectionCaps {
    /// Takes a place for a connection from `ip`, or says which cap is full. `per_ip` is skipped
    /// for peers it does not apply to (the caller passes `None`, e.g. for trusted proxies).
    /// An IPv4-mapped IPv6 peer (`::ffff:a.b.c.d`, what a dual-stack `[::]` listener sees of an
    /// IPv4 client) counts as its IPv4 address: one client, one count, whichever listener it uses.
    pub fn admit(
        self: &Arc<Self>,
        ip: Option<IpAddr>,
        max_total: usize,
        per_ip: Option<usize>,
    ) -> Result<ConnPermit, CapFull> {
        let ip = ip.map(|ip| ip.to_canonical());
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max_total).then_some(n + 1))
            .map_err(|_| CapFull::Instance)?;
        let mut permit = ConnPermit { caps: self.clone(), ip: None };
        if let (Some(ip), Some(max)) = (ip, per_ip) {
            let mut map = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
            let count = map.entry(ip).or_insert(0);
            if *count >= max {
                // `permit` drops here and gives the instance place back.
                return Err(CapFull::PerIp);
            }
            *count += 1;
            permit.ip = Some(ip);
        }
        Ok(permit)
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Addresses with at least one connection counted against the per-address cap.
    pub fn tracked_ips(&self) -> usize {
        self.per_ip.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        if let Some(ip) = self.ip {
            let mut map = self.caps.per_ip.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(count) = map.get_mut(&ip) {
                *count -= 1;
                if *count == 0 {
                    // Entries live only while their address has connections: no growth over time.
                    map.remove(&ip);
                }
            }
        }
        self.caps.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        s.parse().ok()
    }

    #[test]
    fn instance_cap_and_release() {
        let caps = Arc::new(ConnectionCaps::default());
        let a = caps.admit(ip("192.0.2.1"), 2, None).unwrap();
        let _b = caps.admit(ip("192.0.2.2"), 2, None).unwrap();
        assert_eq!(caps.admit(ip("192.0.2.3"), 2, None).unwrap_err(), CapFull::Instance);
        drop(a);
        assert!(caps.admit(ip("192.0.2.3"), 2, None).is_ok());
    }

    #[test]
    fn per_ip_cap_counts_each_address_and_forgets_it_when_closed() {
        let caps = Arc::new(ConnectionCaps::default());
        let a1 = caps.admit(ip("192.0.2.1"), 10, Some(2)).unwrap();
        let a2 = caps.admit(ip("192.0.2.1"), 10, Some(2)).unwrap();
        assert_eq!(caps.admit(ip("192.0.2.1"), 10, Some(2)).unwrap_err(), CapFull::PerIp);
        assert_eq!(caps.open(), 2, "a refused connection holds no place");
        let _b = caps.admit(ip("192.0.2.2"), 10, Some(2)).unwrap();
        assert!(caps.admit(ip("192.0.2.1"), 10, None).is_ok(), "exempt peers skip the per-address cap");
        drop((a1, a2));
        assert_eq!(caps.tracked_ips(), 1);
        assert!(caps.admit(ip("192.0.2.1"), 10, Some(2)).is_ok());
    }

    #[test]
    fn an_ipv4_mapped_peer_counts_as_its_ipv4_address() {
        let caps = Arc::new(ConnectionCaps::default());
        let _v4 = caps.admit(ip("192.0.2.1"), 10, Some(2)).unwrap();
        let _mapped = caps.admit(ip("::ffff:192.0.2.1"), 10, Some(2)).unwrap();
        assert_eq!(caps.admit(ip("::ffff:192.0.2.1"), 10, Some(2)).unwrap_err(), CapFull::PerIp);
        assert_eq!(caps.admit(ip("192.0.2.1"), 10, Some(2)).unwrap_err(), CapFull::PerIp);
        assert_eq!(caps.tracked_ips(), 1);
    }
}
