#!/usr/bin/env python3
"""Weir benchmark harness (issue 4). Started by bench/run.sh; Python 3.11 standard library only.

One run measures, on this machine, side by side:

* throughput rows: upstream direct, Weir passthrough, Weir with the memory and Redis stores, a
  one-key flood, and nginx limit_req; each repeated and interleaved round-robin, medians reported;
* a paced pair (Weir passthrough and Weir on Redis at half of the Redis row's peak) for the
  latency a Redis decision adds below saturation;
* Redis cost: EVALSHA calls per request and Redis CPU per decision (from INFO deltas), and the
  redis-benchmark ceiling of lua/limit_req.lua on one Redis core;
* memory: Redis bytes per active key, Weir RSS with many distinct keys in the memory store;
* fleet accuracy: N Weir instances on one Redis against N independent nginx instances.

Results go to <out>/latest.json and <out>/latest.md (--quick: quick.json and quick.md), and the
markdown is printed. The exit status is 1 if any part failed to run or a sanity check failed (e.g.
a "Redis" row that made no Redis calls, an "all passing" row that was limited).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import platform
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
WRK_SCRIPT = BENCH_DIR / "wrk" / "client.lua"
LUA_SCRIPT = REPO_DIR / "lua" / "limit_req.lua"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Rates for "all passing" rows: far above what one key sees (10k keys share < 100k r/s).
PASS_RATE_RPS = 100_000
PASS_BURST = 100_000
# Fleet accuracy: the limit every instance enforces on one shared key.
FLEET_RATE_RPS = 50
FLEET_BURST = 10
# A run during which processes outside the bench used more than this (% of one core) is run again
# while the retry budget lasts (Bench.measure_retrying).
DISTURBED_PCT = 20


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A part of the benchmark could not run (a process did not start, a tool failed)."""


# --------------------------------------------------------------------------------------------
# Processes: every server is started in its own process group, and every process (wrk runs too)
# is recorded in a pid file, so that bench/run.sh's EXIT trap can end what is left even if this
# script dies without cleaning up.
# --------------------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 15) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


class Procs:
    def __init__(self, workdir: Path, pidfile: Path):
        self.workdir = workdir
        self.pidfile = pidfile
        self.procs: list[Proc] = []

    def start(self, name: str, argv: list[str], cpus: str | None, env: dict | None = None) -> Proc:
        if cpus is not None:
            argv = ["taskset", "-c", cpus] + argv  # taskset execs: the pid is the program's
        log_path = self.workdir / f"{name}.log"
        out = open(log_path, "ab")
        full_env = dict(os.environ)
        full_env.update(env or {})
        popen = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, start_new_session=True,
        )
        out.close()
        record_pid(self.pidfile, popen.pid)
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def ours(self) -> set[int]:
        """Our pids: this script, every process it started, and their children (nginx workers)."""
        pids = {os.getpid()}
        try:
            for line in self.pidfile.read_text().splitlines():
                pids.add(int(line.split()[0]))
        except OSError:
            pass
        for pid in list(pids):
            pids.update(children_of(pid))
        return pids

    def stop(self, *procs: Proc, grace: float = 5.0) -> None:
        """SIGTERM to each process group (nginx workers included), all at once (Weir takes about
        a second to drain); SIGKILL to whatever is left after `grace` seconds."""
        for proc in procs:
            self._signal(proc, signal.SIGTERM)
        deadline = time.time() + grace
        for proc in procs:
            try:
                proc.popen.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                # Not reaped yet, so the group id is still this process's own.
                log(f"{proc.name} ignored SIGTERM for {grace}s: SIGKILL")
                self._signal(proc, signal.SIGKILL)
                proc.popen.wait()
            if proc in self.procs:
                self.procs.remove(proc)

    @staticmethod
    def _signal(proc: Proc, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # the group was created for it: start_new_session
        except (ProcessLookupError, PermissionError):
            pass

    def stop_all(self) -> None:
        self.stop(*reversed(self.procs))


def record_pid(pidfile: Path, pid: int) -> None:
    """Appends "pid starttime" (field 22 of /proc/pid/stat): run.sh's trap checks the start time
    so that it never signals an unrelated process that reused the pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        start = stat[stat.rindex(")") + 2:].split()[19]
    except (OSError, IndexError):
        start = "?"
    with open(pidfile, "a") as f:
        f.write(f"{pid} {start}\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(proc: Proc, port: int, timeout: float = 15.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not proc.alive():
            raise BenchError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise BenchError(f"{proc.name} not listening on {port} after {timeout}s:\n{proc.log_tail()}")


def http_get(port: int, xff: str | None = None, path: str = "/") -> int:
    """One HTTP/1.1 GET; returns the status code."""
    req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    if xff:
        req += f"X-Forwarded-For: {xff}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall((req + "\r\n").encode())
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
    if not m:
        raise BenchError(f"no HTTP response on port {port}: {data[:80]!r}")
    return int(m.group(1))


# --------------------------------------------------------------------------------------------
# /proc readings
# --------------------------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes (all threads), in seconds."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5)
    return total / CLK_TCK


def ctx_switches(pids: list[int]) -> int:
    """Voluntary + involuntary context switches of every thread of the processes."""
    total = 0
    for pid in pids:
        for status in Path(f"/proc/{pid}/task").glob("*/status"):
            try:
                for line in status.read_text().splitlines():
                    if "ctxt_switches:" in line:
                        total += int(line.split()[1])
            except OSError:
                pass
    return total


def core_times() -> dict[str, tuple[int, int]]:
    """Per CPU: (busy, total) jiffies from /proc/stat."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if re.match(r"cpu\d+ ", line):
            name, *vals = line.split()
            v = [int(x) for x in vals]
            idle = v[3] + v[4]
            out[name] = (sum(v[:8]) - idle, sum(v[:8]))
    return out


def core_busy(before: dict, after: dict) -> dict[str, float]:
    out = {}
    for name in after:
        db = after[name][0] - before[name][0]
        dt = after[name][1] - before[name][1]
        out[name] = round(100.0 * db / dt, 1) if dt > 0 else 0.0
    return out


def task_cpu_s() -> float:
    """CPU seconds spent in tasks (user + nice + system, all CPUs; no irq, softirq or steal)
    since boot, from /proc/stat."""
    f = Path("/proc/stat").read_text().splitlines()[0].split()
    return (int(f[1]) + int(f[2]) + int(f[3])) / CLK_TCK


def per_pid_cpu(pids: set[int]) -> dict[int, float]:
    return {pid: cpu_seconds([pid]) for pid in pids}


def ours_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(after[p] - before[p] for p in before if p in after)


def rss_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, val = line.split(":", 1)
            out[key] = int(val.split()[0])
    return out


# --------------------------------------------------------------------------------------------
# A minimal Redis client (RESP2), enough for INFO, EVAL, GET, MEMORY USAGE; and MONITOR.
# --------------------------------------------------------------------------------------------


class Redis:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.reader = self.sock.makefile("rb")

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def cmd(self, *args):
        parts = [f"*{len(args)}\r\n".encode()]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.sock.sendall(b"".join(parts))
        return self._read()

    def _read(self):
        line = self.reader.readline()
        if not line:
            raise BenchError("redis: connection closed")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise BenchError(f"redis: {rest.decode()}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.reader.read(n + 2)[:-2]
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise BenchError(f"redis: unexpected reply {line!r}")

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


def capture_eval(redis_port: int, send) -> list[str]:
    """The EVALSHA (or EVAL) that Weir sends to Redis while `send()` runs, seen through MONITOR:
    the script's exact KEYS/ARGV layout, whatever version of lua/limit_req.lua Weir embeds."""
    with socket.create_connection(("127.0.0.1", redis_port), timeout=5) as s:
        reader = s.makefile("rb")
        s.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        if not reader.readline().startswith(b"+OK"):
            raise BenchError("redis: MONITOR refused")
        send()
        deadline = time.time() + 5
        while time.time() < deadline:
            line = reader.readline().decode("latin-1").rstrip("\r\n")
            args = monitor_args(line) if "]" in line else []
            if args and args[0].upper() in ("EVALSHA", "EVAL"):
                return args
    raise BenchError("no EVALSHA reached Redis from Weir within 5 s")


def rand_keys(call: list[str], tag: str) -> list[str]:
    """Replaces the client key (the `{...}` hash tag) of every KEYS[i] of a captured call with
    `{__rand_int__}`, which redis-benchmark replaces with random numbers; zones get `tag`."""
    nkeys = int(call[2])
    out = list(call)
    for i in range(3, 3 + nkeys):
        out[i] = re.sub(r"\{.*\}$", "{__rand_int__}", out[i]).replace("weir:", f"weir:{tag}", 1)
    return out


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


def weir_toml(port: int, upstream_port: int, *, store: str = "memory", redis_port: int = 0,
              zones: int = 0, rate: str = f"{PASS_RATE_RPS}r/s", burst: int = PASS_BURST,
              threads: int = 1, deny_cache_size: int | None = None,
              access_log: bool | None = None) -> str:
    """A Weir config: one catch-all route to the upstream with `zones` ip-keyed limit_req zones.
    `access_log = False` writes `[log] access_log = false` (nginx here runs with access_log off)."""
    lines = [
        "# generated by bench/harness.py",
        "[server]",
        f'listen = ["127.0.0.1:{port}"]',
        f"threads = {threads}",
        "",
    ]
    if access_log is not None:
        lines += ["[log]", f"access_log = {'true' if access_log else 'false'}", ""]
    if store == "redis":
        lines += [
            "[store]",
            'kind = "redis"',
            f'url = "redis://127.0.0.1:{redis_port}/0"',
            'timeout = "25ms"',
            'clock = "redis"',
            'key_prefix = "weir:"',
        ]
        if deny_cache_size is not None:
            lines.append(f"deny_cache_size = {deny_cache_size}")
        lines.append("")
    if zones:
        lines += ["[real_ip]", 'trusted = ["127.0.0.1/32"]', 'header = "X-Forwarded-For"', ""]
    lines += ["[[upstream]]", 'name = "app"', f'servers = ["127.0.0.1:{upstream_port}"]', ""]
    for z in range(1, zones + 1):
        lines += ["[[limit_req_zone]]", f'name = "z{z}"', 'key = "ip"', f'rate = "{rate}"', ""]
    limits = ", ".join(
        f'{{ zone = "z{z}", burst = {burst}, nodelay = true }}' for z in range(1, zones + 1))
    lines += ["[[route]]", 'name = "all"', 'path_prefix = "/"', 'upstream = "app"']
    if zones:
        lines.append(f"limit_req = [ {limits} ]")
    return "\n".join(lines) + "\n"


def nginx_conf(root: Path, port: int, *, role: str, upstream_port: int = 0,
               rate: str = f"{PASS_RATE_RPS}r/s", burst: int = PASS_BURST) -> str:
    """role: "upstream" (return 200), "proxy" (no limits) or "limit" (limit_req, 1 zone)."""
    if role == "upstream":
        locations = (
            "        location / {\n"
            "            default_type text/plain;\n"
            '            return 200 "ok $uri\\n";\n'
            "        }\n"
            # Fleet runs time admitted requests by the upstream's clock (ms): see phase_fleet.
            "        location /fleet {\n"
            "            default_type text/plain;\n"
            "            add_header X-Upstream-Msec $msec;\n"
            '            return 200 "ok $uri\\n";\n'
            "        }\n"
        )
        http_extra = ""
    else:
        locations = (
            "        location / {\n"
            + (f"            limit_req zone=z burst={burst} nodelay;\n" if role == "limit" else "")
            + "            proxy_pass http://app;\n"
            "            proxy_http_version 1.1;\n"
            '            proxy_set_header Connection "";\n'
            "        }\n"
        )
        http_extra = (
            f"    upstream app {{\n        server 127.0.0.1:{upstream_port};\n"
            "        keepalive 128;\n        keepalive_requests 1000000;\n    }\n"
        )
        if role == "limit":
            http_extra += (
                "    set_real_ip_from 127.0.0.1;\n"
                "    real_ip_header X-Forwarded-For;\n"
                f"    limit_req_zone $binary_remote_addr zone=z:20m rate={rate};\n"
                "    limit_req_status 429;\n"
                "    limit_req_log_level info;\n"
            )
    return f"""# generated by bench/harness.py ({role})
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{
    worker_connections 8192;
}}
http {{
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    client_body_temp_path {root}/tmp_body;
    proxy_temp_path {root}/tmp_proxy;
    fastcgi_temp_path {root}/tmp_fastcgi;
    uwsgi_temp_path {root}/tmp_uwsgi;
    scgi_temp_path {root}/tmp_scgi;
{http_extra}    server {{
        listen 127.0.0.1:{port} backlog=4096;
{locations}    }}
}}
"""


# --------------------------------------------------------------------------------------------
# The bench
# --------------------------------------------------------------------------------------------


@dataclass
class Target:
    """Something wrk can hit: a port and the processes whose CPU counts as "the proxy"."""
    port: int
    procs: list[Proc]
    nginx: bool = False

    def pids(self) -> list[int]:
        pids = []
        for p in self.procs:
            pids.append(p.pid)
            if self.nginx:
                pids += children_of(p.pid)
        return pids


@dataclass
class Row:
    id: str
    label: str
    target: str            # key into Bench.targets
    keys: int = 10_000     # distinct XFF addresses
    expect: str = "pass"   # "pass": ≥ 99% 2xx; "reject": ≤ 1% 2xx
    redis: bool = False    # decisions go to Redis: check EVALSHA calls, report Redis cost
    note: str = ""
    runs: list[dict] = field(default_factory=list)


class Bench:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.workdir = Path(args.workdir)
        self.out = Path(args.out)
        self.procs = Procs(self.workdir, self.workdir / "pids")
        self.weir = args.weir
        self.sut_cpu = os.environ.get("BENCH_SUT_CPU", "0")
        self.load_cpu = os.environ.get("BENCH_LOAD_CPU", "1")
        self.redis_cpu = os.environ.get("BENCH_REDIS_CPU", self.load_cpu)
        self.conns = int(os.environ.get("BENCH_CONNECTIONS", "64"))
        self.reps = args.reps if args.reps else (1 if self.quick else 4)
        self.duration = args.duration if args.duration else (2 if self.quick else 5)
        # Seconds of wrk before the first measured run of each row (connections, upstream pool,
        # Redis connection, memory-store keys); later repetitions start warm.
        self.warmup = 0 if self.quick else 1
        self.targets: dict[str, Target] = {}
        self.failures: list[str] = []
        self.warnings: list[str] = []
        self.results: dict = {}
        self.redis: Redis | None = None
        self.redis_proc: Proc | None = None
        self.redis_port = 0
        self.upstream_port = 0
        self.deny_cache = False
        self.access_log: bool | None = None
        self.quiet_budget = 30.0  # seconds the whole run may spend waiting for a quiet machine
        self.retry_budget = 0.0 if args.quick else 60.0  # seconds of re-runs of disturbed runs

    # ---- starting things -------------------------------------------------------------------

    def start_nginx(self, name: str, role: str, port: int, **kw) -> Proc:
        root = self.workdir / name
        root.mkdir(parents=True, exist_ok=True)
        conf = root / "nginx.conf"
        conf.write_text(nginx_conf(root, port, role=role, **kw))
        proc = self.procs.start(
            name, ["nginx", "-p", str(root), "-c", str(conf), "-g", "daemon off;"], self.sut_cpu)
        wait_port(proc, port)
        return proc

    def start_weir(self, name: str, toml: str, port: int) -> Proc:
        conf = self.workdir / f"{name}.toml"
        conf.write_text(toml)
        proc = self.procs.start(name, [self.weir, "-c", str(conf)], self.sut_cpu,
                                env={"RUST_LOG": "warn"})
        wait_port(proc, port)
        return proc

    def start_redis(self) -> None:
        port = free_port()
        self.redis_proc = self.procs.start(
            "redis", ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                      "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
            self.redis_cpu)
        wait_port(self.redis_proc, port)
        self.redis_port = port
        self.redis = Redis(port)

    def start_all(self) -> None:
        log(f"starting servers (SUT on CPU {self.sut_cpu}, load on CPU {self.load_cpu}, "
            f"Redis on CPU {self.redis_cpu})")
        self.start_redis()
        up = free_port()
        self.upstream_port = up
        upstream = self.start_nginx("upstream", "upstream", up)
        self.targets["upstream"] = Target(up, [upstream], nginx=True)
        echo_port = free_port()
        echo = self.procs.start("echo", [self.weir, "echo", "--listen", f"127.0.0.1:{echo_port}"],
                                self.sut_cpu, env={"RUST_LOG": "warn"})
        wait_port(echo, echo_port)
        self.targets["echo"] = Target(echo_port, [echo])

        self.deny_cache = self.weir_accepts(
            weir_toml(1, up, store="redis", redis_port=self.redis_port, zones=1,
                      deny_cache_size=0))
        # Newer builds log every request at info (RUST_LOG=warn drops the lines); turn the access
        # log off where the build knows the setting, as nginx runs here with access_log off.
        self.access_log = False if self.weir_accepts(weir_toml(1, up, access_log=False)) else None
        flood = dict(zones=1, store="redis", rate="1r/h", burst=0)
        specs = {
            "passthrough": dict(zones=0),
            "memory": dict(zones=1),
            "redis": dict(zones=1, store="redis"),
            "redis3": dict(zones=3, store="redis"),
            # One key, 1 request per hour, no burst: the first request passes, the rest are 429.
            "flood": dict(flood, deny_cache_size=0) if self.deny_cache else flood,
        }
        if self.deny_cache:
            specs["flood_cache"] = flood  # the default deny cache
        for name, spec in specs.items():
            port = free_port()
            toml = weir_toml(port, up, redis_port=self.redis_port, access_log=self.access_log,
                             **spec)
            self.targets[name] = Target(port, [self.start_weir(f"weir-{name}", toml, port)])
        for name, role in (("nginx_limit", "limit"), ("nginx_proxy", "proxy")):
            port = free_port()
            self.targets[name] = Target(
                port, [self.start_nginx(name, role, port, upstream_port=up)], nginx=True)
        self.check_weir_store()

    def weir_accepts(self, toml: str) -> bool:
        """Does this weir build accept the config (`weir check`)? For settings that are newer
        than the harness, e.g. store.deny_cache_size."""
        conf = self.workdir / "probe.toml"
        conf.write_text(toml)
        cp = subprocess.run([self.weir, "check", "-c", str(conf)], capture_output=True, text=True)
        return cp.returncode == 0

    def check_weir_store(self) -> None:
        """Fail early and clearly if the Redis store is not deciding (e.g. not implemented)."""
        t = self.targets["flood"]
        before = self.redis.snapshot()
        statuses = [http_get(t.port, xff="10.250.0.1") for _ in range(3)]
        calls = redis_delta(before, self.redis.snapshot())["calls"]
        evals = calls.get("evalsha", 0) + calls.get("eval", 0)
        if statuses[1:] != [429, 429] or evals == 0:
            raise BenchError(
                "the Redis store does not limit: 3 requests on a 1r/h, burst 0 zone answered "
                f"{statuses}, Redis saw {calls}; weir log:\n"
                + self.targets["flood"].procs[0].log_tail())
        self.redis.cmd("DEL", "weir:z1:{10.250.0.1}")

    # ---- one wrk run -----------------------------------------------------------------------

    def wrk(self, port: int, duration: int, conns: int, env: dict | None = None,
            cpus: str | None = None, background: bool = False, path: str = "/"):
        argv = ["taskset", "-c", cpus or self.load_cpu, "wrk", "-t1", f"-c{conns}",
                f"-d{duration}s", "--timeout", "5s", "-s", str(WRK_SCRIPT),
                f"http://127.0.0.1:{port}{path}"]
        full_env = dict(os.environ)
        full_env.update(env or {})
        popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=full_env, text=True)
        record_pid(self.procs.pidfile, popen.pid)
        if background:
            return popen
        return self.wrk_result(popen, duration)

    @staticmethod
    def wrk_result(popen: subprocess.Popen, duration: int) -> dict:
        try:
            out, err = popen.communicate(timeout=duration + 30)
        except subprocess.TimeoutExpired:
            popen.kill()
            out, err = popen.communicate()
        for line in out.splitlines():
            if line.startswith("WRKJSON "):
                res = json.loads(line[len("WRKJSON "):])
                res["rps"] = res["requests"] / (res["duration_us"] / 1e6)
                return res
        raise BenchError(f"wrk gave no result (exit {popen.returncode}): {out[-500:]} {err[-500:]}")

    def other_load(self, seconds: float) -> float:
        """CPU used by processes that are not ours over `seconds`, in cores."""
        ex = self.procs.ours()
        t0, p0 = task_cpu_s(), per_pid_cpu(ex)
        time.sleep(seconds)
        t1, p1 = task_cpu_s(), per_pid_cpu(ex)
        return max(0.0, (t1 - t0) - ours_delta(p0, p1)) / seconds

    def wait_quiet(self) -> None:
        """Before a measured run (full mode): wait, within a budget, until processes that are not
        ours use < 10% of a core, so that other work on a shared machine does not land in a
        measurement (each run records what other load remained anyway)."""
        if self.quick:
            return
        waited = 0.0
        while self.quiet_budget > 0 and waited < 10:
            load = self.other_load(0.5)
            if load < 0.1:
                return
            if waited == 0:
                log(f"  waiting for other processes to quiet down ({load:.2f} cores busy)")
            waited += 0.5
            self.quiet_budget -= 0.5

    def measure(self, target: Target, keys: int, duration: int, conns: int,
                extra_env: dict | None = None, key_offset: int = 0, warm: bool = True) -> dict:
        """(Warm up, then) one measured wrk run with CPU, core and Redis counters around it."""
        env = {"WRK_KEYS": str(keys), "WRK_KEY_OFFSET": str(key_offset)}
        env.update(extra_env or {})
        self.wait_quiet()
        if warm and self.warmup:
            self.wrk(target.port, self.warmup, conns, env)
        pids = target.pids()
        up_pids = self.targets["upstream"].pids()
        ex = self.procs.ours()
        o0, q0 = task_cpu_s(), per_pid_cpu(ex)
        w0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        logs0 = {p.log_path: p.log_path.stat().st_size for p in target.procs}
        r0, c0, u0, k0 = (self.redis.snapshot(), cpu_seconds(pids), cpu_seconds(up_pids),
                          core_times())
        x0 = ctx_switches(pids)
        t0 = time.time()
        res = self.wrk(target.port, duration, conns, env)
        wall = time.time() - t0
        r1, c1, u1, k1 = (self.redis.snapshot(), cpu_seconds(pids), cpu_seconds(up_pids),
                          core_times())
        x1 = ctx_switches(pids)
        o1, q1 = task_cpu_s(), per_pid_cpu(ex)
        w1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        n = max(res["requests"], 1)
        rd = redis_delta(r0, r1)
        evals = rd["calls"].get("evalsha", 0) + rd["calls"].get("eval", 0)
        wrk_cpu = (w1.ru_utime + w1.ru_stime) - (w0.ru_utime + w0.ru_stime)
        # What the proxy logged meanwhile (Weir runs with RUST_LOG=warn: every line is a warning
        # or an error, e.g. Redis timeouts that sent decisions to the fallback).
        logged = []
        for path, size in logs0.items():
            with open(path, "rb") as f:
                f.seek(size)
                text = f.read().decode(errors="replace")
            logged += [ln for ln in text.splitlines() if ln.strip()]
        # wrk closes its connections with requests in flight when it stops: Pingora logs those as
        # "Downstream ConnectionClosed". Not a problem of the proxy; counted apart.
        hangups = [ln for ln in logged if "Downstream ConnectionClosed" in ln]
        logged = [ln for ln in logged if "Downstream ConnectionClosed" not in ln]
        store_failures = sum(1 for ln in logged if "limit store" in ln)  # failed, or circuit open
        # Other load: task CPU of the whole machine minus ours (servers, this script, wrk).
        other = max(0.0, (o1 - o0) - ours_delta(q0, q1) - wrk_cpu)
        res.update({
            "wall_s": round(wall, 3),
            "proxy_cpu_s": round(c1 - c0, 3),
            "proxy_cpu_s_per_1k": (c1 - c0) / n * 1000,
            "proxy_core_util_pct": round(100 * (c1 - c0) / wall, 1),
            "upstream_cpu_s": round(u1 - u0, 3),
            # Mostly the upstream (same core) preempting the proxy: one per response or so.
            "proxy_ctx_switches_per_req": (x1 - x0) / n,
            "wrk_cpu_s": round(wrk_cpu, 3),
            "other_cpu_s": round(other, 3),
            "other_load_pct": round(100 * other / wall, 1),
            "core_busy_pct": core_busy(k0, k1),
            "redis_calls": rd["calls"],
            # Round trips: EVALSHA calls. Commands the script runs inside (GET, SET, TIME) are
            # counted by commandstats too; reported apart.
            "redis_evalsha_per_req": evals / n,
            "redis_inner_cmds_per_req": (sum(rd["calls"].values()) - evals) / n,
            "redis_cpu_s": round(rd["cpu_s"], 3),
            "redis_cpu_ms_per_1k": (rd["cpu_s"] * 1e3 / evals * 1000) if evals else None,
            "admitted_pct": 100.0 * (res["requests"] - res["errors"]["status"]) / n,
            "proxy_log_lines": len(logged),
            "proxy_log_sample": [ln[:300] for ln in logged[:3]],
            "proxy_log_store_failures": store_failures,
            "proxy_log_client_hangups": len(hangups),
        })
        if logged:
            log(f"  the proxy logged {len(logged)} line(s), e.g. {logged[0][:200]}")
        if res["other_load_pct"] > 10:
            log(f"  note: other processes used {res['other_load_pct']:.0f}% of a core meanwhile")
        return res

    def measure_retrying(self, *args, **kwargs) -> dict:
        """measure(), run again (within a budget for the whole bench) when processes outside the
        bench took more than DISTURBED_PCT of a core meanwhile: outside load only ever slows a
        run down, so a disturbed run is replaced rather than averaged in. Replaced runs are kept
        in the result, under "discarded"."""
        discarded = []
        while True:
            res = self.measure(*args, **kwargs)
            if self.quick or res["other_load_pct"] <= DISTURBED_PCT or self.retry_budget <= 0:
                break
            self.retry_budget -= res["wall_s"] + 0.5
            log(f"  disturbed ({res['other_load_pct']:.0f}% of a core by other processes): "
                "running it again")
            discarded.append({k: res[k] for k in ("rps", "other_load_pct", "latency_us",
                                                  "proxy_cpu_s_per_1k")})
            kwargs["warm"] = False
        res["discarded"] = discarded
        return res

    # ---- phase 1: throughput rows ------------------------------------------------------------

    def rows(self) -> list[Row]:
        rows = [
            Row("upstream", "1. upstream direct (nginx `return 200`)", "upstream"),
            Row("echo", "1b. upstream direct (`weir echo`, for reference)", "echo"),
            Row("passthrough", "2. Weir, no limits (Pingora passthrough)", "passthrough"),
            Row("memory", "3. Weir, memory store, 1 zone, 10k keys", "memory"),
            Row("redis", "4. Weir, Redis store, 1 zone, 10k keys", "redis", redis=True),
            Row("redis3", "5. Weir, Redis store, 3 zones, 10k keys", "redis3", redis=True),
            Row("flood", "6. Weir, Redis, one-key flood (all 429), no deny cache", "flood",
                keys=1, expect="reject", redis=True,
                note="deny_cache_size = 0" if self.deny_cache
                else "deny cache: not implemented yet"),
            Row("flood_cache", "6b. Weir, Redis, one-key flood (all 429), deny cache",
                "flood_cache", keys=1, expect="reject", note="default deny_cache_size"),
            Row("nginx_limit", "7. nginx limit_req, 1 zone, 10k keys", "nginx_limit"),
            Row("nginx_proxy", "7b. nginx proxy, no limits (for reference)", "nginx_proxy"),
        ]
        if not self.deny_cache:
            rows = [r for r in rows if r.id != "flood_cache"]
        if self.quick:
            rows = [r for r in rows if r.id not in ("echo", "nginx_proxy")]
        if self.args.rows:
            rows = [r for r in rows if r.id in self.args.rows.split(",")]
        return rows

    def phase_throughput(self) -> list[Row]:
        rows = self.rows()
        for rep in range(self.reps):
            for row in rows:
                log(f"rep {rep + 1}/{self.reps}: {row.label}")
                try:
                    res = self.measure_retrying(
                        self.targets[row.target], row.keys, self.duration, self.conns,
                        key_offset=2_000_000 if row.keys == 1 else 0, warm=rep == 0)
                except BenchError as e:
                    self.fail(f"{row.id}: {e}")
                    continue
                row.runs.append(res)
                self.check_row(row, res)
        return rows

    def check_row(self, row: Row, res: dict) -> None:
        n = res["requests"]
        sock_errors = sum(v for k, v in res["errors"].items() if k != "status")
        if n == 0:
            self.fail(f"{row.id}: no request completed")
        if sock_errors > 0.01 * max(n, 1):
            self.fail(f"{row.id}: {sock_errors} socket errors / {n} requests: {res['errors']}")
        if row.expect == "pass" and res["admitted_pct"] < 99.0:
            self.fail(f"{row.id}: only {res['admitted_pct']:.2f}% of requests got 2xx")
        if row.expect == "reject" and res["admitted_pct"] > 1.0:
            self.fail(f"{row.id}: {res['admitted_pct']:.2f}% got 2xx, expected all rejected")
        if row.redis and res["redis_evalsha_per_req"] < 0.2:
            self.fail(f"{row.id}: {res['redis_evalsha_per_req']:.3f} EVALSHA per request: "
                      "is the Redis store deciding?")
        if res["other_load_pct"] > DISTURBED_PCT:
            self.warn(f"{row.id}: other processes used {res['other_load_pct']:.0f}% of a core "
                      "during a run (shared machine): its numbers are noisy")
        if row.redis and 0.2 <= res["redis_evalsha_per_req"] < 0.95:
            self.warn(f"{row.id}: only {res['redis_evalsha_per_req']:.2f} EVALSHA per request: "
                      "decisions were made without Redis")
        if res.get("proxy_log_store_failures"):
            self.warn(f"{row.id}: Weir logged {res['proxy_log_store_failures']} failed Redis "
                      f"decisions in one run (e.g. {res['proxy_log_sample'][0][:160]})")

    def fail(self, msg: str) -> None:
        log(f"FAILED: {msg}")
        self.failures.append(msg)

    def warn(self, msg: str) -> None:
        """Something that makes a number doubtful without failing the run."""
        log(f"WARNING: {msg}")
        self.warnings.append(msg)

    # ---- phase 2: latency at half of the Redis row's peak ----------------------------------

    def phase_paced(self, rows: list[Row]) -> dict:
        """Rows 2 and 4 at the same offered rate, half of row 4's peak: wrk has no rate control,
        so C connections each wait D ms after every response (about C*1000/(D+latency) r/s)."""
        peak = summarize(next(r for r in rows if r.id == "redis"))["rps"]
        if not peak:
            return {"skipped": "row 4 has no result"}
        target_rps = peak / 2
        delay_ms = 10
        conns = max(2, round(target_rps * (delay_ms + 0.3) / 1000))
        env = {"WRK_DELAY_MS": str(delay_ms)}
        # Calibrate once on row 4: scale the connection count to the measured rate.
        probe = self.measure(self.targets["redis"], 10_000, 2, conns, env)
        conns = max(2, round(conns * target_rps / max(probe["rps"], 1)))
        log(f"paced: target {target_rps:.0f} r/s = {conns} connections x {delay_ms} ms delay")
        paced = {"passthrough": [], "redis": []}
        for rep in range(self.reps):
            for rid in ("passthrough", "redis"):
                log(f"rep {rep + 1}/{self.reps}: paced {rid}")
                paced[rid].append(self.measure_retrying(
                    self.targets[rid], 10_000, self.duration, conns, env, warm=rep == 0))
        out = {
            "target_rps": round(target_rps), "connections": conns, "delay_ms": delay_ms,
            "runs": paced,
            "passthrough": summarize_runs(paced["passthrough"]),
            "redis": summarize_runs(paced["redis"]),
        }
        out["added_p99_ms"] = out["redis"]["p99_ms"] - out["passthrough"]["p99_ms"]
        out["added_p50_ms"] = out["redis"]["p50_ms"] - out["passthrough"]["p50_ms"]
        return out

    # ---- optional: where the proxy's CPU goes (perf) ----------------------------------------

    def phase_profile(self) -> dict:
        """perf record (cpu-clock, flat) of the proxy, and of Redis for Redis rows, during one
        extra saturated run per row; not part of the medians. Reports in <out>/profile-<row>.txt."""
        if subprocess.run(["sh", "-c", "command -v perf"], capture_output=True).returncode:
            return {"skipped": "perf not installed"}
        out = {}
        for rid in ("passthrough", "memory", "redis", "nginx_limit"):
            target = self.targets[rid]
            pids = target.pids()
            if rid.startswith("redis"):
                pids.append(self.redis_proc.pid)
            data = self.workdir / f"perf-{rid}.data"
            log(f"profile: {rid}")
            perf = subprocess.Popen(
                ["perf", "record", "-F", "999", "-o", str(data), "-p",
                 ",".join(map(str, pids)), "--", "sleep", str(self.duration)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            record_pid(self.procs.pidfile, perf.pid)
            res = self.measure(target, 10_000, self.duration, self.conns)
            perf.wait()
            def report(sort: str, limit: str) -> list[str]:
                cp = subprocess.run(
                    ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", sort,
                     "--percent-limit", limit], capture_output=True, text=True)
                lines = []
                for ln in cp.stdout.splitlines():
                    if ln.strip() and not ln.startswith("#"):
                        ln = re.sub(r"(\s+-)+\s*$", "", ln.rstrip())  # empty trailing columns
                        lines.append(re.sub(r" {3,}", "  ", ln))
                return lines

            by_dso, by_symbol = report("comm,dso", "0.5"), report("comm,dso,symbol", "0.7")
            by_crate = crate_totals(report("dso,symbol", "0"))
            text = (f"# perf record -F 999 (cpu-clock) of {rid} at {res['rps']:.0f} req/s, pids "
                    f"{pids}\n\n## by thread and object\n" + "\n".join(by_dso)
                    + "\n\n## the proxy binary's own samples, by the first crate in the symbol\n"
                    + "\n".join(f"{pct:6.2f}%  {crate}" for crate, pct in by_crate)
                    + "\n\n## by symbol\n" + "\n".join(by_symbol) + "\n")
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / f"profile-{rid}.txt").write_text(text)
            out[rid] = {"rps": res["rps"], "by_object": by_dso, "by_crate": by_crate,
                        "top_symbols": by_symbol[:25]}
        return out

    # ---- phase 3: Redis ceiling -----------------------------------------------------------

    def phase_redis_ceiling(self) -> dict:
        """redis-benchmark EVALSHA of lua/limit_req.lua with the exact arguments Weir sends (seen
        through MONITOR) and random client keys: the most decisions one Redis core makes."""
        if not LUA_SCRIPT.exists():
            return {"skipped": f"{LUA_SCRIPT.relative_to(REPO_DIR)} not found"}
        n = 40_000 if self.quick else 300_000
        bench_cpu = self.sut_cpu if self.redis_cpu != self.sut_cpu else self.load_cpu
        calls = {}
        for zones, rid in ((1, "redis"), (3, "redis3")):
            port = self.targets[rid].port
            calls[zones] = rand_keys(
                capture_eval(self.redis_port, lambda: http_get(port, xff="10.251.0.1")), "rb")
        out = {"requests": n, "redis_cpu": self.redis_cpu, "redis_benchmark_cpu": bench_cpu,
               "call_1_zone": calls[1], "runs": []}
        cases = [(1, 16), (1, 1), (3, 16)] if not self.quick else [(1, 16)]
        for zones, pipeline in cases:
            before = self.redis.snapshot()
            argv = ["taskset", "-c", bench_cpu, "redis-benchmark", "-p", str(self.redis_port),
                    "-c", "50", "-n", str(n), "-P", str(pipeline), "-r", "10000", "--csv"]
            cp = subprocess.run(argv + calls[zones], capture_output=True, text=True, timeout=120)
            d = redis_delta(before, self.redis.snapshot())
            rows = list(csv.reader(io.StringIO(cp.stdout)))
            failed = d["failed"].get("evalsha", 0)
            if cp.returncode != 0 or len(rows) < 2 or failed:
                self.fail(f"redis-benchmark EVALSHA failed ({failed} failed calls): "
                          f"{cp.stdout[-300:]} {cp.stderr[-300:]}")
                continue
            ncalls = d["calls"].get("evalsha", 0)
            out["runs"].append({
                "zones": zones, "pipeline": pipeline, "ops_per_s": float(rows[1][1]),
                "redis_cpu_us_per_call": d["cpu_s"] * 1e6 / max(ncalls, 1),
                "evalsha_calls": ncalls,
            })
            log(f"redis-benchmark EVALSHA {zones} zone(s) -P {pipeline}: {rows[1][1]} ops/s")
        return out

    # ---- phase 4: memory ------------------------------------------------------------------

    def phase_memory(self, row3_rps: float) -> dict:
        out = {}
        parts = (("redis", self.redis_memory), ("weir", lambda: self.weir_memory(row3_rps)))
        for name, fn in parts:
            try:
                out[name] = fn()
            except BenchError as e:
                self.fail(f"memory ({name}): {e}")
        return out

    def redis_memory(self) -> dict:
        """Redis bytes per active key: MEMORY USAGE of a key Weir wrote, and the used_memory
        delta of many keys written by the same script call (KEYS[1] varied)."""
        r = self.redis
        # A Weir on Redis with a zone whose keys live for an hour (1r/h; burst 10, nodelay).
        port = free_port()
        toml = weir_toml(port, self.upstream_port, store="redis", redis_port=self.redis_port,
                         zones=1, rate="1r/h", burst=10, access_log=self.access_log)
        weir = self.start_weir("weir-redis-memory", toml.replace('"z1"', '"per_ip"'), port)
        try:
            call = capture_eval(self.redis_port, lambda: http_get(port, xff="10.1.2.3"))
        finally:
            self.procs.stop(weir)
        key = call[3]
        sample = {
            "key": key, "value": (r.cmd("GET", key) or b"").decode(errors="replace"),
            "pttl_ms": r.cmd("PTTL", key), "type": r.cmd("TYPE", key),
            "memory_usage_bytes": r.cmd("MEMORY", "USAGE", key, "SAMPLES", "0"),
            "weir_call": call,
        }
        # Fill: Weir's own call, run once per key inside one EVAL of lua/limit_req.lua wrapped in
        # a loop that rewrites KEYS[1] (<prefix>{10.a.b.c}); batches keep each EVAL short.
        nkeys = 20_000 if self.quick else 1_000_000
        batch = 100_000
        body = LUA_SCRIPT.read_bytes()
        prefix = re.sub(r"\{.*\}$", "", key).replace(":", ":fill:", 1)
        wrapper = (
            b"local n = #ARGV\n"
            b"local prefix, first, last = ARGV[n - 2], tonumber(ARGV[n - 1]), tonumber(ARGV[n])\n"
            b"ARGV[n - 2], ARGV[n - 1], ARGV[n] = nil, nil, nil\n"
            b"local function limit_req()\n" + body + b"\nend\n"
            b"for i = first, last do\n"
            b"  KEYS[1] = prefix .. string.format('{10.%d.%d.%d}',"
            b" math.floor(i / 65536) % 256, math.floor(i / 256) % 256, i % 256)\n"
            b"  local reply = limit_req()\n"
            b"  if type(reply) == 'table' and reply.err then return reply end\n"
            b"end\n"
            b"return last - first + 1\n"
        )
        r.cmd("FLUSHDB")
        r.cmd("MEMORY", "PURGE")
        used0 = int(r.info("memory")["used_memory"])
        t0 = time.time()
        method = "Weir's EVALSHA arguments, lua/limit_req.lua looped in EVAL"
        try:
            if hashlib.sha1(body).hexdigest() != call[1]:
                raise BenchError("lua/limit_req.lua is not the script this weir build sends "
                                 "(rebuild weir)")
            for first in range(0, nkeys, batch):
                last = min(first + batch, nkeys) - 1
                r.cmd("EVAL", wrapper, 1, "x", *call[4:], prefix, first, last)
        except BenchError as e:
            # Fallback: the same key names and value shape with plain SET ... PX.
            log(f"EVAL loop not possible ({e}); filling with SET of the sampled value")
            method = f"SET of the sampled value and TTL ({e})"
            r.cmd("FLUSHDB")
            used0 = int(r.info("memory")["used_memory"])
            loop = (
                "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do\n"
                "  redis.call('SET', ARGV[5] .. string.format('{10.%d.%d.%d}',"
                " math.floor(i / 65536) % 256, math.floor(i / 256) % 256, i % 256),"
                " ARGV[3], 'PX', ARGV[4])\n"
                "end\nreturn 1\n")
            for first in range(0, nkeys, batch):
                last = min(first + batch, nkeys) - 1
                r.cmd("EVAL", loop, 0, first, last, sample["value"],
                      max(int(sample["pttl_ms"]), 60_000), prefix)
        fill_s = time.time() - t0
        dbsize = r.cmd("DBSIZE")
        used1 = int(r.info("memory")["used_memory"])
        r.cmd("FLUSHDB")
        return {
            "sample": sample,
            "fill": {
                "method": method, "keys_requested": nkeys, "dbsize": dbsize,
                "used_memory_before": used0, "used_memory_after": used1,
                "bytes_per_key": (used1 - used0) / max(dbsize, 1), "seconds": round(fill_s, 2),
            },
        }

    def weir_memory(self, row3_rps: float) -> dict:
        """RSS of a fresh memory-store Weir after startup and after N distinct client keys."""
        nkeys = 20_000 if self.quick else 1_000_000
        port = free_port()
        # 1 r/h, burst 10: every first request passes and its state stays active for an hour.
        toml = weir_toml(port, self.upstream_port, zones=1, rate="1r/h", burst=10,
                         access_log=self.access_log)
        proc = self.start_weir("weir-memory-rss", toml, port)
        time.sleep(0.5)
        rss0 = rss_kib(proc.pid)
        http_get(port, xff="10.254.0.1")
        rss_warm = rss_kib(proc.pid)
        # wrk has no request count: run chunks, each sized by the rate measured so far, the last
        # ones short, so that the total lands a little above nkeys.
        sent, chunks, t0 = 0, 0, time.time()
        rate = max(row3_rps, 5000) * 0.8  # sequential mode builds each request: a bit slower
        conns = 32
        while sent < nkeys and chunks < 20 and time.time() - t0 < 120:
            remaining = nkeys - sent
            dur = max(1, min(20, int(remaining / rate)))
            res = self.wrk(port, dur, conns, {"WRK_SEQUENTIAL": "1", "WRK_KEYS": "16000000",
                                              "WRK_KEY_OFFSET": str(sent)})
            sent += res["requests"]
            rate = res["rps"]
            chunks += 1
            if res["errors"]["status"]:
                self.fail(f"weir memory RSS: {res['errors']['status']} requests were limited")
        time.sleep(0.5)
        rss1 = rss_kib(proc.pid)
        self.procs.stop(proc)
        return {
            "keys": sent, "seconds": round(time.time() - t0, 1),
            "rss_after_start_kib": rss0["VmRSS"], "rss_after_first_request_kib": rss_warm["VmRSS"],
            "rss_after_keys_kib": rss1["VmRSS"], "hwm_kib": rss1["VmHWM"],
            "bytes_per_key": (rss1["VmRSS"] - rss_warm["VmRSS"]) * 1024 / max(sent, 1),
        }

    # ---- phase 5: fleet accuracy ----------------------------------------------------------

    def phase_fleet(self) -> dict:
        ns = [1, 2] if self.quick else [1, 2, 4]
        duration = 2 if self.quick else 10
        nmax = max(ns)
        rate = f"{FLEET_RATE_RPS}r/s"
        weirs, nginxes = [], []
        for i in range(nmax):
            port = free_port()
            toml = weir_toml(port, self.upstream_port, store="redis", redis_port=self.redis_port,
                             zones=1, rate=rate, burst=FLEET_BURST, access_log=self.access_log)
            weirs.append(Target(port, [self.start_weir(f"weir-fleet{i}", toml, port)]))
            port = free_port()
            nginxes.append(Target(port, [self.start_nginx(
                f"nginx-fleet{i}", "limit", port, upstream_port=self.upstream_port, rate=rate,
                burst=FLEET_BURST)], nginx=True))
        out = {"rate_rps": FLEET_RATE_RPS, "burst": FLEET_BURST, "duration_s": duration,
               "runs": []}
        offset = 3_000_000
        for kind, fleet in (("weir", weirs), ("nginx", nginxes)):
            for n in ns:
                offset += 1  # a fresh client address, so every run starts on an empty bucket
                log(f"fleet: {n} x {kind}, one key, {duration} s")
                env = {"WRK_KEYS": "1", "WRK_KEY_OFFSET": str(offset), "WRK_COUNT": "1",
                       "WRK_DELAY_MS": "1"}
                popens = [self.wrk(t.port, duration, 2, env, background=True, path="/fleet")
                          for t in fleet[:n]]
                results = [self.wrk_result(p, duration) for p in popens]
                admitted = sum(r["status"]["200"] for r in results)
                rejected = sum(r["status"]["429"] for r in results)
                other = sum(r["status"]["other"] for r in results)
                # The window: first to last admitted request, by the upstream's clock (its
                # X-Upstream-Msec), so that wrk start-up and the tail after the last admission do
                # not count. An exact fleet admits burst + 1 at once, then rate × window.
                firsts = [r["upstream_s"]["first"] for r in results if r["upstream_s"]["first"] > 0]
                lasts = [r["upstream_s"]["last"] for r in results if r["upstream_s"]["last"] > 0]
                window = (max(lasts) - min(firsts)) if firsts else 0.0
                wrk_s = max(r["duration_us"] for r in results) / 1e6
                ideal = FLEET_BURST + 1 + FLEET_RATE_RPS * window
                offered = sum(r["requests"] for r in results) / wrk_s
                run = {
                    "kind": kind, "instances": n, "window_s": round(window, 3),
                    "wrk_duration_s": round(wrk_s, 3),
                    "admitted": admitted, "rejected": rejected, "other": other,
                    "ideal": round(ideal, 1), "admitted_minus_ideal": round(admitted - ideal, 1),
                    "admitted_over_ideal": round(admitted / ideal, 2),
                    "offered_rps": round(offered), "overload_x": round(offered / FLEET_RATE_RPS),
                }
                out["runs"].append(run)
                log(f"  admitted {admitted}, ideal {ideal:.1f}, offered {offered:.0f} r/s")
                if other:
                    self.fail(f"fleet {kind} x{n}: {other} responses neither 200 nor 429")
                if run["overload_x"] < 10:
                    self.fail(f"fleet {kind} x{n}: overload only {run['overload_x']}x")
        self.procs.stop(*(t.procs[0] for t in weirs + nginxes))
        return out

    # ---- the whole run ---------------------------------------------------------------------

    def run(self) -> int:
        t_start = time.time()
        self.results["meta"] = self.meta()
        try:
            self.start_all()
            self.results["meta"]["weir_settings"] = {
                "deny_cache_size_supported": self.deny_cache,
                "access_log": ("off" if self.access_log is False
                               else "setting unknown to this build"),
                "configs": {name: (self.workdir / f"{name}.toml").read_text()
                            for name in ("weir-passthrough", "weir-redis", "weir-redis3",
                                         "weir-flood")},
                "nginx_limit_conf": (self.workdir / "nginx_limit" / "nginx.conf").read_text(),
            }
            rows = self.phase_throughput()
            self.results["rows"] = rows_json(rows)
            if not self.args.rows:
                self.other_phases(rows)
            elif "paced" in self.args.rows.split(",") and any(r.id == "redis" for r in rows):
                self.results["paced"] = self.phase_paced(rows)  # --rows ...,redis,paced
        except BenchError as e:
            self.fail(str(e))
        finally:
            if self.redis:
                self.redis.close()
            self.procs.stop_all()
        self.results["meta"]["elapsed_s"] = round(time.time() - t_start, 1)
        self.results["failures"] = self.failures
        self.results["warnings"] = self.warnings
        self.results["ok"] = not self.failures
        self.results["targets"] = targets(self.results)
        md = render_markdown(self.results)
        self.out.mkdir(parents=True, exist_ok=True)
        # A quick run must not overwrite the full run's results (bench/README.md quotes them).
        stem = "quick" if self.quick else "latest"
        (self.out / f"{stem}.json").write_text(json.dumps(self.results, indent=2) + "\n")
        (self.out / f"{stem}.md").write_text(md)
        print(md)
        log(f"wrote {self.out}/{stem}.json and {stem}.md in {time.time() - t_start:.0f} s")
        if self.failures:
            log(f"{len(self.failures)} failure(s):\n  " + "\n  ".join(self.failures))
            return 1
        return 0

    def other_phases(self, rows: list[Row]) -> None:
        """Everything after the throughput rows; a part that fails is reported and skipped."""
        row3 = summarize(next(r for r in rows if r.id == "memory"))["rps"] or 10_000
        phases = [
            ("paced", self.phase_paced, (rows,), not self.quick),
            ("profile", self.phase_profile, (), self.args.profile),
            ("redis_ceiling", self.phase_redis_ceiling, (), True),
            ("memory", self.phase_memory, (row3,), True),
            ("fleet", self.phase_fleet, (), True),
        ]
        for name, fn, args, enabled in phases:
            if not enabled:
                continue
            try:
                self.results[name] = fn(*args)
            except BenchError as e:
                self.fail(f"{name}: {e}")

    def meta(self) -> dict:
        def cmd(argv):
            try:
                cp = subprocess.run(argv, capture_output=True, text=True, timeout=10)
                return (cp.stdout + cp.stderr).strip().splitlines()[0]
            except (OSError, IndexError, subprocess.TimeoutExpired):
                return None
        cpu_model = None
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
        return {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "mode": "quick" if self.quick else "full",
            "git": cmd(["git", "-C", str(REPO_DIR), "describe", "--always", "--dirty"]),
            "host": {"cpus": os.cpu_count(), "cpu_model": cpu_model,
                     "kernel": platform.release()},
            "versions": {"nginx": cmd(["nginx", "-v"]), "wrk": cmd(["wrk", "--version"]),
                         "redis": cmd(["redis-server", "--version"])},
            "reps": self.reps, "duration_s": self.duration, "warmup_s": self.warmup,
            "connections": self.conns, "wrk_threads": 1,
            "pinning": {"proxy_and_upstream_cpu": self.sut_cpu, "wrk_cpu": self.load_cpu,
                        "redis_cpu": self.redis_cpu},
            "proxy_threads": 1, "nginx_workers": 1,
            "upstream": "nginx return 200 (1 worker)",
        }


def crate_totals(lines: list[str]) -> list[tuple[str, float]]:
    """perf report lines `pct%  dso  [.] symbol` of the weir binary, summed by the first
    `crate::` path in the (demangled) symbol: where the proxy's own code spends its time."""
    totals: dict[str, float] = {}
    for ln in lines:
        m = re.match(r"\s*([\d.]+)%\s+weir\s+\[\.\]\s+(.*)", ln)
        if not m:
            continue
        crate = re.search(r"([A-Za-z_][A-Za-z0-9_]*)::", m.group(2))
        name = crate.group(1) if crate else "(other)"
        totals[name] = totals.get(name, 0.0) + float(m.group(1))
    return sorted(((k, round(v, 2)) for k, v in totals.items()), key=lambda kv: -kv[1])[:15]


# --------------------------------------------------------------------------------------------
# Summaries, targets, markdown
# --------------------------------------------------------------------------------------------


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize_runs(runs: list[dict]) -> dict:
    if not runs:
        return {"rps": None}
    rps = [r["rps"] for r in runs]
    return {
        "rps": med(rps),
        "rps_min": min(rps), "rps_max": max(rps),
        "p50_ms": med(r["latency_us"]["p50"] / 1000 for r in runs),
        "p99_ms": med(r["latency_us"]["p99"] / 1000 for r in runs),
        "p99_9_ms": med(r["latency_us"]["p99_9"] / 1000 for r in runs),
        "proxy_cpu_s_per_1k": med(r["proxy_cpu_s_per_1k"] for r in runs),
        "proxy_core_util_pct": med(r["proxy_core_util_pct"] for r in runs),
        "proxy_ctx_switches_per_req": med(r["proxy_ctx_switches_per_req"] for r in runs),
        "redis_inner_cmds_per_req": med(r["redis_inner_cmds_per_req"] for r in runs),
        "redis_evalsha_per_req": med(r["redis_evalsha_per_req"] for r in runs),
        "redis_cpu_ms_per_1k": med(r["redis_cpu_ms_per_1k"] for r in runs),
        "admitted_pct": med(r["admitted_pct"] for r in runs),
        "other_load_pct": med(r["other_load_pct"] for r in runs),
        "discarded_runs": sum(len(r.get("discarded", [])) for r in runs),
        "other_load_pct_max": max(r["other_load_pct"] for r in runs),
        "core_busy_pct": {c: med(r["core_busy_pct"][c] for r in runs)
                          for c in runs[0]["core_busy_pct"]},
    }


def summarize(row: Row) -> dict:
    return summarize_runs(row.runs)


def rows_json(rows: list[Row]) -> list[dict]:
    base = next((summarize(r)["rps"] for r in rows if r.id == "passthrough"), None)
    out = []
    for r in rows:
        s = summarize(r)
        s["ratio_to_passthrough"] = (s["rps"] / base) if (s["rps"] and base) else None
        out.append({"id": r.id, "label": r.label, "keys": r.keys, "note": r.note,
                    "median": s, "runs": r.runs})
    return out


def targets(res: dict) -> list[dict]:
    """The issue's targets, each with the measured value and met / not met."""
    rows = {r["id"]: r["median"] for r in res.get("rows", [])}
    out = []
    redis, nginx = rows.get("redis", {}), rows.get("nginx_limit", {})
    if redis.get("ratio_to_passthrough") is not None:
        out.append({"target": "Redis all-passing ≥ 85% of passthrough req/s",
                    "value": f"{100 * redis['ratio_to_passthrough']:.0f}%",
                    "met": redis["ratio_to_passthrough"] >= 0.85})
    if redis.get("rps") and nginx.get("rps"):
        out.append({"target": "Redis all-passing ≥ nginx limit_req req/s",
                    "value": f"{redis['rps']:.0f} vs {nginx['rps']:.0f} "
                             f"({100 * redis['rps'] / nginx['rps']:.0f}%)",
                    "met": redis["rps"] >= nginx["rps"]})
    paced = res.get("paced", {})
    if "added_p99_ms" in paced:
        out.append({"target": "added p99 of a Redis decision at half of peak ≤ 1 ms",
                    "value": f"{paced['added_p99_ms']:.2f} ms (p99 {paced['redis']['p99_ms']:.2f}"
                             f" vs {paced['passthrough']['p99_ms']:.2f} ms at "
                             f"{paced['redis']['rps']:.0f} r/s)",
                    "met": paced["added_p99_ms"] <= 1.0})
    flood, cached = rows.get("flood", {}), rows.get("flood_cache")
    if cached and cached.get("redis_evalsha_per_req") is not None:
        out.append({"target": "one-key flood with deny cache ≤ 0.01 Redis calls/request",
                    "value": f"{cached['redis_evalsha_per_req']:.4f} (without: "
                             f"{flood.get('redis_evalsha_per_req', 0):.3f})",
                    "met": cached["redis_evalsha_per_req"] <= 0.01})
    elif flood.get("redis_evalsha_per_req") is not None:
        out.append({"target": "one-key flood with deny cache ≤ 0.01 Redis calls/request",
                    "value": f"{flood['redis_evalsha_per_req']:.3f} (deny cache: not implemented "
                             "yet)",
                    "met": flood["redis_evalsha_per_req"] <= 0.01})
    fleet = res.get("fleet", {}).get("runs", [])
    weir_runs = [r for r in fleet if r["kind"] == "weir"]
    if weir_runs:
        worst = max(weir_runs, key=lambda r: abs(r["admitted_minus_ideal"]))
        out.append({"target": "fleet accuracy: admitted within ±1 of burst + 1 + rate × t, all N",
                    "value": ", ".join(f"N={r['instances']}: {r['admitted_minus_ideal'] + 0.0:+.1f}"
                                       for r in weir_runs),
                    "met": abs(worst["admitted_minus_ideal"]) <= 1.0})
    return out


def fmt(v, spec: str, none: str = "–") -> str:
    return none if v is None else format(v, spec)


def render_markdown(res: dict) -> str:
    m = res["meta"]
    out = []
    out.append(f"### Weir benchmark ({m['mode']}, {m['date']}, {m['git']})\n")
    out.append(
        f"{m['host']['cpus']} CPUs ({m['host']['cpu_model']}); proxy + upstream pinned to CPU "
        f"{m['pinning']['proxy_and_upstream_cpu']}, wrk (1 thread, {m['connections']} "
        f"connections) to CPU {m['pinning']['wrk_cpu']}, Redis to CPU "
        f"{m['pinning']['redis_cpu']}; Weir threads = 1, nginx worker_processes 1. "
        f"Median of {m['reps']} × {m['duration_s']} s runs per row, rows interleaved round-robin "
        f"({m['warmup_s']} s warm-up before each row's first run). Upstream: {m['upstream']}.\n")
    rows = res.get("rows", [])
    if rows:
        out.append("| row | req/s | ratio to row 2 | p50 ms | p99 ms | p99.9 ms "
                   "| proxy CPU s/1k req | Redis calls/req | Redis CPU ms/1k | 2xx % "
                   "| CPU0/CPU1 busy % | other load % |")
        out.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        for r in rows:
            s = r["median"]
            if s["rps"] is None:
                out.append(f"| {r['label']} | failed | | | | | | | | | | |")
                continue
            spread = 100 * (s["rps_max"] - s["rps_min"]) / s["rps"] / 2
            busy = s["core_busy_pct"]
            redis_cols = (f"{fmt(s['redis_evalsha_per_req'], '.2f')} | "
                          f"{fmt(s['redis_cpu_ms_per_1k'], '.1f')}"
                          if s["redis_evalsha_per_req"] and s["redis_evalsha_per_req"] > 0.01
                          else "– | –")
            out.append(
                f"| {r['label']} | {s['rps']:,.0f} ±{spread:.0f}% | "
                f"{fmt(s['ratio_to_passthrough'], '.2f')} | {s['p50_ms']:.2f} | "
                f"{s['p99_ms']:.2f} | {s['p99_9_ms']:.2f} | {s['proxy_cpu_s_per_1k']:.4f} | "
                f"{redis_cols} | {s['admitted_pct']:.1f} | "
                f"{busy.get('cpu0', 0):.0f}/{busy.get('cpu1', 0):.0f} | "
                f"{s['other_load_pct']:.0f} |")
        out.append("")
        out.append("±: half the spread (max − min) of the repetitions. Proxy CPU: utime+stime "
                   "of the proxy process(es) (row 1: the upstream itself). Redis calls: EVALSHA "
                   "per request (INFO commandstats; the GET/TIME/SET the script runs inside are "
                   "in the JSON). Redis CPU: used_cpu_user+sys per 1k EVALSHA. CPU busy: all "
                   "processes, from /proc/stat. "
                   "Other load: CPU of processes outside the benchmark during the run, in % of "
                   "one core (noise from a shared machine).\n")
        rerun = sum(r["median"].get("discarded_runs", 0) for r in rows)
        if rerun:
            out.append(f"{rerun} run(s) disturbed by other processes (> {DISTURBED_PCT}% of a "
                       "core) were run again; the JSON keeps them under `discarded`.\n")
        notes = [f"{r['label'].split('.')[0]}: {r['note']}" for r in rows if r.get("note")]
        if notes:
            out.append("Notes: " + "; ".join(notes) + ".\n")
    paced = res.get("paced")
    if paced and "redis" in paced:
        out.append(f"**Below saturation** (offered ≈ {paced['target_rps']:,} r/s = half of row "
                   f"4's peak; {paced['connections']} connections × {paced['delay_ms']} ms think "
                   "time):\n")
        out.append("| row | req/s | p50 ms | p99 ms | p99.9 ms | proxy CPU s/1k req |")
        out.append("|---|--:|--:|--:|--:|--:|")
        for rid, label in (("passthrough", "2. Weir, no limits"),
                           ("redis", "4. Weir, Redis, 1 zone")):
            s = paced[rid]
            out.append(f"| {label} | {s['rps']:,.0f} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} | "
                       f"{s['p99_9_ms']:.2f} | {s['proxy_cpu_s_per_1k']:.4f} |")
        out.append(f"\nAdded by a Redis decision: p50 {paced['added_p50_ms']:+.2f} ms, "
                   f"p99 {paced['added_p99_ms']:+.2f} ms.\n")
    ceiling = res.get("redis_ceiling")
    if ceiling:
        if "skipped" in ceiling:
            out.append(f"**Redis ceiling**: skipped ({ceiling['skipped']}).\n")
        else:
            call = " ".join(a if a and " " not in a else f'"{a}"' for a in ceiling["call_1_zone"])
            out.append("**Redis ceiling** (`redis-benchmark` EVALSHA of `lua/limit_req.lua` with "
                       "the arguments Weir sends, seen through MONITOR, and random client keys "
                       f"(`-r 10000`); 50 clients; Redis on CPU {ceiling['redis_cpu']}, "
                       f"redis-benchmark on CPU {ceiling['redis_benchmark_cpu']}): "
                       f"`{call}`\n")
            out.append("| zones per call | pipeline | EVALSHA/s | Redis CPU µs/call |")
            out.append("|--:|--:|--:|--:|")
            for r in ceiling["runs"]:
                out.append(f"| {r['zones']} | {r['pipeline']} | {r['ops_per_s']:,.0f} | "
                           f"{r['redis_cpu_us_per_call']:.1f} |")
            out.append("")
    mem = res.get("memory") or {}
    if mem:
        out.append("**Memory**:\n")
    if "redis" in mem:
        rs, rf = mem["redis"]["sample"], mem["redis"]["fill"]
        out.append(f"- Redis, one key as Weir wrote it (`{rs['key']}` = `{rs['value']}`, TTL "
                   f"{rs['pttl_ms'] / 1000:.0f} s): MEMORY USAGE {rs['memory_usage_bytes']} B.")
        out.append(f"- Redis, {rf['dbsize']:,} such keys ({rf['method']}): used_memory "
                   f"+{(rf['used_memory_after'] - rf['used_memory_before']) / 2**20:.1f} MiB = "
                   f"{rf['bytes_per_key']:.0f} B per active key (dict and expiry overhead "
                   "included).")
    if "weir" in mem:
        w = mem["weir"]
        out.append(f"- Weir memory store, {w['keys']:,} distinct keys: RSS "
                   f"{w['rss_after_first_request_kib'] / 1024:.1f} MiB after startup → "
                   f"{w['rss_after_keys_kib'] / 1024:.1f} MiB = {w['bytes_per_key']:.0f} B per key "
                   f"(peak {w['hwm_kib'] / 1024:.1f} MiB).")
    if mem:
        out.append("")
    fleet = res.get("fleet")
    if fleet and fleet.get("runs"):
        out.append(f"**Fleet accuracy** (one key, rate {fleet['rate_rps']} r/s, burst "
                   f"{fleet['burst']} nodelay, {fleet['duration_s']} s of overload; ideal = "
                   "burst + "
                   "1 + rate × window, the window running from the first to the last admitted "
                   "request by the upstream's clock):\n")
        out.append("| instances | admitted | window s | ideal | admitted − ideal "
                   "| admitted / ideal "
                   "| offered r/s (× limit) |")
        out.append("|---|--:|--:|--:|--:|--:|--:|")
        for r in fleet["runs"]:
            what = "Weir on one Redis" if r["kind"] == "weir" else "nginx, local state each"
            out.append(f"| {r['instances']} × {what} | {r['admitted']} | {r['window_s']:.3f} | "
                       f"{r['ideal']:.1f} | "
                       f"{r['admitted_minus_ideal'] + 0.0:+.1f} | {r['admitted_over_ideal']:.2f} | "
                       f"{r['offered_rps']:,} ({r['overload_x']}×) |")
        out.append("")
    if res.get("targets"):
        out.append("**Targets**:\n")
        out.append("| target | measured | met |")
        out.append("|---|---|---|")
        for t in res["targets"]:
            out.append(f"| {t['target']} | {t['value']} | {'yes' if t['met'] else '**no**'} |")
        out.append("")
    if res.get("warnings"):
        out.append("**Warnings**:\n")
        out += [f"- {w}" for w in res["warnings"]]
        out.append("")
    if res.get("failures"):
        out.append("**Failures**:\n")
        out += [f"- {f}" for f in res["failures"]]
        out.append("")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 repetition, 2 s rows")
    ap.add_argument("--reps", type=int, default=0, help="repetitions per row (default 4; quick 1)")
    ap.add_argument("--duration", type=int, default=0, help="seconds per run (default 5; quick 2)")
    ap.add_argument("--weir", required=True, help="the weir binary")
    ap.add_argument("--workdir", required=True, help="scratch directory (configs, logs, pids)")
    ap.add_argument("--out", default=str(BENCH_DIR / "results"), help="where latest.* go")
    ap.add_argument("--rows", default="",
                    help="only these throughput rows (ids, comma-separated), no other part: for "
                         "experiments (ids: upstream echo passthrough memory redis redis3 flood "
                         "flood_cache nginx_limit nginx_proxy; add paced, with passthrough and "
                         "redis, for the paced pair)")
    ap.add_argument("--profile", action="store_true",
                    help="also perf-profile rows 2, 3, 4 and 7 (extra runs, results/profile-*.txt)")
    args = ap.parse_args()
    bench = Bench(args)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        return bench.run()
    except KeyboardInterrupt:
        bench.procs.stop_all()
        return 130


if __name__ == "__main__":
    sys.exit(main())
