"""The bench's Redis client (RESP2 from resp.py), with INFO and counter snapshots; and MONITOR."""

from __future__ import annotations

import re
import socket
import time

from .common import BenchError
from .resp import RespClient


class Redis(RespClient):
    error = BenchError

    def info(self, section: str) -> dict[str, str]:
        text = self.cmd("INFO", section).decode()
        out = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v
        return out

    def snapshot(self) -> dict:
        """Counters for deltas: calls per command, and Redis CPU seconds."""
        stats = self.info("commandstats")
        calls, failed = {}, {}
        for k, v in stats.items():
            if k.startswith("cmdstat_"):
                m = re.search(r"(?:^|,)calls=(\d+)", v)
                f = re.search(r"failed_calls=(\d+)", v)
                calls[k[len("cmdstat_"):]] = int(m.group(1)) if m else 0
                failed[k[len("cmdstat_"):]] = int(f.group(1)) if f else 0
        cpu = self.info("cpu")
        return {
            "calls": calls,
            "failed": failed,
            "cpu_s": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        }


def redis_delta(before: dict, after: dict) -> dict:
    calls = {k: after["calls"].get(k, 0) - before["calls"].get(k, 0) for k in after["calls"]}
    calls = {k: v for k, v in calls.items() if v}
    # INFO itself is counted between the snapshots: leave out our own monitoring commands.
    calls.pop("info", None)
    failed = {k: v - before["failed"].get(k, 0) for k, v in after["failed"].items()}
    return {"calls": calls, "failed": {k: v for k, v in failed.items() if v},
            "cpu_s": after["cpu_s"] - before["cpu_s"]}


def monitor_args(line: str) -> list[str]:
    """The arguments of one MONITOR line: `+<time> [<db> <addr>] "ARG" "ARG" ...`, each quoted
    by Redis's sdscatrepr: \\\\, \\", \\n, \\r, \\t, \\a, \\b, and \\xHH for other bytes."""
    named = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b"}
    out = []
    for quoted in re.findall(r'"((?:[^"\\]|\\.)*)"', line.split("]", 1)[1]):
        raw, i = bytearray(), 0
        while i < len(quoted):
            c = quoted[i]
            if c == "\\" and i + 1 < len(quoted):
                nxt = quoted[i + 1]
                if nxt == "x":
                    raw.append(int(quoted[i + 2:i + 4], 16))
                    i += 4
                    continue
                raw += named.get(nxt, nxt.encode())
                i += 2
                continue
            raw += c.encode()
            i += 1
        out.append(raw.decode("utf-8", "surrogateescape"))
    return out


def capture_eval(redis_port: int, send, timeout: float = 15.0) -> list[str]:
    """The EVALSHA (or EVAL) that Weir sends to Redis while `send(i)` runs, seen through MONITOR:
    the script's exact KEYS/ARGV layout, whatever version of lua/limit_req.lua Weir embeds.
    `send(i)` is called again (i = 1, 2, ...; use a fresh client for each) every second until a
    call shows up: on a busy machine Weir's circuit breaker may be open for a while, and then the
    request is decided without Redis."""
    with socket.create_connection(("127.0.0.1", redis_port), timeout=5) as s:
        s.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        s.settimeout(0.25)
        buf, ok = b"", False
        deadline = time.time() + timeout
        attempt, next_send = 0, 0.0
        while time.time() < deadline:
            if ok and time.time() >= next_send:
                send(attempt)
                attempt += 1
                next_send = time.time() + 1.0
            try:
                chunk = s.recv(65536)
            except (socket.timeout, TimeoutError):
                continue
            if not chunk:
                raise BenchError("redis: MONITOR connection closed")
            buf += chunk
            while b"\r\n" in buf:
                raw, buf = buf.split(b"\r\n", 1)
                line = raw.decode("latin-1")
                if not ok:
                    if not line.startswith("+OK"):
                        raise BenchError(f"redis: MONITOR refused: {line[:100]}")
                    ok = True
                    continue
                args = monitor_args(line) if "]" in line else []
                if args and args[0].upper() in ("EVALSHA", "EVAL"):
                    return args
    raise BenchError(f"no EVALSHA reached Redis from Weir within {timeout:.0f} s "
                     f"({attempt} requests)")


def rand_keys(call: list[str], tag: str) -> list[str]:
    """Replaces the client key (the `{...}` hash tag) of every KEYS[i] of a captured call with
    `{__rand_int__}`, which redis-benchmark replaces with random numbers; zones get `tag`."""
    nkeys = int(call[2])
    out = list(call)
    for i in range(3, 3 + nkeys):
        out[i] = re.sub(r"\{.*\}$", "{__rand_int__}", out[i]).replace("weir:", f"weir:{tag}", 1)
    return out
