//! OpenTelemetry traces (optional, off by default): one server span per request, with the route,
//! the limit decision, the zones that decided, the store's decision time and the upstream
//! attempts; the W3C `traceparent` of that span goes to the upstream, and spans are exported over
//! OTLP/HTTP (protobuf) by a batch processor on a thread of its own.
//!
//! Configured by `[tracing]` (config/tracing.rs) and installed once at start ([`install`]); with no
//! `[tracing]` nothing is installed, and a request pays one check of an unset `OnceLock`.
//! Sampling is the SDK's: a sampled incoming `traceparent` is followed, otherwise `sample_ratio`
//! of the trace ids are kept.

use std::borrow::Cow;
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
        .with_resource(Resource::builder().with_service_name(settings.service_name.clone()).build())
        .build();
    let tracer = provider.tracer("weir");
    // A second install (never done) would keep the first.
    let _ = INSTALLED.set(Installed { provider, tracer });
    Ok(())
}

/// Sends the spans still queued (at shutdown).
pub fn shutdown() {
    if let Some(installed) = INSTALLED.get() {
        let _ = installed.provider.shutdown_with_timeout(Duration::from_secs(2));
    }
}

/// The span of one request, from its start to its end.
pub struct RequestSpan {
    span: opentelemetry_sdk::trace::Span,
    method: String,
}

/// What the span records when the request ends.
pub struct Finished<'a> {
    pub route: &'a str,
    /// The request's outcome as the metrics label it (`passed`, `rejected`, …).
    pub outcome: &'a str,
    /// limit_req's word for the request (`PASSED`, `REJECTED`, …) or `-`.
    pub limit_req: &'a str,
    /// `zone=STATUS` of each zone that had a say.
    pub zones: Vec<String>,
    /// When the store decided (µs since the epoch, the store's clock).
    pub decided_us: Option<u64>,
    /// Servers tried, in order.
    pub upstream_addrs: Vec<String>,
    pub upstream_time: Option<Duration>,
    pub status: u16,
}

/// A span for the request whose head is `req` and which began at `started`, child of its
/// `traceparent` when it has one; `None` when tracing is off (before anything else is done) or
/// the request is not sampled.
pub fn start(req: &RequestHeader, started: Instant) -> Option<RequestSpan> {
    let installed = INSTALLED.get()?;
    let started = SystemTime::now() - started.elapsed();
    let parent = TraceContextPropagator::new().extract(&Headers(&req.headers));
    let span = installed
        .tracer
        .span_builder(Cow::Owned(req.method.as_str().to_string()))
        .with_kind(SpanKind::Server)
        .with_start_time(started)
        .with_attributes([
            KeyValue::new("http.request.method", req.method.as_str().to_string()),
            KeyValue::new("url.path", req.uri.path().to_string()),
        ])
        .start_with_context(&installed.tracer, &parent);
    let method = req.method.as_str().to_string();
    span.span_context().is_sampled().then_some(RequestSpan { span, method })
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

    /// Records how the request ended and hands the span to the exporter.
    pub fn finish(mut self, f: Finished<'_>) {
        // HTTP semantic conventions: "{method} {route}".
        self.span.update_name(format!("{} {}", self.method, f.route));
        let mut attributes = vec![
            KeyValue::new("weir.route", f.route.to_string()),
            KeyValue::new("weir.outcome", f.outcome.to_string()),
            KeyValue::new("weir.limit_req", f.limit_req.to_string()),
            KeyValue::new("weir.upstream.attempts", f.upstream_addrs.len() as i64),
            KeyValue::new("http.response.status_code", i64::from(f.status)),
        ];
        if !f.zones.is_empty() {
            attributes.push(KeyValue::new("weir.zones", strings(f.zones)));
        }
        if let Some(us) = f.decided_us {
            attributes.push(KeyValue::new("weir.store.decided_us", us as i64));
        }
        if !f.upstream_addrs.is_empty() {
            attributes.push(KeyValue::new("weir.upstream.addresses", strings(f.upstream_addrs)));
        }
        if let Some(t) = f.upstream_time {
            attributes.push(KeyValue::new("weir.upstream.duration_ms", t.as_secs_f64() * 1000.0));
        }
        self.span.set_attributes(attributes);
        if f.status >= 500 {
            self.span.set_status(Status::error(format!("status {}", f.status)));
        }
        self.span.end();
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
