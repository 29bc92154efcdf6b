#!/usr/bin/env bash
# Runs Weir on the embedded default: the memory store (no Redis needed), conf/routes.toml, and a
# built-in demo upstream on 127.0.0.1:9000 to proxy to. Weir listens on 127.0.0.1:8080.
# Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-run.sh
export PATH="$HOME/.cargo/bin:$PATH"

cargo build --release --locked --bin weir
./target/release/weir check -c conf/routes.toml
./target/release/weir echo --listen 127.0.0.1:9000 &
echo_pid=$!
trap 'kill $echo_pid 2>/dev/null || true' EXIT
cat >&2 <<'MSG'

Weir is starting on http://127.0.0.1:8080 (demo upstream on :9000). In another terminal:

  for i in $(seq 10); do curl -s -o /dev/null -w '%{http_code}\n' localhost:8080/api/hello; done

shows 200s turning into 429s (route "api": 2r/s per client IP, burst 5, nodelay).
  curl -i localhost:8080/api/hello     shows the RateLimit-Policy, RateLimit and Retry-After headers.

MSG
./target/release/weir -c conf/routes.toml
