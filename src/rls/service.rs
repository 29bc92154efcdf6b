//! `ShouldRateLimit`: one call is one decision — plan the descriptors, decide through
//! the call's engine ticket (`Ticket::rule_zones`), answer; then write its access-log line and
//! finish the ticket (which reports the call).

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use tonic::{Request, Response, Status};
use tracing::Level;

use super::plan::{self, Plan};
use super::proto::rate_limit_response::Code;
use super::proto::{RateLimitRequest, RateLimitResponse, RateLimitService};
use super::{answer, decide};
use crate::config::{FailurePolicy, Runtime};
use crate::engine::LimitStatus;
use crate::engine::Stores;
use crate::engine::{Ending, Outcome, Report, Ticket};
use crate::logging::{self, line};
use crate::metrics::METRICS;

/// Access-log lines of the rate limit service: the proxy's target, with `front_door = "rls"`.
const TARGET: &str = "weir::access";

pub struct RlsService {
    runtime: Arc<ArcSwap<Runtime>>,
    stores: Stores,
}

impl RlsService {
    pub fn new(runtime: Arc<ArcSwap<Runtime>>, stores: Stores) -> Self {
        Self { runtime, stores }
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        // One config snapshot for the whole call: a reload swaps the rules for the next one.
        let rt = self.runtime.load_full();
        let Some(settings) = rt.rls.as_ref() else {
            return Err(Status::unavailable("the rate limit service is not configured ([rls]); reload pending?"));
        };
        let trace_parent = crate::trace::rls_parent(request.metadata());
        let req = request.into_inner();
        let domain = settings.domain(&req.domain);
        let domain_label = domain.map_or("-", |d| d.name.as_str());
        // The call's ticket: it reports the call (`weir_rls_requests_total`, the zones' words)
        // when it is finished, whatever happens below.
        let mut ticket = Ticket::for_rls(rt.clone(), domain_label, self.stores.observer);
        let plan = match plan::plan(&rt, domain, &req, settings.max_descriptors) {
            Ok(plan) => plan,
            Err(invalid) => {
                ticket.settle_as(Outcome::BadRequest);
                finish(trace_parent, started, domain_label, &req, Vec::new(), "INVALID_ARGUMENT");
                ticket.finish(Ending::Over, 0, &self.stores).await;
                return Err(Status::invalid_argument(invalid.0));
            }
        };
        let unmatched = plan.unmatched();
        if unmatched > 0 {
            METRICS.rls_unmatched.with_label_values(&[domain_label]).inc_by(unmatched as u64);
        }
        let response = match domain {
            Some(domain) if !plan.keyed.is_empty() => {
                let decided = decide::decide(&mut ticket, &domain.route, plan, &self.stores).await;
                let response = answer::respond(&decided.plan, &decided.zones, &decided.call);
                let report = ticket.report();
                access_log(&req, &decided.plan, Some(&report), &response, &rt, started);
                finish(trace_parent, started, domain_label, &req, zone_words(&rt, &report), code(&response));
                response
            }
            _ => {
                // Nothing to decide: every descriptor is unmatched or unlimited (or the domain unknown).
                let response = answer::undecided(&plan);
                access_log(&req, &plan, None, &response, &rt, started);
                finish(trace_parent, started, domain_label, &req, Vec::new(), "OK");
                response
            }
        };
        ticket.finish(Ending::Over, 0, &self.stores).await;
        Ok(Response::new(response))
    }
}

/// The call's latency and trace span (after its answer is built).
fn finish(
    parent: Option<opentelemetry::Context>,
    started: Instant,
    domain: &str,
    req: &RateLimitRequest,
    zones: Vec<String>,
    code: &str,
) {
    METRICS.rls_duration.with_label_values(&[domain]).observe(started.elapsed().as_secs_f64());
    let call = crate::trace::RlsCall { domain, descriptors: req.descriptors.len(), zones, code };
    crate::trace::record_rls(parent, started, call);
}

fn code(response: &RateLimitResponse) -> &'static str {
    if response.overall_code == i32::from(Code::OverLimit) {
        "OVER_LIMIT"
    } else {
        "OK"
    }
}

/// `zone=STATUS` of each zone decided (the access log's `zones`).
fn zone_words(rt: &Runtime, report: &Report<'_>) -> Vec<String> {
    report.zone_words().map(|(z, s)| format!("{}={}", rt.zones[z].name, s.as_str())).collect()
}

/// One JSON (or text) line per decision, beside the proxy's request lines.
fn access_log(
    req: &RateLimitRequest,
    plan: &Plan<'_>,
    report: Option<&Report<'_>>,
    response: &RateLimitResponse,
    rt: &Runtime,
    started: Instant,
) {
    if !rt.log.access_log || !tracing::enabled!(target: "weir::access", Level::INFO) {
        return;
    }
    let code = if response.overall_code == i32::from(Code::OverLimit) { "OVER_LIMIT" } else { "OK" };
    let limit_req = report.and_then(|r| r.limit_req).map_or("-", LimitStatus::as_str);
    let zones = report.map(|r| zone_words(rt, r)).unwrap_or_default();
    let zones = if zones.is_empty() { "-".to_string() } else { zones.join(",") };
    let fallback = report.and_then(|r| r.fallback).map_or("-", FailurePolicy::as_str);
    let decided_us = report.and_then(|r| r.decided_us);
    let took_us = started.elapsed().as_micros() as u64;
    // The domain is the caller's: escaped and cut in every format.
    let domain = logging::caller::caller_text(&req.domain);
    if logging::json_lines() {
        line::write_json(Level::INFO, TARGET, "rls", |o| {
            o.str("front_door", "rls");
            o.str("domain", &domain);
            o.u64("descriptors", req.descriptors.len() as u64);
            o.u64("unmatched", plan.unmatched() as u64);
            o.str("code", code);
            o.str("limit_req", limit_req);
            o.str("zones", &zones);
            o.str("fallback", fallback);
            if let Some(d) = decided_us {
                o.u64("decided_us", d);
            }
            o.u64("took_us", took_us);
        });
    } else {
        tracing::info!(
            target: "weir::access",
            front_door = "rls",
            domain = %domain,
            descriptors = req.descriptors.len(),
            unmatched = plan.unmatched(),
            code,
            limit_req,
            zones = %zones,
            fallback,
            took_us,
            "rls"
        );
    }
}
