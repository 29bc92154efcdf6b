#!/usr/bin/env bash
# Installs what building and running Weir needs on Debian/Ubuntu, and nothing else (scripts/run.sh
# sources it): cmake (Pingora's zlib-ng build), a C compiler, curl and CA certificates (rustup), and
# a Rust toolchain through rustup when cargo is missing. What the tests need on top is in
# scripts/setup.sh. WEIR_SETUP_PLAN=1 prints what would be installed and installs nothing
# (tests/install.rs checks the list).
set -euo pipefail

# Installs Debian packages ("$@"), as root or through sudo; in plan mode, only names them.
weir_apt_install() {
  [ $# -gt 0 ] || return 0
  if [ -n "${WEIR_SETUP_PLAN:-}" ]; then
    echo "setup: would install with apt-get: $*"
    return 0
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing $* with apt-get" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

run_apt=()
command -v cmake >/dev/null 2>&1 || run_apt+=(cmake)
command -v cc >/dev/null 2>&1 || run_apt+=(build-essential)
need_rustup=""
if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  need_rustup=1
  command -v curl >/dev/null 2>&1 || run_apt+=(curl ca-certificates)
fi
weir_apt_install "${run_apt[@]}"

if ! command -v cargo >/dev/null 2>&1; then
  if [ -z "$need_rustup" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  elif [ -n "${WEIR_SETUP_PLAN:-}" ]; then
    echo "setup: would install Rust with rustup (stable)"
  else
    echo "setup: installing Rust with rustup (stable)" >&2
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c clippy -c rustfmt
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi
