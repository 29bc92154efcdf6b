#!/usr/bin/env bash
# Weir as Envoy's rate limit service (docs/rls.md): decisions per second on one core and µs of
# Weir CPU per decision, on the memory and the Redis store. Weir (one thread) is pinned to
# BENCH_SUT_CPU, the gRPC load generator (examples/rls_load.rs, the generated tonic client) and
# Redis to BENCH_LOAD_CPU, like bench/run.sh's proxy rows.
#
#   bench/rls.sh                       5 s per row, 3 repetitions; writes bench/results/rls-latest.md
#   bench/rls.sh --quick               2 s per row, 1 repetition; writes bench/results/rls-quick.md
#   bench/rls.sh --limitador PATH      + Kuadrant Limitador's rows (its `limitador-server`, built
#                                      apart; LIMITADOR_BIN=PATH does the same), in the same run
#
# Every row says the server's CPU per decision (the whole process) and Redis's (INFO cpu deltas
# over the calls). With Limitador, each store's rows run side by side in every repetition:
# Limitador's memory, redis and redis_cached (its write-behind cache) storages against Weir's
# memory and Redis stores, one limits file equivalent to Weir's config (one limit per
# remote_address; 1000 per 1 s window against Weir's 1000r/s, burst 1000). Then fleet accuracy:
# one key, 100 per 60 s window, one and two instances on one Redis, how many calls were admitted.
#
# Then leased budgets against exact Redis decisions (issue 47: Redis script calls per call and per
# admitted call, below and above the limit), and latency at a fixed rate (open loop, RLS_RATE calls/s, each call a task of its own so a
# stalled answer never holds back the next calls), per store: p50, p90, p99, p99.9 and max against
# issue 40's targets (p99 <= 1 ms, p99.9 <= 3 ms, max <= 10 ms at 5,000 calls/s), and how late the
# generator started its calls (p99; tokio's timer ticks every millisecond), and how long the machine
# itself kept a ready thread waiting on each core meanwhile (bench/lib/hiccup.c: a thread that only
# sleeps and wakes; its stalls are the kernel's, the hypervisor's and other tenants' processes',
# which no server on that core escapes). Each scheduling policy of RLS_SCHED gets its own rows:
# "other" (the default CFS, as deployed) and "fifo" (server, load generator and Redis at real-time
# priority `chrt -f 10`, so the other tenants' processes on the shared cores cannot preempt them).
#
# Environment: BENCH_SUT_CPU (0), BENCH_LOAD_CPU (1), BENCH_SKIP_BUILD=1 (use target/release as
# it is), RLS_CONNECTIONS (4), RLS_IN_FLIGHT (16 per connection), RLS_RATE (5000), RLS_SCHED
# ("other fifo"; --quick: "other"; fifo needs CAP_SYS_NICE and is skipped, with a note, without).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh >/dev/null   # redis-server, the Rust toolchain
export PATH="$HOME/.cargo/bin:$PATH"

duration=5 reps=3 out=bench/results/rls-latest.md sched=${RLS_SCHED:-other fifo}
limitador=${LIMITADOR_BIN:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) duration=2 reps=1 out=bench/results/rls-quick.md sched=${RLS_SCHED:-other} ;;
    --limitador) limitador=${2:?--limitador needs the path of limitador-server}; shift ;;
    *) echo "rls.sh: unknown argument $1 (--quick, --limitador PATH)" >&2; exit 2 ;;
  esac
  shift
done
if [ -n "$limitador" ] && [ ! -x "$limitador" ]; then
  echo "rls.sh: $limitador is not an executable limitador-server" >&2
  exit 2
fi
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

# The machine's own stalls beside each latency row (none if there is no C compiler).
hiccup=""
if command -v cc >/dev/null 2>&1 && cc -O2 -o "$tmp/hiccup" bench/lib/hiccup.c 2>"$tmp/hiccup.log"; then
  hiccup="$tmp/hiccup"
fi
# Real-time priority for the "fifo" rows, if this user may set it.
sched_note=""
if [[ " $sched " == *" fifo "* ]] && ! chrt -f 10 true 2>/dev/null; then
  sched=${sched//fifo/}
  sched_note="The fifo rows were skipped: this user may not set real-time priority (chrt -f needs CAP_SYS_NICE)."
fi
rt=()   # the current rows' scheduling: () or (chrt -f 10)

redis_port=$(free_port)
taskset -c "$load_cpu" redis-server --port "$redis_port" --save '' --appendonly no --daemonize no >"$tmp/redis.log" 2>&1 &
pids+=($!)
wait_port "$redis_port"

config() {  # $1: store section, $2: port, $3: zone (rate and algorithm lines), $4: descriptor's extra lines
  cat <<TOML
[server]
threads = 1

[log]
access_log = false

$1

[[limit_req_zone]]
name = "per_ip"
$3

[rls]
listen = ["127.0.0.1:$2"]

[[rls.domain]]
name = "bench"

[[rls.domain.descriptor]]
key = "remote_address"
zone = "per_ip"
$4
TOML
}
bench_zone='rate = "1000r/s"' bench_descriptor='burst = 1000
nodelay = true'
fleet_zone='algorithm = "fixed_window"
rate = "100r/m"'
fleet_lease='lease = { tokens = 10, lifetime = "2s" }'

# Limitador's limits: the same descriptor, one counter per remote_address.
limits() {  # $1: max_value, $2: seconds
  cat <<YAML
- namespace: bench
  max_value: $1
  seconds: $2
  conditions: []
  variables:
    - "descriptors[0]['remote_address']"
YAML
}
limits 1000 1 >"$tmp/limits-bench.yaml"
limits 100 60 >"$tmp/limits-fleet.yaml"

redis_url="redis://127.0.0.1:$redis_port"
store_section() {  # $1: memory | redis
  if [ "$1" = memory ]; then
    printf '[store]\nkind = "memory"\n'
  else
    printf '[store]\nkind = "redis"\nurl = "%s"\ntimeout = "1s"\n' "$redis_url"
  fi
}

# start SERVER STORE NAME [fleet] → sets $port and $pid of a serving weir or limitador.
# SERVER: weir | limitador; STORE: memory | redis | redis_cached (Limitador only).
start() {
  local server=$1 store=$2 name=$3 kind=${4:-bench}
  port=$(free_port)
  if [ "$server" = weir ]; then
    local zone=$bench_zone descriptor=$bench_descriptor
    if [ "$kind" = fleet ]; then zone=$fleet_zone descriptor=""; fi
    local section=$store
    if [ "$store" = leased ]; then section=redis zone="$zone
$fleet_lease"; fi
    config "$(store_section "$section")" "$port" "$zone" "$descriptor" >"$tmp/$name.toml"
    "${rt[@]}" taskset -c "$sut_cpu" "$weir" -c "$tmp/$name.toml" 2>"$tmp/$name.log" &
  else
    local storage=(memory)
    if [ "$store" != memory ]; then storage=("$store" "$redis_url"); fi
    "${rt[@]}" taskset -c "$sut_cpu" "$limitador" --rls-ip 127.0.0.1 --rls-port "$port" --http-ip 127.0.0.1 \
      --http-port "$(free_port)" "$tmp/limits-$kind.yaml" "${storage[@]}" >"$tmp/$name.log" 2>&1 &
  fi
  pid=$!
  pids+=("$pid")
  wait_port "$port"
}

stop() { kill "$1"; wait "$1" 2>/dev/null || true; }
redis_cpu() { redis-cli -p "$redis_port" info cpu | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }

row() {  # $1: server, $2: store → "calls/s µs-per-decision redis-µs-per-decision calls"
  local port pid
  start "$1" "$2" "$1-$2"
  taskset -c "$load_cpu" "$load" "127.0.0.1:$port" 1 "$connections" "$in_flight" >/dev/null   # warm-up
  local before redis_before; before=$(cpu_ticks "$pid") redis_before=$(redis_cpu)
  local result; result=$(taskset -c "$load_cpu" "$load" "127.0.0.1:$port" "$duration" "$connections" "$in_flight")
  local after redis_after; after=$(cpu_ticks "$pid") redis_after=$(redis_cpu)
  stop "$pid"
  python3 - "$result" "$before" "$after" "$tck" "$redis_before" "$redis_after" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); before, after, tck = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
redis_s = float(sys.argv[6]) - float(sys.argv[5])
if r["errors"] or not r["calls"]:
    sys.exit(f"rls bench: {r['errors']} errors of {r['calls']} calls")
cpu_s = (after - before) / tck
print(f"{r['calls_per_sec']:.0f} {cpu_s * 1e6 / r['calls']:.1f} {redis_s * 1e6 / r['calls']:.1f} {r['calls']}")
PY
}

servers=("weir memory" "weir redis")
if [ -n "$limitador" ]; then
  servers=("weir memory" "limitador memory" "weir redis" "limitador redis" "limitador redis_cached")
fi
{
  echo "# Rate limit service (gRPC) — $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Servers (1 thread for Weir, release; Limitador's own release build) on CPU $sut_cpu; examples/rls_load ($profile build, $connections connections × $in_flight calls in flight, 10k keys) and Redis on CPU $load_cpu; ${duration}s per row, $reps repetition(s), the servers' rows side by side in each. One descriptor per call. CPU per decision: the whole server process (user + system); Redis: its own INFO cpu over the same calls (0 on the memory store)."
  [ -n "$limitador" ] && echo "Limitador: \`$("$limitador" --version 2>&1 | head -1)\`."
  echo "Machine: load average $(cut -d' ' -f1-3 /proc/loadavg) at the start (2 cores; other engineers build on it)."
  echo
  echo "| server | store | rep | decisions/s | µs server CPU per decision | µs Redis CPU per decision | calls |"
  echo "|---|---|---|---|---|---|---|"
} >"$out"
for rep in $(seq "$reps"); do
  for s in "${servers[@]}"; do
    read -r server store <<<"$s"
    read -r rate us redis_us calls < <(row "$server" "$store")
    echo "| $server | $store | $rep | $rate | $us | $redis_us | $calls |" | tee -a "$out" >&2
  done
done

latency_row() {  # $1: server, $2: store → the load generator's JSON line, CPU ticks, Redis CPU, stalls
  local port pid
  start "$1" "$2" "lat-$1-$2"
  "${rt[@]}" taskset -c "$load_cpu" "$load" "127.0.0.1:$port" 1 "$connections" --rate "$fixed_rate" >/dev/null   # warm-up
  local before redis_before; before=$(cpu_ticks "$pid") redis_before=$(redis_cpu)
  local meters=() c
  if [ -n "$hiccup" ]; then
    for c in "$sut_cpu" "$load_cpu"; do
      "${rt[@]}" taskset -c "$c" "$hiccup" "$duration" >"$tmp/hiccup-$c.json" &
      meters+=("$!")
    done
  fi
  local result; result=$("${rt[@]}" taskset -c "$load_cpu" "$load" "127.0.0.1:$port" "$duration" "$connections" --rate "$fixed_rate")
  local after redis_after; after=$(cpu_ticks "$pid") redis_after=$(redis_cpu)
  for c in "${meters[@]}"; do wait "$c"; done
  stop "$pid"
  local stalls=null
  if [ -n "$hiccup" ]; then
    stalls=$(python3 -c 'import json, sys; print(json.dumps([json.load(open(f)) for f in sys.argv[1:]], separators=(",", ":")))' "$tmp/hiccup-$sut_cpu.json" "$tmp/hiccup-$load_cpu.json")
  fi
  echo "$result $before $after $redis_before $redis_after $stalls"
}
{
  echo
  echo "## Latency at a fixed rate"
  echo
  echo "Open loop at $fixed_rate calls/s over $connections connections, ${duration}s per row; latency of each call from its start (µs), each call a task of its own; \"late p99\": how late the generator started calls against the schedule. Targets (issue 40): p99 ≤ 1000, p99.9 ≤ 3000, max ≤ 10000. CPU per decision at this rate: the server's and Redis's. Scheduling: \"other\" is Linux's default (CFS), as deployed; \"fifo\" runs the server, the load generator and Redis at real-time priority (\`chrt -f 10\`), out of reach of other tenants' processes on the shared cores. Machine stalls: bench/lib/hiccup.c on each core during the row, with the row's scheduling (a thread that only sleeps 0.5 ms and wakes): its latest wake-up (ms, CPU $sut_cpu / CPU $load_cpu) and how many wake-ups came over 2 ms late. A stall of 5 ms delays every call due meanwhile: at $fixed_rate calls/s that is 25 calls, 0.1 % of a 5 s row, so one such stall sets p99.9 by itself."
  [ -n "$sched_note" ] && { echo; echo "$sched_note"; }
  echo
  echo "| server | store | sched | rep | calls/s | p50 | p90 | p99 | p99.9 | max | late p99 | errors | µs server CPU | µs Redis CPU | machine stalls max ms (> 2 ms) | targets |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} >>"$out"
redis_pid=${pids[0]}
for policy in $sched; do
  if [ "$policy" = fifo ]; then rt=(chrt -f 10); chrt -a -f -p 10 "$redis_pid" >/dev/null; else rt=(); fi
  for rep in $(seq "$reps"); do
    for s in "${servers[@]}"; do
      read -r server store <<<"$s"
      read -r result before after redis_before redis_after stalls < <(latency_row "$server" "$store")
      python3 - "$result" "$server" "$store" "$rep" "$before" "$after" "$tck" "$redis_before" "$redis_after" "$policy" "$stalls" <<'PY' | tee -a "$out" >&2
import json, sys
r, server, store, rep = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
cpu_s = (int(sys.argv[6]) - int(sys.argv[5])) / int(sys.argv[7])
redis_s = float(sys.argv[9]) - float(sys.argv[8])
policy, stalls = sys.argv[10], json.loads(sys.argv[11])
n = max(r["calls"], 1)
met = r["p99_us"] <= 1000 and r["p999_us"] <= 3000 and r["max_us"] <= 10000
machine = ("–" if not stalls else
           " / ".join(f"{m['max_us'] / 1000:.1f}" for m in stalls) + f" ({sum(m['over_2ms'] for m in stalls)})")
print(f"| {server} | {store} | {policy} | {rep} | {r['calls_per_sec']:.0f} | {r['p50_us']} | {r['p90_us']} | {r['p99_us']} | {r['p999_us']} | {r['max_us']} | {r['late_p99_us']} | {r['errors']} | {cpu_s * 1e6 / n:.1f} | {redis_s * 1e6 / n:.1f} | {machine} | {'met' if met else 'MISSED'} |")
if r["errors"] or not r["calls"]:
    sys.exit(f"rls bench: {r['errors']} errors of {r['calls']} calls")
PY
    done
  done
done
rt=()
chrt -a -o -p 0 "$redis_pid" >/dev/null 2>&1 || true

# Leased budgets (issue 47, docs/leases.md) through this front door: Envoy's calls for a leased
# zone are answered from this instance's lease, without a Redis call while it holds tokens. The
# same open-loop rate over few keys (each key seen at least `tokens` times per lifetime), exact
# Redis against leased Redis, a flushed Redis per row; Redis script calls from INFO commandstats.
lease_rate=${RLS_LEASE_RATE:-4000}
script_calls() {  # "EVALSHA+EVAL calls, all commands" (INFO commandstats)
  redis-cli -p "$redis_port" info commandstats | tr -d '\r' | awk -F'[:=,]' '/^cmdstat_(evalsha|eval):/ {n += $3} /^cmdstat_/ && !/^cmdstat_(info|flushall)/ {a += $3} END {printf "%d,%d", n, a}'
}
limits 1000 1 >"$tmp/limits-lbelow.yaml"
limits 20 1 >"$tmp/limits-labove.yaml"
lease_setting='lease = { tokens = 100, lifetime = "2s" }'
lease_schedule() {  # $1: below | above → sets keys, zone and descriptor (the exact zone's lines)
  if [ "$1" = below ]; then
    keys=50 zone='rate = "1000r/s"' descriptor='burst = 1000
nodelay = true'
  else
    keys=20 zone='rate = "20r/s"' descriptor='burst = 100
nodelay = true'
  fi
}
stated_bound() {  # $1: config file, $2: instances → the first leased zone's bound weir check prints
  "$weir" check -c "$1" --instances "$2" 2>&1 | grep -i '^ *lease' | head -1 | sed 's/^ *//'
}
lease_bound() {  # $1: below | above → the line weir check prints for that leased zone
  local keys zone descriptor
  lease_schedule "$1"
  config "$(store_section redis)" "$(free_port)" "$zone
$lease_setting" "$descriptor" >"$tmp/lease-bound.toml"
  stated_bound "$tmp/lease-bound.toml" 1
}
lease_row() {  # $1: exact | leased | limitador-redis | limitador-redis_cached, $2: below | above
  local mode=$1 schedule=$2 keys zone descriptor
  lease_schedule "$schedule"
  if [ "$mode" = leased ]; then zone="$zone
$lease_setting"; fi
  redis-cli -p "$redis_port" flushall >/dev/null
  redis-cli -p "$redis_port" config resetstat >/dev/null
  port=$(free_port)
  if [ "${mode#limitador-}" != "$mode" ]; then
    taskset -c "$sut_cpu" "$limitador" --rls-ip 127.0.0.1 --rls-port "$port" --http-ip 127.0.0.1 \
      --http-port "$(free_port)" "$tmp/limits-l$schedule.yaml" "${mode#limitador-}" "$redis_url" >"$tmp/lease-$mode-$schedule.log" 2>&1 &
  else
    config "$(store_section redis)" "$port" "$zone" "$descriptor" >"$tmp/lease-$mode-$schedule.toml"
    taskset -c "$sut_cpu" "$weir" -c "$tmp/lease-$mode-$schedule.toml" 2>"$tmp/lease-$mode-$schedule.log" &
  fi
  pid=$!
  pids+=("$pid")
  wait_port "$port"
  taskset -c "$load_cpu" "$load" "127.0.0.1:$port" 1 "$connections" --rate "$lease_rate" "$keys" >/dev/null   # warm-up
  local before redis_before calls_before
  before=$(cpu_ticks "$pid") redis_before=$(redis_cpu) calls_before=$(script_calls)
  local result; result=$(taskset -c "$load_cpu" "$load" "127.0.0.1:$port" "$duration" "$connections" --rate "$lease_rate" "$keys")
  local after redis_after calls_after
  after=$(cpu_ticks "$pid") redis_after=$(redis_cpu) calls_after=$(script_calls)
  stop "$pid"
  python3 - "$result" "$before" "$after" "$tck" "$redis_before" "$redis_after" "$calls_before" "$calls_after" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); cpu_s = (int(sys.argv[3]) - int(sys.argv[2])) / int(sys.argv[4])
redis_s = float(sys.argv[6]) - float(sys.argv[5])
(s0, a0), (s1, a1) = (map(int, a.split(",")) for a in sys.argv[7:9]); script, cmds = s1 - s0, a1 - a0
if r["errors"] or not r["calls"]:
    sys.exit(f"rls bench: {r['errors']} errors of {r['calls']} calls")
n, ok = r["calls"], max(r["ok"], 1)
print(f"{n} | {r['ok']} | {r['over_limit']} | {script} | {script / ok:.4f} | {script / n:.4f} | {cmds} | {cmds / ok:.4f} | {redis_s * 1e6 / ok:.2f} | {cpu_s * 1e6 / n:.1f} | {r['p50_us']} / {r['p99_us']}")
PY
}
{
  echo
  echo "## Leased budgets (issue 47)"
  echo
  echo "Open loop at $lease_rate calls/s over $connections connections, ${duration}s per row after 1 s of warm-up, a flushed Redis per row. below: 50 keys (80 calls/s each), 1000r/s burst 1000; above: 20 keys (200 calls/s each), 20r/s burst 100. Leased: \`$lease_setting\`. Script calls: EVALSHA + EVAL (INFO commandstats) over the measured run."
  echo
  echo "Bounds Weir states (\`weir check --instances 1\`): below: $(lease_bound below); above: $(lease_bound above)."
  [ -n "$limitador" ] && echo "Limitador rows: its own storages on the same Redis and schedules, limits file 1000 per 1 s (below) and 20 per 1 s (above) per remote_address: a fixed window of that count, where Weir's zone is a token bucket (1000r/s burst 1000; 20r/s burst 100) — the algorithms differ, so their admitted counts differ above the limit. Limitador's scripts are counted in \"script calls\" too; \"Redis commands\": every command Redis executed (INFO commandstats, without INFO and FLUSHALL)."
  echo
  echo "| schedule | mode | rep | calls | OK | over limit | script calls | per OK call | per call | Redis commands | per OK call | µs Redis CPU per OK call | µs server CPU per call | p50 / p99 µs |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} >>"$out"
lease_modes=(exact leased)
if [ -n "$limitador" ]; then lease_modes+=(limitador-redis limitador-redis_cached); fi
for schedule in below above; do
  for rep in $(seq "$reps"); do
    for mode in "${lease_modes[@]}"; do
      echo "| $schedule | $mode | $rep | $(lease_row "$mode" "$schedule") |" | tee -a "$out" >&2
    done
  done
done

# Fleet accuracy: one key (KEYS = 1), 100 calls per 60 s window, a fresh Redis database per trial,
# 1 s of closed-loop load on each instance at once; every admitted call counted.
fleet_trial() {  # $1: server, $2: store, $3: instances → calls admitted
  redis-cli -p "$redis_port" flushall >/dev/null
  local ports=() started=() i
  for i in $(seq "$3"); do
    start "$1" "$2" "fleet-$1-$2-$i" fleet
    ports+=("$port") started+=("$pid")
  done
  local loads=() files=()
  # The 60 s windows are aligned to the clock's minutes: a trial that straddled a minute's edge
  # would rightly admit 100 in each window (200). Start the load early enough in a minute.
  local second
  second=$(date +%-S)
  if [ "$second" -ge 55 ]; then sleep $((61 - second)); fi
  for p in "${ports[@]}"; do
    taskset -c "$load_cpu" "$load" "127.0.0.1:$p" 1 2 8 1 >"$tmp/fleet-$p.json" &
    loads+=("$!") files+=("$tmp/fleet-$p.json")
  done
  for l in "${loads[@]}"; do wait "$l"; done
  for p in "${started[@]}"; do stop "$p"; done
  python3 -c 'import json, sys; print(sum(json.load(open(f))["ok"] for f in sys.argv[1:]))' "${files[@]}"
}
{
  echo
  echo "## Fleet accuracy"
  echo
  echo "One key, a limit of 100 per 60 s window, on one Redis; 1 s of load (2 connections × 8 calls in flight) on every instance at once, a fresh Redis database per trial. Calls admitted (exact: 100)."
  echo
  echo "Weir leased: the same zone with \`$fleet_lease\`; its bound is what \`weir check -c FILE --instances N\` prints for the config (docs/leases.md: a leased fixed window admits at most its count per window)."
  echo
  echo "| server | store | instances | admitted per trial | bound |"
  echo "|---|---|---|---|---|"
} >>"$out"
fleet_bound() {  # $1: store, $2: instances → the bound Weir states for that config and fleet
  if [ "$1" != leased ]; then echo "100 (exact)"; return; fi
  local port; port=$(free_port)
  config "$(store_section redis)" "$port" "$fleet_zone
$fleet_lease" "" >"$tmp/fleet-bound.toml"
  stated_bound "$tmp/fleet-bound.toml" "$2" | tr '|' '/'
}
fleet_servers=("weir redis" "weir leased")
if [ -n "$limitador" ]; then fleet_servers+=("limitador redis" "limitador redis_cached"); fi
for s in "${fleet_servers[@]}"; do
  read -r server store <<<"$s"
  counts="1 2"
  if [ "$store" = leased ] || [ "$store" = redis_cached ]; then counts="1 2 4"; fi
  for instances in $counts; do
    admitted=()
    for _ in $(seq "$reps"); do admitted+=("$(fleet_trial "$server" "$store" "$instances")"); done
    bound="100 (exact)"
    if [ "$server" = weir ]; then bound=$(fleet_bound "$store" "$instances"); fi
    if [ "$server" = limitador ]; then bound="100 (Limitador states none)"; fi
    echo "| $server | $store | $instances | ${admitted[*]} | $bound |" | tee -a "$out" >&2
  done
done
echo "bench: wrote $out" >&2
