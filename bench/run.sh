#!/usr/bin/env bash
# Weir benchmark harness (issue 4): Weir vs its own passthrough vs nginx limit_req, on one machine,
# in one run. See bench/README.md for what is measured and how to read it.
#
#   bench/run.sh            full run (4 interleaved repetitions, 5 s per row; < 10 min + build);
#                           writes bench/results/latest.{json,md}
#   bench/run.sh --quick    smoke test for CI (1 repetition, 2 s per row, small memory and fleet
#                           parts; < 1 min + build); writes bench/results/quick.{json,md} and
#                           exits non-zero if any part fails to run
#   extra options go to the harness (bench/harness/): --reps N, --duration S, --out DIR, --profile,
#   --rows ID,ID, --variant NAME=PATH_TO_WEIR[,table.key=value;...] (A/B: rows 2-5 and 4a again for
#   another binary and/or settings, interleaved; repeatable), --instructions (instead of the
#   throughput rows: instructions per request of each proxy under valgrind's callgrind, ~40 s a row)
#
# Environment: BENCH_SUT_CPU (default 0: proxy + upstream), BENCH_LOAD_CPU (default 1: wrk),
# BENCH_REDIS_CPU (default: same as BENCH_LOAD_CPU), BENCH_CONNECTIONS (default 64),
# BENCH_SKIP_BUILD=1 (use target/release/weir as it is), BENCH_WEIR / BENCH_PINGORA (other weir and
# pingora_passthrough binaries than target/release's, e.g. built elsewhere; with BENCH_SKIP_BUILD=1).
#
# Installs what it needs when missing (nginx-light, wrk, redis-server, python3, the build tools of
# scripts/setup.sh; libnginx-mod-http-lua + lua-resty-core + lua-resty-lrucache for the OpenResty
# row, nghttp2-client for h2load, openssl for the test certificate), builds `weir` and the plain
# Pingora example in release mode, and stops every process it started, also when interrupted.
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
command -v h2load >/dev/null 2>&1 || need_apt+=(nghttp2-client)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# OpenResty row: nginx's Lua module (with the NDK) and the resty.core it requires at start.
[ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ] || need_apt+=(libnginx-mod-http-lua)
[ -f /usr/share/lua/5.1/resty/core.lua ] || need_apt+=(lua-resty-core)
[ -f /usr/share/lua/5.1/resty/lrucache.lua ] || need_apt+=(lua-resty-lrucache)
# --instructions: valgrind (callgrind, callgrind_control) and strace (syscalls per request).
if [[ " $* " == *" --instructions "* ]]; then
  command -v valgrind >/dev/null 2>&1 || need_apt+=(valgrind)
  command -v strace >/dev/null 2>&1 || need_apt+=(strace)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "bench: installing ${need_apt[*]} with apt-get" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${need_apt[@]}" >/dev/null
  # Debian's nginx package starts a system nginx on :80. The bench never uses it (it runs its own
  # instances on free loopback ports); stop it so it does not take CPU or the port.
  if [[ " ${need_apt[*]} " == *" nginx-light "* || " ${need_apt[*]} " == *" libnginx-mod-http-lua "* ]]; then
    $sudo service nginx stop >/dev/null 2>&1 || $sudo nginx -s stop >/dev/null 2>&1 || true
  fi
fi
export PATH="$PATH:/usr/sbin:/sbin"

# ---- build -------------------------------------------------------------------------------------
if [ "${BENCH_SKIP_BUILD:-0}" != 1 ]; then
  echo "bench: cargo build --release --bin weir" >&2
  cargo build --release --locked --bin weir
  # The plain Pingora row (examples/pingora_passthrough.rs): Pingora's own per-request cost.
  echo "bench: cargo build --release --example pingora_passthrough" >&2
  cargo build --release --locked --example pingora_passthrough
fi
weir="${BENCH_WEIR:-$PWD/target/release/weir}"
[ -x "$weir" ] || { echo "bench: $weir not found" >&2; exit 1; }
pingora_args=()
pingora="${BENCH_PINGORA:-$PWD/target/release/examples/pingora_passthrough}"
if [ -x "$pingora" ]; then
  pingora_args=(--pingora "$pingora")
else
  echo "bench: $pingora not built: the plain Pingora row is skipped" >&2
fi

# ---- run, and clean up whatever was started ------------------------------------------------------
source bench/lib/supervise.sh
workdir="$(mktemp -d /tmp/weir-bench.XXXXXX)"
supervise bench "${BENCH_KEEP_WORKDIR:-0}" "$workdir" -- python3 bench/harness --weir "$weir" --workdir "$workdir" \
  ${pingora_args[@]+"${pingora_args[@]}"} "$@"
