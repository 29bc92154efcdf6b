//! Active health checks, built on Pingora's `TcpHealthCheck` and `HttpHealthCheck`: `rise`
//! consecutive passes bring a server back, `fall` consecutive failures take it out. Changes are
//! logged and exported as metrics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use pingora::http::RequestHeader;
use pingora::lb::health_check::{HealthCheck, HealthObserve, HttpHealthCheck, TcpHealthCheck};
use pingora::lb::Backend;
use pingora::prelude::*;

use super::server_state::{lock, States};
use super::{CheckKind, HealthCheckSpec, UpstreamSpec};
use crate::metrics::METRICS;

/// Logs health changes and counts them; a server coming back also forgets its passive failures.
struct Observer {
    upstream: String,
    states: States,
}

#[async_trait]
impl HealthObserve for Observer {
    async fn observe(&self, target: &Backend, healthy: bool) {
        let server = target.addr.to_string();
        if healthy {
            let state = super::member_key(&target.addr).and_then(|a| lock(&self.states).get(&a).cloned());
            if let Some(state) = state {
                state.clear_failures();
            }
            tracing::info!(upstream = %self.upstream, %server, "upstream server is healthy again (active check)");
        } else {
            tracing::warn!(upstream = %self.upstream, %server, "upstream server is unhealthy (active check)");
        }
        let to = if healthy { "up" } else { "down" };
        METRICS.upstream_health_changes.with_label_values(&[&self.upstream, &server, to]).inc();
        // At once rather than at the next refresh (passive health may still keep it out).
        if !healthy {
            METRICS.upstream_server_up.with_label_values(&[&self.upstream, &server]).set(0);
        }
    }
}

pub(super) fn build(
    upstream: &UpstreamSpec,
    spec: &HealthCheckSpec,
    states: States,
) -> Box<dyn HealthCheck + Send + Sync + 'static> {
    let observer = Box::new(Observer { upstream: upstream.name.clone(), states });
    match &spec.kind {
        CheckKind::Tcp => {
            let mut check = TcpHealthCheck::new();
            check.consecutive_success = spec.rise;
            check.consecutive_failure = spec.fall;
            check.peer_template.options.connection_timeout = Some(spec.timeout);
            check.health_changed_callback = Some(observer);
            if let Some(port) = spec.port {
                return Box::new(PortOverride { inner: check, port });
            }
            check
        }
        CheckKind::Http { .. } if upstream.tls.is_some() => Box::new(TlsHttpChecks {
            upstream: upstream.clone(),
            spec: spec.clone(),
            observer,
            checks: Mutex::new(HashMap::new()),
        }),
        CheckKind::Http { .. } => {
            let mut check = http_check(upstream, spec, String::new());
            check.health_changed_callback = Some(observer);
            Box::new(check)
        }
    }
}

/// Pingora's HTTP(S) check with the upstream's connection settings and `sni`.
fn http_check(upstream: &UpstreamSpec, spec: &HealthCheckSpec, sni: String) -> HttpHealthCheck {
    let CheckKind::Http { path, host, statuses } = &spec.kind else {
        return HttpHealthCheck::new("", false);
    };
    let mut check = HttpHealthCheck::new(host, upstream.tls.is_some());
    check.peer_template.sni = sni;
    super::tls::apply_options(&mut check.peer_template, upstream);
    check.consecutive_success = spec.rise;
    check.consecutive_failure = spec.fall;
    check.peer_template.options.connection_timeout = Some(spec.timeout);
    check.peer_template.options.read_timeout = Some(spec.timeout);
    check.peer_template.options.write_timeout = Some(spec.timeout);
    check.port_override = spec.port;
    // The path and host were validated at compile time; a failure here keeps GET /.
    if let Ok(mut req) = RequestHeader::build("GET", path.as_bytes(), None) {
        if req.append_header("Host", host.as_str()).is_ok()
            && req.append_header("User-Agent", "weir-health-check").is_ok()
        {
            check.req = req;
        }
    }
    let statuses = statuses.clone();
    check.validator = Some(Box::new(move |resp| {
        let code = resp.status.as_u16();
        if statuses.iter().any(|(lo, hi)| (*lo..=*hi).contains(&code)) {
            Ok(())
        } else {
            Error::e_explain(ErrorType::CustomCode("unexpected status", code), "during http health check")
        }
    }));
    check
}

/// The name a server is checked (and verified) as over TLS, carried by its `Backend`.
#[derive(Clone)]
pub(super) struct CheckSni(pub String);

/// HTTPS checks that verify each server like its requests do: Pingora's check has one SNI, so
/// there is one per name (the upstream's `sni`, or each server entry's host), made on first use.
struct TlsHttpChecks {
    upstream: UpstreamSpec,
    spec: HealthCheckSpec,
    observer: Box<Observer>,
    checks: Mutex<HashMap<String, Arc<HttpHealthCheck>>>,
}

#[async_trait]
impl HealthCheck for TlsHttpChecks {
    async fn check(&self, target: &Backend) -> Result<()> {
        let sni = target.ext.get::<CheckSni>().map_or_else(String::new, |s| s.0.clone());
        let check = {
            let mut checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
            checks.entry(sni.clone()).or_insert_with(|| Arc::new(http_check(&self.upstream, &self.spec, sni))).clone()
        };
        check.check(target).await
    }

    async fn health_status_change(&self, target: &Backend, healthy: bool) {
        self.observer.observe(target, healthy).await
    }

    fn health_threshold(&self, success: bool) -> usize {
        if success {
            self.spec.rise
        } else {
            self.spec.fall
        }
    }
}

/// A TCP check on another port of the server's address.
struct PortOverride {
    inner: Box<TcpHealthCheck>,
    port: u16,
}

#[async_trait]
impl HealthCheck for PortOverride {
    async fn check(&self, target: &Backend) -> Result<()> {
        let mut target = target.clone();
        target.addr.set_port(self.port);
        self.inner.check(&target).await
    }

    async fn health_status_change(&self, target: &Backend, healthy: bool) {
        self.inner.health_status_change(target, healthy).await
    }

    fn health_threshold(&self, success: bool) -> usize {
        self.inner.health_threshold(success)
    }
}
