//! Weir as a drop-in for envoyproxy/ratelimit (issue #35): the peer's own configs
//! (`tests/data/envoy-ratelimit/`, copied from envoyproxy/ratelimit at f2fb157) through the real
//! `weir import-rls` and `weir check`, and the imported configs served by the real binary,
//! answering over gRPC what the peer's tests and README say they answer.

mod support;

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use support::weir as weir_proc;

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

/// `weir import-rls [--merge-domains] FILES…`.
fn import(files: &[&str], merge: bool) -> weir_proc::RunOutput {
    let mut args: Vec<OsString> = vec!["import-rls".into()];
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
/// ones exit non-zero with the peer's reason. Prints the counts (the closing note).
#[test]
fn the_peers_corpus_imports_as_the_peer_loads_it() {
    let (mut imported_ok, mut refused_ok, mut disagree) = (0, 0, Vec::new());
    for (files, merge, peer) in CASES {
        let out = import(files, *merge);
        match peer {
            Peer::Loads if out.code == Some(0) => {
                let check = weir_proc::check_config("imported.toml", &out.stdout, RUN_TIMEOUT);
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
