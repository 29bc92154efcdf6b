#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs missing tools, then formatting, lints, every unit
# and integration test (each integration test starts its own redis-server and weir processes on
# free loopback ports), a smoke run of the benchmark harness so it never rots, and a one-minute
# soak (two Weirs on one Redis under chaos: Redis killed, reloads, an instance SIGKILLed).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"

cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo build --locked --bins
for conf in conf/*.toml; do ./target/debug/weir check -c "$conf"; done
cargo test --locked -- --test-threads="${WEIR_TEST_THREADS:-2}"
bash bench/run.sh --quick
bash bench/rls.sh --quick
bash bench/soak.sh --duration 60
