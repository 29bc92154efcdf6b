#!/usr/bin/env bash
# The CPU a request costs with tracing off, at sample_ratio 0.01 and at 1.0 (docs/production.md,
# "Cost"): a release weir on one thread (memory store, one limit, access log off) in front of
# `weir echo`, spans exported to a second `weir echo` (an OTLP sink answering 200), loaded by wrk
# (1 thread, 16 connections, 2 s warm-up, 8 s measured) in rounds of the three configs. CPU is the
# weir process's user + system time (exporter thread included) over the requests wrk completed.
# Loopback only; stops what it started.
#
#   cargo build --release --locked --bin weir && bash scripts/trace-cost.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
weir="${WEIR:-${CARGO_TARGET_DIR:-$PWD/target}/release/weir}"
rounds="${1:-3}"
for tool in wrk curl python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "trace-cost: $tool is missing (apt-get install $tool)" >&2; exit 1; }
done
[ -x "$weir" ] || { echo "trace-cost: no $weir (cargo build --release --locked --bin weir)" >&2; exit 1; }
work="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
ports=($(python3 -c 'import socket
ss=[socket.socket() for _ in range(3)]
[s.bind(("127.0.0.1",0)) for s in ss]
print(*[s.getsockname()[1] for s in ss])'))
proxy="127.0.0.1:${ports[0]}" upstream="127.0.0.1:${ports[1]}" sink="127.0.0.1:${ports[2]}"
"$weir" echo --listen "$upstream" >/dev/null 2>&1 & pids+=($!)
"$weir" echo --listen "$sink" >/dev/null 2>&1 & pids+=($!)
config() {
  cat <<CONF
[server]
listen = ["$proxy"]
threads = 1
[store]
kind = "memory"
[log]
access_log = false
$1
[[upstream]]
name = "app"
servers = ["$upstream"]
[[limit_req_zone]]
name = "z"
key = "ip"
rate = "1000000r/s"
[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
limit_req = [ { zone = "z", burst = 1000000, nodelay = true } ]
CONF
}
config "" >"$work/off.toml"
for ratio in 0.01 1.0; do
  config "$(printf '[tracing]\nendpoint = "http://%s/v1/traces"\nsample_ratio = %s' "$sink" "$ratio")" >"$work/$ratio.toml"
done
ticks="$(getconf CLK_TCK)"
for round in $(seq "$rounds"); do
  for c in off 0.01 1.0; do
    "$weir" -c "$work/$c.toml" >/dev/null 2>&1 & pid=$!
    for _ in $(seq 100); do curl -s -o /dev/null "http://$proxy/" && break; sleep 0.1; done
    wrk -t1 -c16 -d2s "http://$proxy/" >/dev/null 2>&1
    read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$pid/stat")
    out="$(wrk -t1 -c16 -d8s "http://$proxy/")"
    read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
    kill "$pid"; wait "$pid" 2>/dev/null || true
    requests="$(awk '/requests in/ {print $1}' <<<"$out")"
    rps="$(awk '/Requests\/sec/ {print $2}' <<<"$out")"
    python3 -c "import sys; r,c,t=int(sys.argv[1]),int(sys.argv[2]),int(sys.argv[3]); print(f'round {sys.argv[4]} tracing={sys.argv[5]:>4}: {r} requests, {sys.argv[6]} req/s, {c*1e6/t/r:.1f} us CPU per request')" \
      "$requests" "$((u1 + s1 - u0 - s0))" "$ticks" "$round" "$c" "$rps"
  done
done
