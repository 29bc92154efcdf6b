#!/usr/bin/env python3
"""bench/leases.py: bench/leases.sh's fixed-rate load generator (`load`) and its report (`report`).

`load`: HTTP/1.1 at a fixed rate, standard library only (wrk has no rate control; `bench/wrk/client.lua`'s WRK_DELAY_MS paces by
latency, which a leased and an exact row do not share). Request i is due at start + i/RATE and
carries `X-Key: k<(offset + i) % KEYS>`, so every key sees RATE/KEYS requests a second, evenly
spread. Each of CONNECTIONS keep-alive connections has at most one request in flight; a due
request waits for an idle connection (its lateness is counted from when it was due, so a slow
answer shows in the latency, not as a lower rate: no coordinated omission).

    python3 bench/leases.py load PORT RATE SECONDS KEYS CONNECTIONS [KEY_OFFSET]

prints one JSON line: requests sent and answered, statuses (200, 429, other), errors, the rate
achieved, latency percentiles from each request's due time (µs) and how late sends were (p99, µs).

    python3 bench/leases.py report RUNS.jsonl

`report`: the markdown of a run's measurements (one JSON object per row and repetition, written by
leases.sh): per schedule and row the medians, then the ratios against the issue's targets.
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
import time


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class Conn:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.buf = b""
        self.due = None  # the in-flight request's due time (None: idle)


def parse_response(buf: bytes) -> tuple[int, int] | None:
    """(status, bytes of the whole response) once `buf` holds one, else None."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    head = buf[:head_end].decode("latin-1")
    lines = head.split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
        elif name.strip().lower() == "transfer-encoding":
            raise ValueError(f"chunked responses are not read here: {lines[0]}")
    if length is None:
        length = 0
    total = head_end + 4 + length
    return (status, total) if len(buf) >= total else None


def load(args: list[str]) -> None:
    if len(args) < 5:
        sys.exit(__doc__)
    port, rate, seconds, keys, connections = (int(args[0]), float(args[1]), float(args[2]),
                                              int(args[3]), int(args[4]))
    offset = int(args[5]) if len(args) > 5 else 0
    requests = [f"GET / HTTP/1.1\r\nHost: bench\r\nX-Key: k{k}\r\n\r\n".encode() for k in range(keys)]
    sel = selectors.DefaultSelector()
    conns = [Conn(port) for _ in range(connections)]
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
    idle = list(conns)
    total = int(rate * seconds)
    statuses = {"200": 0, "429": 0, "other": 0}
    latencies: list[float] = []
    lateness: list[float] = []
    errors = 0
    sent = answered = 0
    start = time.monotonic() + 0.01
    while answered + errors < total:
        now = time.monotonic()
        while sent < total and idle and start + sent / rate <= now:
            # The longest idle first: every connection stays in use (a stack would leave most
            # idle past the proxy's keepalive_timeout).
            c = idle.pop(0)
            due = start + sent / rate
            try:
                c.sock.sendall(requests[(offset + sent) % keys])
            except (BlockingIOError, OSError):
                errors += 1
                sent += 1
                continue
            lateness.append(now - due)
            c.due = due
            sent += 1
        if sent < total and idle:
            timeout = max(0.0, start + sent / rate - time.monotonic())
        else:
            timeout = 1.0
        for key, _ in sel.select(timeout):
            c = key.data
            try:
                data = c.sock.recv(65536)
            except BlockingIOError:
                continue
            if not data:
                if c.due is not None:
                    sys.exit("leases_load: the proxy closed a connection with a request in flight")
                # An idle keep-alive connection closed by the proxy's keepalive_timeout: a client
                # opens another, as browsers and pools do.
                sel.unregister(c.sock)
                c.sock.close()
                fresh = Conn(port)
                sel.register(fresh.sock, selectors.EVENT_READ, fresh)
                idle[idle.index(c)] = fresh
                continue
            c.buf += data
            while c.due is not None:
                parsed = parse_response(c.buf)
                if parsed is None:
                    break
                status, length = parsed
                c.buf = c.buf[length:]
                statuses[str(status) if status in (200, 429) else "other"] += 1
                latencies.append(time.monotonic() - c.due)
                answered += 1
                c.due = None
                idle.append(c)
        if time.monotonic() > start + seconds + 30:
            sys.exit(f"leases_load: {total - answered} requests unanswered 30 s after the run")
    elapsed = time.monotonic() - start
    latencies.sort()
    lateness.sort()
    print(json.dumps({
        "sent": sent, "answered": answered, "errors": errors, **{f"s{k}": v for k, v in statuses.items()},
        "rate": answered / elapsed if elapsed > 0 else 0.0,
        "p50_us": round(percentile(latencies, 0.5) * 1e6), "p99_us": round(percentile(latencies, 0.99) * 1e6),
        "max_us": round(latencies[-1] * 1e6) if latencies else 0,
        "late_p99_us": round(percentile(lateness, 0.99) * 1e6),
    }))


ROWS = ("memory", "exact", "leased")


def median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    if n == 0:
        return float("nan")
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def report(path: str) -> None:
    runs = [json.loads(line) for line in open(path) if line.strip()]
    out = []
    schedules = list(dict.fromkeys(r["schedule"] for r in runs))
    med: dict[tuple[str, str], dict[str, float]] = {}
    for schedule in schedules:
        out += ["", f"### {schedule}: {runs[[r['schedule'] for r in runs].index(schedule)]['what']}", "",
                "| row | rep | requests | admitted | rejected | rejected with no call | grants / refused asks | script calls | "
                "calls per admitted | all Redis commands per admitted | µs Redis CPU per admitted | "
                "µs proxy CPU per request | p50 / p99 µs |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in ROWS:
            mine = [r for r in runs if r["schedule"] == schedule and r["row"] == row]
            if not mine:
                continue
            per = {"calls": [], "commands": [], "redis_us": [], "cpu_us": [], "admitted": []}
            for r in mine:
                admitted, requests = max(r["s200"], 1), max(r["answered"], 1)
                per["calls"].append(r["script_calls"] / admitted)
                per["commands"].append(r["commands"] / admitted)
                per["redis_us"].append(r["redis_cpu_us"] / admitted)
                per["cpu_us"].append(r["proxy_cpu_us"] / requests)
                per["admitted"].append(r["s200"] / requests)
                local = "–" if r.get("local_rejected") is None else str(r["local_rejected"])
                asks = "–" if r.get("grants") is None else f"{r['grants']} / {r['refused_asks']}"
                out.append(
                    f"| {row} | {r['rep']} | {r['answered']} | {r['s200']} | {r['s429']} | {local} | {asks} | "
                    f"{r['script_calls']} | {per['calls'][-1]:.4f} | {per['commands'][-1]:.4f} | "
                    f"{per['redis_us'][-1]:.2f} | {per['cpu_us'][-1]:.1f} | {r['p50_us']} / {r['p99_us']} |")
                if r["errors"] or r["other"]:
                    out.append(f"| {row} | {r['rep']} | {r['errors']} errors, {r['other']} other statuses | | | | | | | | | | |")
            med[(schedule, row)] = {k: median(v) for k, v in per.items()}
        out.append("")
        m = {row: med.get((schedule, row)) for row in ROWS}
        lines = [f"Medians: " + "; ".join(
            f"{row} {v['calls']:.4f} calls and {v['cpu_us']:.1f} µs CPU per request"
            for row, v in m.items() if v)]
        if m["exact"] and m["leased"]:
            calls_ratio = m["leased"]["calls"] / m["exact"]["calls"] if m["exact"]["calls"] else float("nan")
            lines.append(f"Redis script calls per admitted request, leased / exact: **{calls_ratio:.4f}** "
                         f"(1/{1 / calls_ratio:.0f})" if 0 < calls_ratio < 1 else
                         f"Redis script calls per admitted request, leased / exact: {calls_ratio:.4f}")
            if m["exact"]["redis_us"]:
                lines.append(f"Redis CPU per admitted request, leased / exact: "
                             f"{m['leased']['redis_us'] / m['exact']['redis_us']:.4f}")
        if m["memory"] and m["leased"]:
            lines.append(f"Proxy CPU per request, leased / memory: **{m['leased']['cpu_us'] / m['memory']['cpu_us']:.3f}**"
                         f"; exact / memory: {m['exact']['cpu_us'] / m['memory']['cpu_us']:.3f}" if m["exact"] else "")
        out += [f"- {line}" for line in lines if line]
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("load", "report"):
        sys.exit(__doc__)
    if sys.argv[1] == "load":
        load(sys.argv[2:])
    else:
        report(sys.argv[2])
