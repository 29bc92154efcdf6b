//! Weir as a drop-in for envoyproxy/ratelimit (issue #35): the peer's own configs
//! (`tests/data/envoy-ratelimit/`, copied from envoyproxy/ratelimit at f2fb157) through the real
//! `weir import-rls` and `weir check`, and the imported configs served by the real binary,
//! answering over gRPC what the peer's tests and README say they answer.

use crate::support;

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use support::rls_client::{client, code, descriptor};
use support::weir::{self as weir_proc, Weir};
use tonic::transport::Channel;
use weir::rls::proto::rate_limit_response::rate_limit::Unit;
use weir::rls::proto::rate_limit_response::Code;
use weir::rls::proto::{
    DescriptorStatus, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient,
};

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/envoy-ratelimit");
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// What the peer's loader does with a set of files (`config_impl.go`, `config_test.go`).
#[derive(Clone, Copy)]
enum Peer {
    Loads,
    /// Refuses, with (a part of) its reason.
    Refuses(&'static str),
}

/// The files (relative to the corpus; a directory is the peer's runtime config directory), whether
/// domains are merged (the peer's `MERGE_DOMAIN_CONFIG`), and what the peer does.
type Case = (&'static [&'static str], bool, Peer);

const LOADS: Peer = Peer::Loads;

/// Every config file of the peer's repository and README, alone, and the combinations its tests load.
const CASES: &[Case] = &[
    (&["examples/ratelimit/config/config.yaml"], false, LOADS),
    (&["examples/ratelimit/config/example.yaml"], false, LOADS),
    (&["test/config/basic_config.yaml"], false, LOADS),
    (&["test/config/duplicate_domain.yaml"], false, LOADS),
    (&["test/config/merge_domain_key1.yaml"], false, LOADS),
    (&["test/config/merge_domain_key2.yaml"], false, LOADS),
    (&["test/config/metadata.yaml"], false, LOADS),
    (&["test/config/shadowmode_config.yaml"], false, LOADS),
    (&["test/config/share_threshold.yaml"], false, LOADS),
    (&["test/config/wildcard.yaml"], false, LOADS),
    (&["test/integration/runtime/current/ratelimit/config/another.yaml"], false, LOADS),
    (&["test/integration/runtime/current/ratelimit/config/basic.yaml"], false, LOADS),
    (&["test/integration/runtime/current/ratelimit/config/share_threshold.yaml"], false, LOADS),
    (&["test/integration/runtime/current/ratelimit/reload.yaml"], false, LOADS),
    (&["test/integration/runtime/current/ratelimit/config"], false, LOADS),
    (&["readme/example1_1.yaml"], false, LOADS),
    (&["readme/example2_1.yaml"], false, LOADS),
    (&["readme/example3_1.yaml"], false, LOADS),
    (&["readme/example4_1.yaml"], false, LOADS),
    (&["readme/example4_2.yaml"], false, LOADS),
    (&["readme/example5_1.yaml"], false, LOADS),
    (&["readme/example6_1.yaml"], false, LOADS),
    (&["readme/example7_1.yaml"], false, LOADS),
    (&["readme/example8_1.yaml"], false, LOADS),
    (&["readme/example9_1.yaml"], false, LOADS),
    (&["readme/example9_2.yaml"], false, LOADS),
    (&["readme/example9_3.yaml"], false, LOADS),
    (&["readme/example10_1.yaml"], false, LOADS),
    (&["readme/example10_2.yaml"], false, LOADS),
    (&["readme/example11_1.yaml"], false, LOADS),
    (&["readme/example11_2.yaml"], false, LOADS),
    (&["test/config/merge_domain_key1.yaml", "test/config/merge_domain_key2.yaml"], true, LOADS),
    // The peer's refusals (config_test.go), with its reasons.
    (&["test/config/bad_limit_unit.yaml"], false, Peer::Refuses("invalid rate limit unit 'foo'")),
    (&["test/config/bad_yaml.yaml"], false, Peer::Refuses("error loading config file")),
    (
        &["test/config/duplicate_key.yaml"],
        false,
        Peer::Refuses("duplicate descriptor composite key 'test-domain.key1_value1'"),
    ),
    (&["test/config/empty_domain.yaml"], false, Peer::Refuses("config file cannot have empty domain")),
    (&["test/config/empty_key.yaml"], false, Peer::Refuses("descriptor has empty key")),
    (&["test/config/misspelled_key.yaml"], false, Peer::Refuses("unknown key 'ratelimit'")),
    (&["test/config/misspelled_key2.yaml"], false, Peer::Refuses("unknown key 'requestsperunit'")),
    (&["test/config/non_map_list.yaml"], false, Peer::Refuses("list of type other than map")),
    (&["test/config/non_string_key.yaml"], false, Peer::Refuses("key is not of type string")),
    (&["test/config/replaces_empty.yaml"], false, Peer::Refuses("should not have an empty replaces entry")),
    (&["test/config/replaces_self.yaml"], false, Peer::Refuses("replaces should not contain name of same descriptor")),
    (
        &["test/config/unlimited_with_unit.yaml"],
        false,
        Peer::Refuses("should not specify rate limit unit when unlimited"),
    ),
    (
        &["test/config/basic_config.yaml", "test/config/duplicate_domain.yaml"],
        false,
        Peer::Refuses("duplicate domain 'test-domain'"),
    ),
    (
        &["test/config/merge_domain_key1.yaml", "test/config/merge_domain_key2.yaml"],
        false,
        Peer::Refuses("duplicate domain 'test-domain'"),
    ),
    (
        &["test/config/merge_domain_key1.yaml", "test/config/merge_domain_key1.yaml"],
        true,
        Peer::Refuses("duplicate descriptor composite key 'test-domain.key1_value1'"),
    ),
];

/// `weir import-rls [--merge-domains] FILES…`, serving on `$LISTEN`.
fn import(files: &[&str], merge: bool) -> weir_proc::RunOutput {
    let mut args: Vec<OsString> = vec!["import-rls".into(), "--listen".into(), "$LISTEN".into()];
    if merge {
        args.push("--merge-domains".into());
    }
    args.extend(files.iter().map(|f| Path::new(CORPUS).join(f).into_os_string()));
    weir_proc::run(args, RUN_TIMEOUT)
}

/// The imported TOML of files the peer loads (panics with the import's output otherwise).
fn imported(files: &[&str], merge: bool) -> String {
    let out = import(files, merge);
    assert_eq!(out.code, Some(0), "weir import-rls {files:?}:\n{}", out.describe());
    out.stdout
}

/// Each case as the peer decides it: loaded files import (exit 0) and pass `weir check`; refused
/// ones exit non-zero with the peer's reason. Prints the counts (the issue's closing note).
#[test]
fn the_peers_corpus_imports_as_the_peer_loads_it() {
    let (mut imported_ok, mut refused_ok, mut disagree) = (0, 0, Vec::new());
    for (files, merge, peer) in CASES {
        let out = import(files, *merge);
        match peer {
            Peer::Loads if out.code == Some(0) => {
                let toml = out.stdout.replace("$LISTEN", "127.0.0.1:1");
                let check = weir_proc::check_config("imported.toml", &toml, RUN_TIMEOUT);
                if check.code == Some(0) {
                    imported_ok += 1;
                } else {
                    disagree.push(format!("{files:?}: imported but `weir check` refuses it:\n{}", check.describe()));
                }
            }
            Peer::Loads => disagree.push(format!("{files:?}: the peer loads it, import-rls refuses:\n{}", out.stderr)),
            Peer::Refuses(reason) if out.code != Some(0) && out.stderr.contains(reason) => refused_ok += 1,
            Peer::Refuses(reason) => disagree.push(format!(
                "{files:?}: the peer refuses it ({reason}); import-rls: code {:?}\n{}",
                out.code, out.stderr
            )),
        }
    }
    let loads = CASES.iter().filter(|c| matches!(c.2, Peer::Loads)).count();
    eprintln!(
        "corpus: {imported_ok}/{loads} the peer loads import and pass weir check; {refused_ok}/{} the peer refuses are refused",
        CASES.len() - loads
    );
    assert!(
        disagree.is_empty(),
        "{} of {} cases disagree with the peer:\n{}",
        disagree.len(),
        CASES.len(),
        disagree.join("\n")
    );
}

// --- The imported configs served: the peer's scenarios through the real gRPC API. ---

/// Waits, if needed, until the current minute has more than 5 s left: the scenarios count within
/// minute (and hour) windows aligned to the epoch, and take well under a second.
async fn away_from_a_minute_end() {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64();
    let left = 60.0 - secs % 60.0;
    if left < 5.0 {
        tokio::time::sleep(Duration::from_secs_f64(left + 0.1)).await;
    }
}

/// The files imported and served by a `weir` of their own (memory store).
fn serve(files: &[&str], merge: bool) -> Weir {
    Weir::start(&format!("[log]\naccess_log = false\n\n{}", imported(files, merge)))
}

async fn call(
    c: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> RateLimitResponse {
    let req = RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    };
    c.should_rate_limit(req).await.unwrap_or_else(|s| panic!("ShouldRateLimit failed: {s:?}")).into_inner()
}

fn status_code(s: &DescriptorStatus) -> Code {
    Code::try_from(s.code).expect("a known code")
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add.iter().find(|h| h.key == name).map(|h| h.value.as_str())
}

/// The limit a status reports: (name, requests per unit, unit).
fn limit_of(s: &DescriptorStatus) -> Option<(String, u32, Unit)> {
    s.current_limit.as_ref().map(|l| (l.name.clone(), l.requests_per_unit, l.unit()))
}

/// `requests_per_unit: 0` (reload.yaml's `block`, README example 3's blocklisted address): always
/// over, with the time to the window's end in `duration_until_reset` and `Retry-After`, counting
/// nothing; the other descriptors of the file keep their limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_of_zero_blocks_and_names_the_reset() {
    let w = serve(&["test/integration/runtime/current/ratelimit/reload.yaml", "readme/example3_1.yaml"], false);
    let mut c = client(w.addr).await;
    let blocked = call(&mut c, "reload", &[&[("block", "foo")]]).await;
    assert_eq!(code(&blocked), Code::OverLimit);
    let s = &blocked.statuses[0];
    assert_eq!(status_code(s), Code::OverLimit);
    assert_eq!(s.limit_remaining, 0);
    let reset = s.duration_until_reset.as_ref().expect("duration_until_reset on an over-limit answer").seconds;
    assert!((0..=1).contains(&reset), "a one-second window ends within a second: {reset}");
    assert!(header(&blocked, "Retry-After").is_some(), "{:?}", blocked.response_headers_to_add);
    assert_eq!(limit_of(s).map(|l| (l.1, l.2)), Some((0, Unit::Second)));

    away_from_a_minute_end().await;
    let one = call(&mut c, "reload", &[&[("one_per_minute", "x")]]).await;
    assert_eq!(code(&one), Code::Ok);
    assert_eq!(one.statuses[0].limit_remaining, 0, "1 per minute, just used");
    let again = call(&mut c, "reload", &[&[("one_per_minute", "x")]]).await;
    assert_eq!(code(&again), Code::OverLimit);
    let reset = again.statuses[0].duration_until_reset.as_ref().expect("reset").seconds;
    assert!((1..=60).contains(&reset), "the minute's end: {reset}");

    // README example 3: 10/s per address, 0 for 50.0.0.5 (the most specific match).
    let edge = "edge_proxy_per_ip";
    assert_eq!(code(&call(&mut c, edge, &[&[("remote_address", "50.0.0.5")]]).await), Code::OverLimit);
    let other = call(&mut c, edge, &[&[("remote_address", "50.0.0.1")]]).await;
    assert_eq!(code(&other), Code::Ok);
    assert_eq!(limit_of(&other.statuses[0]).map(|l| (l.1, l.2)), Some((10, Unit::Second)));
}

/// The flagship `examples/ratelimit/config/example.yaml` (domain `rl`): names, `replaces`,
/// unlimited, shadow mode and `quota_mode`, as its README and service tests describe them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flagship_example_answers_as_the_peer() {
    let w = serve(&["examples/ratelimit/config/example.yaml"], false);
    let mut c = client(w.addr).await;
    away_from_a_minute_end().await;
    // The banned value: a limit of 0, reported under the rule's name.
    let banned: &[(&str, &str)] = &[("foo", "x"), ("bar", "banned")];
    let r = call(&mut c, "rl", &[banned]).await;
    assert_eq!(code(&r), Code::OverLimit);
    assert_eq!(limit_of(&r.statuses[0]), Some(("banned_limit".to_string(), 0, Unit::Minute)));
    // `destination_cluster: override` replaces `banned_limit`: in one call, only the override counts.
    let overriding: &[(&str, &str)] = &[("source_cluster", "proxy"), ("destination_cluster", "override")];
    for i in 0..2 {
        let r = call(&mut c, "rl", &[banned, overriding]).await;
        assert_eq!(code(&r), Code::Ok, "call {i}: banned_limit is replaced");
        assert_eq!(status_code(&r.statuses[0]), Code::Ok);
        assert_eq!(r.statuses[0].current_limit, None, "a replaced limit is not decided");
        assert_eq!(limit_of(&r.statuses[1]).map(|l| l.1), Some(2));
    }
    assert_eq!(code(&call(&mut c, "rl", &[banned, overriding]).await), Code::OverLimit, "2 per minute");

    // Unlimited: OK with MaxUint32 remaining (README example 5).
    let r = call(&mut c, "rl", &[&[("qux", "anything")]]).await;
    assert_eq!((code(&r), r.statuses[0].limit_remaining), (Code::Ok, u32::MAX));
    let r = call(&mut c, "rl", &[&[("foo", "x"), ("bay", "y")]]).await;
    assert_eq!((code(&r), r.statuses[0].limit_remaining), (Code::Ok, u32::MAX), "a nested unlimited rule");

    // Shadow mode: 3 per minute, never refused.
    for i in 0..5 {
        let r = call(&mut c, "rl", &[&[("foo", "x"), ("baz", "shady")]]).await;
        assert_eq!(code(&r), Code::Ok, "shadow call {i}");
    }

    // quota_mode: over only when every quota descriptor of the call is over.
    let s1: &[(&str, &str)] = &[("service", "service_1")];
    let s2: &[(&str, &str)] = &[("service", "service_2")];
    let r = call(&mut c, "rl", &[s1, s2]).await;
    assert_eq!(code(&r), Code::Ok);
    let r = call(&mut c, "rl", &[s1, s2]).await;
    assert_eq!(code(&r), Code::Ok, "service_1 (1/min) is over, service_2 (2/min) is not: soft");
    assert_eq!((status_code(&r.statuses[0]), status_code(&r.statuses[1])), (Code::OverLimit, Code::Ok));
    assert!(r.statuses[0].duration_until_reset.is_some());
    assert_eq!(r.statuses[1].limit_remaining, 0, "service_2 was charged by the admitted call");
    let r = call(&mut c, "rl", &[s1, s2]).await;
    assert_eq!(code(&r), Code::OverLimit, "every quota descriptor is over");
    assert_eq!(code(&call(&mut c, "rl", &[&[("unspec", "v")]]).await), Code::Ok, "a hard limit elsewhere is untouched");
}

/// wildcard.yaml and README example 9: `*` in the middle and several times; share_threshold
/// (integration share_threshold.yaml, README example 11): one counter for every matching value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcards_anywhere_and_shared_thresholds() {
    let w = serve(
        &["test/config/wildcard.yaml", "test/integration/runtime/current/ratelimit/config/share_threshold.yaml"],
        false,
    );
    let mut c = client(w.addr).await;
    away_from_a_minute_end().await;
    let d = "test-domain";
    let limit = |r: &RateLimitResponse| limit_of(&r.statuses[0]).map(|l| l.1);
    assert_eq!(limit(&call(&mut c, d, &[&[("midWild", "barxyzb")]]).await), Some(20));
    assert_eq!(limit(&call(&mut c, d, &[&[("midWild", "barxyz")]]).await), None, "must end with b");
    assert_eq!(limit(&call(&mut c, d, &[&[("multiWild", "foo1bar2baz")]]).await), Some(10));
    assert_eq!(limit(&call(&mut c, d, &[&[("multiWild", "foobazbar")]]).await), None, "in order");
    assert_eq!(limit(&call(&mut c, d, &[&[("nestedWild", "val1"), ("wild", "goose")]]).await), Some(20));
    // Each value of a pattern without share_threshold has its own counter: 10 of multiWild each.
    for i in 0..10 {
        assert_eq!(code(&call(&mut c, d, &[&[("multiWild", "fooAbarBbaz")]]).await), Code::Ok, "call {i}");
    }
    assert_eq!(code(&call(&mut c, d, &[&[("multiWild", "fooAbarBbaz")]]).await), Code::OverLimit);
    assert_eq!(code(&call(&mut c, d, &[&[("multiWild", "fooCbarDbaz")]]).await), Code::Ok);

    let s = "share-threshold-test";
    for (i, file) in ["files/a.pdf", "files/b.csv"].iter().cycle().take(10).enumerate() {
        assert_eq!(code(&call(&mut c, s, &[&[("files", file)]]).await), Code::Ok, "shared call {i}");
    }
    assert_eq!(code(&call(&mut c, s, &[&[("files", "files/c.txt")]]).await), Code::OverLimit, "10 per hour, shared");
    for i in 0..10 {
        let r = call(&mut c, s, &[&[("files_no_share", "files_no_share/a.pdf")]]).await;
        assert_eq!(code(&r), Code::Ok, "call {i}");
    }
    let r = call(&mut c, s, &[&[("files_no_share", "files_no_share/b.csv")]]).await;
    assert_eq!(code(&r), Code::Ok, "without share_threshold each value has its own 10");
}

/// basic_config.yaml as config_test.go's TestBasicConfig reads it, merged domains (TestDomainMerge),
/// and the integration directory (three domains) in one process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_merged_domains_and_a_directory() {
    let w = serve(&["test/config/basic_config.yaml"], false);
    let mut c = client(w.addr).await;
    let d = "test-domain";
    let limit = |r: &RateLimitResponse| limit_of(&r.statuses[0]).map(|l| (l.1, l.2));
    assert_eq!(
        limit(&call(&mut c, d, &[&[("key1", "value1"), ("subkey1", "something")]]).await),
        Some((5, Unit::Second))
    );
    assert_eq!(
        limit(&call(&mut c, d, &[&[("key1", "value1"), ("subkey1", "subvalue1")]]).await),
        Some((10, Unit::Second))
    );
    assert_eq!(limit(&call(&mut c, d, &[&[("key2", "something")]]).await), Some((20, Unit::Minute)));
    assert_eq!(limit(&call(&mut c, d, &[&[("key2", "value2")]]).await), Some((30, Unit::Minute)));
    let exempt = call(&mut c, d, &[&[("key2", "value3")]]).await;
    assert_eq!((code(&exempt), exempt.statuses[0].current_limit.clone()), (Code::Ok, None), "key2/value3 is exempt");
    assert_eq!(limit(&call(&mut c, d, &[&[("key3", "foo")]]).await), Some((1, Unit::Hour)));
    let key4 = call(&mut c, d, &[&[("key4", "foo")]]).await;
    assert_eq!(limit_of(&key4.statuses[0]), Some(("key4_rate_limit".to_string(), 1, Unit::Day)), "its name");
    assert_eq!(
        limit(&call(&mut c, d, &[&[("key5", "value5"), ("subkey5", "subvalue5")]]).await),
        Some((25, Unit::Day))
    );
    assert_eq!(call(&mut c, d, &[&[("key6", "foo")]]).await.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(limit(&call(&mut c, d, &[&[("key7", "unspecified")]]).await), Some((70, Unit::Minute)));
    assert_eq!(limit(&call(&mut c, d, &[&[("key1", "value1")]]).await), None, "depth must match");
    drop(w);

    let w = serve(&["test/config/merge_domain_key1.yaml", "test/config/merge_domain_key2.yaml"], true);
    let mut c = client(w.addr).await;
    assert_eq!(limit(&call(&mut c, d, &[&[("key1", "value1")]]).await), Some((10, Unit::Minute)));
    assert_eq!(limit(&call(&mut c, d, &[&[("key2", "value2")]]).await), Some((20, Unit::Minute)));
    drop(w);

    let w = serve(&["test/integration/runtime/current/ratelimit/config"], false);
    let mut c = client(w.addr).await;
    assert_eq!(limit(&call(&mut c, "basic", &[&[("key1", "foo")]]).await), Some((50, Unit::Second)));
    assert_eq!(limit(&call(&mut c, "another", &[&[("key4", "foo")]]).await), Some((20, Unit::Day)));
    assert_eq!(limit(&call(&mut c, "share-threshold-test", &[&[("files", "files/x")]]).await), Some((10, Unit::Hour)));
}

/// What the peer needs two descriptors for: several zones on one rule ("2 a minute and 3 a
/// day"), decided all or nothing, and week-long windows reported as the peer's WEEK unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_zones_on_one_rule_are_all_or_nothing() {
    let w = Weir::start(
        r#"[log]
access_log = false

[[limit_req_zone]]
name = "per_minute"
algorithm = "fixed_window"
window = "1m"
limit = 2

[[limit_req_zone]]
name = "per_day"
algorithm = "fixed_window"
window = "1d"
limit = 3

[[limit_req_zone]]
name = "per_week"
algorithm = "sliding_window"
window = "7d"
limit = 5

[rls]
listen = ["$LISTEN"]

[[rls.domain]]
name = "d"

[[rls.domain.descriptor]]
key = "user"
name = "user_quota"
limit_req = [{ zone = "per_minute" }, { zone = "per_day" }]

[[rls.domain.descriptor]]
key = "probe"
zone = "per_day"

[[rls.domain.descriptor]]
key = "weekly"
zone = "per_week"
"#,
    );
    let mut c = client(w.addr).await;
    away_from_a_minute_end().await;
    for i in 0..2 {
        let r = call(&mut c, "d", &[&[("user", "v")]]).await;
        assert_eq!(code(&r), Code::Ok, "call {i}");
        assert_eq!(r.statuses[0].current_limit.as_ref().map(|l| l.name.as_str()), Some("user_quota"));
    }
    let r = call(&mut c, "d", &[&[("user", "v")]]).await;
    assert_eq!(code(&r), Code::OverLimit, "2 a minute");
    assert_eq!(limit_of(&r.statuses[0]).map(|l| (l.1, l.2)), Some((2, Unit::Minute)), "the zone that refused speaks");
    // `probe` keys per_day with the same value: the refused call charged it nothing.
    let probe = call(&mut c, "d", &[&[("probe", "v")]]).await;
    assert_eq!((code(&probe), probe.statuses[0].limit_remaining), (Code::Ok, 0), "3 a day: 2 + this one");
    assert_eq!(code(&call(&mut c, "d", &[&[("probe", "v")]]).await), Code::OverLimit);

    let weekly = call(&mut c, "d", &[&[("weekly", "v")]]).await;
    assert_eq!(limit_of(&weekly.statuses[0]).map(|l| (l.1, l.2)), Some((5, Unit::Week)));
    assert_eq!(weekly.statuses[0].limit_remaining, 4);
}

/// Envoy's per-descriptor `limit` (`RateLimitOverride`), which the peer applies whatever its
/// rules say (config_test.go TestConfigLimitOverride): ignored unless the domain names a
/// `limit_override_zone`, then decided at the caller's rate, its own counter per rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_limit_override_is_honoured_only_where_enabled() {
    let w = Weir::start(
        r#"[log]
access_log = false

[[limit_req_zone]]
name = "configured"
algorithm = "fixed_window"
window = "1m"
limit = 100

[[limit_req_zone]]
name = "overrides"
algorithm = "fixed_window"
window = "1s"
limit = 1

[rls]
listen = ["$LISTEN"]

[[rls.domain]]
name = "closed"

[[rls.domain.descriptor]]
key = "k"
zone = "configured"

[[rls.domain]]
name = "open"
limit_override_zone = "overrides"

[[rls.domain.descriptor]]
key = "k"
zone = "configured"
"#,
    );
    let mut c = client(w.addr).await;
    away_from_a_minute_end().await;
    let with_limit = |domain: &str| RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            limit: Some(weir::rls::proto::rate_limit_descriptor::RateLimitOverride {
                requests_per_unit: 2,
                unit: Unit::Minute.into(),
            }),
            ..descriptor(&[("k", "v")])
        }],
        hits_addend: 0,
    };
    let r = c.should_rate_limit(with_limit("closed")).await.expect("call").into_inner();
    assert_eq!(limit_of(&r.statuses[0]).map(|l| (l.1, l.2)), Some((100, Unit::Minute)), "ignored by default");
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = c.should_rate_limit(with_limit("open")).await.expect("call").into_inner();
        assert_eq!(limit_of(&r.statuses[0]).map(|l| (l.1, l.2)), Some((2, Unit::Minute)), "the caller's limit");
        codes.push(code(&r));
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
    let plain = call(&mut c, "open", &[&[("k", "v")]]).await;
    assert_eq!(
        limit_of(&plain.statuses[0]).map(|l| (l.1, l.2)),
        Some((100, Unit::Minute)),
        "without a limit: the rules"
    );
    let bad = RateLimitRequest {
        descriptors: vec![RateLimitDescriptor {
            limit: Some(weir::rls::proto::rate_limit_descriptor::RateLimitOverride { requests_per_unit: 2, unit: 0 }),
            ..descriptor(&[("k", "v")])
        }],
        ..with_limit("open")
    };
    let status = c.should_rate_limit(bad).await.expect_err("an unknown unit is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
}

/// What the peer answers one descriptor on a fresh counter: no limit (`OK`, no `current_limit`,
/// remaining 0), unlimited (`OK`, remaining MaxUint32), or a limit (requests per unit, unit, the
/// name when not the zone's) with its code.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    NoLimit,
    Unlimited,
    Limit(u32, Unit, Option<&'static str>, Code),
}

use Answer::{Limit, NoLimit, Unlimited};
const OK: Code = Code::Ok;
const OVER: Code = Code::OverLimit;
const SEC: Unit = Unit::Second;
const MIN: Unit = Unit::Minute;
const HOUR: Unit = Unit::Hour;
const DAY: Unit = Unit::Day;

/// (files, domain, one call's descriptors, the peer's answer per descriptor), from
/// config_test.go, the README and the configs' own comments, read against config_impl.go's
/// GetLimit and ratelimit.go (replaces, unlimited, quota).
type AnswerCase =
    (&'static [&'static str], &'static str, &'static [&'static [(&'static str, &'static str)]], &'static [Answer]);

const ANSWERS: &[AnswerCase] = &[
    // test/config/basic_config.yaml (TestBasicConfig)
    (
        &["test/config/basic_config.yaml"],
        "test-domain",
        &[&[("key1", "value1"), ("subkey1", "something")]],
        &[Limit(5, SEC, None, OK)],
    ),
    (
        &["test/config/basic_config.yaml"],
        "test-domain",
        &[&[("key1", "value1"), ("subkey1", "subvalue1")]],
        &[Limit(10, SEC, None, OK)],
    ),
    (&["test/config/basic_config.yaml"], "test-domain", &[&[("key2", "something")]], &[Limit(20, MIN, None, OK)]),
    (&["test/config/basic_config.yaml"], "test-domain", &[&[("key2", "value2")]], &[Limit(30, MIN, None, OK)]),
    (&["test/config/basic_config.yaml"], "test-domain", &[&[("key2", "value3")]], &[NoLimit]),
    (&["test/config/basic_config.yaml"], "test-domain", &[&[("key3", "foo")]], &[Limit(1, HOUR, None, OK)]),
    (
        &["test/config/basic_config.yaml"],
        "test-domain",
        &[&[("key4", "foo")]],
        &[Limit(1, DAY, Some("key4_rate_limit"), OK)],
    ),
    (
        &["test/config/basic_config.yaml"],
        "test-domain",
        &[&[("key5", "value5"), ("subkey5", "subvalue5")]],
        &[Limit(25, DAY, None, OK)],
    ),
    (&["test/config/basic_config.yaml"], "test-domain", &[&[("key5", "value5")]], &[Limit(15, DAY, None, OK)]),
    (&["test/config/basic_config.yaml"], "test-domain", &[&[("key6", "foo")]], &[Unlimited]),
    (
        &["test/config/basic_config.yaml"],
        "test-domain",
        &[&[("key7", "unspecified_value")]],
        &[Limit(70, MIN, None, OK)],
    ),
    (&["test/config/basic_config.yaml"], "test-domain", &[&[("key1", "value1")]], &[NoLimit]),
    (
        &["test/config/basic_config.yaml"],
        "test-domain",
        &[&[("key1", "value1"), ("subkey1", "x"), ("extra", "y")]],
        &[NoLimit],
    ),
    (&["test/config/basic_config.yaml"], "unknown-domain", &[&[("key1", "value1")]], &[NoLimit]),
    // test/config/shadowmode_config.yaml: a shadow limit never refuses
    (&["test/config/shadowmode_config.yaml"], "test-domain", &[&[("key2", "foo")]], &[Limit(20, MIN, None, OK)]),
    // test/config/wildcard.yaml
    (&["test/config/wildcard.yaml"], "test-domain", &[&[("wild", "foo1")]], &[Limit(20, MIN, None, OK)]),
    (&["test/config/wildcard.yaml"], "test-domain", &[&[("wild", "bar")]], &[NoLimit]),
    (&["test/config/wildcard.yaml"], "test-domain", &[&[("noWild", "foo1")]], &[NoLimit]),
    (&["test/config/wildcard.yaml"], "test-domain", &[&[("noVal", "foo1")]], &[Limit(20, MIN, None, OK)]),
    (&["test/config/wildcard.yaml"], "test-domain", &[&[("midWild", "barab")]], &[Limit(20, MIN, None, OK)]),
    (&["test/config/wildcard.yaml"], "test-domain", &[&[("midWild", "barba")]], &[NoLimit]),
    (&["test/config/wildcard.yaml"], "test-domain", &[&[("multiWild", "fooXbarYbaz")]], &[Limit(10, MIN, None, OK)]),
    (
        &["test/config/wildcard.yaml"],
        "test-domain",
        &[&[("nestedWild", "val1"), ("wild", "goo1")]],
        &[Limit(20, MIN, None, OK)],
    ),
    // test/config/share_threshold.yaml
    (
        &["test/config/share_threshold.yaml"],
        "test-domain",
        &[&[("files", "files/a.pdf")]],
        &[Limit(100, MIN, None, OK)],
    ),
    (
        &["test/config/share_threshold.yaml"],
        "test-domain",
        &[&[("nested", "parent"), ("files", "nested/x")]],
        &[Limit(200, MIN, None, OK)],
    ),
    (
        &["test/config/share_threshold.yaml"],
        "test-domain",
        &[&[("files", "top/a"), ("files", "nested/b")]],
        &[Limit(300, MIN, None, OK)],
    ),
    (
        &["test/config/share_threshold.yaml"],
        "test-domain",
        &[&[("route", "api/v1"), ("method", "GET")]],
        &[Limit(60, MIN, None, OK)],
    ),
    (
        &["test/config/share_threshold.yaml"],
        "test-domain",
        &[&[("service", "svc/a"), ("endpoint", "e")]],
        &[Limit(80, MIN, None, OK)],
    ),
    (
        &["test/config/share_threshold.yaml"],
        "test-domain",
        &[&[("path", "path/a"), ("file", "file/b"), ("type", "t")]],
        &[Limit(120, MIN, None, OK)],
    ),
    (
        &["test/config/share_threshold.yaml"],
        "test-domain",
        &[&[("user", "user/a"), ("resource", "res/b"), ("action", "x")]],
        &[Limit(150, MIN, None, OK)],
    ),
    (&["test/config/share_threshold.yaml"], "test-domain", &[&[("file", "test1")]], &[Limit(50, MIN, None, OK)]),
    (&["test/config/share_threshold.yaml"], "test-domain", &[&[("file", "test2")]], &[Limit(100, MIN, None, OK)]),
    (&["test/config/share_threshold.yaml"], "test-domain", &[&[("midpath", "/apiXv1")]], &[Limit(100, MIN, None, OK)]),
    (
        &["test/config/share_threshold.yaml"],
        "test-domain",
        &[&[("multiroute", "svcAepBrpc")]],
        &[Limit(50, MIN, None, OK)],
    ),
    (&["test/config/share_threshold.yaml"], "test-domain", &[&[("midroute", "/apiXv2")]], &[Limit(80, MIN, None, OK)]),
    (
        &["test/config/share_threshold.yaml"],
        "test-domain",
        &[&[("tenant", "tXprod"), ("resource", "resXv2")]],
        &[Limit(60, MIN, None, OK)],
    ),
    // test/config/metadata.yaml: metadata changes no decision
    (&["test/config/metadata.yaml"], "test-domain", &[&[("key2", "x")]], &[Limit(20, MIN, None, OK)]),
    // examples/ratelimit/config/example.yaml
    (&["examples/ratelimit/config/example.yaml"], "rl", &[&[("category", "account")]], &[Limit(4, MIN, None, OK)]),
    (
        &["examples/ratelimit/config/example.yaml"],
        "rl",
        &[&[("source_cluster", "proxy"), ("destination_cluster", "mock")]],
        &[Limit(1, MIN, None, OK)],
    ),
    (
        &["examples/ratelimit/config/example.yaml"],
        "rl",
        &[&[("source_cluster", "proxy"), ("destination_cluster", "fake")]],
        &[Limit(2, MIN, Some("fake_name"), OK)],
    ),
    (&["examples/ratelimit/config/example.yaml"], "rl", &[&[("foo", "x")]], &[Limit(2, MIN, None, OK)]),
    (&["examples/ratelimit/config/example.yaml"], "rl", &[&[("foo", "x"), ("bar", "y")]], &[Limit(3, MIN, None, OK)]),
    (
        &["examples/ratelimit/config/example.yaml"],
        "rl",
        &[&[("foo", "x"), ("bar", "bkthomps")]],
        &[Limit(1, MIN, Some("bkthomps"), OK)],
    ),
    (
        &["examples/ratelimit/config/example.yaml"],
        "rl",
        &[&[("foo", "x"), ("bar", "banned")]],
        &[Limit(0, MIN, Some("banned_limit"), OVER)],
    ),
    (&["examples/ratelimit/config/example.yaml"], "rl", &[&[("foo", "x"), ("baz", "y")]], &[Limit(1, SEC, None, OK)]),
    (&["examples/ratelimit/config/example.yaml"], "rl", &[&[("foo", "x"), ("bay", "y")]], &[Unlimited]),
    (&["examples/ratelimit/config/example.yaml"], "rl", &[&[("qux", "y")]], &[Unlimited]),
    (&["examples/ratelimit/config/example.yaml"], "rl", &[&[("unspec", "y")]], &[Limit(2, MIN, None, OK)]),
    (
        &["examples/ratelimit/config/example.yaml"],
        "rl",
        &[
            &[("category", "account")],
            &[("source_cluster", "proxy"), ("destination_cluster", "bkthomps")],
            &[("foo", "x"), ("bar", "bkthomps")],
        ],
        &[Limit(4, MIN, None, OK), Limit(2, MIN, None, OK), NoLimit],
    ),
    // the integration configs
    (
        &["test/integration/runtime/current/ratelimit/config"],
        "basic",
        &[&[("key1", "foo")]],
        &[Limit(50, SEC, None, OK)],
    ),
    (
        &["test/integration/runtime/current/ratelimit/config"],
        "basic",
        &[&[("one_per_minute", "foo")]],
        &[Limit(1, MIN, None, OK)],
    ),
    (
        &["test/integration/runtime/current/ratelimit/config"],
        "another",
        &[&[("key3", "foo")]],
        &[Limit(10, HOUR, None, OK)],
    ),
    (
        &["test/integration/runtime/current/ratelimit/config"],
        "another",
        &[&[("key4_local", "foo")]],
        &[Limit(20, DAY, None, OK)],
    ),
    (
        &["test/integration/runtime/current/ratelimit/reload.yaml"],
        "reload",
        &[&[("block", "foo")]],
        &[Limit(0, SEC, None, OVER)],
    ),
    // README examples
    (&["readme/example1_1.yaml"], "mongo_cps", &[&[("database", "users")]], &[Limit(500, SEC, None, OK)]),
    (&["readme/example1_1.yaml"], "mongo_cps", &[&[("database", "other")]], &[NoLimit]),
    (
        &["readme/example2_1.yaml"],
        "messaging",
        &[&[("message_type", "marketing"), ("to_number", "2061111111")], &[("to_number", "2061111111")]],
        &[Limit(5, DAY, None, OK), Limit(100, DAY, None, OK)],
    ),
    (
        &["readme/example3_1.yaml"],
        "edge_proxy_per_ip",
        &[&[("remote_address", "50.0.0.5")]],
        &[Limit(0, SEC, None, OVER)],
    ),
    (&["readme/example4_1.yaml"], "example4", &[&[("key", "value"), ("subkey", "subvalue")]], &[NoLimit]),
    (
        &["readme/example4_2.yaml"],
        "example4",
        &[&[("key", "value"), ("subkey", "subvalue")]],
        &[Limit(300, SEC, None, OK)],
    ),
    (
        &["readme/example5_1.yaml"],
        "internal",
        &[&[("ldap", "x")], &[("azure", "y")]],
        &[Unlimited, Limit(100, MIN, None, OK)],
    ),
    (
        &["readme/example6_1.yaml"],
        "example6",
        &[&[("service", "auth-service"), ("user", "user-a")]],
        &[Limit(10, SEC, None, OK)],
    ),
    (
        &["readme/example6_1.yaml"],
        "example6",
        &[&[("service", "auth-service"), ("user", "user-b")]],
        &[Limit(20, SEC, None, OK)],
    ),
    (
        &["readme/example7_1.yaml"],
        "example7",
        &[&[("key_1", "value_1"), ("user", "bkthomps")]],
        &[Limit(5, SEC, Some("specific_limit"), OK)],
    ),
    (
        &["readme/example7_1.yaml"],
        "example7",
        &[&[("key_1", "value_1"), ("user", "bkthomps")], &[("key_2", "value_2"), ("user", "bkthomps")]],
        &[NoLimit, Limit(10, SEC, None, OK)],
    ),
    (&["readme/example8_1.yaml"], "example8", &[&[("key1", "unspecified_value")]], &[Limit(10, MIN, None, OK)]),
    (&["readme/example8_1.yaml"], "example8", &[&[("key1", "value1")]], &[Limit(20, MIN, None, OK)]),
    (&["readme/example9_1.yaml"], "example9", &[&[("key1", "valueXYZ")]], &[Limit(20, MIN, None, OK)]),
    (&["readme/example9_2.yaml"], "example9", &[&[("path", "/api/user-id/action")]], &[Limit(20, MIN, None, OK)]),
    (&["readme/example9_2.yaml"], "example9", &[&[("path", "/api/123/other")]], &[NoLimit]),
    (
        &["readme/example9_3.yaml"],
        "example9",
        &[&[("route", "/api/v2/resource/456/action")]],
        &[Limit(20, MIN, None, OK)],
    ),
    (
        &["readme/example10_1.yaml"],
        "example10",
        &[&[("route", "api"), ("http_method", "GET"), ("subject_id", "123")]],
        &[Limit(60, MIN, None, OK)],
    ),
    (
        &["readme/example10_2.yaml"],
        "example10_wildcard",
        &[&[("user", "alice"), ("action", "readfile"), ("resource", "documents")]],
        &[Limit(100, MIN, None, OK)],
    ),
    (&["readme/example11_1.yaml"], "example11", &[&[("files", "files/a.pdf")]], &[Limit(10, HOUR, None, OK)]),
    (
        &["readme/example11_2.yaml"],
        "example11_metrics",
        &[&[("route", "api/v1"), ("method", "GET")]],
        &[Limit(60, MIN, None, OK)],
    ),
];

/// What Weir answered, in the peer's terms.
fn answer_of(s: &DescriptorStatus) -> Answer {
    match &s.current_limit {
        None if s.limit_remaining == u32::MAX => Unlimited,
        None => NoLimit,
        Some(l) => {
            // The peer names a limit only when its rule has a name: the zone name is Weir's.
            let named = ANSWERS.iter().flat_map(|c| c.3.iter()).find_map(|a| match a {
                Limit(_, _, Some(n), _) if *n == l.name => Some(*n),
                _ => None,
            });
            Limit(l.requests_per_unit, l.unit(), named, status_code(s))
        }
    }
}

/// Every answer case on a fresh `weir` per file set: the count of answers equal to the peer's
/// (the issue's closing note), all of them required.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peers_documented_answers() {
    let mut by_files: Vec<&'static [&'static str]> = Vec::new();
    for case in ANSWERS {
        if !by_files.contains(&case.0) {
            by_files.push(case.0);
        }
    }
    let (mut equal, mut differ) = (0, Vec::new());
    for files in by_files {
        let out = import(files, false);
        if out.code != Some(0) {
            for case in ANSWERS.iter().filter(|c| c.0 == files) {
                differ.push(format!("{files:?} {} {:?}: not imported: {}", case.1, case.2, out.stderr.trim()));
            }
            continue;
        }
        let w = Weir::start(&format!("[log]\naccess_log = false\n\n{}", out.stdout));
        let mut c = client(w.addr).await;
        for (_, domain, descriptors, expected) in ANSWERS.iter().filter(|c| c.0 == files) {
            let r = call(&mut c, domain, descriptors).await;
            let got: Vec<Answer> = r.statuses.iter().map(answer_of).collect();
            let overall = if expected.iter().any(|a| matches!(a, Limit(_, _, _, Code::OverLimit))) { OVER } else { OK };
            if got == *expected && code(&r) == overall {
                equal += 1;
            } else {
                differ.push(format!(
                    "{files:?} {domain} {descriptors:?}: the peer {expected:?} ({overall:?}), Weir {got:?} ({:?})",
                    code(&r)
                ));
            }
        }
    }
    eprintln!("answers: {equal}/{} equal to the peer's", ANSWERS.len());
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// The same decisions on the Redis store (the Lua script): a block with its reset, `replaces`,
/// quota mode's second decision, and a week-long sliding window, for two instances sharing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_two_instances_decide_alike() {
    let redis = support::redis_server::RedisServer::start();
    let toml = format!(
        "[log]\naccess_log = false\n\n{}\n\n{}",
        support::config::redis_store(&redis.url(), ""),
        imported(
            &["examples/ratelimit/config/example.yaml", "test/integration/runtime/current/ratelimit/reload.yaml"],
            false
        )
    );
    let (a, b) = (Weir::start(&toml), Weir::start(&toml));
    let (mut ca, mut cb) = (client(a.addr).await, client(b.addr).await);
    away_from_a_minute_end().await;
    let blocked = call(&mut ca, "reload", &[&[("block", "x")]]).await;
    assert_eq!(code(&blocked), Code::OverLimit);
    assert!(blocked.statuses[0].duration_until_reset.is_some() && header(&blocked, "Retry-After").is_some());
    let banned: &[(&str, &str)] = &[("foo", "x"), ("bar", "banned")];
    let overriding: &[(&str, &str)] = &[("source_cluster", "proxy"), ("destination_cluster", "override")];
    assert_eq!(code(&call(&mut ca, "rl", &[banned]).await), Code::OverLimit);
    assert_eq!(code(&call(&mut ca, "rl", &[banned, overriding]).await), Code::Ok, "replaced");
    assert_eq!(code(&call(&mut cb, "rl", &[banned, overriding]).await), Code::Ok, "replaced, second instance");
    assert_eq!(code(&call(&mut ca, "rl", &[banned, overriding]).await), Code::OverLimit, "2 a minute across both");
    let s1: &[(&str, &str)] = &[("service", "service_1")];
    let s2: &[(&str, &str)] = &[("service", "service_2")];
    assert_eq!(code(&call(&mut ca, "rl", &[s1, s2]).await), Code::Ok);
    let soft = call(&mut cb, "rl", &[s1, s2]).await;
    assert_eq!(code(&soft), Code::Ok, "only service_1 is over: soft");
    assert_eq!((status_code(&soft.statuses[0]), soft.statuses[1].limit_remaining), (Code::OverLimit, 0));
    assert_eq!(code(&call(&mut ca, "rl", &[s1, s2]).await), Code::OverLimit, "both quotas over");
}

/// The peer's integration test `testBasicBaseConfig` (test/integration/integration_test.go) on
/// its runtime config directory: the unknown domain, the first call's remaining count, going over
/// a minute limit, two descriptors in one call, and `duration_until_reset` ticking down. Where
/// one descriptor of a call is over, the peer's other counter still moves unless
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`; Weir charges nothing, which is what the peer's test
/// expects with that setting (`limitRemaining1 = 10`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peers_basic_integration_scenario() {
    let w = serve(&["test/integration/runtime/current/ratelimit/config"], false);
    let mut c = client(w.addr).await;
    let with_reset = |s: &DescriptorStatus, unit_secs: i64| {
        let t = s.duration_until_reset.as_ref().expect("duration_until_reset").seconds;
        assert!((0..=unit_secs).contains(&t), "{t} s within a {unit_secs} s window");
        (status_code(s), limit_of(s).map(|l| (l.1, l.2)), s.limit_remaining)
    };
    let r = call(&mut c, "foo", &[&[("hello", "world")]]).await;
    assert_eq!((code(&r), r.statuses[0].current_limit.clone(), r.statuses[0].limit_remaining), (OK, None, 0));

    let r = call(&mut c, "basic", &[&[("key1", "foo")]]).await;
    assert_eq!(with_reset(&r.statuses[0], 1), (OK, Some((50, SEC)), 49));

    away_from_a_minute_end().await;
    let random = format!("{}", std::process::id() ^ 0x5eed);
    for i in 0..25u32 {
        let r = call(&mut c, "another", &[&[("key2", &random)]]).await;
        let (status, remaining) = if i >= 20 { (OVER, 0) } else { (OK, 20 - (i + 1)) };
        assert_eq!(code(&r), status, "call {i}");
        assert_eq!(with_reset(&r.statuses[0], 60), (status, Some((20, MIN)), remaining), "call {i}");
    }
    let random = format!("{random}-2");
    for i in 0..15u32 {
        let r = call(&mut c, "another", &[&[("key2", &random)], &[("key3", &random)]]).await;
        let (status, remaining1, remaining2) = if i >= 10 { (OVER, 10, 0) } else { (OK, 20 - (i + 1), 10 - (i + 1)) };
        assert_eq!(code(&r), status, "call {i}");
        assert_eq!(with_reset(&r.statuses[0], 60), (OK, Some((20, MIN)), remaining1), "call {i}");
        assert_eq!(with_reset(&r.statuses[1], 3600), (status, Some((10, HOUR)), remaining2), "call {i}");
    }

    // duration_until_reset ticks down (the peer waits 2 s between two calls). Time must pass
    // here, on the real clock of another process: the reset is told in whole seconds, so a little
    // over one second is the least that makes every rounding of it smaller.
    let first = call(&mut c, "another", &[&[("key4", "durTest")]]).await;
    let t1 = first.statuses[0].duration_until_reset.as_ref().expect("reset").seconds;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = call(&mut c, "another", &[&[("key4", "durTest")]]).await;
    let t2 = second.statuses[0].duration_until_reset.as_ref().expect("reset").seconds;
    assert!(t2 < t1, "{t2} s after {t1} s");
}

/// The peer's `testConfigReload`: the runtime config swapped for `reload.yaml` while serving.
/// Weir follows a changed config file: the new domain's `block` answers OVER_LIMIT, bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_config_is_served_after_a_reload() {
    let w = serve(&["test/integration/runtime/current/ratelimit/config"], false);
    let mut c = client(w.addr).await;
    assert_eq!(call(&mut c, "reload", &[&[("block", "foo")]]).await.statuses[0].current_limit, None, "not yet");
    let served = std::fs::read_to_string(&w.config_path).expect("the served config");
    let listen = served.lines().find(|l| l.starts_with("listen = ")).expect("[rls] listen").to_string();
    let next = format!(
        "[log]\naccess_log = false\n\n{}",
        imported(&["test/integration/runtime/current/ratelimit/reload.yaml"], false)
    )
    .replace("listen = [\"$LISTEN\"]", &listen);
    // Written beside it and renamed over it, as a ConfigMap's symlink swap replaces it at once.
    let staged = w.config_path.with_extension("next");
    std::fs::write(&staged, next).expect("write");
    std::fs::rename(&staged, &w.config_path).expect("rename");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = call(&mut c, "reload", &[&[("block", "foo")]]).await;
        if code(&r) == OVER {
            assert_eq!(limit_of(&r.statuses[0]).map(|l| (l.1, l.2)), Some((0, SEC)));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the new config never answered:\n{}", w.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone = call(&mut c, "basic", &[&[("key1", "foo")]]).await;
    assert_eq!(gone.statuses[0].current_limit, None, "the old domain is gone with its file");
}

/// The same features on a proxied route, decided by the same engine: a block (limit 0) is a
/// 429 with a `Retry-After` within its window, and a 30-day window counts across requests.
#[test]
fn routes_get_blocks_and_long_windows_too() {
    let up = support::upstream::Upstream::start();
    let w = Weir::start(&support::config::memory_with_app(
        up.addr(),
        r#"[[limit_req_zone]]
name = "blocked"
key = "ip"
algorithm = "fixed_window"
window = "1h"
limit = 0

[[limit_req_zone]]
name = "monthly"
key = "ip"
algorithm = "fixed_window"
window = "30d"
limit = 2

[[route]]
name = "blocked"
path_prefix = "/blocked/"
upstream = "app"
limit_req = [{ zone = "blocked" }]

[[route]]
name = "monthly"
path_prefix = "/"
upstream = "app"
limit_req = [{ zone = "monthly" }]
"#,
    ));
    let r = support::http::must_send(w.addr, &support::http::Request::get("/blocked/x"));
    assert_eq!(r.status, 429, "{}", r.summary());
    let retry = support::ratelimit::retry_after(&r);
    assert!((1..=3600).contains(&retry), "Retry-After {retry} within the hour window");
    let statuses: Vec<u16> =
        (0..3).map(|_| support::http::must_send(w.addr, &support::http::Request::get("/m")).status).collect();
    assert_eq!(statuses, [200, 200, 429], "2 per 30 days");
    assert!(up.seen().iter().all(|s| !s.path.starts_with("/blocked")), "the block never reached the upstream");
}
