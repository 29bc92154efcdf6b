#!/usr/bin/env bash
# Weir benchmark harness (issue 4): Weir vs its own passthrough vs nginx limit_req, on one machine,
# in one run. See bench/README.md for what is measured and how to read it.
#
#   bench/run.sh            full run (4 interleaved repetitions, 5 s per row; < 10 min + build);
#                           writes bench/results/latest.{json,md}
#   bench/run.sh --quick    smoke test for CI (1 repetition, 2 s per row, small memory and fleet
#                           parts; < 1 min + build); writes bench/results/quick.{json,md} and
#                           exits non-zero if any part fails to run
#   extra options go to the harness (bench/harness/): --reps N, --duration S, --out DIR, --profile
#
# Environment: BENCH_SUT_CPU (default 0: proxy + upstream), BENCH_LOAD_CPU (default 1: wrk),
# BENCH_REDIS_CPU (default: same as BENCH_LOAD_CPU), BENCH_CONNECTIONS (default 64),
# BENCH_SKIP_BUILD=1 (use target/release/weir as it is).
#
# Installs what it needs when missing (nginx-light, wrk, redis-server, python3, the build tools of
# scripts/setup.sh), builds `weir` in release mode, and stops every process it started, also when
# interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."

# ---- tools -------------------------------------------------------------------------------------
source scripts/setup.sh   # cmake, cc, redis-server, curl, pkg-config, Rust
export PATH="$HOME/.cargo/bin:$PATH"

need_apt=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx-light)
command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)
command -v redis-benchmark >/dev/null 2>&1 || need_apt+=(redis-tools)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
command -v taskset >/dev/null 2>&1 || need_apt+=(util-linux)
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "bench: installing ${need_apt[*]} with apt-get" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${need_apt[@]}" >/dev/null
  # Debian's nginx package starts a system nginx on :80. The bench never uses it (it runs its own
  # instances on free loopback ports); stop it so it does not take CPU or the port.
  if [[ " ${need_apt[*]} " == *" nginx-light "* ]]; then
    $sudo service nginx stop >/dev/null 2>&1 || $sudo nginx -s stop >/dev/null 2>&1 || true
  fi
fi
export PATH="$PATH:/usr/sbin:/sbin"

# ---- build -------------------------------------------------------------------------------------
if [ "${BENCH_SKIP_BUILD:-0}" != 1 ]; then
  echo "bench: cargo build --release --bin weir" >&2
  cargo build --release --locked --bin weir
fi
weir="$PWD/target/release/weir"
[ -x "$weir" ] || { echo "bench: $weir not found" >&2; exit 1; }

# ---- run, and clean up whatever was started ------------------------------------------------------
workdir="$(mktemp -d /tmp/weir-bench.XXXXXX)"
harness_pid=""
# Is pid still the process we started (same start time, field 22 of /proc/pid/stat)?
ours() {
  [ -r "/proc/$1/stat" ] || return 1
  [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f20)" = "$2" ]
}
cleanup() {
  local rc=$?
  set +e
  if [ -n "$harness_pid" ]; then
    kill -TERM "$harness_pid" 2>/dev/null
    wait "$harness_pid" 2>/dev/null
  fi
  # The harness records every process it starts (each leads its own process group) in $workdir/pids
  # and stops them itself; this is the backstop if it died first.
  if [ -f "$workdir/pids" ]; then
    for sig in TERM KILL; do
      left=0
      while read -r pid start; do
        ours "$pid" "$start" || continue
        left=1
        kill "-$sig" -- "-$pid" 2>/dev/null || kill "-$sig" "$pid" 2>/dev/null || true
      done <"$workdir/pids"
      if [ "$left" = 0 ]; then break; fi
      if [ "$sig" = TERM ]; then sleep 1; fi   # Weir drains for about a second
    done
  fi
  if [ "$rc" -eq 0 ] || [ "${BENCH_KEEP_WORKDIR:-0}" != 1 ]; then rm -rf "$workdir"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

python3 bench/harness --weir "$weir" --workdir "$workdir" "$@" &
harness_pid=$!
set +e
wait "$harness_pid"
rc=$?
set -e
harness_pid=""
exit "$rc"
