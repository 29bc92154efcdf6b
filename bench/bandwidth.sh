#!/usr/bin/env bash
# Bandwidth limits (docs/bandwidth.md): Weir's CPU per MiB of response body sent, paced by
# limit_rate against unpaced, the same downloads in one run. Weir (2 threads) on BENCH_SUT_CPU,
# the upstream (a Python server of N-byte bodies) and curl on BENCH_LOAD_CPU.
#
#   bench/bandwidth.sh           40 downloads of 16 MiB per row, paced at 64 MiB/s, 3 repetitions
#   bench/bandwidth.sh --quick   10 downloads, 1 repetition (CI's smoke run)
#
# Writes bench/results/bandwidth-latest.md (or -quick.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

downloads=40 reps=3 out=bench/results/bandwidth-latest.md
if [ "${1:-}" = "--quick" ]; then downloads=10 reps=1 out=bench/results/bandwidth-quick.md; fi
size=$((16 << 20)) rate=64m parallel=4
sut_cpu=${BENCH_SUT_CPU:-0} load_cpu=${BENCH_LOAD_CPU:-1}
profile=release
if [ "$reps" = 1 ]; then profile=debug; fi
if [ "${BENCH_SKIP_BUILD:-0}" != 1 ]; then
  if [ "$profile" = release ]; then cargo build --release --locked --bin weir >&2; else cargo build --locked --bin weir >&2; fi
fi
weir=target/$profile/weir
command -v curl >/dev/null || { echo "bench: curl is needed" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM

source bench/lib/procs.sh

up_port=$(free_port)
taskset -c "$load_cpu" python3 - "$up_port" <<'PY' &
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
CHUNK = b"x" * (1 << 16)
class Bytes(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        n = int(self.path.rsplit("/", 1)[-1])
        self.send_response(200)
        self.send_header("Content-Length", str(n))
        self.end_headers()
        while n > 0:
            part = CHUNK[: min(n, len(CHUNK))]
            self.wfile.write(part)
            n -= len(part)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Bytes).serve_forever()
PY
pids+=($!)
wait_port "$up_port"

row() {  # $1: name, $2: extra route lines → "seconds cpu_us_per_mib"
  local port; port=$(free_port)
  cat >"$tmp/$1.toml" <<TOML
[server]
listen = ["127.0.0.1:$port"]
threads = 2

[log]
access_log = false

[store]
kind = "memory"

[[upstream]]
name = "up"
servers = ["127.0.0.1:$up_port"]

[[route]]
name = "dl"
path_prefix = "/"
upstream = "up"
$2
TOML
  taskset -c "$sut_cpu" "$weir" -c "$tmp/$1.toml" 2>"$tmp/$1.log" &
  local pid=$!
  pids+=("$pid")
  wait_port "$port"
  local before; before=$(cpu_ticks "$pid")
  local started; started=$(date +%s.%N)
  seq "$downloads" | taskset -c "$load_cpu" xargs -P "$parallel" -I{} \
    curl -s -o /dev/null --fail "http://127.0.0.1:$port/$size"
  local ended; ended=$(date +%s.%N)
  local after; after=$(cpu_ticks "$pid")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 -c "
mib = $downloads * $size / (1 << 20)
print(f'{$ended - $started:.2f} {($after - $before) / $tck * 1e6 / mib:.1f}')"
}

{
  echo "# Bandwidth limits: CPU per MiB paced and unpaced — $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Weir ($profile, 2 threads) on CPU $sut_cpu; a Python upstream and curl ($parallel at a time) on CPU $load_cpu. $downloads downloads of $((size >> 20)) MiB per row; paced: \`limit_rate = \"$rate\"\` per download."
  echo
  echo "| row | rep | seconds | µs Weir CPU per MiB |"
  echo "|---|---|---|---|"
} >"$out"
for rep in $(seq "$reps"); do
  read -r secs us < <(row "unpaced-$rep" "")
  echo "| unpaced | $rep | $secs | $us |" | tee -a "$out" >&2
  read -r secs us < <(row "paced-$rep" "limit_rate = \"$rate\"")
  echo "| paced | $rep | $secs | $us |" | tee -a "$out" >&2
done
echo "bench: wrote $out" >&2
