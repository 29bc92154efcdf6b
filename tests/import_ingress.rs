//! `weir import-ingress` on the manifests of tests/data/ingress/: each imports (every backend
//! sent to a test address) and passes `weir check`; a raw-nginx snippet is refused at its line;
//! `--replicas` reports the per-replica totals.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::weir;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ingress")
}

fn import(args: &[&str]) -> weir::RunOutput {
    let mut all = vec!["import-ingress", "--upstream", "127.0.0.1:9000", "--listen", "127.0.0.1:8080"];
    all.extend_from_slice(args);
    weir::run(all, Duration::from_secs(30))
}

#[test]
fn every_manifest_imports_and_passes_weir_check() {
    for name in ["killercoda-rate-limited.yaml", "annotations-doc.yaml", "limits-every-annotation.yaml"] {
        let p = corpus().join(name).display().to_string();
        let out = import(&[&p]);
        assert!(out.code == Some(0), "{name}: {}", out.describe());
        let dir = weir::ConfigDir::new();
        let file = dir.write("imported.toml", &out.stdout);
        let check = weir::run(["check", "-c", &file.display().to_string()], Duration::from_secs(30));
        assert!(check.code == Some(0), "{name}: {}\n{}", check.describe(), out.stdout);
    }
    // A directory is read whole (its refused/ subdirectory too: refused without the flag).
    let dir = corpus().display().to_string();
    let out = import(&[&dir]);
    assert!(out.code != Some(0) && out.stderr.contains("server-snippet"), "{}", out.describe());
    let out = import(&[&dir, "--allow-unexpressed"]);
    assert!(out.code == Some(0), "{}", out.describe());
    assert!(out.stderr.contains("left out:") && out.stderr.contains("server-snippet"), "{}", out.stderr);
}

#[test]
fn annotations_translate_as_ingress_nginx_generated_them() {
    let p = corpus().join("annotations-doc.yaml").display().to_string();
    let out = import(&[&p, "--replicas", "3"]);
    assert!(out.code == Some(0), "{}", out.describe());
    let t = &out.stdout;
    assert!(t.contains("limit_req_status = 429"), "{t}");
    assert!(t.contains("{ zone = \"storefront-production_checkout-api_7d0b3c6e-2f41-4a8e-b9d2-5c3e8f1a0b27_rps\", burst = 10, nodelay = true, unless = "), "{t}");
    assert!(t.contains("burst = 200, nodelay = true"), "{t}");
    assert!(t.contains("unless = [ { ip = [\"10.1.0.0/16\", \"192.168.0.0/24\"] } ]"), "{t}");
    assert!(t.contains("trusted = [\"10.0.0.0/8\"]"), "{t}");
    assert!(t.contains("path_regex = \"(?i)^/api/checkout\""), "{t}");
    assert!(out.stderr.contains("limit-rps 5: across 3 replicas effectively 15 r/s"), "{}", out.stderr);
}

#[test]
fn every_annotation_of_one_ingress_applies_and_the_whitelist_exempts_from_all_of_them() {
    let p = corpus().join("limits-every-annotation.yaml").display().to_string();
    let out = import(&[&p]);
    assert!(out.code == Some(0), "{}", out.describe());
    let t = &out.stdout;
    let exempt = "unless = [ { ip = [\"10.0.0.0/8\", \"172.16.0.0/12\"] } ]";
    // limit-rps and limit-rpm both apply, burst = rate × limit-burst-multiplier, always nodelay.
    assert!(t.contains(&format!("_rps\", burst = 15, nodelay = true, {exempt} }}")), "{t}");
    assert!(t.contains(&format!("_rpm\", burst = 300, nodelay = true, {exempt} }}")), "{t}");
    // limit-connections, exempted by the same whitelist (ingress-nginx keys both by one map).
    assert!(t.contains(&format!("_conn\", max = 10, {exempt} }}]\nlimit_conn_status = 503")), "{t}");
    assert!(t.contains("limit_rate = \"512k\"\nlimit_rate_after = \"1024k\""), "{t}");
    // limit-allowlist (the newer spelling) and the default multiplier 5.
    assert!(t.contains("burst = 150, nodelay = true, unless = [ { ip = [\"192.0.2.0/24\"] } ]"), "{t}");
    // The Ingress without annotations has no limit on the same host.
    let docs = &t[t.find("Ingress api_docs path /").unwrap()..];
    let docs = &docs[..docs.find("\n\n").unwrap()];
    assert!(!docs.contains("limit_req"), "{docs}");
}

#[test]
fn refused_manifests_name_their_file_line_and_reason() {
    let dir = corpus().join("refused");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let want = text.lines().find_map(|l| l.strip_prefix("# refused: ")).expect("a `# refused:` line");
        let (line, words) = want.split_once(": ").unwrap();
        let p = path.display().to_string();
        let out = import(&[&p]);
        assert!(out.code != Some(0), "{p} was imported:\n{}", out.stdout);
        let expect = format!("{p}:{line}: ");
        assert!(
            out.stderr.contains(&expect) && out.stderr.contains(words),
            "{p}: want {expect}…{words}, got {}",
            out.stderr
        );
        seen += 1;
    }
    assert!(seen >= 2, "{seen} refused manifests");
}

#[test]
fn snippets_are_refused_with_file_and_line() {
    let p = corpus().join("refused/server-snippet.yaml").display().to_string();
    let out = import(&[&p]);
    assert!(out.code != Some(0), "{}", out.stdout);
    assert!(
        out.stderr.contains(&format!("{p}:6: Ingress default/stats: nginx.ingress.kubernetes.io/server-snippet")),
        "{}",
        out.stderr
    );
}
