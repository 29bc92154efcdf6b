//! `StreamRateLimitQuotas`: the gRPC glue. Each stream is one task that reads the Envoy's reports,
//! asks the ledger (`ledger.rs`) and the division (`assign.rs`) for each bucket due, and writes
//! the assignments back; a timer a quarter interval long asks again for clamped buckets and
//! abandons quiet ones. The stream's decisions are `stream.rs`'s.
//!
//! A malformed stream is ended with a status that says what was wrong (INVALID_ARGUMENT, or
//! RESOURCE_EXHAUSTED for the bounds); other streams and the unary service are not touched. When
//! the ledger cannot be reached, a bucket gets no new assignment: its Envoy keeps the last one
//! until its time to live, then applies its `expired_assignment_behavior` (docs/rlqs.md).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::assign::{self, Budget, Grant};
use super::buckets;
use super::ledger::Ledger;
use super::live::{Divided, Live};
use super::stream::{recheck_after, Refusal, Sent, StreamState};
use crate::config::rls::{BucketLimit, QuotaSettings};
use crate::config::Runtime;
use crate::limit::{Clock, SystemClock};
use crate::metrics::METRICS;
use crate::rls::proto::quota::{
    bucket_action, AbandonAction, BlanketRule, BucketAction, BucketId, QuotaAssignmentAction, RateLimitQuotaResponse,
    RateLimitQuotaService, RateLimitQuotaUsageReports, RateLimitStrategy, Strategy, TokenBucket,
};

/// Answers queued for one stream's writer before the stream waits for the Envoy to read them.
const ANSWERS_QUEUED: usize = 8;
/// An answer holds actions up to about this many bytes, so it stays under the 64 KiB message
/// bound (an action is at most one bucket id of 16 KiB-sized entries and a token bucket).
const ANSWER_BYTES: usize = 32 * 1024;

pub struct QuotaService {
    runtime: Arc<ArcSwap<Runtime>>,
    ledger: Ledger,
    clock: Arc<dyn Clock>,
    /// This instance's name: with a stream counter, the prefix of every holder in the ledger.
    instance: String,
    next_stream: AtomicU64,
    /// The open streams' count and shares, for the admin's `GET /rlqs`.
    live: Arc<Live>,
}

impl QuotaService {
    pub fn new(runtime: Arc<ArcSwap<Runtime>>, ledger: Ledger, instance: String) -> Self {
        QuotaService {
            runtime,
            ledger,
            clock: Arc::new(SystemClock),
            instance,
            next_stream: AtomicU64::new(1),
            live: Arc::new(Live::default()),
        }
    }

    /// What the streams record for the admin's live view.
    pub fn live(&self) -> Arc<Live> {
        self.live.clone()
    }
}

/// The answers of one stream, as tonic reads them.
pub struct Answers(mpsc::Receiver<Result<RateLimitQuotaResponse, Status>>);

impl futures_util::Stream for Answers {
    type Item = Result<RateLimitQuotaResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// One open stream counted while it lives.
struct Open {
    count: Arc<AtomicUsize>,
    domain: Option<String>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
        if let Some(d) = &self.domain {
            METRICS.rlqs_streams.with_label_values(&[d]).dec();
        }
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let rt = self.runtime.load();
        let Some(settings) = rt.rls.as_ref().map(|r| r.quota) else {
            return Err(Status::unavailable("the rate limit service is not configured ([rls]); reload pending?"));
        };
        drop(rt);
        let count = self.live.open.fetch_add(1, Ordering::Relaxed) + 1;
        let open = Open { count: self.live.open.clone(), domain: None };
        if count > settings.max_streams {
            METRICS.rlqs_refused.with_label_values(&["-"]).inc();
            return Err(Status::resource_exhausted(format!(
                "weir: {} RLQS streams are open, the most this instance takes (rls.max_quota_streams)",
                settings.max_streams
            )));
        }
        let name = format!("{}-{}", self.instance, self.next_stream.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = mpsc::channel(ANSWERS_QUEUED);
        let task = StreamTask {
            runtime: self.runtime.clone(),
            ledger: self.ledger.clone(),
            live: self.live.clone(),
            trace_parent: crate::trace::rls_parent(request.metadata()),
            clock: self.clock.clone(),
            state: StreamState::new(name, self.clock.now_us()),
            tx,
            open,
        };
        tokio::spawn(task.run(request.into_inner()));
        Ok(Response::new(Answers(rx)))
    }
}

struct StreamTask {
    runtime: Arc<ArcSwap<Runtime>>,
    ledger: Ledger,
    live: Arc<Live>,
    /// The stream's `traceparent` (each report's span is its child); `None` with tracing off.
    trace_parent: Option<opentelemetry::Context>,
    clock: Arc<dyn Clock>,
    state: StreamState,
    tx: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    open: Open,
}

/// The interval and bounds in force (a reload applies to the next message).
fn settings(rt: &Runtime) -> QuotaSettings {
    rt.rls.as_ref().map(|r| r.quota).unwrap_or_default()
}

impl StreamTask {
    async fn run(mut self, mut inbound: Streaming<RateLimitQuotaUsageReports>) {
        let interval = settings(&self.runtime.load()).report_interval;
        let mut tick = tokio::time::interval(recheck_after(interval).max(Duration::from_millis(250)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let actions = tokio::select! {
                message = inbound.message() => match message {
                    Ok(Some(reports)) => {
                        let (started, buckets) = (std::time::Instant::now(), reports.bucket_quota_usages.len());
                        match self.on_reports(reports).await {
                            Ok(actions) => {
                                self.span(started, "report", buckets, &actions, "OK");
                                actions
                            }
                            Err(refusal) => {
                                let (status, code) = match refusal {
                                    Refusal::Invalid(m) => {
                                        (Status::invalid_argument(format!("weir rlqs: {m}")), "INVALID_ARGUMENT")
                                    }
                                    Refusal::Exhausted(m) => {
                                        (Status::resource_exhausted(format!("weir rlqs: {m}")), "RESOURCE_EXHAUSTED")
                                    }
                                };
                                self.span(started, "report", buckets, &[], code);
                                // Labelled only by a configured domain (`-` before one): never the
                                // caller's text.
                                let d = self.open.domain.as_deref().unwrap_or("-");
                                METRICS.rlqs_refused.with_label_values(&[d]).inc();
                                let _ = self.tx.send(Err(status)).await;
                                break;
                            }
                        }
                    }
                    // The Envoy closed its side.
                    Ok(None) => break,
                    // A message tonic cannot read (too large: OUT_OF_RANGE; not protobuf), or
                    // the stream broke: the status goes back, if anyone is there to read it.
                    Err(status) => {
                        let _ = self.tx.send(Err(status)).await;
                        break;
                    }
                },
                _ = tick.tick() => {
                    let started = std::time::Instant::now();
                    let actions = self.on_tick().await;
                    if !actions.is_empty() {
                        self.span(started, "timer", 0, &actions, "OK");
                    }
                    actions
                }
                _ = self.tx.closed() => break,
            };
            let mut gone = false;
            for response in messages(actions) {
                if self.tx.send(Ok(response)).await.is_err() {
                    gone = true;
                    break;
                }
            }
            if gone {
                break;
            }
        }
        if let Some(d) = &self.open.domain {
            METRICS.rlqs_buckets.with_label_values(&[d.as_str()]).sub(self.state.len() as i64);
        }
        // The ledger keeps this stream's grants until they expire: its Envoy may use them as long.
        // The live view shows them from the ledger's side from now on.
        self.live.forget_stream(self.state.name());
    }

    /// One span for a report (or a timer's work) and the answer it made.
    fn span(&self, started: std::time::Instant, event: &str, buckets: usize, actions: &[BucketAction], code: &str) {
        if self.trace_parent.is_none() {
            return;
        }
        let abandoned = actions
            .iter()
            .filter(|a| matches!(a.bucket_action, Some(bucket_action::BucketAction::AbandonAction(_))))
            .count();
        let report = crate::trace::QuotaReport {
            domain: self.open.domain.as_deref().unwrap_or("-"),
            event,
            buckets,
            assignments: actions.len() - abandoned,
            abandoned,
            code,
        };
        crate::trace::record_quota(self.trace_parent.as_ref(), started, report);
    }

    async fn on_reports(&mut self, reports: RateLimitQuotaUsageReports) -> Result<Vec<BucketAction>, Refusal> {
        let rt = self.runtime.load_full();
        let quota = settings(&rt);
        let now = self.clock.now_us();
        self.state.message(now, quota.report_interval, quota.max_buckets)?;
        let first = self.state.domain.is_none();
        let domain_name = self.state.domain_of(&reports.domain)?;
        let Some(domain) = rt.rls.as_ref().and_then(|r| r.domain(&domain_name)) else {
            return Err(Refusal::Invalid(format!(
                "no [[rls.domain]] is named {:?}",
                crate::safe_text::escape(&domain_name)
            )));
        };
        if first {
            METRICS.rlqs_streams.with_label_values(&[domain_name.as_str()]).inc();
            self.open.domain = Some(domain_name.clone());
        }
        let label = [domain_name.as_str()];
        let mut actions = Vec::new();
        for usage in reports.bucket_quota_usages {
            let Some(id) = usage.bucket_id else {
                return Err(Refusal::Invalid("a bucket_quota_usage without its bucket_id".into()));
            };
            if let Some(why) = buckets::invalid(&id.bucket) {
                return Err(Refusal::Invalid(why));
            }
            METRICS.rlqs_reports.with_label_values(&label).inc();
            let Some(rule) = buckets::find(&domain.buckets, &id.bucket, domain.pattern_order) else {
                // No rule: Envoy's no_assignment_behavior applies.
                METRICS.rlqs_unmatched.with_label_values(&label).inc();
                continue;
            };
            let rule = &domain.buckets[rule];
            let ttl = assign::time_to_live(quota.report_interval);
            match &rule.limit {
                BucketLimit::Unlimited => actions.push(blanket(id, BlanketRule::AllowAll, ttl)),
                BucketLimit::Deny => actions.push(blanket(id, BlanketRule::DenyAll, ttl)),
                BucketLimit::Divided { zone, rate, capacity } => {
                    let canonical = buckets::canonical(&id.bucket);
                    let before = self.state.len();
                    let reported = usage.time_elapsed.map(duration).unwrap_or_default();
                    let due = self.state.usage(
                        now,
                        canonical.clone(),
                        &id,
                        (usage.num_requests_allowed, usage.num_requests_denied),
                        quota.report_interval,
                        quota.max_buckets,
                    )?;
                    if self.state.len() > before {
                        METRICS.rlqs_buckets.with_label_values(&label).inc();
                    }
                    let Some(due) = due else { continue };
                    let demand = assign::demand(due.allowed, due.denied, due.measured, reported, quota.report_interval);
                    let key = buckets::zone_key(rule, &id.bucket);
                    let budget = Budget::of(*rate, *capacity);
                    if let Some(action) = self.divide(&label, &canonical, zone, &key, demand, &budget, &quota).await {
                        actions.push(action);
                    }
                }
            }
        }
        Ok(actions)
    }

    /// Reports one bucket's demand to the ledger and claims its share: the assignment to send, or
    /// none when the ledger cannot be reached.
    #[allow(clippy::too_many_arguments)]
    async fn divide(
        &mut self,
        label: &[&str; 1],
        canonical: &[u8],
        zone: &str,
        key: &[u8],
        demand: f64,
        budget: &Budget,
        quota: &QuotaSettings,
    ) -> Option<BucketAction> {
        let tracked = self.state.get(canonical)?;
        let holder = tracked.holder.clone();
        let current = match tracked.sent {
            Some(Sent::Bucket(g)) => Some(g),
            _ => None,
        };
        let started = std::time::Instant::now();
        let outcome = self.ledger.share(zone, key, &holder, demand, current, budget, quota.report_interval).await;
        METRICS.rlqs_ledger_duration.with_label_values(label).observe(started.elapsed().as_secs_f64());
        let division = match outcome {
            Ok(division) => division,
            Err(e) => {
                METRICS.rlqs_ledger_errors.with_label_values(label).inc();
                tracing::warn!(error = %e, zone, "rlqs: the ledger did not answer; the bucket keeps its assignment until it expires");
                return None;
            }
        };
        let (want, granted) = (division.want, division.granted);
        let now = self.clock.now_us();
        self.live.record(Divided {
            domain: label[0],
            zone,
            key,
            budget: *budget,
            stream: self.state.name(),
            holder: &holder,
            demand,
            granted,
            view: division.view,
            now_us: now,
        });
        let tracked = self.state.get_mut(canonical)?;
        tracked.demand = demand;
        tracked.recheck_us =
            assign::clamped(want, granted).then(|| now + recheck_after(quota.report_interval).as_micros() as u64);
        let ttl = assign::time_to_live(quota.report_interval);
        let (sent, action) = if granted.is_empty() {
            (Sent::DenyAll, blanket(tracked.id.clone(), BlanketRule::DenyAll, ttl))
        } else {
            (Sent::Bucket(granted), token_bucket(tracked.id.clone(), granted, budget, ttl))
        };
        if tracked.sent != Some(sent) {
            METRICS.rlqs_assignments.with_label_values(label).inc();
        }
        tracked.sent = Some(sent);
        Some(action)
    }

    /// Asks again for clamped buckets; abandons quiet ones.
    async fn on_tick(&mut self) -> Vec<BucketAction> {
        // A configured domain only (set once the first report named one).
        let Some(domain_name) = self.open.domain.clone() else { return Vec::new() };
        let rt = self.runtime.load_full();
        let quota = settings(&rt);
        let now = self.clock.now_us();
        let label = [domain_name.as_str()];
        let domain = rt.rls.as_ref().and_then(|r| r.domain(&domain_name));
        let mut actions = Vec::new();
        for canonical in self.state.quiet(now, quota.report_interval) {
            let Some(tracked) = self.state.remove(&canonical) else { continue };
            METRICS.rlqs_buckets.with_label_values(&label).dec();
            METRICS.rlqs_abandoned.with_label_values(&label).inc();
            if let Some((zone, key, _)) = domain.and_then(|d| divided(d, &tracked.id)) {
                self.live.forget(&zone, &key, &tracked.holder);
                if let Err(e) = self.ledger.leave(&zone, &key, &tracked.holder).await {
                    tracing::debug!(error = %e, "rlqs: could not take an abandoned bucket out of its ledger; it expires");
                }
            }
            actions.push(BucketAction {
                bucket_id: Some(tracked.id),
                bucket_action: Some(bucket_action::BucketAction::AbandonAction(AbandonAction {})),
            });
        }
        for canonical in self.state.rechecks(now) {
            let Some(tracked) = self.state.get(&canonical) else { continue };
            let (id, demand) = (tracked.id.clone(), tracked.demand);
            let Some((zone, key, budget)) = domain.and_then(|d| divided(d, &id)) else {
                if let Some(t) = self.state.get_mut(&canonical) {
                    t.recheck_us = None;
                }
                continue;
            };
            let before = self.state.get(&canonical).and_then(|t| t.sent);
            if let Some(action) = self.divide(&label, &canonical, &zone, &key, demand, &budget, &quota).await {
                // Pushed only when it changed: an unchanged one waits for the next report.
                if self.state.get(&canonical).and_then(|t| t.sent) != before {
                    actions.push(action);
                }
            }
        }
        actions
    }
}

/// `actions` as answers of at most [`ANSWER_BYTES`] each (one action alone may be more: a bucket
/// id is at most 16 entries of 2 KiB, 32 KiB, plus a few bytes, so under the 64 KiB bound).
fn messages(actions: Vec<BucketAction>) -> Vec<RateLimitQuotaResponse> {
    use prost::Message;
    let mut out: Vec<RateLimitQuotaResponse> = Vec::new();
    let mut bytes = 0;
    for action in actions {
        let size = action.encoded_len() + 4;
        match out.last_mut() {
            Some(last) if bytes + size <= ANSWER_BYTES => last.bucket_action.push(action),
            _ => {
                out.push(RateLimitQuotaResponse { bucket_action: vec![action] });
                bytes = 0;
            }
        }
        bytes += size;
    }
    out
}

/// The zone, key and budget of a divided bucket under the domain's current rules.
fn divided(domain: &crate::config::rls::Domain, id: &BucketId) -> Option<(String, Vec<u8>, Budget)> {
    let rule = &domain.buckets[buckets::find(&domain.buckets, &id.bucket, domain.pattern_order)?];
    match &rule.limit {
        BucketLimit::Divided { zone, rate, capacity } => {
            Some((zone.clone(), buckets::zone_key(rule, &id.bucket), Budget::of(*rate, *capacity)))
        }
        _ => None,
    }
}

fn duration(d: prost_types::Duration) -> Duration {
    if d.seconds < 0 || d.nanos < 0 {
        return Duration::ZERO;
    }
    Duration::new(d.seconds as u64, d.nanos.min(999_999_999) as u32)
}

fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

fn assignment(id: BucketId, strategy: Strategy, ttl: Duration) -> BucketAction {
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(proto_duration(ttl)),
            rate_limit_strategy: Some(RateLimitStrategy { strategy: Some(strategy) }),
        })),
    }
}

fn blanket(id: BucketId, rule: BlanketRule, ttl: Duration) -> BucketAction {
    assignment(id, Strategy::BlanketRule(rule as i32), ttl)
}

/// A grant as Envoy's token bucket (u32 fields: a zone's budget fits them, see `Budget::of`).
fn token_bucket(id: BucketId, grant: Grant, budget: &Budget, ttl: Duration) -> BucketAction {
    let bucket = TokenBucket {
        max_tokens: grant.max_tokens.min(u32::MAX as u64) as u32,
        tokens_per_fill: Some(grant.tokens_per_fill.min(u32::MAX as u64) as u32),
        fill_interval: Some(proto_duration(Duration::from_secs(budget.fill_interval_s))),
    };
    assignment(id, Strategy::TokenBucket(bucket), ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_split_under_the_message_bound() {
        use prost::Message;
        let id = |i: usize| BucketId { bucket: (0..16).map(|k| (format!("k{k}-{i}"), "v".repeat(1000))).collect() };
        let actions: Vec<BucketAction> =
            (0..50).map(|i| blanket(id(i), BlanketRule::AllowAll, Duration::from_secs(6))).collect();
        let answers = messages(actions);
        assert!(answers.len() > 1);
        assert_eq!(answers.iter().map(|a| a.bucket_action.len()).sum::<usize>(), 50);
        assert!(answers.iter().all(|a| a.encoded_len() < crate::rls::listener::MAX_MESSAGE_BYTES));
        assert!(messages(Vec::new()).is_empty());
    }
}
