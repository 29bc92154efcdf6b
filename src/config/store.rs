//! The `[store]` section: where limit state lives and what happens when that store fails.

use std::time::Duration;

use super::spanned::Spanned;

use super::checks::parse_duration;
use super::error::{ConfigError, Source};
use super::schema;
use super::secrets::{url_with_password, Secrets};
use crate::store::{parse_redis_url, RedisClock, RedisStoreConfig, RedisTls};
use rustls_pki_types::pem::PemObject;

#[derive(Debug, Clone)]
pub enum StoreSettings {
    Memory,
    Redis(RedisStoreConfig, Resilience),
}

/// What happens when the shared store fails, and how to fail less often.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resilience {
    /// The default failure policy; routes may override it.
    pub on_error: FailurePolicy,
    /// Instances sharing the limits: the `local` policy gives each 1/N of every limit.
    pub fleet_size: u64,
    /// Entries of the deny cache; 0 turns it off.
    pub deny_cache_size: usize,
    /// Consecutive failures that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long a concurrency lease lives without renewal: a crashed proxy's slots come back
    /// after this. Leases are renewed every third of it while their request runs.
    pub lease_ttl: Duration,
    /// `coalesce`: the decision lanes (store/redis/lane.rs) for a plain `redis://` server or each master of a plain `redis+cluster://`.
    pub coalesce: bool,
}

pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// What a request gets when its limits cannot be decided by the shared store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Fail open: forward the request.
    Allow,
    /// Fail closed: reject with the route's status.
    Deny,
    /// Decide in-process with this instance's share (1/fleet_size) of each limit.
    Local,
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Allow => "allow",
            FailurePolicy::Deny => "deny",
            FailurePolicy::Local => "local",
        }
    }

    pub(super) fn parse(text: &str) -> Option<FailurePolicy> {
        match text {
            "allow" => Some(FailurePolicy::Allow),
            "deny" => Some(FailurePolicy::Deny),
            "local" => Some(FailurePolicy::Local),
            _ => None,
        }
    }
}

/// `cluster = ["redis://:pw@10.0.0.1:7000", "10.0.0.2:7001"]` as the equivalent
/// `redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7001` (credentials from the first entry that has
/// them), so both spellings take one path from here on.
fn cluster_url(src: &Source<'_>, list: &Spanned<Vec<Spanned<String>>>) -> Result<Spanned<String>, ConfigError> {
    if list.get_ref().is_empty() {
        return Err(src.error_at(&list.span(), "store.cluster: list at least one node, e.g. [\"10.0.0.1:7000\"]"));
    }
    let mut credentials = None;
    let mut hosts = Vec::new();
    for node in list.get_ref() {
        let text = node.get_ref();
        let rest = match text.split_once("://") {
            Some(("redis", rest)) => rest,
            Some(_) => {
                return Err(src.error_at(&node.span(), "store.cluster: nodes are host:port or redis://host:port"));
            }
            None => text.as_str(),
        };
        let (auth, host) = match rest.rsplit_once('@') {
            Some((auth, host)) => (Some(auth), host),
            None => (None, rest),
        };
        if host.is_empty() || host.contains('/') {
            return Err(src.error_at(
                &node.span(),
                format!("store.cluster: node {} must be host:port (no path)", hosts.len() + 1),
            ));
        }
        credentials = credentials.or(auth);
        hosts.push(host);
    }
    let auth = credentials.map_or(String::new(), |a| format!("{a}@"));
    Ok(Spanned::new(list.span(), format!("redis+cluster://{auth}{}", hosts.join(","))))
}

/// `tls_ca`, `tls_cert`, `tls_key`: only with a `rediss://` URL; every file is read and checked
/// here (the CA parses, the client key matches its certificate).
fn redis_tls(
    src: &Source<'_>,
    url: &str,
    ca: Option<Spanned<String>>,
    cert: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
) -> Result<Option<std::sync::Arc<RedisTls>>, ConfigError> {
    let Some(first) = [&ca, &cert, &key].into_iter().flatten().next() else { return Ok(None) };
    let field = if ca.is_some() { "tls_ca" } else { "tls_cert" };
    if !url.starts_with("rediss") {
        return Err(src.error_at(
            &first.span(),
            format!(
                "store.{field}: the url does not use TLS; write rediss:// (or rediss+cluster://, rediss+sentinel://)"
            ),
        ));
    }
    let base = super::tls::base_dir(src.file);
    let ca = match ca {
        None => None,
        Some(ca) => {
            let path = super::tls::resolve(&base, ca.get_ref());
            let pem = src
                .outside
                .read(&path)
                .map_err(|e| src.error_at(&ca.span(), format!("store.tls_ca: cannot read {}: {e}", path.display())))?;
            let certs = rustls_pki_types::CertificateDer::pem_slice_iter(&pem).filter(|c| c.is_ok()).count();
            if certs == 0 {
                return Err(
                    src.error_at(&ca.span(), format!("store.tls_ca: {} holds no PEM certificate", path.display()))
                );
            }
            Some((path, pem))
        }
    };
    let client = match (cert, key) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            let cert_path = super::tls::resolve(&base, cert.get_ref());
            let key_path = super::tls::resolve(&base, key.get_ref());
            let read = |p: &std::path::Path, what: &str| {
                src.outside.read(p).map_err(|e| {
                    src.error_at(&cert.span(), format!("store.tls_cert: cannot read the {what} {}: {e}", p.display()))
                })
            };
            let (cert_pem, key_pem) = (read(&cert_path, "certificate")?, read(&key_path, "key")?);
            // Checked as a pair here; redis-rs is handed the bytes.
            crate::tls::parse_pair(&cert_path, cert_pem.clone(), &key_path, &key_pem)
                .map_err(|e| src.error_at(&cert.span(), format!("store.tls_cert: {e}")))?;
            Some((cert_path.clone(), cert_pem, key_pem))
        }
        (Some(one), None) | (None, Some(one)) => {
            return Err(src.error_at(&one.span(), "store.tls_cert and store.tls_key: give both, or neither"))
        }
    };
    let (ca_file, ca_pem) = ca.map_or((None, None), |(p, pem)| (Some(p), Some(pem)));
    Ok(Some(std::sync::Arc::new(RedisTls { ca_file, ca_pem, client })))
}

pub(super) fn compile_store(
    src: &Source<'_>,
    store: Option<Spanned<schema::Store>>,
    secrets: &mut Secrets,
) -> Result<StoreSettings, ConfigError> {
    let Some(store) = store else {
        return Ok(StoreSettings::Memory);
    };
    let schema::Store {
        kind,
        url,
        url_file,
        password,
        password_file,
        timeout,
        clock,
        key_prefix,
        on_error,
        fleet_size,
        deny_cache_size,
        circuit_breaker_failures,
        lease_ttl,
        coalesce,
        cluster,
        tls_ca,
        tls_cert,
        tls_key,
    } = store.into_inner();
    match kind.get_ref().as_str() {
        "memory" => {
            let redis_only = [
                ("url", url.map(|u| u.span())),
                ("url_file", url_file.map(|u| u.span())),
                ("password", password.map(|u| u.span())),
                ("password_file", password_file.map(|u| u.span())),
                ("timeout", timeout.map(|t| t.span())),
                ("clock", clock.map(|c| c.span())),
                ("key_prefix", key_prefix.map(|k| k.span())),
                ("on_error", on_error.map(|k| k.span())),
                ("fleet_size", fleet_size.map(|k| k.span())),
                ("deny_cache_size", deny_cache_size.map(|k| k.span())),
                ("circuit_breaker_failures", circuit_breaker_failures.map(|k| k.span())),
                ("lease_ttl", lease_ttl.map(|k| k.span())),
                ("coalesce", coalesce.as_ref().map(|k| k.span())),
                ("cluster", cluster.as_ref().map(|k| k.span())),
                ("tls_ca", tls_ca.as_ref().map(|k| k.span())),
                ("tls_cert", tls_cert.as_ref().map(|k| k.span())),
                ("tls_key", tls_key.as_ref().map(|k| k.span())),
            ];
            if let Some((field, Some(span))) = redis_only.into_iter().find(|(_, s)| s.is_some()) {
                return Err(src.error_at(&span, format!("store.{field}: only applies to kind = \"redis\"")));
            }
            Ok(StoreSettings::Memory)
        }
        "redis" => {
            let url = secrets.value_or_file(src, "store.url", url, url_file)?;
            let password = secrets.value_or_file(src, "store.password", password, password_file)?;
            let url = match (url, cluster) {
                (Some(u), Some(c)) => {
                    let at = if c.span().start > u.span().start { c.span() } else { u.span() };
                    return Err(src.error_at(&at, "store.cluster: give either url or cluster, not both"));
                }
                (None, Some(c)) => Some(cluster_url(src, &c)?),
                (url, None) => url,
            };
            let url = url.ok_or_else(|| {
                src.error_at(
                    &kind.span(),
                    "store.url: required with kind = \"redis\", e.g. \"redis://127.0.0.1:6379/0\", \
                     \"redis+cluster://10.0.0.1:7000,10.0.0.2:7001\" or \"redis+sentinel://10.0.0.1:26379/mymaster\"",
                )
            })?;
            let url = match password {
                None => url,
                Some(pw) => Spanned::new(
                    url.span(),
                    url_with_password(url.get_ref(), pw.get_ref()).map_err(|e| src.error_at(&pw.span(), e))?,
                ),
            };
            // redis://, rediss://, redis+cluster://, rediss+cluster:// or redis+sentinel://.
            if let Err(e) = parse_redis_url(url.get_ref()) {
                return Err(src.error_at(&url.span(), format!("store.url: {e}")));
            }
            let timeout = match timeout {
                None => Duration::from_millis(25),
                // Every limited request may wait this long: a minute is already far past useful.
                Some(t) => parse_duration(t.get_ref())
                    .filter(|d| !d.is_zero() && *d <= Duration::from_secs(60))
                    .ok_or_else(|| {
                        src.error_at(
                            &t.span(),
                            format!(
                                "store.timeout: expected a positive duration up to \"60s\" like \"25ms\" or \"1s\", \
                                 got {:?}",
                                t.get_ref()
                            ),
                        )
                    })?,
            };
            let clock = match clock.as_ref().map(|c| c.get_ref().as_str()) {
                None | Some("redis") => RedisClock::Redis,
                Some("local") => RedisClock::Local,
                Some(other) => {
                    let span = clock.as_ref().map(|c| c.span()).unwrap_or_default();
                    return Err(
                        src.error_at(&span, format!("store.clock: expected \"redis\" or \"local\", got {other:?}"))
                    );
                }
            };
            let key_prefix = key_prefix.map_or_else(|| "weir:".to_string(), |k| k.into_inner());
            let int_in =
                |v: &Option<Spanned<i64>>, field: &str, range: std::ops::RangeInclusive<i64>, default: i64| match v {
                    None => Ok(default),
                    Some(v) if range.contains(v.get_ref()) => Ok(*v.get_ref()),
                    Some(v) => Err(src.error_at(
                        &v.span(),
                        format!("store.{field}: must be {}..={}, got {}", range.start(), range.end(), v.get_ref()),
                    )),
                };
            let resilience = Resilience {
                on_error: match &on_error {
                    None => FailurePolicy::Local,
                    Some(p) => FailurePolicy::parse(p.get_ref()).ok_or_else(|| {
                        src.error_at(
                            &p.span(),
                            format!("store.on_error: expected \"allow\", \"deny\" or \"local\", got {:?}", p.get_ref()),
                        )
                    })?,
                },
                fleet_size: int_in(&fleet_size, "fleet_size", 1..=10_000, 1)? as u64,
                deny_cache_size: int_in(&deny_cache_size, "deny_cache_size", 0..=10_000_000, 10_000)? as usize,
                lease_ttl: match &lease_ttl {
                    None => DEFAULT_LEASE_TTL,
                    Some(t) => parse_duration(t.get_ref())
                        .filter(|d| *d >= Duration::from_secs(1) && *d <= Duration::from_secs(3600))
                        .ok_or_else(|| {
                            src.error_at(
                                &t.span(),
                                format!(
                                    "store.lease_ttl: expected a duration from \"1s\" to \"60m\", got {:?}",
                                    t.get_ref()
                                ),
                            )
                        })?,
                },
                breaker_failures: int_in(&circuit_breaker_failures, "circuit_breaker_failures", 1..=1_000, 3)? as u32,
                coalesce: coalesce.is_none_or(|c| c.into_inner()),
            };
            let tls = redis_tls(src, url.get_ref(), tls_ca, tls_cert, tls_key)?;
            Ok(StoreSettings::Redis(
                RedisStoreConfig { url: url.into_inner(), timeout, clock, key_prefix, tls },
                resilience,
            ))
        }
        other => {
            Err(src.error_at(&kind.span(), format!("store.kind: expected \"memory\" or \"redis\", got {other:?}")))
        }
    }
}

/// The `store` label of the config's store, as the store itself reports it (`LimitStore::kind`).
pub fn store_label(store: &StoreSettings) -> &'static str {
    match store {
        StoreSettings::Memory => "memory",
        StoreSettings::Redis(..) => "redis",
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Deserialize)]
    struct Wrapper {
        store: Option<Spanned<schema::Store>>,
    }

    fn compile(text: &str) -> Result<StoreSettings, ConfigError> {
        let wrapper: Wrapper = toml::from_str(text).expect("valid TOML");
        compile_store(
            &Source { file: "t.toml", text, outside: &crate::config::Machine },
            wrapper.store,
            &mut Secrets::default(),
        )
    }

    fn url_of(text: &str) -> String {
        match compile(text) {
            Ok(StoreSettings::Redis(cfg, _)) => cfg.url,
            other => panic!("expected redis, got {other:?}"),
        }
    }

    fn with_url(url: &str) -> String {
        format!("# weir\n[store]\nkind = \"redis\"\ntimeout = \"50ms\"\nurl = \"{url}\"\n")
    }

    #[test]
    fn cluster_and_sentinel_urls() {
        for url in [
            "redis://127.0.0.1:6379/0",
            "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002",
            "redis+cluster://:secret@10.0.0.1:7000",
            "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster",
            "redis+sentinel://:secret@127.0.0.1:26379/mymaster/3",
        ] {
            assert_eq!(url_of(&with_url(url)), url);
        }
    }

    #[test]
    fn cluster_list_is_the_cluster_url() {
        let text = "# weir\n[store]\nkind = \"redis\"\ncluster = [\"redis://:pw@10.0.0.1:7000\", \"10.0.0.2:7001\"]\n";
        assert_eq!(url_of(text), "redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7001");
        let both = "# weir\n[store]\nkind = \"redis\"\nurl = \"redis://h:1\"\ncluster = [\"h:2\"]\n";
        assert_eq!(compile(both).expect_err("both").line, Some(5));
        let bad = "# weir\n[store]\nkind = \"redis\"\ncluster = [\"h:7000/1\"]\n";
        assert!(compile(bad).expect_err("path").message.contains("node 1"));
        let empty = "# weir\n[store]\nkind = \"redis\"\ncluster = []\n";
        assert_eq!(compile(empty).expect_err("empty").line, Some(4));
    }

    #[test]
    fn malformed_urls_name_the_line() {
        for (url, needle) in [
            ("redis+cluster://", "lists no host"),
            ("redis+cluster://h1:7000,h2:notaport", "host 2"),
            ("redis+cluster://h1:7000,,h2:7001", "empty host"),
            ("redis+cluster://h1:7000/2", "takes no path"),
            ("redis+sentinel://127.0.0.1:26379", "names no master"),
            ("redis+sentinel://127.0.0.1:26379/mymaster/zero", "db after the master name"),
            ("redis+sentinel://:hunter2@127.0.0.1:99999/m", r#"port "99999""#),
            ("redis+cluster://h1:7000?protocol=3", "query"),
            ("http://h1:7000", "unknown scheme"),
            ("h1:7000", "not a redis://"),
        ] {
            let err = compile(&with_url(url)).expect_err(url);
            assert_eq!(err.line, Some(5), "{url}: {err}");
            assert!(err.message.starts_with("store.url: "), "{url}: {err}");
            assert!(err.message.contains(needle), "{url}: {needle:?} not in {err}");
            assert!(!err.to_string().contains("hunter2"), "password shown: {err}");
            assert!(err.to_string().starts_with("t.toml:5: "), "{err}");
        }
    }
}
