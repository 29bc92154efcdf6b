#!/usr/bin/env bash
# Leased budgets (issue 47, docs/leases.md) against the exact Redis mode and the memory store, side
# by side in one run on one Redis: the proxy (one thread, release, on BENCH_SUT_CPU) driven at a
# fixed rate over many keys by bench/leases.py (on BENCH_LOAD_CPU, with Redis and the nginx
# upstream), one fresh weir and a flushed Redis per row and repetition, the rows interleaved.
#
#   bench/leases.sh            10 s per row after a 2 s warm-up, 3 repetitions: bench/results/leases-latest.md
#   bench/leases.sh --quick    3 s per row after a 1 s warm-up, 1 repetition: bench/results/leases-quick.md
#
# Rows: `memory` (the memory store), `exact` (Redis, one script call per decision), `leased` (Redis,
# `lease = { tokens = 100, lifetime = "2s" }`). Schedules:
#   below   LEASE_RATE (4000) r/s over 50 keys (80 r/s each, 160 per lifetime: each key is seen at
#           least `tokens` times per lifetime), limit 1000r/s burst 1000: everything admitted.
#   above   the same rate over 20 keys (200 r/s each), limit 20r/s burst 100: ~9 of 10 rejected.
# Measured over the row (the warm-up excluded): Redis script calls (INFO commandstats: EVALSHA,
# EVAL) and all commands (total_commands_processed: the fleet sync and health probe included), and
# Redis CPU (INFO cpu), per admitted request; proxy CPU per request (every thread of the weir
# process, /proc/<pid>/task/*/schedstat, ns); admitted and rejected; for the leased row, rejections
# made with no Redis call (weir_lease_local_decisions_total{decision="rejected"}).
#
# Environment: BENCH_SUT_CPU (0), BENCH_LOAD_CPU (1), BENCH_SKIP_BUILD=1 (use target/release as it
# is), BENCH_WEIR (a weir binary instead of target/release/weir), LEASE_RATE (4000 requests/s),
# LEASE_CONNECTIONS (32).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in redis-server redis-cli python3 cargo; do
  command -v "$tool" >/dev/null 2>&1 || { source scripts/setup.sh >/dev/null; break; }
done
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || source scripts/setup.sh >/dev/null
export PATH="$HOME/.cargo/bin:/usr/sbin:$PATH"

duration=10 warmup=2 reps=3 out=bench/results/leases-latest.md
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) duration=3 warmup=1 reps=1 out=bench/results/leases-quick.md ;;
    *) echo "leases.sh: unknown argument $1 (--quick)" >&2; exit 2 ;;
  esac
  shift
done
sut_cpu=${BENCH_SUT_CPU:-0} load_cpu=${BENCH_LOAD_CPU:-1}
rate=${LEASE_RATE:-4000} connections=${LEASE_CONNECTIONS:-32}

if [ "${BENCH_SKIP_BUILD:-0}" != 1 ]; then
  cargo build --release --locked --bin weir >&2
fi
weir=${BENCH_WEIR:-target/release/weir}
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM

source bench/lib/procs.sh

# Every thread's CPU of a process so far, ns (schedstat: finer than /proc/<pid>/stat's ticks).
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%d", s}'; }
# "script-calls all-commands redis-cpu-seconds" from one INFO.
redis_counts() {
  redis-cli -p "$redis_port" info all | tr -d '\r' | awk -F'[:=,]' '
    /^cmdstat_(evalsha|eval):/ {calls += $3}
    /^total_commands_processed:/ {commands = $2}
    /^used_cpu_(sys|user):/ {cpu += $2}
    END {printf "%d %d %.6f", calls, commands, cpu}'
}
# "local-rejections grants refused-asks" of the leased zone so far (weir's /metrics).
local_rejected() {
  python3 - "$1" <<'PY'
import re, sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
def total(name, label):
    return sum(float(m.group(1)) for m in re.finditer(
        rf'^{name}\{{[^}}]*{label}[^}}]*\}} (\S+)$', text, re.M))
print(total("weir_lease_local_decisions_total", 'decision="rejected"'),
      total("weir_lease_grants_total", 'answer="granted"'), total("weir_lease_grants_total", 'answer="refused"'))
PY
}

redis_port=$(free_port) upstream_port=$(free_port)
taskset -c "$load_cpu" redis-server --port "$redis_port" --save '' --appendonly no --daemonize no >"$tmp/redis.log" 2>&1 &
pids+=($!)
mkdir -p "$tmp/nginx/logs"
cat >"$tmp/nginx/nginx.conf" <<NGINX
worker_processes 1;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/logs/error.log;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$upstream_port;
        location / { default_type text/plain; return 200 "ok\n"; }
    }
}
NGINX
taskset -c "$load_cpu" nginx -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" -g 'daemon off;' >"$tmp/nginx.log" 2>&1 &
pids+=($!)
wait_port "$redis_port"
wait_port "$upstream_port"

config() {  # $1: row, $2: port, $3: admin port, $4: zone rate, $5: burst
  local store lease=""
  if [ "$1" = memory ]; then
    store='kind = "memory"'
  else
    store=$(printf 'kind = "redis"\nurl = "redis://127.0.0.1:%s/0"\ntimeout = "250ms"' "$redis_port")
  fi
  if [ "$1" = leased ]; then lease='lease = { tokens = 100, lifetime = "2s" }'; fi
  cat <<TOML
[server]
listen = ["127.0.0.1:$2"]
admin = "127.0.0.1:$3"
threads = 1

[log]
access_log = false

[store]
$store

[[upstream]]
name = "app"
servers = ["127.0.0.1:$upstream_port"]

[[limit_req_zone]]
name = "api"
key = "header:X-Key"
rate = "$4"
$lease

[[route]]
name = "all"
path_prefix = "/"
upstream = "app"
limit_req = [ { zone = "api", burst = $5, nodelay = true } ]
TOML
}

run_row() {  # $1: schedule, $2: row, $3: rep, $4: keys, $5: zone rate, $6: burst, $7: what
  local port admin pid
  port=$(free_port) admin=$(free_port)
  redis-cli -p "$redis_port" flushall >/dev/null
  config "$2" "$port" "$admin" "$5" "$6" >"$tmp/$1-$2.toml"
  taskset -c "$sut_cpu" "$weir" -c "$tmp/$1-$2.toml" 2>"$tmp/$1-$2-$3.log" &
  pid=$!
  pids+=("$pid")
  wait_port "$port"
  wait_port "$admin"
  taskset -c "$load_cpu" python3 bench/leases.py load "$port" "$rate" "$warmup" "$4" "$connections" >/dev/null
  local cpu_before counts_before rejected_before
  rejected_before=$(local_rejected "$admin") counts_before=$(redis_counts) cpu_before=$(cpu_ns "$pid")
  local result
  result=$(taskset -c "$load_cpu" python3 bench/leases.py load "$port" "$rate" "$duration" "$4" "$connections")
  local cpu_after counts_after rejected_after
  cpu_after=$(cpu_ns "$pid") counts_after=$(redis_counts) rejected_after=$(local_rejected "$admin")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  python3 - "$result" "$1" "$2" "$3" "$cpu_before" "$cpu_after" "$counts_before" "$counts_after" \
    "$rejected_before" "$rejected_after" "$7" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
schedule, row, rep = sys.argv[2], sys.argv[3], int(sys.argv[4])
cpu_ns = int(sys.argv[6]) - int(sys.argv[5])
before, after = sys.argv[7].split(), sys.argv[8].split()
local, granted, refused = (float(a) - float(b) for a, b in zip(sys.argv[10].split(), sys.argv[9].split()))
print(json.dumps({
    "schedule": schedule, "row": row, "rep": rep, "what": sys.argv[11],
    "answered": r["answered"], "s200": r["s200"], "s429": r["s429"], "other": r["sother"], "errors": r["errors"],
    "rate": r["rate"], "p50_us": r["p50_us"], "p99_us": r["p99_us"],
    "proxy_cpu_us": cpu_ns / 1e3,
    "script_calls": int(after[0]) - int(before[0]),
    # The INFO before counts itself; the one after does not.
    "commands": int(after[1]) - int(before[1]) - 1,
    "redis_cpu_us": (float(after[2]) - float(before[2])) * 1e6,
    "local_rejected": int(local) if row == "leased" else None,
    "grants": int(granted) if row == "leased" else None,
    "refused_asks": int(refused) if row == "leased" else None,
}))
PY
}

below_what="$rate r/s over 50 keys ($((rate / 50)) r/s per key, $((rate / 25)) per 2 s lifetime), limit 1000r/s burst 1000"
above_what="$rate r/s over 20 keys ($((rate / 20)) r/s per key), limit 20r/s burst 100"
runs="$tmp/runs.jsonl"
started=$(date -u +%Y-%m-%dT%H:%MZ) load_average=$(cut -d' ' -f1-3 /proc/loadavg)
for rep in $(seq "$reps"); do
  # The rows' order turns each repetition, so none always runs first on a warming machine.
  rows=(memory exact leased)
  for _ in $(seq $(((rep - 1) % 3))); do rows=("${rows[@]:1}" "${rows[0]}"); done
  for row in "${rows[@]}"; do
    echo "rep $rep/$reps: below, $row" >&2
    run_row below "$row" "$rep" 50 1000r/s 1000 "$below_what" | tee -a "$runs" >&2
  done
  for row in "${rows[@]}"; do
    echo "rep $rep/$reps: above, $row" >&2
    run_row above "$row" "$rep" 20 20r/s 100 "$above_what" | tee -a "$runs" >&2
  done
done
{
  echo "# Leased budgets against exact Redis decisions and the memory store — $started"
  echo
  echo "weir (release, 1 thread) on CPU $sut_cpu; bench/leases.py (a fixed-rate HTTP/1.1 generator, $connections keep-alive connections), Redis and an nginx upstream on CPU $load_cpu. One weir and a flushed Redis per row, ${warmup}s of warm-up then ${duration}s measured, $reps repetition(s), the rows interleaved. Leased: \`lease = { tokens = 100, lifetime = \"2s\" }\`. Script calls: EVALSHA + EVAL (INFO commandstats); all commands: total_commands_processed (the fleet sync and the health probe too). Proxy CPU: every thread of the weir process (schedstat) over the measured run, per request answered. \"Rejected with no call\": the leased row's local refusals (weir_lease_local_decisions_total)."
  echo "Machine: load average $load_average at the start (2 cores, shared)."
  python3 bench/leases.py report "$runs"
} >"$out"
cat "$out" >&2
echo "bench: wrote $out" >&2
