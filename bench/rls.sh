#!/usr/bin/env bash
# Weir as Envoy's rate limit service (docs/rls.md): decisions per second on one core and µs of
# Weir CPU per decision, on the memory and the Redis store. Weir (one thread) is pinned to
# BENCH_SUT_CPU, the gRPC load generator (examples/rls_load.rs, the generated tonic client) and
# Redis to BENCH_LOAD_CPU, like bench/run.sh's proxy rows.
#
#   bench/rls.sh            5 s per row, 3 repetitions; writes bench/results/rls-latest.md
#   bench/rls.sh --quick    2 s per row, 1 repetition; writes bench/results/rls-quick.md
#
# Then latency at a fixed rate (open loop, RLS_RATE calls/s, each call a task of its own so a
# stalled answer never holds back the next calls), per store: p50, p90, p99, p99.9 and max against
# issue 40's targets (p99 <= 1 ms, p99.9 <= 3 ms, max <= 10 ms at 5,000 calls/s), and how late the
# generator started its calls (p99; tokio's timer ticks every millisecond).
#
# Environment: BENCH_SUT_CPU (0), BENCH_LOAD_CPU (1), BENCH_SKIP_BUILD=1 (use target/release as
# it is), RLS_CONNECTIONS (4), RLS_IN_FLIGHT (16 per connection), RLS_RATE (5000).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh >/dev/null   # redis-server, the Rust toolchain
export PATH="$HOME/.cargo/bin:$PATH"

duration=5 reps=3 out=bench/results/rls-latest.md
if [ "${1:-}" = "--quick" ]; then duration=2 reps=1 out=bench/results/rls-quick.md; fi
sut_cpu=${BENCH_SUT_CPU:-0} load_cpu=${BENCH_LOAD_CPU:-1}
connections=${RLS_CONNECTIONS:-4} in_flight=${RLS_IN_FLIGHT:-16} fixed_rate=${RLS_RATE:-5000}

# --quick (CI's smoke run) takes the load generator from the debug build the tests already made:
# a release build of the example is one more whole-program LTO link. Weir is always the release
# build, and its CPU per decision is measured on its side, whatever drives it.
profile=release
if [ "$reps" = 1 ]; then profile=debug; fi
if [ "${BENCH_SKIP_BUILD:-0}" != 1 ]; then
  cargo build --release --locked --bin weir >&2
  if [ "$profile" = release ]; then
    cargo build --release --locked --example rls_load >&2
  else
    cargo build --locked --example rls_load >&2
  fi
fi
weir=target/release/weir load=target/$profile/examples/rls_load
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM

source bench/lib/procs.sh

redis_port=$(free_port)
taskset -c "$load_cpu" redis-server --port "$redis_port" --save '' --appendonly no --daemonize no >"$tmp/redis.log" 2>&1 &
pids+=($!)
wait_port "$redis_port"

config() {  # $1: store section, $2: port
  cat <<TOML
[server]
threads = 1

[log]
access_log = false

$1

[[limit_req_zone]]
name = "per_ip"
rate = "1000r/s"

[rls]
listen = ["127.0.0.1:$2"]

[[rls.domain]]
name = "bench"

[[rls.domain.descriptor]]
key = "remote_address"
zone = "per_ip"
burst = 1000
nodelay = true
TOML
}

start_weir() {  # $1: name, $2: store section → sets $port and $pid of a serving weir
  port=$(free_port)
  config "$2" "$port" >"$tmp/$1.toml"
  taskset -c "$sut_cpu" "$weir" -c "$tmp/$1.toml" 2>"$tmp/$1.log" &
  pid=$!
  pids+=("$pid")
  wait_port "$port"
}

row() {  # $1: name, $2: store section → "calls/s µs-per-decision"
  local port pid
  start_weir "$1" "$2"
  taskset -c "$load_cpu" "$load" "127.0.0.1:$port" 1 "$connections" "$in_flight" >/dev/null   # warm-up
  local before; before=$(cpu_ticks "$pid")
  local result; result=$(taskset -c "$load_cpu" "$load" "127.0.0.1:$port" "$duration" "$connections" "$in_flight")
  local after; after=$(cpu_ticks "$pid")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 - "$result" "$before" "$after" "$tck" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); before, after, tck = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if r["errors"] or not r["calls"]:
    sys.exit(f"rls bench: {r['errors']} errors of {r['calls']} calls")
cpu_s = (after - before) / tck
print(f"{r['calls_per_sec']:.0f} {cpu_s * 1e6 / r['calls']:.1f} {r['calls']}")
PY
}

declare -A rows=([memory]='[store]
kind = "memory"' [redis]="[store]
kind = \"redis\"
url = \"redis://127.0.0.1:$redis_port\"
timeout = \"1s\"")
{
  echo "# Rate limit service (gRPC) — $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Weir (1 thread, release) on CPU $sut_cpu; examples/rls_load ($profile build, $connections connections × $in_flight calls in flight) and Redis on CPU $load_cpu; ${duration}s per row, $reps repetition(s). One descriptor per call."
  echo
  echo "| store | rep | decisions/s | µs Weir CPU per decision | calls |"
  echo "|---|---|---|---|---|"
} >"$out"
for rep in $(seq "$reps"); do
  for store in memory redis; do
    read -r rate us calls < <(row "$store-$rep" "${rows[$store]}")
    echo "| $store | $rep | $rate | $us | $calls |" | tee -a "$out" >&2
  done
done

latency_row() {  # $1: name, $2: store section → the load generator's JSON line
  local port pid
  start_weir "$1" "$2"
  taskset -c "$load_cpu" "$load" "127.0.0.1:$port" 1 "$connections" --rate "$fixed_rate" >/dev/null   # warm-up
  taskset -c "$load_cpu" "$load" "127.0.0.1:$port" "$duration" "$connections" --rate "$fixed_rate"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
{
  echo
  echo "## Latency at a fixed rate"
  echo
  echo "Open loop at $fixed_rate calls/s over $connections connections, ${duration}s per row; latency of each call from its start (µs), each call a task of its own; \"late p99\": how late the generator started calls against the schedule. Targets (issue 40): p99 ≤ 1000, p99.9 ≤ 3000, max ≤ 10000."
  echo
  echo "| store | rep | calls/s | p50 | p90 | p99 | p99.9 | max | late p99 | errors | targets |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
} >>"$out"
for rep in $(seq "$reps"); do
  for store in memory redis; do
    result=$(latency_row "lat-$store-$rep" "${rows[$store]}")
    python3 - "$result" "$store" "$rep" <<'PY' | tee -a "$out" >&2
import json, sys
r, store, rep = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
met = r["p99_us"] <= 1000 and r["p999_us"] <= 3000 and r["max_us"] <= 10000
print(f"| {store} | {rep} | {r['calls_per_sec']:.0f} | {r['p50_us']} | {r['p90_us']} | {r['p99_us']} | {r['p999_us']} | {r['max_us']} | {r['late_p99_us']} | {r['errors']} | {'met' if met else 'MISSED'} |")
if r["errors"] or not r["calls"]:
    sys.exit(f"rls bench: {r['errors']} errors of {r['calls']} calls")
PY
  done
done
echo "bench: wrote $out" >&2
