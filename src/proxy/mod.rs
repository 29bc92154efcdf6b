//! The Pingora `ProxyHttp` implementation. Each phase only calls into the modules of the data path:
//! route match → key extraction → limit decision (`limiting`) → forward, delay or reject; then the
//! access log and metrics when the request ends.

mod access_log;
pub mod conn_limiting;
mod headers;
mod lease;
pub mod limiting;
mod respond;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use http::header::HOST;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};

use crate::config::{allowed, FailurePolicy, Runtime};
use crate::keys::{self, RequestFacts};
use crate::metrics::METRICS;
use crate::routes;
use crate::store::{ConnStore, LimitStore, MemoryConnStore, MemoryStore};
use crate::upstream::ServerSlot;

use conn_limiting::ConnStores;
use lease::Lease;
use limiting::{request_cost, Action, LimitStatus, Stores};

pub struct WeirProxy {
    runtime: Arc<ArcSwap<Runtime>>,
    stores: Stores,
    conn_stores: ConnStores,
}

impl WeirProxy {
    /// `store` decides rates and `conn_store` concurrency; both outlive every reload.
    pub fn new(runtime: Arc<ArcSwap<Runtime>>, store: Arc<dyn LimitStore>, conn_store: Arc<dyn ConnStore>) -> Self {
        let stores = Stores { primary: store, local: MemoryStore::default() };
        let conn_stores = ConnStores { primary: conn_store, local: Arc::new(MemoryConnStore::default()) };
        Self { runtime, stores, conn_stores }
    }
}

/// Per-request state. `runtime` is the config snapshot the request started with, kept to its end,
/// so a reload never changes a request mid-flight.
pub struct RequestCtx {
    runtime: Arc<Runtime>,
    started: Instant,
    route: Option<usize>,
    client_ip: Option<IpAddr>,
    /// Rate-limit fields to add to the upstream's response.
    rate_headers: Vec<(&'static str, String)>,
    limit_status: Option<LimitStatus>,
    zone_statuses: Vec<(usize, LimitStatus)>,
    /// The metrics outcome label of this request.
    outcome: &'static str,
    delay: Duration,
    /// When the limits were decided (µs since the epoch), for the access log and `weir replay`.
    decided_us: Option<u64>,
    upstream_sent: Option<Instant>,
    upstream_time: Option<Duration>,
    /// Concurrency leases held until the request ends.
    leases: Vec<Lease>,
    conn_statuses: Vec<(usize, LimitStatus)>,
    /// The upstream server chosen, holding its `max_conns` place.
    slot: Option<ServerSlot>,
}

#[async_trait]
impl ProxyHttp for WeirProxy {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            runtime: self.runtime.load_full(),
            started: Instant::now(),
            route: None,
            client_ip: None,
            rate_headers: Vec::new(),
            limit_status: None,
            zone_statuses: Vec::new(),
            outcome: "unlimited",
            delay: Duration::ZERO,
            decided_us: None,
            upstream_sent: None,
            upstream_time: None,
            leases: Vec::new(),
            conn_statuses: Vec::new(),
            slot: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let rt = ctx.runtime.clone();
        let req = session.req_header();
        let peer = session.client_addr().and_then(|a| a.as_inet()).map(|a| a.ip());
        ctx.client_ip = keys::client_ip(peer, &req.headers, rt.real_ip.as_ref());
        let host = req.headers.get(HOST).and_then(|h| h.to_str().ok()).or_else(|| req.uri.host());
        let Some(route_index) = routes::find(&rt.matchers, host, &req.method, req.uri.path()) else {
            ctx.outcome = "no_route";
            let body = "{\"error\":\"no_route\",\"detail\":\"no route matches this request\"}\n".to_string();
            return respond::json(session, 404, &[], body).await;
        };
        ctx.route = Some(route_index);
        let route = &rt.routes[route_index];

        // Like nginx's allow/deny, on the real client address; checked first so that refused
        // clients never touch limit state.
        if let Some(ip) = ctx.client_ip {
            if !allowed(&route.access, ip) {
                ctx.outcome = "denied";
                let body = format!("{{\"error\":\"forbidden\",\"route\":\"{}\"}}\n", route.name);
                return respond::json(session, 403, &[], body).await;
            }
        }

        let cost = match request_cost(&route.cost, &req.headers) {
            Ok(cost) => cost,
            Err(detail) => {
                ctx.outcome = "bad_request";
                let body = format!("{{\"error\":\"bad_cost\",\"route\":\"{}\",\"detail\":\"{detail}\"}}\n", route.name);
                return respond::json(session, 400, &[], body).await;
            }
        };

        // Every key is extracted up front: the request header is not borrowed across awaits.
        let facts = RequestFacts { client_ip: ctx.client_ip, headers: &req.headers, query: req.uri.query() };
        let keyed = limiting::keyed_zones(&rt, route, &facts, cost);
        let keyed_conns = conn_limiting::keyed_conns(&rt, route, &facts);

        if !keyed.is_empty() {
            ctx.decided_us = Some(crate::limit::Clock::now_us(&crate::limit::SystemClock));
            let enforcement = limiting::enforce(&rt, route, &keyed, &self.stores).await;
            ctx.limit_status = enforcement.status;
            ctx.zone_statuses = enforcement.zones;
            ctx.outcome = match (enforcement.fallback, enforcement.status) {
                (Some(FailurePolicy::Allow), _) => "fail_open",
                (Some(FailurePolicy::Deny), _) => "fail_closed",
                (_, Some(status)) => status.metric_label(),
                (_, None) => "unlimited",
            };
            match enforcement.action {
                Action::Reject { status, body } => {
                    return respond::json(session, status, &enforcement.headers, body).await;
                }
                Action::Delay(delay) => {
                    // A timer on the proxy's runtime: this request waits, nothing else does.
                    ctx.delay = delay;
                    METRICS.delay_seconds.with_label_values(&[&route.name]).observe(delay.as_secs_f64());
                    tokio::time::sleep(delay).await;
                }
                Action::Forward => {}
            }
            ctx.rate_headers = enforcement.headers;
        }

        // limit_conn after limit_req, like nginx: a delayed request is not counted while it waits,
        // and a rejected one never takes a lease.
        if !keyed_conns.is_empty() {
            let conn = conn_limiting::acquire(&rt, route, &keyed_conns, &self.conn_stores).await;
            ctx.leases = conn.leases;
            ctx.conn_statuses = conn.zones;
            if let Some(reject) = conn.reject {
                ctx.outcome = match conn.fallback {
                    Some(FailurePolicy::Deny) => "fail_closed",
                    _ => "conn_rejected",
                };
                return respond::json(session, reject.status, &reject.headers, reject.body).await;
            }
        }

        let Some(slot) = rt.upstreams.get(route.upstream).and_then(|u| u.pick()) else {
            ctx.outcome = "upstream_busy";
            let body = format!("{{\"error\":\"upstream_busy\",\"route\":\"{}\",\"retry_after\":1}}\n", route.name);
            return respond::json(session, 503, &[("Retry-After", "1".to_string())], body).await;
        };
        ctx.slot = Some(slot);
        Ok(false)
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut RequestCtx) -> Result<Box<HttpPeer>> {
        let addr = ctx
            .slot
            .as_ref()
            .map(|s| s.addr)
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no upstream server for this request"))?;
        Ok(Box::new(HttpPeer::new(addr, false, String::new())))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        _upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.upstream_sent = Some(Instant::now());
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.upstream_time = ctx.upstream_sent.map(|t| t.elapsed());
        for (name, value) in ctx.rate_headers.drain(..) {
            resp.insert_header(name, value)?;
        }
        Ok(())
    }

    async fn logging(&self, session: &mut Session, error: Option<&Error>, ctx: &mut RequestCtx) {
        // The request is over, however it ended: give back its concurrency slots first.
        for lease in ctx.leases.drain(..) {
            lease.release().await;
        }
        ctx.slot = None;
        let rt = &ctx.runtime;
        let route = ctx.route.and_then(|i| rt.routes.get(i)).map_or("-", |r| r.name.as_str());
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        METRICS.requests.with_label_values(&[route, ctx.outcome]).inc();
        for (zone, zone_status) in &ctx.zone_statuses {
            METRICS.zone_decisions.with_label_values(&[&rt.zones[*zone].name, zone_status.metric_label()]).inc();
        }
        for (zone, zone_status) in &ctx.conn_statuses {
            METRICS.conn_decisions.with_label_values(&[&rt.conn_zones[*zone].name, zone_status.metric_label()]).inc();
        }
        if let Some(upstream_time) = ctx.upstream_time {
            METRICS.upstream_responses.with_label_values(&[route, &status.to_string()]).inc();
            METRICS.upstream_duration.with_label_values(&[route]).observe(upstream_time.as_secs_f64());
        }
        if rt.log.access_log {
            access_log::write(session, error, ctx, route, status);
        }
    }
}
