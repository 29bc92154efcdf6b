//! One file-descriptor budget for every listener: the proxy's (cleartext and TLS), the rate limit
//! service's and the admin's. Each listener has its own connection cap, so a flood on one never
//! takes another's places, and the caps together stay below the process's descriptor limit, so a
//! flood never runs the process out of descriptors (where accept fails and nothing else can open
//! a socket, not even to Redis).

/// Descriptors kept for everything but client connections: the admin listener's connections
/// ([`ADMIN_MAX_CONNECTIONS`]), Redis, the config watcher, logs, Pingora's own.
pub const FD_RESERVE: usize = 128;
/// Connections the admin listener serves at once (taken from [`FD_RESERVE`]): probes, a
/// Prometheus scraper, a few operators.
pub const ADMIN_MAX_CONNECTIONS: usize = 32;
/// The rate limit service's default share: Envoy multiplexes its calls on a few connections per
/// instance (one per worker), so 1024 serves hundreds of Envoys.
const RLS_MAX_CONNECTIONS: usize = 1024;
/// The smallest cap a listener gets, however low the descriptor limit.
const MIN_CONNECTIONS: usize = 16;

/// Each client-facing listener's connection cap when the config sets none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Proxied connections hold two descriptors (client and upstream).
    pub proxy: usize,
    /// Rate limit service connections hold one.
    pub rls: usize,
    pub admin: usize,
}

impl Budget {
    /// Splits `fd_limit`: the reserve first, then a quarter (at most 1024) to the rate limit
    /// service when it runs, the rest to the proxy at two descriptors a connection.
    pub fn split(fd_limit: u64, rls: bool) -> Budget {
        let clients = usize::try_from(fd_limit).unwrap_or(usize::MAX).saturating_sub(FD_RESERVE);
        let rls = if rls { (clients / 4).clamp(MIN_CONNECTIONS, RLS_MAX_CONNECTIONS) } else { 0 };
        let proxy = (clients.saturating_sub(rls) / 2).max(MIN_CONNECTIONS);
        Budget { proxy, rls, admin: ADMIN_MAX_CONNECTIONS }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caps_together_stay_below_the_descriptor_limit() {
        // Without the rate limit service the proxy keeps its share of before: (limit - 128) / 2.
        assert_eq!(Budget::split(256, false), Budget { proxy: 64, rls: 0, admin: 32 });
        assert_eq!(Budget::split(512, true), Budget { proxy: 144, rls: 96, admin: 32 });
        assert_eq!(Budget::split(1 << 20, true).rls, 1024, "the service's share is capped");
        for limit in [256u64, 512, 1024, 4096, 65_536, 1 << 20] {
            let b = Budget::split(limit, true);
            let fds = 2 * b.proxy + b.rls + FD_RESERVE;
            assert!(fds <= limit as usize, "{limit}: {b:?} uses {fds}");
            assert!(b.admin < FD_RESERVE);
        }
    }
}
