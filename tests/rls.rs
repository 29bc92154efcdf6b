//! The rate limit service (`[rls]`, Envoy's `envoy.service.ratelimit.v3`) of the real `weir`
//! binary, called by a gRPC client generated from the same protos (tonic): decisions equal to the
//! proxy's on the same zone (memory and Redis), two instances sharing one Redis, hostile input,
//! Redis down, and an imported envoyproxy/ratelimit config.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::http;
use support::redis_server::RedisServer;
use support::rls_client::{client, code, descriptor, CALL_TIMEOUT};
use support::upstream::Upstream;
use support::weir::{self as weir_proc, Weir};
use tonic::transport::Channel;
use weir::rls::proto::rate_limit_response::Code;
use weir::rls::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient};

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest { domain: domain.into(), descriptors, hits_addend: 0 }
}

async fn call(c: &mut RateLimitServiceClient<Channel>, req: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(req).await.unwrap_or_else(|s| panic!("ShouldRateLimit failed: {s:?}")).into_inner()
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add.iter().find(|h| h.key == name).map(|h| h.value.as_str())
}

/// `r=` of the first item of a `RateLimit` field.
fn r_of(field: &str) -> u64 {
    field.split(';').find_map(|p| p.strip_prefix("r=")).and_then(|v| v.parse().ok()).expect("r=")
}

/// A proxy route and an RLS domain on the same zones: `per_client` keyed by `X-Client` (1r/m,
/// burst 3, so time does not matter), `tight` (1r/m, no burst) for all-or-nothing.
fn shared_zones(store: &str, up: &Upstream) -> String {
    format!(
        r#"[server]
listen = ["$LISTEN"]
threads = 2

[log]
access_log = false

{store}

[[upstream]]
name = "app"
servers = ["{up}"]

[[limit_req_zone]]
name = "per_client"
key = "header:X-Client"
rate = "1r/m"

[[limit_req_zone.override]]
match = "header:X-Client=vip"
rate = "1r/m"
burst = 6

[[limit_req_zone]]
name = "tight"
key = "header:X-Client"
rate = "1r/m"

[[limit_req_zone]]
name = "slow"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
limit_req = [{{ zone = "per_client", burst = 3, nodelay = true }}]

[rls]
listen = ["$LISTEN2"]

[[rls.domain]]
name = "edge"

[[rls.domain.descriptor]]
key = "client"
zone = "per_client"
burst = 3
nodelay = true

[[rls.domain.descriptor]]
key = "x-client"
zone = "per_client"
burst = 3
nodelay = true

[[rls.domain.descriptor]]
key = "login"
zone = "tight"

[[rls.domain.descriptor]]
key = "queued"
zone = "slow"
burst = 5
delay = 1
"#,
        up = up.addr()
    )
}

/// The same sequence through the proxy (one client key) and the RLS (another key of the same
/// zone): the same admissions and the same remaining counts, then all-or-nothing and delay.
async fn rls_decides_like_the_proxy(store: &str) {
    let up = Upstream::start();
    let w = Weir::start(&shared_zones(store, &up));
    let (proxy, rls) = (w.addrs[0], w.addrs[1]);
    let mut c = client(rls).await;

    let mut through_proxy = Vec::new();
    let mut through_rls = Vec::new();
    for _ in 0..6 {
        let resp = http::get_with(proxy, "/", &[("X-Client", "alice")]);
        let r = resp.header("RateLimit").map(|f| r_of(&f));
        through_proxy.push((resp.status == 200, r));
        let answer = call(&mut c, request("edge", vec![descriptor(&[("client", "bob")])])).await;
        let status = &answer.statuses[0];
        assert_eq!(header(&answer, "RateLimit").map(r_of), Some(u64::from(status.limit_remaining)));
        through_rls.push((code(&answer) == Code::Ok, header(&answer, "RateLimit").map(r_of)));
    }
    assert_eq!(through_rls, through_proxy, "RLS (right) vs proxy (left), same zone and store");
    assert_eq!(through_proxy.iter().filter(|(ok, _)| *ok).count(), 4, "burst 3: four pass, {through_proxy:?}");

    // One counter for both front doors: alice spent her burst through the proxy.
    let alice = call(&mut c, request("edge", vec![descriptor(&[("client", "alice")])])).await;
    assert_eq!(code(&alice), Code::OverLimit, "the descriptor's key is the HTTP key with the same value");

    // The last answer was a rejection: statuses, limit and Retry-After for Envoy's 429.
    let over = call(&mut c, request("edge", vec![descriptor(&[("client", "bob")])])).await;
    assert_eq!(code(&over), Code::OverLimit);
    assert_eq!(over.statuses[0].code, i32::from(Code::OverLimit));
    let limit = over.statuses[0].current_limit.as_ref().expect("current_limit");
    assert_eq!((limit.name.as_str(), limit.requests_per_unit), ("per_client", 1));
    assert!(header(&over, "Retry-After").is_some_and(|s| s.parse::<u64>().is_ok_and(|s| (1..=60).contains(&s))));
    assert_eq!(header(&over, "RateLimit-Policy"), Some("\"per_client\";q=4;w=240"));

    // Several descriptors: all or nothing. `tight` admits one; the second call is rejected by it
    // and must not charge `per_client` for carol.
    let both = || request("edge", vec![descriptor(&[("client", "carol")]), descriptor(&[("login", "carol")])]);
    let first = call(&mut c, both()).await;
    assert_eq!(code(&first), Code::Ok);
    assert_eq!(first.statuses.iter().map(|s| s.limit_remaining).collect::<Vec<_>>(), vec![3, 0]);
    let second = call(&mut c, both()).await;
    assert_eq!(code(&second), Code::OverLimit);
    assert_eq!(second.statuses.iter().map(|s| s.code).collect::<Vec<_>>(), vec![1, 2], "only `tight` is over");
    let alone = call(&mut c, request("edge", vec![descriptor(&[("client", "carol")])])).await;
    assert_eq!(alone.statuses[0].limit_remaining, 2, "the rejected call charged nothing: 3 left before this one");

    // Unknown keys and unknown domains are allowed, with one OK status per descriptor.
    let unknown =
        call(&mut c, request("edge", vec![descriptor(&[("nope", "x")]), descriptor(&[("client", "dave")])])).await;
    assert_eq!((code(&unknown), unknown.statuses.len()), (Code::Ok, 2));
    assert!(unknown.statuses[0].current_limit.is_none());
    let other = call(&mut c, request("other", vec![descriptor(&[("client", "x")])])).await;
    assert_eq!((code(&other), other.statuses.len()), (Code::Ok, 1));

    // delay: OK, with the wait for the upstream (Envoy cannot hold a request).
    let mut waits = Vec::new();
    for _ in 0..3 {
        let a = call(&mut c, request("edge", vec![descriptor(&[("queued", "q")])])).await;
        assert_eq!(code(&a), Code::Ok);
        waits.push(a.request_headers_to_add.iter().find(|h| h.key == "x-weir-delay-ms").map(|h| h.value.clone()));
    }
    assert_eq!(waits[0], None, "the first two fit the delay = 1 allowance");
    assert_eq!(waits[1], None);
    let wait: u64 = waits[2].as_deref().expect("the third is delayed").parse().expect("ms");
    assert!((50_000..=60_000).contains(&wait), "about one 1r/m slot: {wait} ms");

    // The zone's overrides apply to what a descriptor names, as to a proxied request: an entry
    // keyed by a header's name is that header, and `header:X-Client=vip` has burst 6.
    let mut vip = Vec::new();
    for _ in 0..8 {
        let a = call(&mut c, request("edge", vec![descriptor(&[("x-client", "vip")])])).await;
        vip.push(code(&a) == Code::Ok);
    }
    assert_eq!(vip, [true, true, true, true, true, true, true, false], "burst 6: seven pass");
    let proxied = http::get_with(proxy, "/", &[("X-Client", "vip")]);
    assert_eq!(proxied.status, 429, "one counter: the proxy finds the override's bucket full");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_decides_like_the_proxy_on_memory() {
    rls_decides_like_the_proxy("[store]\nkind = \"memory\"").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_decides_like_the_proxy_on_redis() {
    let redis = RedisServer::start();
    // A generous store timeout: on a loaded machine the default 25 ms would hand some decisions to
    // the `local` failure policy, which is not what this compares.
    let store = format!("[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"", redis.url());
    rls_decides_like_the_proxy(&store).await;
}

fn rls_only(store: &str, domains: &str) -> String {
    format!(
        r#"[log]
access_log = false

{store}

[[limit_req_zone]]
name = "shared"
rate = "1r/m"

[rls]
listen = ["$LISTEN"]

{domains}
"#
    )
}

/// Two instances on one Redis, hammered at once with the same key: exactly the zone's count
/// passes fleet-wide (±1 for what leaks during the run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_admit_one_limiters_count() {
    let redis = RedisServer::start();
    let config = rls_only(
        // A generous timeout, and `deny` on failure: only Redis's own decisions can admit.
        &format!("[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\non_error = \"deny\"", redis.url()),
        "[[rls.domain]]\nname = \"d\"\n\n[[rls.domain.descriptor]]\nkey = \"k\"\nzone = \"shared\"\nburst = 49\nnodelay = true\n",
    );
    let (a, b) = (Weir::start(&config), Weir::start(&config));
    let mut tasks = tokio::task::JoinSet::new();
    for addr in [a.addr, b.addr] {
        for _ in 0..4 {
            let mut c = client(addr).await;
            tasks.spawn(async move {
                let mut ok = 0u32;
                for _ in 0..100 {
                    if code(&call(&mut c, request("d", vec![descriptor(&[("k", "same")])])).await) == Code::Ok {
                        ok += 1;
                    }
                }
                ok
            });
        }
    }
    let mut admitted = 0;
    while let Some(n) = tasks.join_next().await {
        admitted += n.expect("client task");
    }
    assert!((50..=51).contains(&admitted), "capacity 50 fleet-wide, admitted {admitted} of 800");
}

/// Malformed and hostile calls get clear gRPC statuses; the process stays small and its proxy
/// listener keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_gets_clear_statuses_and_bounded_memory() {
    let up = Upstream::start();
    let w = Weir::start(&shared_zones("[store]\nkind = \"memory\"", &up));
    let (proxy, rls) = (w.addrs[0], w.addrs[1]);
    let mut c = client(rls).await;
    let invalid = |r: Result<tonic::Response<RateLimitResponse>, tonic::Status>, what: &str| match r {
        Err(s) => {
            assert_eq!(s.code(), tonic::Code::InvalidArgument, "{what}: {s:?}");
            s.message().to_string()
        }
        Ok(r) => panic!("{what}: answered {r:?}"),
    };
    let one = || vec![descriptor(&[("client", "x")])];
    assert!(invalid(c.should_rate_limit(request("", one())).await, "empty domain").contains("domain"));
    assert!(invalid(c.should_rate_limit(request("edge", vec![])).await, "no descriptors").contains("descriptor"));
    let many = (0..300).map(|i| descriptor(&[("client", &i.to_string())])).collect();
    assert!(invalid(c.should_rate_limit(request("edge", many)).await, "300 descriptors").contains("at most 64"));
    invalid(c.should_rate_limit(request("edge", vec![descriptor(&[])])).await, "an empty descriptor");

    // 10k-character values: decided (the key is hashed to a bounded size), as are unknown keys.
    let long = "v".repeat(10_000);
    let a = call(&mut c, request("edge", vec![descriptor(&[("client", &long)]), descriptor(&[(&long, &long)])])).await;
    assert_eq!((code(&a), a.statuses.len()), (Code::Ok, 2));
    assert_eq!(a.statuses[0].limit_remaining, 3);

    // A message over the size cap: refused by the codec before any decoding work.
    let huge = "v".repeat(100_000);
    let s = c.should_rate_limit(request("edge", vec![descriptor(&[("client", &huge)])])).await.expect_err("too big");
    assert_eq!(s.code(), tonic::Code::OutOfRange, "{s:?}");

    // Invalid UTF-8 in a string field: a decode error, not a crash.
    let s = raw_call(rls, b"\x0a\x02\xff\xfe").await.expect_err("invalid UTF-8");
    assert_eq!(s.code(), tonic::Code::Internal, "{s:?}");
    assert!(s.message().contains("UTF-8") || s.message().contains("utf-8"), "{s:?}");

    // Huge metadata: the connection's call fails; a fresh call is answered.
    let mut req = tonic::Request::new(request("edge", one()));
    req.metadata_mut().insert("x-huge", "h".repeat(100_000).parse().expect("ascii metadata"));
    let s = client(rls).await.should_rate_limit(req).await.expect_err("metadata over 16 KiB");
    // The server closes that connection (GOAWAY, ENHANCE_YOUR_CALM); tonic reports it so.
    assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");

    // 1,000 concurrent calls on one connection: the server admits 100 streams at a time and the
    // client queues the rest; every call is answered.
    let started = Instant::now();
    let shared = client(rls).await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..1000 {
        let mut c = shared.clone();
        calls.spawn(async move {
            c.should_rate_limit(request("edge", vec![descriptor(&[("nope", &i.to_string())])])).await
        });
    }
    let mut answered = 0;
    while let Some(r) = calls.join_next().await {
        if r.expect("task").is_ok() {
            answered += 1;
        }
    }
    assert_eq!(answered, 1000, "in {:?}", started.elapsed());

    let rss_kib = rss_kib(w.pid().expect("pid"));
    assert!(rss_kib < 200 * 1024, "weir's RSS after the hostile calls: {rss_kib} KiB");
    let resp = http::get_with(proxy, "/", &[("X-Client", "after")]);
    assert_eq!(resp.status, 200, "the proxy listener is unaffected");
    let after = call(&mut client(rls).await, request("edge", one())).await;
    assert_eq!(code(&after), Code::Ok);
}

/// A call whose body is `payload` as it is (for bytes the generated types cannot hold).
async fn raw_call(
    addr: SocketAddr,
    payload: &'static [u8],
) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
    #[derive(Clone, PartialEq, prost::Message)]
    struct Raw {
        #[prost(bytes = "vec", tag = "1")]
        domain: Vec<u8>,
    }
    let domain = prost::Message::decode(payload).map(|r: Raw| r.domain).unwrap_or_default();
    let channel = Channel::from_shared(format!("http://{addr}")).expect("uri").connect().await.expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| tonic::Status::unknown(e.to_string()))?;
    let path = http_path("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
    grpc.unary(tonic::Request::new(Raw { domain }), path, tonic_prost::ProstCodec::<Raw, RateLimitResponse>::default())
        .await
}

fn http_path(p: &'static str) -> ::http::uri::PathAndQuery {
    ::http::uri::PathAndQuery::from_static(p)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Redis gone: each domain's failure policy answers, within the store's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_with_the_failure_policy() {
    let mut redis = RedisServer::start();
    let config = rls_only(
        &format!("[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"100ms\"\non_error = \"allow\"", redis.url()),
        r#"[[rls.domain]]
name = "closed"
on_error = "deny"

[[rls.domain.descriptor]]
key = "k"
zone = "shared"
burst = 100

[[rls.domain]]
name = "open"

[[rls.domain.descriptor]]
key = "k"
zone = "shared"
burst = 100
"#,
    );
    let w = Weir::start(&config);
    let mut c = client(w.addr).await;
    assert_eq!(code(&call(&mut c, request("closed", vec![descriptor(&[("k", "a")])])).await), Code::Ok);
    redis.stop();
    for _ in 0..5 {
        let started = Instant::now();
        let denied = call(&mut c, request("closed", vec![descriptor(&[("k", "a")])])).await;
        assert_eq!(code(&denied), Code::OverLimit, "on_error = deny");
        assert_eq!(header(&denied, "Retry-After"), Some("1"));
        let allowed = call(&mut c, request("open", vec![descriptor(&[("k", "a")])])).await;
        assert_eq!(code(&allowed), Code::Ok, "the store's on_error = allow");
        assert!(started.elapsed() < Duration::from_secs(2), "two decisions took {:?}", started.elapsed());
    }
}

/// envoyproxy/ratelimit's README example (domain `messaging`), imported with `weir import-rls`
/// and served: 5 marketing messages a day per number, 100 messages a day per number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_envoyproxy_ratelimit_example_decides_as_documented() {
    let yaml = r#"
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#;
    let dir = weir_proc::ConfigDir::new();
    let file = dir.write("messaging.yaml", yaml);
    let out = weir_proc::run(
        [std::ffi::OsStr::new("import-rls"), file.as_os_str(), "--listen".as_ref(), "$LISTEN".as_ref()],
        Duration::from_secs(30),
    );
    assert!(out.code == Some(0), "{}", out.describe());
    assert!(out.stderr.is_empty(), "everything is expressible: {}", out.describe());
    let toml = format!("[log]\naccess_log = false\n\n{}", out.stdout);
    let checked =
        weir_proc::check_config("imported.toml", &toml.replace("$LISTEN", "127.0.0.1:1"), Duration::from_secs(30));
    assert!(checked.code == Some(0), "{}", checked.describe());

    let w = Weir::start(&toml);
    let mut c = client(w.addr).await;
    let marketing = || {
        request(
            "messaging",
            vec![
                descriptor(&[("message_type", "marketing"), ("to_number", "2061111111")]),
                descriptor(&[("to_number", "2061111111")]),
            ],
        )
    };
    let codes: Vec<Code> = {
        let mut v = Vec::new();
        for _ in 0..6 {
            v.push(code(&call(&mut c, marketing()).await));
        }
        v
    };
    assert_eq!(codes, [vec![Code::Ok; 5], vec![Code::OverLimit]].concat(), "5 marketing messages a day");
    let plain = || request("messaging", vec![descriptor(&[("to_number", "2061111111")])]);
    let mut ok = 0;
    for _ in 0..100 {
        if code(&call(&mut c, plain()).await) == Code::Ok {
            ok += 1;
        }
    }
    assert_eq!(ok, 95, "100 messages a day to one number, 5 of them marketing");
    let other = call(&mut c, request("messaging", vec![descriptor(&[("to_number", "2062222222")])])).await;
    assert_eq!(code(&other), Code::Ok, "each number has its own count");
}

/// `[rls]` is validated by `weir check` like the rest of the file.
#[test]
fn check_reports_rls_mistakes_with_lines() {
    let bad =
        rls_only("", "[[rls.domain]]\nname = \"d\"\n\n[[rls.domain.descriptor]]\nkey = \"k\"\nzone = \"missing\"\n")
            .replace("$LISTEN", "127.0.0.1:1");
    let out = weir_proc::check_config("bad.toml", &bad, Duration::from_secs(30));
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stderr.contains("unknown zone \"missing\""), "{}", out.describe());
    let good =
        rls_only("", "[[rls.domain]]\nname = \"d\"\n\n[[rls.domain.descriptor]]\nkey = \"k\"\nzone = \"shared\"\n")
            .replace("$LISTEN", "127.0.0.1:1");
    let out = weir_proc::check_config("good.toml", &good, Duration::from_secs(30));
    assert!(out.code == Some(0), "{}", out.describe());
    assert!(out.stdout.contains("1 rls domains"), "{}", out.describe());
}

/// gRPC over TLS with the `[[server.tls]]` certificates, rules changed by a hot reload, and the
/// RLS's metrics on the admin listener; no `[server]` listener: the service alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_hot_reload_and_metrics() {
    use support::certs::{install, Ca};
    use tonic::transport::{Certificate, ClientTlsConfig};

    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = install(dir.path(), "rls", &ca.leaf(&["localhost"], "localhost", 30));
    let base = format!(
        r#"[server]
admin = "$LISTEN2"

[[server.tls]]
cert = "{}"
key = "{}"

[log]
access_log = false

[[limit_req_zone]]
name = "shared"
rate = "1r/m"

[rls]
listen_tls = ["$LISTEN"]

[[rls.domain]]
name = "d"

[[rls.domain.descriptor]]
key = "a"
zone = "shared"
"#,
        cert.display(),
        key.display()
    );
    let w = Weir::start(&base);
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca.pem())).domain_name("localhost");
    let channel = Channel::from_shared(format!("https://localhost:{}", w.addr.port()))
        .expect("uri")
        .tls_config(tls)
        .expect("tls config")
        .timeout(CALL_TIMEOUT)
        .connect()
        .await
        .expect("TLS connect");
    let mut c = RateLimitServiceClient::new(channel);
    let b = || request("d", vec![descriptor(&[("b", "x")])]);
    for _ in 0..3 {
        assert_eq!(code(&call(&mut c, b()).await), Code::Ok, "no rule for b yet: unmatched, allowed");
    }

    // A rule for `b` appears on the next reload: the rewritten file is applied by itself.
    let text = std::fs::read_to_string(&w.config_path).expect("config");
    std::fs::write(&w.config_path, format!("{text}\n[[rls.domain.descriptor]]\nkey = \"b\"\nzone = \"shared\"\n"))
        .expect("rewrite config");
    let started = Instant::now();
    let mut reloaded = false;
    while started.elapsed() < Duration::from_secs(15) {
        if code(&call(&mut c, b()).await) == Code::OverLimit {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reloaded, "the new rule limits b within 15 s of the rewrite\n{}", w.stderr());

    let admin = w.addrs[1];
    let m = tokio::task::spawn_blocking(move || {
        support::metrics::scrape_until(admin, Duration::from_secs(10), Duration::from_millis(50), |m| {
            m.value_or_zero("weir_rls_requests_total", &[("domain", "d"), ("outcome", "rejected")]) >= 1.0
        })
    })
    .await
    .expect("scrape");
    let m = m.unwrap_or_else(|last| panic!("{}", last.filtered()));
    assert!(m.value_or_zero("weir_rls_unmatched_descriptors_total", &[("domain", "d")]) >= 3.0, "{}", m.filtered());
    assert!(
        m.value_or_zero("weir_rls_requests_total", &[("domain", "d"), ("outcome", "passed")])
            + m.value_or_zero("weir_rls_requests_total", &[("domain", "d"), ("outcome", "unlimited")])
            >= 4.0,
        "{}",
        m.filtered()
    );
    assert!(
        m.value_or_zero("weir_limit_req_decisions_total", &[("zone", "shared"), ("status", "rejected")]) >= 1.0,
        "the zone's own series count RLS decisions\n{}",
        m.filtered()
    );
}

/// One JSON access-log line per decision, beside the proxy's, with the RLS's fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_writes_one_json_access_line() {
    let config = rls_only(
        "[store]\nkind = \"memory\"",
        "[[rls.domain]]\nname = \"d\"\n\n[[rls.domain.descriptor]]\nkey = \"k\"\nzone = \"shared\"\n",
    )
    .replace("[log]\naccess_log = false", "[log]\nformat = \"json\"");
    let w = Weir::start(&config);
    let mut c = client(w.addr).await;
    assert_eq!(
        code(&call(&mut c, request("d", vec![descriptor(&[("k", "v")]), descriptor(&[("u", "v")])])).await),
        Code::Ok
    );
    assert_eq!(code(&call(&mut c, request("d", vec![descriptor(&[("k", "v")])])).await), Code::OverLimit);
    let started = Instant::now();
    let lines = loop {
        let lines: Vec<serde_json::Value> = w
            .stderr()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|j| j["front_door"] == "rls")
            .collect();
        if lines.len() >= 2 || started.elapsed() > Duration::from_secs(10) {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(lines.len(), 2, "{}", w.stderr());
    assert_eq!(
        (&lines[0]["domain"], &lines[0]["descriptors"], &lines[0]["unmatched"], &lines[0]["code"]),
        (&"d".into(), &2.into(), &1.into(), &"OK".into())
    );
    assert_eq!((&lines[0]["limit_req"], &lines[0]["zones"]), (&"PASSED".into(), &"shared=PASSED".into()));
    assert_eq!((&lines[1]["code"], &lines[1]["limit_req"]), (&"OVER_LIMIT".into(), &"REJECTED".into()));
    assert_eq!(lines[1]["target"], "weir::access");
}
