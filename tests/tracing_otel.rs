//! OpenTelemetry traces with the real binary: a small OTLP/HTTP receiver (protobuf, decoded with
//! opentelemetry-proto) gets one span per request with the decision attributes, the upstream
//! sees the span's `traceparent`, an incoming `traceparent` is the span's parent; with no
//! `[tracing]` Weir adds no `traceparent` and exports nothing. The rate limit service's calls
//! and each RLQS usage report are server spans of their own.

use crate::support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use support::http::{must_send, Request};
use support::poll::poll;
use support::upstream::Upstream;
use support::weir::Weir;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP traces endpoint: every POST body decoded and kept.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    resources: Arc<Mutex<Vec<HashMap<String, String>>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let resources = Arc::new(Mutex::new(Vec::new()));
        let (kept, kept_resources) = (spans.clone(), resources.clone());
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (kept, kept_resources) = (kept.clone(), kept_resources.clone());
                thread::spawn(move || serve(stream, &kept, &kept_resources));
            }
        });
        Receiver { addr, spans, resources }
    }

    fn resources(&self) -> Vec<HashMap<String, String>> {
        self.resources.lock().expect("lock").clone()
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().expect("lock").clone()
    }
}

/// Requests on one connection until it closes: head, `Content-Length` body, 200.
fn serve(stream: TcpStream, kept: &Mutex<Vec<Span>>, resources: &Mutex<Vec<HashMap<String, String>>>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        assert!(line.starts_with("POST /v1/traces "), "unexpected request line {line:?}");
        let mut length = 0;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).expect("header");
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().expect("Content-Length");
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("body");
        let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("an OTLP protobuf trace export");
        for r in &request.resource_spans {
            if let Some(resource) = &r.resource {
                resources.lock().expect("lock").push(key_values(&resource.attributes));
            }
        }
        let spans = request.resource_spans.into_iter().flat_map(|r| r.scope_spans).flat_map(|s| s.spans);
        kept.lock().expect("lock").extend(spans);
        let _ =
            writer.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n");
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A span's attributes as text (arrays joined with ",").
fn attributes(span: &Span) -> HashMap<String, String> {
    key_values(&span.attributes)
}

fn key_values(pairs: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => s.clone(),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                Some(AnyValue::DoubleValue(d)) => d.to_string(),
                Some(AnyValue::BoolValue(b)) => b.to_string(),
                Some(AnyValue::ArrayValue(a)) => a
                    .values
                    .iter()
                    .filter_map(|v| match &v.value {
                        Some(AnyValue::StringValue(s)) => Some(s.clone()),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join(","),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

/// Routes everything to `up` through the zone `per_ip` (1r/m, no burst) when `limited`.
fn config(up: &Upstream, tracing: &str, limited: bool) -> String {
    let limit = if limited { r#"limit_req = [{ zone = "per_ip" }]"# } else { "" };
    support::config::memory_with_app(
        up.addr(),
        &format!(
            r#"{tracing}

[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
{limit}
"#
        ),
    )
}

#[test]
fn spans_reach_an_otlp_receiver_and_the_trace_reaches_the_upstream() {
    let receiver = Receiver::start();
    let up = Upstream::start();
    let weir = Weir::start(&config(
        &up,
        &format!("[tracing]\nendpoint = \"http://{}/v1/traces\"\nsample_ratio = 1.0", receiver.addr),
        true,
    ));

    // Passed, as the child of the caller's trace.
    let incoming = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let r = must_send(weir.addr, &Request::get("/first").header("traceparent", &incoming));
    assert_eq!(r.status, 200, "{}", r.summary());
    // Rejected (1r/m, no burst), a trace of its own.
    let r = must_send(weir.addr, &Request::get("/second"));
    assert_eq!(r.status, 429, "{}", r.summary());

    let seen = up.seen();
    assert_eq!(seen.len(), 1, "the upstream saw {seen:?}");
    let forwarded = seen[0].header("traceparent").expect("the upstream gets a traceparent");
    let parts: Vec<&str> = forwarded.split('-').collect();
    assert_eq!(parts.len(), 4, "{forwarded}");
    assert_eq!((parts[0], parts[1], parts[3]), ("00", TRACE_ID, "01"), "same trace, sampled: {forwarded}");
    assert_ne!(parts[2], PARENT_ID, "Weir's span is the upstream's parent: {forwarded}");

    // Two server spans, each with its children (store decision, upstream attempt).
    let is_server = |s: &Span| s.name == "GET all";
    let all = poll(
        Duration::from_secs(15),
        Duration::from_millis(100),
        || receiver.spans(),
        |s| s.iter().filter(|s| is_server(s)).count() >= 2 && s.len() >= 5,
    )
    .unwrap_or_else(|got| panic!("the receiver got {} spans:\n{got:#?}\n{}", got.len(), weir.stderr()));
    let spans: Vec<Span> = all.iter().filter(|s| is_server(s)).cloned().collect();
    assert_eq!(spans.len(), 2, "{all:#?}");
    let passed = spans.iter().find(|s| hex(&s.trace_id) == TRACE_ID).expect("the span of the traced request");
    assert_eq!(hex(&passed.parent_span_id), PARENT_ID);
    assert_eq!(hex(&passed.span_id), parts[2], "the upstream's parent is this span");
    assert_eq!(passed.name, "GET all");
    let a = attributes(passed);
    assert_eq!(a["weir.route"], "all");
    assert_eq!(a["weir.outcome"], "passed");
    assert_eq!(a["weir.limit_req"], "PASSED");
    assert_eq!(a["weir.zones"], "per_ip=PASSED");
    assert_eq!(a["weir.upstream.attempts"], "1");
    assert_eq!(a["weir.upstream.addresses"], up.addr().to_string());
    assert_eq!(a["http.response.status_code"], "200");
    assert_eq!(a["url.path"], "/first");
    assert!(a["weir.store.decided_us"].parse::<u64>().is_ok_and(|us| us > 1_600_000_000_000_000), "{a:?}");

    let rejected = spans.iter().find(|s| hex(&s.trace_id) != TRACE_ID).expect("the rejected request's span");
    assert!(rejected.parent_span_id.is_empty(), "a root span: {rejected:?}");
    let a = attributes(rejected);
    assert_eq!(a["weir.outcome"], "rejected");
    assert_eq!(a["weir.limit_req"], "REJECTED");
    assert_eq!(a["weir.zones"], "per_ip=REJECTED");
    assert_eq!(a["weir.upstream.attempts"], "0");
    assert_eq!(a["http.response.status_code"], "429");
    let kids: Vec<&str> = children(&all, rejected).iter().map(|s| s.name.as_str()).collect();
    assert_eq!(kids, ["limit_req"], "a decision and no upstream attempt");
    let kids: Vec<&str> = children(&all, passed).iter().map(|s| s.name.as_str()).collect();
    assert_eq!(kids.len(), 2, "{kids:?}");
    assert!(kids.contains(&"limit_req") && kids.contains(&"GET"), "{kids:?}");
}

#[test]
fn without_tracing_nothing_is_added() {
    let up = Upstream::start();
    let weir = Weir::start(&config(&up, "", false));
    let r = must_send(weir.addr, &Request::get("/x"));
    assert_eq!(r.status, 200, "{}", r.summary());
    // A caller's own trace context passes through untouched.
    let incoming = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let r = must_send(weir.addr, &Request::get("/y").header("traceparent", &incoming));
    assert_eq!(r.status, 200, "{}", r.summary());
    let seen = up.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].header("traceparent"), None, "no traceparent without [tracing]");
    assert_eq!(seen[1].header("traceparent").as_deref(), Some(incoming.as_str()));
}

/// The rate limit service: one server span per gRPC call, child of the caller's `traceparent`
/// metadata, with its domain, the zones decided and the answer's code.
#[test]
fn a_rate_limit_service_call_is_one_span() {
    use weir::rls::proto::rate_limit_descriptor::Entry;
    use weir::rls::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient};

    let receiver = Receiver::start();
    let weir = Weir::start(&format!(
        "[tracing]\nendpoint = \"http://{}/v1/traces\"\nsample_ratio = 1.0\n\n[log]\naccess_log = false\n\n\
         [[limit_req_zone]]\nname = \"per_ip\"\nrate = \"1r/m\"\n\n[rls]\nlisten = [\"$LISTEN\"]\n\n\
         [[rls.domain]]\nname = \"edge\"\n\n[[rls.domain.descriptor]]\nkey = \"remote_address\"\nzone = \"per_ip\"\n",
        receiver.addr
    ));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", weir.addr))
            .expect("uri")
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("connect");
        let mut client = RateLimitServiceClient::new(channel);
        for _ in 0..2 {
            let mut req = tonic::Request::new(RateLimitRequest {
                domain: "edge".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry { key: "remote_address".into(), value: "192.0.2.1".into() }],
                    limit: None,
                    hits_addend: None,
                }],
                hits_addend: 0,
            });
            let incoming = format!("00-{TRACE_ID}-{PARENT_ID}-01");
            req.metadata_mut().insert("traceparent", incoming.parse().expect("ascii"));
            client.should_rate_limit(req).await.expect("a call");
        }
    });
    let spans = poll(Duration::from_secs(15), Duration::from_millis(100), || receiver.spans(), |s| s.len() >= 2)
        .unwrap_or_else(|got| panic!("the receiver got {} spans, not 2:\n{}", got.len(), weir.stderr()));
    assert_eq!(spans.len(), 2, "{spans:#?}");
    for span in &spans {
        assert_eq!(hex(&span.trace_id), TRACE_ID);
        assert_eq!(hex(&span.parent_span_id), PARENT_ID);
        assert_eq!(span.name, "rls edge");
    }
    let codes: Vec<(String, String)> = spans
        .iter()
        .map(|s| {
            let a = attributes(s);
            assert_eq!(a["weir.rls.domain"], "edge");
            assert_eq!(a["rpc.method"], "ShouldRateLimit");
            (a["weir.rls.code"].clone(), a["weir.zones"].clone())
        })
        .collect();
    assert!(codes.contains(&("OK".into(), "per_ip=PASSED".into())), "{codes:?}");
    assert!(codes.contains(&("OVER_LIMIT".into(), "per_ip=REJECTED".into())), "{codes:?}");
}

/// The rate limit quota service: one server span per usage report, child of the stream's
/// `traceparent` metadata, with its domain, its bucket count and the assignments sent; a report
/// that ends the stream is a span with the refusal's code.
#[test]
fn each_rlqs_report_is_one_span() {
    use weir::rls::proto::quota::{
        BucketId, BucketQuotaUsage, RateLimitQuotaServiceClient, RateLimitQuotaUsageReports,
    };

    let receiver = Receiver::start();
    let weir = Weir::start(&format!(
        "[tracing]\nendpoint = \"http://{}/v1/traces\"\nsample_ratio = 1.0\n\n[log]\naccess_log = false\n\n\
         [[limit_req_zone]]\nname = \"api\"\nrate = \"60r/s\"\n\n[rls]\nlisten = [\"$LISTEN\"]\n\n\
         [[rls.domain]]\nname = \"edge\"\n\n[[rls.domain.bucket]]\nid = {{ name = \"*\" }}\nzone = \"api\"\n",
        receiver.addr
    ));
    let usage = |name: &str| BucketQuotaUsage {
        bucket_id: Some(BucketId { bucket: [("name".to_string(), name.to_string())].into_iter().collect() }),
        time_elapsed: Some(prost_types::Duration { seconds: 0, nanos: 0 }),
        num_requests_allowed: 1,
        num_requests_denied: 0,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (answered, status) = rt.block_on(async {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", weir.addr))
            .expect("uri")
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("connect");
        let mut client = RateLimitQuotaServiceClient::new(channel);
        let (tx, rx) = tokio::sync::mpsc::channel::<RateLimitQuotaUsageReports>(4);
        let outbound = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let mut req = tonic::Request::new(outbound);
        let incoming = format!("00-{TRACE_ID}-{PARENT_ID}-01");
        req.metadata_mut().insert("traceparent", incoming.parse().expect("ascii"));
        let first =
            RateLimitQuotaUsageReports { domain: "edge".into(), bucket_quota_usages: vec![usage("a"), usage("b")] };
        tx.send(first).await.expect("queued");
        let mut inbound = client.stream_rate_limit_quotas(req).await.expect("stream opens").into_inner();
        let mut answered = 0;
        while answered < 2 {
            let answer = tokio::time::timeout(Duration::from_secs(10), inbound.message())
                .await
                .expect("an answer in time")
                .expect("no error")
                .expect("not ended");
            answered += answer.bucket_action.len();
        }
        // A stream keeps its first domain: this report ends it with INVALID_ARGUMENT.
        let other = RateLimitQuotaUsageReports { domain: "other".into(), bucket_quota_usages: vec![usage("a")] };
        tx.send(other).await.expect("queued");
        let status = loop {
            match tokio::time::timeout(Duration::from_secs(10), inbound.message()).await.expect("an end in time") {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("ended without a status"),
                Err(status) => break status,
            }
        };
        (answered, status)
    });
    assert_eq!(answered, 2, "both buckets were assigned");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let spans = poll(Duration::from_secs(15), Duration::from_millis(100), || receiver.spans(), |s| s.len() >= 2)
        .unwrap_or_else(|got| panic!("the receiver got {} spans, not 2:\n{}", got.len(), weir.stderr()));
    assert_eq!(spans.len(), 2, "one span per report: {spans:#?}");
    let mut seen: Vec<(String, String, String, String)> = spans
        .iter()
        .map(|span| {
            assert_eq!(hex(&span.trace_id), TRACE_ID);
            assert_eq!(hex(&span.parent_span_id), PARENT_ID);
            assert_eq!(span.name, "rlqs edge");
            let a = attributes(span);
            assert_eq!(a["rpc.method"], "StreamRateLimitQuotas");
            assert_eq!(a["weir.rlqs.domain"], "edge", "the configured domain, never the caller's other one");
            assert_eq!(a["weir.rlqs.event"], "report");
            assert_eq!(a["weir.rlqs.abandoned"], "0");
            assert!(!format!("{span:?}").contains("\"a\""), "no bucket id in a span: {span:?}");
            (
                a["weir.rlqs.code"].clone(),
                a["weir.rlqs.buckets"].clone(),
                a["weir.rlqs.assignments"].clone(),
                a["weir.rlqs.domain"].clone(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("INVALID_ARGUMENT".into(), "1".into(), "0".into(), "edge".into()),
            ("OK".into(), "2".into(), "2".into(), "edge".into()),
        ]
    );
}

/// The spans whose parent is `parent`.
fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.parent_span_id == parent.span_id && s.trace_id == parent.trace_id).collect()
}

#[test]
fn semantic_conventions_child_spans_and_the_delay() {
    let receiver = Receiver::start();
    let up = Upstream::start();
    // The first server refuses connections: a request sent to it is retried on the second.
    let (_refusing, refused) = support::weir::refusing_addr();
    let config = format!(
        r#"[server]
listen = ["$LISTEN"]
threads = 2

[store]
kind = "memory"

[real_ip]
trusted = ["127.0.0.1/32"]

[tracing]
endpoint = "http://{receiver}/v1/traces"
sample_ratio = 1.0

[[upstream]]
name = "app"
servers = ["{refused}", "{up}"]

[[limit_req_zone]]
name = "slow"
key = "ip"
rate = "30r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ {{ zone = "slow", burst = 5 }} ]
"#,
        receiver = receiver.addr,
        up = up.addr()
    );
    let weir = Weir::start(&config);

    // Two back-to-back requests of one client at 30r/m: the second waits 2 s less the first's
    // time (a loaded machine took the first past 500 ms, at 2r/s the second then did not wait).
    // Round robin sends one of them to the refusing server first.
    let send = |path: &str| {
        let r = must_send(
            weir.addr,
            &Request::get(path)
                .header("Host", "api.example.com:8443")
                .header("User-Agent", "otel-test/1.0")
                .header("X-Forwarded-For", "203.0.113.7"),
        );
        assert_eq!(r.status, 200, "{}", r.summary());
    };
    send("/api/one");
    send("/api/two");

    let spans = poll(
        Duration::from_secs(15),
        Duration::from_millis(100),
        || receiver.spans(),
        |s| s.iter().filter(|s| s.name == "GET api").count() >= 2 && s.len() >= 2 + 2 + 3,
    )
    .unwrap_or_else(|got| panic!("the receiver got {} spans:\n{got:#?}\n{}", got.len(), weir.stderr()));
    let servers: Vec<&Span> = spans.iter().filter(|s| s.name == "GET api").collect();
    assert_eq!(servers.len(), 2, "{spans:#?}");
    let mut retried = 0;
    for server in &servers {
        let a = attributes(server);
        assert_eq!(a["http.route"], "/api/*");
        assert_eq!(a["http.request.method"], "GET");
        assert_eq!(a["url.scheme"], "http");
        assert_eq!(a["server.address"], "api.example.com");
        assert_eq!(a["server.port"], "8443");
        assert_eq!(a["client.address"], "203.0.113.7", "the client as real_ip sees it");
        assert_eq!(a["network.peer.address"], "127.0.0.1");
        assert_eq!(a["user_agent.original"], "otel-test/1.0");
        assert_eq!(a["http.response.status_code"], "200");

        let kids = children(&spans, server);
        let decisions: Vec<&&Span> = kids.iter().filter(|s| s.name == "limit_req").collect();
        assert_eq!(decisions.len(), 1, "one store decision: {kids:#?}");
        let d = decisions[0];
        assert!(
            d.start_time_unix_nano >= server.start_time_unix_nano && d.end_time_unix_nano <= server.end_time_unix_nano
        );
        assert_eq!(attributes(d)["weir.store"], "memory");
        let attempts: Vec<&&Span> = kids.iter().filter(|s| s.name == "GET").collect();
        assert!(!attempts.is_empty() && attempts.len() <= 2, "{kids:#?}");
        let last = attributes(attempts.last().expect("an attempt"));
        assert_eq!(last["server.address"], "127.0.0.1");
        assert_eq!(last["server.port"], up.addr().port().to_string());
        assert_eq!(last["http.response.status_code"], "200");
        if attempts.len() == 2 {
            retried += 1;
            let first = attributes(attempts[0]);
            assert_eq!(first["server.port"], refused.port().to_string(), "{first:?}");
            assert!(first.contains_key("error.type"), "the refused attempt says why: {first:?}");
            assert_eq!(last["http.request.resend_count"], "1");
            assert!(attempts[0].end_time_unix_nano <= attempts[1].start_time_unix_nano);
        }
        let delay: f64 = a["weir.limit_req.delay_ms"].parse().expect("delay_ms is a number");
        if a["url.path"] == "/api/two" {
            assert!(delay >= 250.0, "the second request waited ~2 s: {delay}");
            assert_eq!(a["weir.limit_req"], "DELAYED");
        } else {
            assert_eq!(delay, 0.0);
        }
    }
    assert_eq!(retried, 1, "exactly one request met the refusing server (then max_fails took it out)");

    let resources = receiver.resources();
    let resource = resources.first().expect("a resource");
    assert_eq!(resource["service.name"], "weir");
    assert_eq!(resource["service.version"], env!("CARGO_PKG_VERSION"));
    let instance = &resource["service.instance.id"];
    assert_eq!(instance.len(), 36, "a UUID: {instance}");
}
