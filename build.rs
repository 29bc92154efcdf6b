//! Compiles Envoy's rate limit service and rate limit quota service APIs (proto/, a vendored
//! subset) into Rust with protox, a
//! pure-Rust protobuf compiler, so building Weir needs no `protoc`; and records the commit built
//! (`weir --version`, `weir_build_info`).

use std::path::Path;
use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/envoy/service/ratelimit/v3/rls.proto", "proto/envoy/service/rate_limit_quota/v3/rlqs.proto"];
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(descriptors)?;
    println!("cargo:rustc-env=WEIR_COMMIT={}", commit());
    Ok(())
}

/// `WEIR_COMMIT` when set (a build from a tarball or a container without `.git`), else git's
/// short hash of HEAD, else "unknown".
fn commit() -> String {
    println!("cargo:rerun-if-env-changed=WEIR_COMMIT");
    if let Ok(commit) = std::env::var("WEIR_COMMIT") {
        if !commit.is_empty() {
            return commit;
        }
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|s| s.trim().to_string())
    };
    // Rerun when HEAD moves: the files that say where it is. Only existing ones: cargo reruns a
    // build script on every build while a file it watches is missing.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            if Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_string())
}
