#!/usr/bin/env bash
# Builds (release) and runs the cache micro-benchmark; prints ns/op per structure and workload.
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-../../target/cache-bench}"
cargo run --release --quiet -- "$@"
