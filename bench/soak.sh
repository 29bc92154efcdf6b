#!/usr/bin/env bash
# Weir soak test (issue 16): mixed traffic through two Weir instances on one Redis while Redis is
# killed and restarted, configs are reloaded every 10 s and one instance is SIGKILLed and
# restarted; then checks for Weir-caused 5xx, leaked leases, RSS/fd growth and dead processes.
# See bench/README.md, "Soak"; results in bench/results/soak-2026-11.md.
#
#   bench/soak.sh                      10 minutes with the debug build (target/debug/weir)
#   bench/soak.sh --duration 60        the CI version
#   bench/soak.sh --release            with target/release/weir (a release build takes minutes)
#   extra options go to bench/soak/soak.py (--workers, --think-ms, --seed, --out, …; --help)
#
# Loopback only, bounded in time (duration + ~1 min of start-up and checks, plus the build).
# Writes bench/results/soak-<duration>s.{json,md}; exits 1 if a check failed, 2 if the soak could
# not run. Installs what it needs when missing (redis-server, python3 and the build tools of
# scripts/setup.sh) and stops every process it started, also when interrupted.
# Environment: SOAK_SKIP_BUILD=1 (use the binary as it is), SOAK_KEEP_WORKDIR=1 (keep configs and
# logs of a failed run in /tmp/weir-soak.*).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=debug
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --release) profile=release ;;
    --duration) args+=(--duration "$2"); shift ;;
    --duration=*) args+=(--duration "${1#*=}") ;;
    *) args+=("$1") ;;
  esac
  shift
done

# ---- tools -------------------------------------------------------------------------------------
source scripts/setup.sh   # cmake, cc, redis-server, curl, pkg-config, Rust
export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v python3 >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "soak: installing python3 with apt-get" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 >/dev/null
fi

# ---- build -------------------------------------------------------------------------------------
if [ "${SOAK_SKIP_BUILD:-0}" != 1 ]; then
  if [ "$profile" = release ]; then
    echo "soak: cargo build --release --bin weir" >&2
    cargo build --release --locked --bin weir
  else
    echo "soak: cargo build --bin weir" >&2
    cargo build --locked --bin weir
  fi
fi
weir="$PWD/target/$profile/weir"
[ -x "$weir" ] || { echo "soak: $weir not found" >&2; exit 2; }

# ---- run, and clean up whatever was started ------------------------------------------------------
source bench/lib/supervise.sh
workdir="$(mktemp -d /tmp/weir-soak.XXXXXX)"
supervise soak "${SOAK_KEEP_WORKDIR:-0}" "$workdir" -- python3 bench/soak/soak.py --weir "$weir" --workdir "$workdir" "${args[@]}"
