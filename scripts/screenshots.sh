#!/usr/bin/env bash
# Takes the docs' pictures of Weir as it is: the admin status page (docs/status-page.png, and
# docs/status-page-phone.png at a phone's width) in headless Chromium, and `weir top`
# (docs/top.png) in a real terminal (tmux), rendered to PNG by the same Chromium. Weir runs on the
# memory store with an echo upstream, and three clients send traffic (one well over its limit)
# for the pictures to show rates, rejections and top keys. Loopback only; everything it starts
# is stopped when it ends. Needs chromium, tmux and curl (scripts/setup.sh installs them).
#
#   bash scripts/screenshots.sh            # rewrites the three PNGs in docs/
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
for tool in chromium tmux curl; do
  command -v "$tool" >/dev/null 2>&1 || { echo "screenshots: $tool is missing (bash scripts/setup.sh)" >&2; exit 1; }
done
cargo build --locked --bin weir
weir="$PWD/target/debug/weir"
[ -n "${CARGO_TARGET_DIR:-}" ] && weir="$CARGO_TARGET_DIR/debug/weir"

work="$(mktemp -d)"
pids=()
session="weir-screenshots-$$"
cleanup() {
  tmux kill-session -t "$session" >/dev/null 2>&1 || true
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Three free loopback ports: proxy, admin, upstream.
ports=($(python3 -c 'import socket
ss=[socket.socket() for _ in range(3)]
[s.bind(("127.0.0.1",0)) for s in ss]
print(*[s.getsockname()[1] for s in ss])'))
listen="127.0.0.1:${ports[0]}" admin="127.0.0.1:${ports[1]}" upstream="127.0.0.1:${ports[2]}"
token="screenshot-token-0123456789"
cat >"$work/weir.toml" <<CONF
[server]
listen = ["$listen"]
threads = 2
admin = "$admin"
admin_token = "$token"

[store]
kind = "memory"

[real_ip]
trusted = ["127.0.0.1/32"]

[[upstream]]
name = "app"
servers = ["$upstream"]

[[limit_req_zone]]
name = "per_client"
key = "ip"
rate = "5r/s"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_client", burst = 5, nodelay = true } ]

[[route]]
name = "health"
path = "/health"
upstream = "app"
CONF
"$weir" check -c "$work/weir.toml"
"$weir" echo --listen "$upstream" >"$work/echo.log" 2>&1 & pids+=($!)
"$weir" -c "$work/weir.toml" >"$work/weir.log" 2>&1 & pids+=($!)
for _ in $(seq 100); do curl -sf "http://$admin/healthz" >/dev/null 2>&1 && break; sleep 0.1; done

# Traffic for 60 s at most: a client over its limit (two connections back to back: the page's
# rates come from two readings a moment apart in Chromium's virtual time), one near it, one
# well under it.
client() {
  local ip="$1" pause="$2" end=$((SECONDS + 60))
  while [ $SECONDS -lt $end ]; do
    curl -s -o /dev/null -H "X-Forwarded-For: $ip" "http://$listen/api/orders" || true
    sleep "$pause"
  done
}
client 203.0.113.7 0 & pids+=($!)
client 203.0.113.7 0 & pids+=($!)
client 198.51.100.23 0.2 & pids+=($!)
client 192.0.2.44 1 & pids+=($!)
sleep 6

url="http://$admin/#token=$token"
for spec in "1000,640 docs/status-page.png" "390,844 docs/status-page-phone.png"; do
  read -r size file <<<"$spec"
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$work/profile-$size" \
    --virtual-time-budget=4000 --window-size="$size" --screenshot="$PWD/$file" "$url" >/dev/null 2>&1
  echo "screenshots: $file"
done

# weir top in a 110x28 terminal, its screen as text, then as a picture.
tmux new-session -d -s "$session" -x 110 -y 28 "$weir top --admin $admin --token $token"
sleep 4
tmux capture-pane -p -t "$session" >"$work/top.txt"
python3 - "$work/top.txt" "$work/top.html" <<'PY'
import html, sys
text = open(sys.argv[1], encoding="utf-8").read().rstrip("\n")
page = ("<!doctype html><meta charset=utf-8><body style='margin:0;background:#1e1e1e'>"
        "<pre style='margin:0;padding:12px;color:#e0e0e0;font:14px/1.25 monospace'>"
        + html.escape(text) + "</pre>")
open(sys.argv[2], "w", encoding="utf-8").write(page)
PY
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$work/profile-top" \
  --window-size=1000,520 --screenshot="$PWD/docs/top.png" "file://$work/top.html" >/dev/null 2>&1
echo "screenshots: docs/top.png"
