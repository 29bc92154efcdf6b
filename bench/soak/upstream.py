#!/usr/bin/env python3
"""The soak test's upstream (bench/soak.sh): a small real HTTP/1.1 server, standard library only.

    upstream.py --port PORT

* every response carries `X-Soak-Upstream: 1`, so the driver can tell the upstream's answers
  (including its own 5xx) from Weir's;
* `?ms=N` sleeps N ms before answering (slow requests that hold limit_conn leases);
* a path containing `/err` answers 503 with a plain-text body (an upstream 5xx, not Weir's);
* request bodies are read (Content-Length) and ignored; keep-alive is honoured;
* `GET /__stats` returns the requests served and the peak number in flight, as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

LOCK = threading.Lock()
STATS = {"served": 0, "in_flight": 0, "peak_in_flight": 0}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "soak-upstream"
    sys_version = ""

    def log_message(self, *args) -> None:  # no per-request log
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        url = urlsplit(self.path)
        if url.path == "/__stats":
            with LOCK:
                body = json.dumps(STATS).encode()
            self._send(200, body, "application/json")
            return
        with LOCK:
            STATS["in_flight"] += 1
            STATS["peak_in_flight"] = max(STATS["peak_in_flight"], STATS["in_flight"])
        try:
            ms = parse_qs(url.query).get("ms", ["0"])[0]
            try:
                delay = min(max(int(ms), 0), 30_000) / 1000
            except ValueError:
                delay = 0
            if delay:
                time.sleep(delay)
            if "/err" in url.path:
                self._send(503, b"upstream error (on purpose)\n", "text/plain")
            else:
                self._send(200, b"ok " + url.path.encode() + b"\n", "text/plain")
        finally:
            with LOCK:
                STATS["in_flight"] -= 1
                STATS["served"] += 1

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Soak-Upstream", "1")
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        # A proxy that went away (killed Weir, aborted client) is part of the soak, not news.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    Server(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
