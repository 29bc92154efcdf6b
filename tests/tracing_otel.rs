//! OpenTelemetry traces with the real binary: a small OTLP/HTTP receiver (protobuf, decoded with
//! opentelemetry-proto) gets one span per request with the decision attributes, the upstream
//! sees the span's `traceparent`, an incoming `traceparent` is the span's parent; with no
//! `[tracing]` Weir adds no `traceparent` and exports nothing.

mod support;

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
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = kept.clone();
                thread::spawn(move || serve(stream, &kept));
            }
        });
        Receiver { addr, spans }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().expect("lock").clone()
    }
}

/// Requests on one connection until it closes: head, `Content-Length` body, 200.
fn serve(stream: TcpStream, kept: &Mutex<Vec<Span>>) {
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
    span.attributes
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

    let spans = poll(Duration::from_secs(15), Duration::from_millis(100), || receiver.spans(), |s| s.len() >= 2)
        .unwrap_or_else(|got| panic!("the receiver got {} spans, not 2:\n{}", got.len(), weir.stderr()));
    assert_eq!(spans.len(), 2, "{spans:#?}");
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
