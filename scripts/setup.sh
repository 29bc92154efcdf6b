#!/usr/bin/env bash
# Installs what building and testing Weir needs on Debian/Ubuntu, skipping what is already there
# (scripts/test.sh sources it): first what running needs (scripts/setup-run.sh), then for the tests
# redis-server (and the Redis store), nginx-light (the replay differential test), pkg-config,
# Debian's python3-grpcio (a real gRPC client for tests/tls.rs), kubernetes-validate from PyPI
# (tests/kubernetes.rs), tmux and chromium (tests/top_tui.rs, tests/status_page.rs), promtool
# (Debian's prometheus: tests/observability.rs).
# WEIR_SETUP_PLAN=1 prints what would be installed and installs nothing.
set -euo pipefail
scripts_dir="${BASH_SOURCE[0]%/*}"
[ "$scripts_dir" != "${BASH_SOURCE[0]}" ] || scripts_dir=.
source "$scripts_dir/setup-run.sh"

test_apt=()
command -v redis-server >/dev/null 2>&1 || test_apt+=(redis-server)
command -v curl >/dev/null 2>&1 || test_apt+=(curl ca-certificates)
command -v pkg-config >/dev/null 2>&1 || test_apt+=(pkg-config)
# nginx: the `weir replay` differential test runs it (its own instance on a free loopback port).
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || test_apt+=(nginx-light)
/usr/bin/python3 -c 'import grpc' >/dev/null 2>&1 || test_apt+=(python3-grpcio)
# tmux: tests/top_tui.rs runs `weir top` in a real terminal; chromium: tests/status_page.rs loads
# the admin status page in a real headless browser.
command -v tmux >/dev/null 2>&1 || test_apt+=(tmux)
command -v chromium >/dev/null 2>&1 || test_apt+=(chromium)
# promtool (Debian's prometheus package): tests/observability.rs lints the /metrics exposition.
command -v promtool >/dev/null 2>&1 || test_apt+=(prometheus)
weir_apt_install "${test_apt[@]}"
# Debian's nginx and prometheus packages start system services (:80, :9090) where an init system
# runs; the tests never use them: stop them.
if [ -z "${WEIR_SETUP_PLAN:-}" ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if [[ " ${test_apt[*]} " == *" nginx-light "* ]]; then
    $sudo service nginx stop >/dev/null 2>&1 || $sudo nginx -s stop >/dev/null 2>&1 || true
  fi
  if [[ " ${test_apt[*]} " == *" prometheus "* ]]; then
    $sudo service prometheus stop >/dev/null 2>&1 || true
  fi
fi

# kubernetes-validate (PyPI): tests/kubernetes.rs checks the rendered manifests against the
# Kubernetes API schemas it ships (offline).
if ! python3 -c 'import kubernetes_validate' >/dev/null 2>&1; then
  if [ -n "${WEIR_SETUP_PLAN:-}" ]; then
    echo "setup: would install with pip: kubernetes-validate"
  else
    echo "setup: installing kubernetes-validate with pip" >&2
    python3 -m pip install --quiet kubernetes-validate \
      || python3 -m pip install --quiet --break-system-packages kubernetes-validate
  fi
fi
