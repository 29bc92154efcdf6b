#!/usr/bin/env bash
# Installs what building and testing Weir needs on Debian/Ubuntu, skipping what is already there:
# cmake (Pingora's zlib-ng build), a C compiler, redis-server (tests and the Redis store), nginx-light
# (the replay differential test), curl, Debian's python3-grpcio (a real gRPC client for
# tests/tls.rs), kubernetes-validate from PyPI (tests/kubernetes.rs), and a Rust toolchain through
# rustup when cargo is missing.
set -euo pipefail

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v curl >/dev/null 2>&1 || need_apt+=(curl ca-certificates)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
# nginx: the `weir replay` differential test runs it (its own instance on a free loopback port).
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx-light)
/usr/bin/python3 -c 'import grpc' >/dev/null 2>&1 || need_apt+=(python3-grpcio)

if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${need_apt[*]} with apt-get" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # The Debian package starts a system redis on :6379; Weir's tests start their own on free ports.
  # Debian's nginx package starts a system nginx on :80; the tests never use it: stop it.
  if [[ " ${need_apt[*]} " == *" nginx-light "* ]]; then
    $sudo service nginx stop >/dev/null 2>&1 || $sudo nginx -s stop >/dev/null 2>&1 || true
  fi
fi

# kubernetes-validate (PyPI): tests/kubernetes.rs checks the rendered manifests against the
# Kubernetes API schemas it ships (offline).
if ! python3 -c 'import kubernetes_validate' >/dev/null 2>&1; then
  echo "setup: installing kubernetes-validate with pip" >&2
  python3 -m pip install --quiet kubernetes-validate \
    || python3 -m pip install --quiet --break-system-packages kubernetes-validate
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "setup: installing Rust with rustup (stable)" >&2
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c clippy -c rustfmt
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi
