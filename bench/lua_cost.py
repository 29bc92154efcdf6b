#!/usr/bin/env python3
"""Redis's own cost of one `limit_req` decision: instructions (callgrind) and CPU µs (native).

    python3 bench/lua_cost.py                       # lua/limit_req.lua, every case, both measures
    python3 bench/lua_cost.py --script /tmp/old.lua --case bench --batch 1,16
    python3 bench/lua_cost.py --floor               # the GET + SET + reply floor, same layout

A private redis-server (no persistence) gets the script's calls exactly as the decision lane sends
them (src/store/redis/lane.rs): EVALSHA in batch mode, `batch` requests per call, every request
after the first "=" (the same zones and costs), random client keys, Redis TIME, the compact reply.

* instructions: redis-server runs under `valgrind --tool=callgrind`; after a warm-up the counters
  are zeroed, `--calls` calls are sent (pipelined 8 deep) and the dump's total Ir (the whole
  process: event loop, RESP parsing, the script, the reply) is divided by the decisions made.
  Deterministic to ~0.5 % between runs.
* µs: redis-server runs natively, pinned to one CPU (`--cpu`); the same load, longer, and the
  process's user+sys CPU seconds (INFO cpu) and the EVALSHA time Redis itself accounts
  (INFO commandstats usec) are divided by the decisions. The machine's other load moves these by
  10-20 %: compare variants in one run, several times.

Cases (the zone is `weir:z<i>:{<client>}`, leaky bucket unless noted):
  bench  the bench's rows 4: 100000r/s, burst 100000, nodelay, 10k clients: a key's state has
         always drained by its next request (GET finds nothing), every request admitted
  hot    10r/s, burst 1e9, nodelay, 1000 clients: the state is always there (fractional levels,
         parsed and written back), every request admitted
  reject 1r/s, burst 5, nodelay, 50 clients: mostly rejected (nothing written)
  bench3 the bench's row 5: three zones of the `bench` case per request
  mixed  one zone of each algorithm (token bucket, fixed window, sliding window, sliding log,
         leaky bucket) per request, 10r/s-like limits, 1000 clients
Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (algorithm, count, period_us, burst, delay, cost) per zone, number of clients.
CASES = {
    "bench": ([(0, 100_000, 1_000_000, 100_000, -1, 1)], 10_000),
    "hot": ([(0, 10, 1_000_000, 1_000_000_000, -1, 1)], 1_000),
    "reject": ([(0, 1, 1_000_000, 5, -1, 1)], 50),
    "bench3": ([(0, 100_000, 1_000_000, 100_000, -1, 1)] * 3, 10_000),
    "mixed": ([(1, 10, 1_000_000, 1_000_000_000, -1, 1), (2, 1_000_000_000, 60_000_000, 0, -1, 1),
               (4, 1_000_000_000, 60_000_000, 0, -1, 1), (3, 1_000_000_000, 10_000_000, 0, -1, 1),
               (0, 10, 1_000_000, 1_000_000_000, 5, 1)], 1_000),
}

FLOOR_SCRIPT = r"""
-- The floor: per request and zone one GET and one SET ... PX of a short value, and the compact
-- reply (6 integers for one zone, 4 + 5 per zone otherwise), nested per request, in
-- limit_req.lua's batch layout (arguments read as little as possible).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local requests, n = tonumber(ARGV[2]), tonumber(ARGV[3])
local replies = {}
for r = 1, requests do
  for i = 1, n do
    local key = KEYS[(r - 1) * n + i]
    local old = redis.call('GET', key)
    redis.call('SET', key, '1 1700000000000000', 'PX', 2)
  end
  if n == 1 then
    replies[r] = { 1, 0, -1, now, 100000, 10 }
  else
    local reply = { 1, 0, -1, now }
    for i = 1, n do
      reply[#reply + 1], reply[#reply + 2], reply[#reply + 3], reply[#reply + 4], reply[#reply + 5] = 1, 0, -1, 100000, 10
    end
    replies[r] = reply
  end
end
return replies
"""


def resp(*args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class Reader:
    """Counts complete top-level RESP replies; raises on an error reply anywhere."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""
        self.pos = 0

    def _line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n", self.pos)
            if i >= 0:
                line = self.buf[self.pos:i]
                self.pos = i + 2
                return line
            self._more()

    def _more(self) -> None:
        self.buf = self.buf[self.pos:]
        self.pos = 0
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("redis closed the connection")
        self.buf += chunk

    def value(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            raise RuntimeError(f"redis: {rest.decode()}")
        if kind in (b"+", b":"):
            return int(rest) if kind == b":" else rest.decode()
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) - self.pos < n + 2:
                self._more()
            v = self.buf[self.pos:self.pos + n]
            self.pos += n + 2
            return v
        if kind == b"*":
            n = int(rest)
            return [self.value() for _ in range(max(n, 0))]
        raise RuntimeError(f"unexpected reply {line!r}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def calls_for(sha: str, case: str, batch: int, count: int, seed: int, single: bool = False) -> list[bytes]:
    zones, clients = CASES[case]
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        if single:
            # One request in the single-call layout (what the lane sends for a batch of one).
            client = f"c{rng.randrange(clients)}"
            keys = [f"weir:z{z + 1}:{{{client}}}".encode() for z in range(len(zones))]
            args = [b"", b"0"] + [str(v).encode() for zone in zones for v in zone]
            out.append(resp(b"EVALSHA", sha.encode(), str(len(keys)).encode(), *keys, *args))
            continue
        keys, args = [], [b"batch", str(batch).encode()]
        for r in range(batch):
            client = f"c{rng.randrange(clients)}"
            keys += [f"weir:z{z + 1}:{{{client}}}".encode() for z in range(len(zones))]
            args.append(str(len(zones)).encode())
            if r == 0:
                args += [b"", b"0"] + [str(v).encode() for zone in zones for v in zone]
            else:
                args.append(b"=")
        out.append(resp(b"EVALSHA", sha.encode(), str(len(keys)).encode(), *keys, *args))
    return out


def run_load(port: int, calls: list[bytes], depth: int = 8) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        r = Reader(s)
        sent = done = 0
        while done < len(calls):
            while sent < len(calls) and sent - done < depth:
                s.sendall(calls[sent])
                sent += 1
            r.value()
            done += 1


def command(port: int, *args):
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(resp(*args))
        return Reader(s).value()


def info(port: int, section: str) -> dict[str, str]:
    text = command(port, "INFO", section).decode()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))


def start_redis(port: int, workdir: Path, prefix: list[str]) -> subprocess.Popen:
    argv = prefix + ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "no", "--dir", str(workdir), "--protected-mode", "no"]
    p = subprocess.Popen(argv, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if command(port, "PING") == "PONG":
                return p
        except OSError:
            time.sleep(0.2)
    p.kill()
    raise RuntimeError("redis-server did not start")


def stop(p: subprocess.Popen) -> None:
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def total_ir(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no summary in {path}")


def instructions(body: str, case: str, batch: int, calls: int, workdir: Path, keep: str | None,
                 single: bool = False) -> float:
    port = free_port()
    out = workdir / "callgrind.out"
    p = start_redis(port, workdir, ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"])
    try:
        sha = command(port, "SCRIPT", "LOAD", body).decode()
        run_load(port, calls_for(sha, case, batch, max(calls // 10, 20), seed=1, single=single))
        subprocess.run(["callgrind_control", "-z", str(p.pid)], check=True, capture_output=True)
        run_load(port, calls_for(sha, case, batch, calls, seed=2, single=single))
        for f in workdir.glob("callgrind.out*"):
            f.unlink()
        subprocess.run(["callgrind_control", "-d", str(p.pid)], check=True, capture_output=True)
        dumps = sorted(workdir.glob("callgrind.out.*"))
        if not dumps:
            raise RuntimeError("callgrind wrote no dump")
        ir = total_ir(dumps[-1])
        if keep:
            shutil.copy(dumps[-1], keep)
    finally:
        stop(p)
    return ir / (calls * batch)


def native(body: str, case: str, batch: int, calls: int, workdir: Path, cpu: str,
           single: bool = False) -> tuple[float, float]:
    port = free_port()
    p = start_redis(port, workdir, ["taskset", "-c", cpu])
    try:
        sha = command(port, "SCRIPT", "LOAD", body).decode()
        load = calls_for(sha, case, batch, calls, seed=2, single=single)
        run_load(port, load[: calls // 10])
        command(port, "CONFIG", "RESETSTAT")
        c0 = info(port, "cpu")
        run_load(port, load)
        c1 = info(port, "cpu")
        stats = info(port, "commandstats")["cmdstat_evalsha"]
        usec = int(re.search(r"usec=(\d+)", stats).group(1))
    finally:
        stop(p)
    cpu_s = sum(float(c1[k]) - float(c0[k]) for k in ("used_cpu_user", "used_cpu_sys"))
    return cpu_s * 1e6 / (calls * batch), usec / (calls * batch)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--script", default=str(ROOT / "lua" / "limit_req.lua"))
    ap.add_argument("--floor", action="store_true", help="measure the GET + SET + reply floor instead")
    ap.add_argument("--case", default="bench,hot,reject,bench3,mixed", help=f"comma-separated: {', '.join(CASES)}")
    ap.add_argument("--batch", default="16", help="requests per call, comma-separated (1..16)")
    ap.add_argument("--calls", type=int, default=300, help="calls under callgrind (native: 40x)")
    ap.add_argument("--only", choices=["ir", "us"], help="one measure only")
    ap.add_argument("--cpu", default=os.environ.get("BENCH_REDIS_CPU", "1"), help="CPU for native redis")
    ap.add_argument("--keep", help="copy the (last) callgrind dump here")
    ap.add_argument("--single", action="store_true",
                    help="batch 1 in the single-call layout, as the lane sends a lone request "
                         "(not with --floor, whose script reads the batch layout)")
    args = ap.parse_args()
    body = FLOOR_SCRIPT if args.floor else Path(args.script).read_text()
    name = "floor" if args.floor else Path(args.script).name
    print(f"# {name} sha1 {hashlib.sha1(body.encode()).hexdigest()[:12]}")
    print("case     batch  instructions/decision  cpu_us/decision  evalsha_us/decision")
    with tempfile.TemporaryDirectory(prefix="lua_cost.") as tmp:
        for case in args.case.split(","):
            for batch in (int(b) for b in args.batch.split(",")):
                single = args.single and batch == 1 and not args.floor
                ir = (instructions(body, case, batch, args.calls, Path(tmp), args.keep, single)
                      if args.only != "us" else 0)
                us = (native(body, case, batch, args.calls * 40, Path(tmp), args.cpu, single)
                      if args.only != "ir" else (0, 0))
                print(f"{case:8} {batch:5}  {ir:21,.0f}  {us[0]:15.2f}  {us[1]:19.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
