//! `[store] url`: which Redis deployment holds the limits.
//!
//! * `redis://[user:password@]host[:port][/db]` (or `rediss://`): one server (or a managed
//!   endpoint that hides its failover).
//! * `redis+cluster://[user:password@]host:port[,host:port...]` (or `rediss+cluster://`): a Redis
//!   Cluster, given by one or more of its nodes; the client learns the rest (`CLUSTER SLOTS`) and
//!   follows MOVED/ASK and failovers.
//! * `redis+sentinel://[user:password@]host:port[,host:port...]/<master name>[/<db>]`: a master
//!   watched by Sentinels; the client asks them for the master and asks again after a failover.
//!   The credentials and db are the data nodes'; the Sentinels are reached without a password.
//!   `rediss+sentinel://` reaches the Sentinels and the master over TLS.
//!
//! A missing port is 6379 (26379 for a Sentinel). Parsing does no I/O.

use ::redis::IntoConnectionInfo;

/// The deployment named by a `[store] url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTopology {
    /// One server: the URL as given.
    Single(String),
    /// The seed nodes of a cluster, each as a `redis://` (or `rediss://`) URL carrying the
    /// credentials.
    Cluster(Vec<String>),
    Sentinel {
        /// `redis://host:port` (`rediss://` over TLS) of each Sentinel.
        sentinels: Vec<String>,
        /// The name the Sentinels monitor the master under.
        master: String,
        /// `redis://[user:password@]sentinel-resolved/<db>`: the data nodes' credentials and db
        /// (the host is a placeholder).
        data_node: String,
        /// `rediss+sentinel://`: the Sentinels and the master over TLS.
        tls: bool,
    },
}

impl RedisTopology {
    pub fn kind(&self) -> &'static str {
        match self {
            RedisTopology::Single(_) => "single",
            RedisTopology::Cluster(_) => "cluster",
            RedisTopology::Sentinel { .. } => "sentinel",
        }
    }
}

const CLUSTER_EXAMPLE: &str = "\"redis+cluster://10.0.0.1:7000,10.0.0.2:7001\"";
const SENTINEL_EXAMPLE: &str = "\"redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster\"";

/// Parses a `[store] url`. The error says what is wrong, without the URL's password.
pub fn parse_redis_url(url: &str) -> Result<RedisTopology, String> {
    let shown = redact(url);
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{shown:?} is not a redis://, rediss://, redis+cluster:// or redis+sentinel:// URL"))?;
    match scheme {
        "redis" | "rediss" => {
            if ::redis::Client::open(url).is_err() {
                return Err(format!("{shown:?} is not a valid {scheme}:// URL"));
            }
            Ok(RedisTopology::Single(url.to_string()))
        }
        "redis+cluster" | "rediss+cluster" => {
            let node_scheme = scheme.trim_end_matches("+cluster");
            let parts = split(rest, &shown, CLUSTER_EXAMPLE)?;
            if !parts.path.is_empty() {
                return Err(format!(
                    "{shown:?}: a cluster URL takes no path (\"/{}\"): Redis Cluster has only db 0; e.g. {CLUSTER_EXAMPLE}",
                    parts.path
                ));
            }
            let nodes = parts
                .hosts
                .iter()
                .map(|(host, port)| node_url(node_scheme, parts.userinfo, host, port.unwrap_or(6379), 0, &shown))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(RedisTopology::Cluster(nodes))
        }
        "redis+sentinel" | "rediss+sentinel" => {
            let tls = scheme == "rediss+sentinel";
            let node_scheme = if tls { "rediss" } else { "redis" };
            let parts = split(rest, &shown, SENTINEL_EXAMPLE)?;
            let mut path = parts.path.split('/');
            let master = path.next().unwrap_or_default();
            if master.is_empty() {
                return Err(format!(
                    "{shown:?} names no master: expected redis+sentinel://host:port[,host:port...]/<master name>[/<db>], e.g. {SENTINEL_EXAMPLE}"
                ));
            }
            let db = match path.next() {
                None | Some("") => 0,
                Some(db) => db.parse::<u16>().map_err(|_| {
                    format!("{shown:?}: the db after the master name must be a number 0..=65535, got {db:?}")
                })?,
            };
            if let Some(extra) = path.find(|p| !p.is_empty()) {
                return Err(format!(
                    "{shown:?}: unexpected {extra:?} after /<master name>/<db>, e.g. {SENTINEL_EXAMPLE}"
                ));
            }
            let sentinels = parts
                .hosts
                .iter()
                .map(|(host, port)| node_url(node_scheme, None, host, port.unwrap_or(26379), 0, &shown))
                .collect::<Result<Vec<_>, _>>()?;
            let data_node = node_url(node_scheme, parts.userinfo, "127.0.0.1", 6379, db, &shown)?;
            Ok(RedisTopology::Sentinel { sentinels, master: master.to_string(), data_node, tls })
        }
        other => Err(format!(
            "{shown:?}: unknown scheme {other:?}: expected redis://, rediss://, redis+cluster:// or redis+sentinel:// (rediss+cluster://, rediss+sentinel:// over TLS)"
        )),
    }
}

/// The parts of `[userinfo@]host[:port][,host[:port]...][/path]`.
struct Parts<'a> {
    userinfo: Option<&'a str>,
    hosts: Vec<(&'a str, Option<u16>)>,
    path: &'a str,
}

fn split<'a>(rest: &'a str, shown: &str, example: &str) -> Result<Parts<'a>, String> {
    if rest.contains(['?', '#']) {
        return Err(format!("{shown:?}: query parameters and fragments are not supported here"));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    if hosts.is_empty() {
        return Err(format!("{shown:?} lists no host: expected host:port[,host:port...], e.g. {example}"));
    }
    let hosts = hosts
        .split(',')
        .enumerate()
        .map(|(i, h)| host_port(h).map_err(|e| format!("{shown:?}: host {} ({h:?}): {e}", i + 1)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Parts { userinfo, hosts, path: path.trim_end_matches('/') })
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn host_port(text: &str) -> Result<(&str, Option<u16>), String> {
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let end = v6.find(']').ok_or("an IPv6 address needs its closing \"]\"")?;
        let after = &v6[end + 1..];
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or("expected \":<port>\" after \"]\"")?),
        };
        (&text[..end + 2], port)
    } else {
        match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err("empty host".into());
    }
    let port = match port {
        None => None,
        Some(p) => {
            Some(p.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| format!("port {p:?} is not 1..=65535"))?)
        }
    };
    Ok((host, port))
}

/// One node's URL, checked by the client library.
fn node_url(
    scheme: &str,
    userinfo: Option<&str>,
    host: &str,
    port: u16,
    db: u16,
    shown: &str,
) -> Result<String, String> {
    let auth = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let url = format!("{scheme}://{auth}{host}:{port}/{db}");
    url.as_str().into_connection_info().map_err(|e| format!("{shown:?}: host {host:?}:{port}: {e}"))?;
    Ok(url)
}

/// The URL with its password (if any) replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    let user = rest[..at].split_once(':').map_or(&rest[..at], |(user, _)| user);
    let masked = if rest[..at].contains(':') { format!("{user}:***") } else { "***".to_string() };
    format!("{scheme}://{masked}{}", &rest[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single() {
        assert_eq!(
            parse_redis_url("redis://127.0.0.1:6379/0"),
            Ok(RedisTopology::Single("redis://127.0.0.1:6379/0".into()))
        );
        assert!(parse_redis_url("http://x").is_err());
        assert!(parse_redis_url("127.0.0.1:6379").is_err());
    }

    #[test]
    fn cluster() {
        assert_eq!(
            parse_redis_url("redis+cluster://10.0.0.1:7000,10.0.0.2,[::1]:7002/"),
            Ok(RedisTopology::Cluster(vec![
                "redis://10.0.0.1:7000/0".into(),
                "redis://10.0.0.2:6379/0".into(),
                "redis://[::1]:7002/0".into()
            ]))
        );
        assert_eq!(
            parse_redis_url("redis+cluster://:s%40cret@h1:7000,h2:7001"),
            Ok(RedisTopology::Cluster(vec![
                "redis://:s%40cret@h1:7000/0".into(),
                "redis://:s%40cret@h2:7001/0".into()
            ]))
        );
        for (bad, needle) in [
            ("redis+cluster://", "lists no host"),
            ("redis+cluster://h1:7000,,h2:7001", "host 2"),
            ("redis+cluster://h1:7000,h2:x", "port \"x\""),
            ("redis+cluster://h1:70000", "port \"70000\""),
            ("redis+cluster://h1:0", "port \"0\""),
            ("redis+cluster://h1:7000/3", "takes no path"),
            ("redis+cluster://h1:7000?protocol=3", "query"),
            ("redis+cluster://[::1:7000", "closing"),
        ] {
            let err = parse_redis_url(bad).expect_err(bad);
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn sentinel() {
        assert_eq!(
            parse_redis_url("redis+sentinel://:pw@s1:26380,s2/mymaster/2"),
            Ok(RedisTopology::Sentinel {
                sentinels: vec!["redis://s1:26380/0".into(), "redis://s2:26379/0".into()],
                master: "mymaster".into(),
                data_node: "redis://:pw@127.0.0.1:6379/2".into(),
                tls: false,
            })
        );
        assert_eq!(
            parse_redis_url("rediss+sentinel://s1/mymaster"),
            Ok(RedisTopology::Sentinel {
                sentinels: vec!["rediss://s1:26379/0".into()],
                master: "mymaster".into(),
                data_node: "rediss://127.0.0.1:6379/0".into(),
                tls: true,
            })
        );
        for (bad, needle) in [
            ("redis+sentinel://s1:26379", "names no master"),
            ("redis+sentinel://s1:26379/", "names no master"),
            ("redis+sentinel://s1:26379/m/x", "db after the master name"),
            ("redis+sentinel://s1:26379/m/1/2", "unexpected \"2\""),
            ("redis+sentinel:///m", "lists no host"),
            ("redis+sentinels://s1/m", "unknown scheme"),
        ] {
            let err = parse_redis_url(bad).expect_err(bad);
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn errors_hide_the_password() {
        assert_eq!(redact("redis+cluster://user:secret@h1:1,h2:2"), "redis+cluster://user:***@h1:1,h2:2");
        assert_eq!(redact("redis://:secret@h/0"), "redis://:***@h/0");
        assert_eq!(redact("redis://token@h/0"), "redis://***@h/0");
        assert_eq!(redact("redis://h/0"), "redis://h/0");
        let err = parse_redis_url("redis+cluster://:secret@h1:x").unwrap_err();
        assert!(!err.contains("secret") && err.contains("***"), "{err}");
        let err = parse_redis_url("redis+sentinel://:secret@s1").unwrap_err();
        assert!(!err.contains("secret"), "{err}");
    }
}
