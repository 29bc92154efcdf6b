//! OpenTelemetry traces (optional, off by default): one server span per request with the HTTP
//! semantic conventions' attributes (`http.route`, `server.address`, `url.scheme`,
//! `client.address`, `user_agent.original`, …), the route, the limit decision, the zones that
//! decided and the delay waited; a child span for each store decision (`limit_req`,
//! `limit_conn`) and one for each upstream attempt. The W3C `traceparent` of the server span goes
//! to the upstream, and spans are exported over OTLP/HTTP (protobuf) by a batch processor on a
//! thread of its own. Child spans are written when the request ends, from the times recorded on
//! the way (a few `SystemTime` reads per traced request, none for others).
//!
//! The rate limit service's calls get a server span of their own ([`record_rls`]), a child of the
//! caller's `traceparent`; so does each RLQS report ([`record_quota`]), a child of its stream's.
//! The proxy feeds a request's span through `proxy/trace_span.rs`.
//!
//! Configured by `[tracing]` (config/traces.rs) and installed once at start ([`install`]); with no
//! `[tracing]` nothing is installed, and a request pays one check of an unset `OnceLock`.
//! Sampling is the SDK's: a sampled incoming `traceparent` is followed, otherwise `sample_ratio`
//! of the trace ids are kept.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use pingora::http::RequestHeader;

use crate::config::TraceSettings;

/// How often the batch processor sends what it gathered.
const EXPORT_EVERY: Duration = Duration::from_millis(500);

struct Installed {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

/// Starts the exporter for `settings` (the config's `[tracing]`); nothing when `None`. Once per
/// process: later configs' tracing settings apply at the next start.
pub fn install(settings: Option<&TraceSettings>) -> Result<(), String> {
    let Some(settings) = settings else { return Ok(()) };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(settings.endpoint.clone())
        .with_timeout(settings.timeout)
        .build()
        .map_err(|e| format!("tracing: cannot build the OTLP exporter for {}: {e}", settings.endpoint))?;
    let batches = BatchSpanProcessor::builder(exporter)
        .with_batch_config(BatchConfigBuilder::default().with_scheduled_delay(EXPORT_EVERY).build())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(batches)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sample_ratio))))
        .with_resource(
            Resource::builder()
                .with_service_name(settings.service_name.clone())
                .with_attributes([
                    KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                    KeyValue::new("service.instance.id", instance_id()),
                    KeyValue::new("weir.commit", env!("WEIR_COMMIT")),
                ])
                .build(),
        )
        .build();
    let tracer = provider.tracer("weir");
    // A second install (never done) would keep the first.
    let _ = INSTALLED.set(Installed { provider, tracer });
    Ok(())
}

/// This process's `service.instance.id`: a random UUID (the kernel's), so two instances on one
/// host, or one restarted, never share it; `host-pid` where /proc has none.
fn instance_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid").map(|u| u.trim().to_string()).unwrap_or_else(|_| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    })
}

/// Sends the spans still queued (at shutdown).
pub fn shutdown() {
    if let Some(installed) = INSTALLED.get() {
        let _ = installed.provider.shutdown_with_timeout(Duration::from_secs(2));
    }
}

/// The span of one request, from its start to its end, with the times of its store decisions
/// and upstream attempts (their child spans are written at the end).
pub struct RequestSpan {
    span: opentelemetry_sdk::trace::Span,
    method: String,
    /// `(name, from, to)` of each store decision.
    decisions: Vec<(&'static str, SystemTime, SystemTime)>,
    attempts: Vec<Attempt>,
}

/// One upstream attempt: when it began, and how it ended (if it did before the request).
struct Attempt {
    from: SystemTime,
    to: Option<SystemTime>,
    /// Pingora's error type of a failed attempt (`ConnectTimedout`, `ConnectRefused`, …).
    error: Option<String>,
    status: Option<u16>,
}

/// What the span records when the request ends.
pub struct Finished<'a> {
    pub route: &'a str,
    /// The matched route's path template (`http.route`): `/login`, `/api/*`, a regex.
    pub http_route: Option<String>,
    /// The request's outcome as the metrics label it (`passed`, `rejected`, …).
    pub outcome: &'a str,
    /// limit_req's word for the request (`PASSED`, `REJECTED`, …) or `-`.
    pub limit_req: &'a str,
    /// `zone=STATUS` of each zone that had a say.
    pub zones: Vec<String>,
    /// When the store decided (µs since the epoch, the store's clock).
    pub decided_us: Option<u64>,
    /// The store that decided (`memory`, `redis`).
    pub store: &'a str,
    /// How long limit_req made the request wait.
    pub delay: Duration,
    /// The client as limits see it (`real_ip`), and the TCP peer.
    pub client: Option<IpAddr>,
    pub peer: Option<IpAddr>,
    /// Servers tried, in order.
    pub upstream_addrs: Vec<SocketAddr>,
    pub upstream_time: Option<Duration>,
    pub status: u16,
}

/// What the span reads from the request's head when it starts.
pub struct Incoming<'a> {
    pub req: &'a RequestHeader,
    pub started: Instant,
    /// The connection is TLS (`url.scheme` https).
    pub tls: bool,
    /// The port the request came in on, when the Host header names none.
    pub local_port: Option<u16>,
}

/// The longest header text copied into an attribute: a client chooses these, and a span is held
/// in memory until exported.
const MAX_ATTRIBUTE: usize = 256;

/// `text` cut to [`MAX_ATTRIBUTE`] bytes on a character boundary.
fn bounded(text: &str) -> String {
    let mut end = text.len().min(MAX_ATTRIBUTE);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// `server.address` and `server.port` of a Host header or `:authority`: `example.com:8080`,
/// `[::1]:8080`, `example.com`.
pub fn host_and_port(authority: &str) -> (String, Option<u16>) {
    if let Some(rest) = authority.strip_prefix('[') {
        if let Some((ip, after)) = rest.split_once(']') {
            return (ip.to_string(), after.strip_prefix(':').and_then(|p| p.parse().ok()));
        }
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(port) => (host.to_string(), Some(port)),
            Err(_) => (authority.to_string(), None),
        },
        _ => (authority.to_string(), None),
    }
}

/// Whether tracing is on in this process (a front door asks before gathering a request's facts).
pub fn is_on() -> bool {
    INSTALLED.get().is_some()
}

/// A span for the request described by `incoming`, child of its `traceparent` when it has one;
/// `None` when tracing is off (before anything else is done) or the request is not sampled.
pub fn start(incoming: Incoming<'_>) -> Option<RequestSpan> {
    let installed = INSTALLED.get()?;
    let req = incoming.req;
    let started = SystemTime::now() - incoming.started.elapsed();
    let parent = TraceContextPropagator::new().extract(&Headers(&req.headers));
    // The sampler needs neither name nor attributes: an unsampled request (most of them, with a
    // small `sample_ratio`) allocates none of them. The name is set when the request ends.
    let mut span = installed
        .tracer
        .span_builder(Cow::Borrowed("request"))
        .with_kind(SpanKind::Server)
        .with_start_time(started)
        .start_with_context(&installed.tracer, &parent);
    if !span.span_context().is_sampled() {
        return None;
    }
    let mut attributes = vec![
        KeyValue::new("http.request.method", req.method.as_str().to_string()),
        KeyValue::new("url.path", bounded(req.uri.path())),
        KeyValue::new("url.scheme", if incoming.tls { "https" } else { "http" }),
    ];
    let authority = req
        .uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| req.headers.get(http::header::HOST).and_then(|h| h.to_str().ok()));
    let (address, port) = authority.map(host_and_port).unwrap_or_default();
    if !address.is_empty() {
        attributes.push(KeyValue::new("server.address", bounded(&address)));
    }
    if let Some(port) = port.or(incoming.local_port) {
        attributes.push(KeyValue::new("server.port", i64::from(port)));
    }
    if let Some(agent) = req.headers.get(http::header::USER_AGENT).and_then(|h| h.to_str().ok()) {
        attributes.push(KeyValue::new("user_agent.original", bounded(agent)));
    }
    span.set_attributes(attributes);
    let method = req.method.as_str().to_string();
    Some(RequestSpan { span, method, decisions: Vec::new(), attempts: Vec::new() })
}

impl RequestSpan {
    /// Writes this span's `traceparent` (and `tracestate`) into the upstream request.
    pub fn inject(&self, upstream: &mut RequestHeader) {
        let cx = Context::new().with_remote_span_context(self.span.span_context().clone());
        let mut fields = Fields(Vec::new());
        TraceContextPropagator::new().inject_context(&cx, &mut fields);
        for (name, value) in fields.0 {
            let _ = upstream.insert_header(name, value);
        }
    }

    /// A store decision named `name` (`limit_req`, `limit_conn`) ran from `from` until now.
    pub fn decided(&mut self, name: &'static str, from: SystemTime) {
        self.decisions.push((name, from, SystemTime::now()));
    }

    /// An upstream attempt begins (its server is the next of `Finished::upstream_addrs`).
    pub fn attempt_started(&mut self) {
        self.attempts.push(Attempt { from: SystemTime::now(), to: None, error: None, status: None });
    }

    /// The current attempt failed with Pingora's error type `error`.
    pub fn attempt_failed(&mut self, error: &str) {
        if let Some(a) = self.attempts.last_mut().filter(|a| a.to.is_none()) {
            a.to = Some(SystemTime::now());
            a.error = Some(error.to_string());
        }
    }

    /// The current attempt's response head arrived with `status`.
    pub fn attempt_answered(&mut self, status: u16) {
        if let Some(a) = self.attempts.last_mut().filter(|a| a.to.is_none()) {
            a.to = Some(SystemTime::now());
            a.status = Some(status);
        }
    }

    /// Records how the request ended, writes the child spans and hands all to the exporter.
    pub fn finish(mut self, f: Finished<'_>) {
        let ended = SystemTime::now();
        // HTTP semantic conventions: "{method} {route}".
        self.span.update_name(format!("{} {}", self.method, f.route));
        let mut attributes = vec![
            KeyValue::new("weir.route", f.route.to_string()),
            KeyValue::new("weir.outcome", f.outcome.to_string()),
            KeyValue::new("weir.limit_req", f.limit_req.to_string()),
            KeyValue::new("weir.limit_req.delay_ms", f.delay.as_secs_f64() * 1000.0),
            KeyValue::new("weir.upstream.attempts", f.upstream_addrs.len() as i64),
            KeyValue::new("http.response.status_code", i64::from(f.status)),
        ];
        if let Some(route) = &f.http_route {
            attributes.push(KeyValue::new("http.route", bounded(route)));
        }
        if let Some(client) = f.client {
            attributes.push(KeyValue::new("client.address", client.to_string()));
        }
        if let Some(peer) = f.peer {
            attributes.push(KeyValue::new("network.peer.address", peer.to_string()));
        }
        if !f.zones.is_empty() {
            attributes.push(KeyValue::new("weir.zones", strings(f.zones.clone())));
        }
        if let Some(us) = f.decided_us {
            attributes.push(KeyValue::new("weir.store.decided_us", us as i64));
        }
        if !f.upstream_addrs.is_empty() {
            attributes.push(KeyValue::new(
                "weir.upstream.addresses",
                strings(f.upstream_addrs.iter().map(|a| a.to_string()).collect()),
            ));
        }
        if let Some(t) = f.upstream_time {
            attributes.push(KeyValue::new("weir.upstream.duration_ms", t.as_secs_f64() * 1000.0));
        }
        self.span.set_attributes(attributes);
        if f.status >= 500 {
            self.span.set_status(Status::error(format!("status {}", f.status)));
        }
        self.children(&f, ended);
        self.span.end_with_timestamp(ended);
    }

    /// The child spans: one per store decision, one per upstream attempt.
    fn children(&mut self, f: &Finished<'_>, ended: SystemTime) {
        let Some(installed) = INSTALLED.get() else { return };
        let tracer = &installed.tracer;
        let parent = Context::new().with_remote_span_context(self.span.span_context().clone());
        for &(name, from, to) in &self.decisions {
            let mut attributes = vec![KeyValue::new("weir.store", f.store.to_string())];
            if name == "limit_req" {
                attributes.push(KeyValue::new("weir.limit_req", f.limit_req.to_string()));
                if !f.zones.is_empty() {
                    attributes.push(KeyValue::new("weir.zones", strings(f.zones.clone())));
                }
            }
            let mut span = tracer
                .span_builder(name)
                .with_kind(SpanKind::Internal)
                .with_start_time(from)
                .with_attributes(attributes)
                .start_with_context(tracer, &parent);
            span.end_with_timestamp(to);
        }
        for (i, attempt) in self.attempts.iter().enumerate() {
            let mut attributes = vec![KeyValue::new("http.request.method", self.method.clone())];
            if let Some(addr) = f.upstream_addrs.get(i) {
                attributes.push(KeyValue::new("server.address", addr.ip().to_string()));
                attributes.push(KeyValue::new("server.port", i64::from(addr.port())));
            }
            if i > 0 {
                attributes.push(KeyValue::new("http.request.resend_count", i as i64));
            }
            if let Some(status) = attempt.status {
                attributes.push(KeyValue::new("http.response.status_code", i64::from(status)));
            }
            if let Some(error) = &attempt.error {
                attributes.push(KeyValue::new("error.type", error.clone()));
            }
            let mut span = tracer
                .span_builder(self.method.clone())
                .with_kind(SpanKind::Client)
                .with_start_time(attempt.from)
                .with_attributes(attributes)
                .start_with_context(tracer, &parent);
            if attempt.error.is_some() {
                span.set_status(Status::error("attempt failed"));
            }
            span.end_with_timestamp(attempt.to.unwrap_or(ended));
        }
    }
}

/// The caller's trace context of a rate limit service call (its gRPC metadata's `traceparent`);
/// `None` when tracing is off, before anything is copied.
pub fn rls_parent(metadata: &tonic::metadata::MetadataMap) -> Option<Context> {
    INSTALLED.get()?;
    Some(TraceContextPropagator::new().extract(&Headers(&metadata.clone().into_headers())))
}

/// One rate limit service call, recorded when it ends.
pub struct RlsCall<'a> {
    /// The config's domain name, or `-` (never the caller's string for an unknown one).
    pub domain: &'a str,
    pub descriptors: usize,
    /// `zone=STATUS` of each zone decided.
    pub zones: Vec<String>,
    /// `OK`, `OVER_LIMIT` or the gRPC error.
    pub code: &'a str,
}

/// A server span "rls <domain>" from `started` to now, child of the caller's context (from
/// `rls_parent`); nothing when tracing is off or the call is not sampled.
pub fn record_rls(parent: Option<Context>, started: Instant, call: RlsCall<'_>) {
    let (Some(installed), Some(parent)) = (INSTALLED.get(), parent) else { return };
    let mut span = installed
        .tracer
        .span_builder(format!("rls {}", call.domain))
        .with_kind(SpanKind::Server)
        .with_start_time(SystemTime::now() - started.elapsed())
        .with_attributes([
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
            KeyValue::new("rpc.method", "ShouldRateLimit"),
            KeyValue::new("weir.rls.domain", call.domain.to_string()),
            KeyValue::new("weir.rls.descriptors", call.descriptors as i64),
            KeyValue::new("weir.rls.code", call.code.to_string()),
            KeyValue::new("weir.zones", strings(call.zones)),
        ])
        .start_with_context(&installed.tracer, &parent);
    span.end();
}

/// One RLQS usage report (or a stream's timer that re-asked or abandoned buckets), recorded when
/// its answer is built: the same kind of facts as an RLS call's span, no bucket id or value.
pub struct QuotaReport<'a> {
    /// The config's domain name, or `-` (never the caller's string for an unknown one).
    pub domain: &'a str,
    /// `report` (an Envoy's message) or `timer` (the stream's own re-ask and abandon).
    pub event: &'a str,
    /// Bucket usages in the report.
    pub buckets: usize,
    /// Quota assignments sent in answer.
    pub assignments: usize,
    /// Abandon actions sent.
    pub abandoned: usize,
    /// `OK` or the gRPC status that ended the stream.
    pub code: &'a str,
}

/// A server span "rlqs <domain>" from `started` to now, child of the stream's context (its
/// `traceparent` metadata, `rls_parent`); nothing when tracing is off or it is not sampled.
pub fn record_quota(parent: Option<&Context>, started: Instant, report: QuotaReport<'_>) {
    let (Some(installed), Some(parent)) = (INSTALLED.get(), parent) else { return };
    let mut span = installed
        .tracer
        .span_builder(format!("rlqs {}", report.domain))
        .with_kind(SpanKind::Server)
        .with_start_time(SystemTime::now() - started.elapsed())
        .with_attributes([
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("rpc.service", "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"),
            KeyValue::new("rpc.method", "StreamRateLimitQuotas"),
            KeyValue::new("weir.rlqs.domain", report.domain.to_string()),
            KeyValue::new("weir.rlqs.event", report.event.to_string()),
            KeyValue::new("weir.rlqs.buckets", report.buckets as i64),
            KeyValue::new("weir.rlqs.assignments", report.assignments as i64),
            KeyValue::new("weir.rlqs.abandoned", report.abandoned as i64),
            KeyValue::new("weir.rlqs.code", report.code.to_string()),
        ])
        .start_with_context(&installed.tracer, parent);
    if report.code != "OK" {
        span.set_status(Status::error(report.code.to_string()));
    }
    span.end();
}

fn strings(items: Vec<String>) -> opentelemetry::Value {
    opentelemetry::Value::Array(opentelemetry::Array::String(items.into_iter().map(Into::into).collect()))
}

/// The request's headers, as the propagator reads them.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The fields the propagator writes, to set on the upstream request.
struct Fields(Vec<(String, String)>);

impl Injector for Fields {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_string(), value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_of_an_authority() {
        assert_eq!(host_and_port("example.com:8080"), ("example.com".to_string(), Some(8080)));
        assert_eq!(host_and_port("example.com"), ("example.com".to_string(), None));
        assert_eq!(host_and_port("[::1]:443"), ("::1".to_string(), Some(443)));
        assert_eq!(host_and_port("[::1]"), ("::1".to_string(), None));
        assert_eq!(host_and_port("example.com:http"), ("example.com:http".to_string(), None));
        assert_eq!(host_and_port("::1"), ("::1".to_string(), None), "a bare IPv6 address has no port");
    }

    #[test]
    fn attributes_from_headers_are_bounded() {
        let long = "é".repeat(500);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_ATTRIBUTE && cut.chars().all(|c| c == 'é'), "{}", cut.len());
        assert_eq!(bounded("curl/8.0"), "curl/8.0");
    }
}
