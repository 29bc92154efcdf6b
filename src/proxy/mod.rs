//! The Pingora `ProxyHttp` implementation. Each phase only calls into the modules of the data path:
//! route match → key extraction → limit decision → forward, delay or reject.

mod headers;
mod respond;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use http::header::HOST;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};
use tracing::{debug, info, warn};

use crate::config::Runtime;
use crate::keys::{self, RequestFacts};
use crate::routes;
use crate::store::{LimitStore, ZoneCheck};

use headers::ZoneInfo;

pub struct WeirProxy {
    runtime: Arc<ArcSwap<Runtime>>,
    store: Arc<dyn LimitStore>,
}

impl WeirProxy {
    pub fn new(runtime: Arc<ArcSwap<Runtime>>, store: Arc<dyn LimitStore>) -> Self {
        Self { runtime, store }
    }
}

/// Per-request state: the config snapshot the request started with (kept to its end, so a reload
/// never changes a request mid-flight), its route and the headers to add to the response.
pub struct RequestCtx {
    runtime: Arc<Runtime>,
    route: Option<usize>,
    rate_headers: Vec<(&'static str, String)>,
}

/// How the limits treated one request, in nginx's `$limit_req_status` words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LimitStatus {
    Passed,
    Delayed,
    Rejected,
    DelayedDryRun,
    RejectedDryRun,
}

#[async_trait]
impl ProxyHttp for WeirProxy {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            runtime: self.runtime.load_full(),
            route: None,
            rate_headers: Vec::new(),
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let rt = ctx.runtime.clone();
        let req = session.req_header();
        let host = req
            .headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri.host());
        let Some(route_index) = routes::find(&rt.matchers, host, &req.method, req.uri.path())
        else {
            let body = "{\"error\":\"no_route\",\"detail\":\"no route matches this request\"}\n"
                .to_string();
            return respond::json(session, 404, &[], body).await;
        };
        ctx.route = Some(route_index);
        let route = &rt.routes[route_index];
        if route.limits.is_empty() {
            return Ok(false);
        }

        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        let facts = RequestFacts {
            client_ip: keys::client_ip(peer, &req.headers, rt.real_ip.as_ref()),
            headers: &req.headers,
            query: req.uri.query(),
        };
        // Empty keys are not limited (nginx's allow-list idiom), so only keyed zones take part.
        let keyed: Vec<(usize, Vec<u8>)> = route
            .limits
            .iter()
            .enumerate()
            .map(|(i, l)| (i, rt.zones[l.zone].key.extract(&facts)))
            .filter(|(_, key)| !key.is_empty())
            .collect();
        if keyed.is_empty() {
            return Ok(false);
        }
        const COST: u64 = 1;
        let checks: Vec<ZoneCheck<'_>> = keyed
            .iter()
            .map(|(i, key)| {
                let zl = &route.limits[*i];
                ZoneCheck {
                    zone: &rt.zones[zl.zone].name,
                    key,
                    limit: zl.limit,
                    cost: COST,
                }
            })
            .collect();
        let infos: Vec<ZoneInfo<'_>> = checks
            .iter()
            .map(|c| ZoneInfo {
                name: c.zone,
                limit: &c.limit,
                cost: c.cost,
            })
            .collect();

        let verdict = match self.store.decide(&checks).await {
            Ok(v) => v,
            Err(e) => {
                // Fail open for now; the configurable failure policy is a separate feature.
                warn!(route = %route.name, store = self.store.kind(), error = %e, "limit store failed; request allowed");
                return Ok(false);
            }
        };
        let mut rate_headers = vec![
            ("RateLimit-Policy", headers::policy(&infos)),
            ("RateLimit", headers::remaining(&infos, &verdict)),
        ];
        let status = match (verdict.admitted, verdict.delay_us > 0, route.dry_run) {
            (false, _, false) => LimitStatus::Rejected,
            (false, _, true) => LimitStatus::RejectedDryRun,
            (true, true, false) => LimitStatus::Delayed,
            (true, true, true) => LimitStatus::DelayedDryRun,
            (true, false, _) => LimitStatus::Passed,
        };
        debug!(route = %route.name, ?status, delay_us = verdict.delay_us, "limit_req decision");

        match status {
            LimitStatus::Rejected => {
                let zone = headers::rejecting_zone(&infos, &verdict).unwrap_or("");
                let retry = verdict.retry_after_us.map(headers::retry_after_secs);
                if let Some(secs) = retry {
                    rate_headers.push(("Retry-After", secs.to_string()));
                }
                let body = headers::rejection_body(&route.name, zone, retry);
                return respond::json(session, route.status, &rate_headers, body).await;
            }
            LimitStatus::Delayed => {
                // A timer on the proxy's runtime: this request waits, nothing else does.
                tokio::time::sleep(Duration::from_micros(verdict.delay_us)).await;
            }
            LimitStatus::RejectedDryRun | LimitStatus::DelayedDryRun => {
                info!(route = %route.name, ?status, "dry run: request forwarded unchanged");
            }
            LimitStatus::Passed => {}
        }
        ctx.rate_headers = rate_headers;
        Ok(false)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let rt = &ctx.runtime;
        let route = ctx.route.and_then(|i| rt.routes.get(i));
        let addr = route
            .and_then(|r| rt.upstreams.get(r.upstream))
            .and_then(|u| u.pick())
            .ok_or_else(|| {
                Error::explain(
                    ErrorType::InternalError,
                    "no upstream server for this request",
                )
            })?;
        Ok(Box::new(HttpPeer::new(addr, false, String::new())))
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        for (name, value) in ctx.rate_headers.drain(..) {
            resp.insert_header(name, value)?;
        }
        Ok(())
    }
}
