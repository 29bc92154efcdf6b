#!/usr/bin/env bash
# Weir as Envoy's rate limit quota service (docs/rlqs.md): what one usage report costs. A report is
# one bucket's usage in an Envoy's message (BucketQuotaUsage); each one that is due goes to the
# ledger (one division). Weir (one thread, release) is pinned to BENCH_SUT_CPU, the gRPC load
# generator (examples/rlqs_load.rs, the generated tonic client: STREAMS Envoys, each reporting the
# same BUCKETS buckets every interval, so each key has STREAMS holders) and Redis to BENCH_LOAD_CPU,
# like bench/rls.sh.
#
#   bench/rlqs.sh            10 s measured per row, holders per key 1, 8 and 32; writes
#                            bench/results/rlqs-latest.md
#   bench/rlqs.sh --quick    4 s measured per row, 8 holders per key; bench/results/rlqs-quick.md
#
# Per row: reports per second, µs of Weir CPU per report (utime + stime of /proc/<pid>/stat over
# the measured stretch, divided by the reports Weir counted over it, weir_rlqs_reports_total), the
# ledger steps per report (weir_rlqs_ledger_duration_seconds_count: a report's division, plus the
# clamped buckets' re-asks), Redis calls per report (INFO commandstats: every command Redis ran,
# EVALSHA for the ledger script) and Redis's own CPU per report (INFO cpu). Each row starts with a
# warm-up of two intervals (the first reports create the holders), not measured.
#
# Environment: BENCH_SUT_CPU (0), BENCH_LOAD_CPU (1), BENCH_SKIP_BUILD=1 (use target/ as it is),
# BENCH_WEIR (another weir binary, e.g. target/debug/weir to try the script),
# RLQS_INTERVAL_MS (1000; Weir's quota_report_interval is set to match), RLQS_REPORTS (1000 a
# second offered: BUCKETS = RLQS_REPORTS / STREAMS per stream), RLQS_DEMAND (each Envoy's requests per
# second per bucket, 10: the zone's 1000r/s per key is then clamped only past 100 holders).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh >/dev/null   # redis-server, the Rust toolchain
export PATH="$HOME/.cargo/bin:$PATH"

measure=10 warm=2 holders="1 8 32" out=bench/results/rlqs-latest.md
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) measure=4 holders="8" out=bench/results/rlqs-quick.md ;;
    *) echo "rlqs.sh: unknown argument $1 (--quick)" >&2; exit 2 ;;
  esac
  shift
done
sut_cpu=${BENCH_SUT_CPU:-0} load_cpu=${BENCH_LOAD_CPU:-1}
interval_ms=${RLQS_INTERVAL_MS:-1000} reports=${RLQS_REPORTS:-1000} demand=${RLQS_DEMAND:-10}
if [ $((interval_ms % 1000)) != 0 ] || [ "$interval_ms" -lt 1000 ]; then
  echo "rlqs.sh: RLQS_INTERVAL_MS must be whole seconds, at least 1000 (Weir's quota_report_interval)" >&2
  exit 2
fi

# The load generator runs once per row and costs little: like rls.sh --quick, its debug build.
if [ "${BENCH_SKIP_BUILD:-0}" != 1 ]; then
  cargo build --release --locked --bin weir >&2
  cargo build --locked --example rlqs_load >&2
fi
weir=${BENCH_WEIR:-target/release/weir} load=target/debug/examples/rlqs_load
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM

source bench/lib/procs.sh

redis_port=$(free_port)
taskset -c "$load_cpu" redis-server --port "$redis_port" --save '' --appendonly no --daemonize no >"$tmp/redis.log" 2>&1 &
pids+=($!)
wait_port "$redis_port"
redis_url="redis://127.0.0.1:$redis_port"

config() {  # $1: store section, $2: rls port, $3: admin port
  cat <<TOML
[server]
threads = 1
admin = "127.0.0.1:$3"

[log]
access_log = false

$1

[[limit_req_zone]]
name = "api"
rate = "1000r/s"

[rls]
listen = ["127.0.0.1:$2"]
quota_report_interval = "$((interval_ms / 1000))s"
max_quota_streams = 4096
max_quota_buckets = 100000

[[rls.domain]]
name = "bench"

[[rls.domain.bucket]]
id = { name = "*" }
zone = "api"
burst = 100
TOML
}
store_section() {  # $1: memory | redis
  if [ "$1" = memory ]; then
    printf '[store]\nkind = "memory"\n'
  else
    printf '[store]\nkind = "redis"\nurl = "%s"\ntimeout = "1s"\n' "$redis_url"
  fi
}

# "reports ledger_steps" counted by Weir so far (every domain's; there is one).
weir_counts() {
  curl -sf "http://127.0.0.1:$1/metrics" | awk '
    /^weir_rlqs_reports_total\{/ {r += $NF}
    /^weir_rlqs_ledger_duration_seconds_count\{/ {l += $NF}
    END {printf "%d %d", r, l}'
}
# "command=calls,command=calls,..." of every command Redis ran so far.
redis_calls() { redis-cli -p "$redis_port" info commandstats | awk -F'[=,:]' '/^cmdstat_/ {sub("cmdstat_", "", $1); printf "%s=%d,", $1, $3}'; }
redis_cpu() { redis-cli -p "$redis_port" info cpu | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }

row() {  # $1: store, $2: holders per key → one table row
  local store=$1 streams=$2 buckets=$(( reports * interval_ms / 1000 / $2 ))
  local port admin
  port=$(free_port) admin=$(free_port)
  redis-cli -p "$redis_port" flushall >/dev/null
  config "$(store_section "$store")" "$port" "$admin" >"$tmp/$store.toml"
  taskset -c "$sut_cpu" "$weir" -c "$tmp/$store.toml" 2>"$tmp/weir-$store-$streams.log" &
  local pid=$!
  pids+=("$pid")
  wait_port "$port"
  wait_port "$admin"
  local seconds=$(( warm * interval_ms / 1000 + measure + 1 ))
  taskset -c "$load_cpu" "$load" "127.0.0.1:$port" "$seconds" "$streams" "$buckets" "$interval_ms" "$demand" >"$tmp/load.json" &
  local loader=$!
  sleep $(( warm * interval_ms / 1000 ))
  local t0 c0 w0 rc0 rcpu0
  t0=$(date +%s.%N) c0=$(cpu_ticks "$pid") w0=$(weir_counts "$admin")
  rc0=$(redis_calls) rcpu0=$(redis_cpu)
  sleep "$measure"
  local t1 c1 w1 rc1 rcpu1
  t1=$(date +%s.%N) c1=$(cpu_ticks "$pid") w1=$(weir_counts "$admin")
  rc1=$(redis_calls) rcpu1=$(redis_cpu)
  wait "$loader"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 - "$store" "$streams" "$buckets" "$t0" "$t1" "$c0" "$c1" "$tck" "$w0" "$w1" "$rc0" "$rc1" \
    "$rcpu0" "$rcpu1" "$(cat "$tmp/load.json")" "$tmp/commands" "$interval_ms" <<'PY'
import json, sys
a = sys.argv
store, streams, buckets = a[1], int(a[2]), int(a[3])
secs = float(a[5]) - float(a[4])
cpu_s = (int(a[7]) - int(a[6])) / int(a[8])
(r0, l0), (r1, l1) = (map(int, a[9].split()), map(int, a[10].split()))
reports, steps = r1 - r0, l1 - l0
def commands(text):
    return {k: int(v) for k, v in (c.split("=") for c in text.split(",") if c)}
before, after = commands(a[11]), commands(a[12])
delta = {k: n - before.get(k, 0) for k, n in after.items() if n - before.get(k, 0) > 0}
# This script's own INFO calls between the two readings (one commandstats, one cpu).
delta["info"] = delta.get("info", 0) - 2
calls, evalsha = sum(delta.values()), delta.get("evalsha", 0)
redis_s = float(a[14]) - float(a[13])
load = json.loads(a[15])
with open(a[16], "a") as f:
    top = sorted(((n, k) for k, n in delta.items() if n > 0), reverse=True)
    f.write(f"{store}, {streams} holders: " + ", ".join(f"{k} {n / reports:.3f}" for n, k in top) + "\n")
if load["errors"] or reports <= 0:
    sys.exit(f"rlqs bench: {load['errors']} stream errors, {reports} reports counted ({load})")
offered = streams * buckets * 1000 / int(a[17])
print(f"| {store} | {streams} | {buckets} | {offered:.0f} | {reports / secs:.0f} | {cpu_s * 1e6 / reports:.1f} | "
      f"{steps / reports:.3f} | {evalsha / reports:.3f} | {calls / reports:.3f} | {redis_s * 1e6 / reports:.1f} | "
      f"{cpu_s / secs * 100:.0f} % | {reports} |")
PY
}

{
  echo "# Rate limit quota service (RLQS) — $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Weir (release, 1 thread) on CPU $sut_cpu; examples/rlqs_load (debug build) and Redis on CPU $load_cpu. Each row: STREAMS Envoys (one RLQS stream each) reporting the same BUCKETS buckets every ${interval_ms} ms, so every bucket's key has STREAMS holders; $reports reports a second offered in all (a stream divides its buckets one after another: past 1 / (its ledger steps' time) a second it falls behind, and reports/s handled is then below the offer); each Envoy asks $demand r/s per bucket of a zone of 1000r/s per key. ${measure} s measured per row after a warm-up of $warm intervals. A report: one bucket's usage in a message (\`weir_rlqs_reports_total\`). CPU per report: the whole Weir process (user + system, /proc/<pid>/stat). Ledger steps: \`weir_rlqs_ledger_duration_seconds_count\` per report (each is one division: on Redis two EVALSHA, \`report\` then \`claim\`). EVALSHA per report: the Redis round trips (\`INFO commandstats\`); commands per report: every command Redis ran, the script's inner ones (TIME, HGETALL, HSET, PEXPIRE, HDEL) included, by command below the table. Weir busy: its CPU over the stretch's wall time."
  echo "Machine: load average $(cut -d' ' -f1-3 /proc/loadavg) at the start (2 cores, shared)."
  echo
  echo "| store | holders per key | buckets per stream | offered reports/s | reports/s handled | µs Weir CPU per report | ledger steps per report | EVALSHA (round trips) per report | Redis commands per report | µs Redis CPU per report | Weir busy | reports measured |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
} >"$out"
for h in $holders; do
  for store in memory redis; do
    row "$store" "$h" | tee -a "$out" >&2
  done
done
{
  echo
  echo "Redis commands per report, by command (every command over the measured stretch; the memory store's Weir sends none):"
  echo
  sed 's/^/- /' "$tmp/commands"
} >>"$out"
echo "bench: wrote $out" >&2
