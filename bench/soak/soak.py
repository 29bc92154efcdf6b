#!/usr/bin/env python3
"""Weir soak test (issue 16). Started by bench/soak.sh; Python 3.11 standard library only.

For `--duration` seconds, on loopback only: one redis-server (no persistence), a small real
upstream (bench/soak/upstream.py: some requests slow), two Weir instances sharing that Redis, and
mixed traffic from several client threads (keep-alive and new connections, many keys, some over the
limits, some slow), while on a schedule:

* Redis is SIGKILLed and restarted on the same port (every ~60 s; scaled down for short runs);
* both configs are rewritten every 10 s (atomic rename), alternating two valid variants, and the
  reload is confirmed through each instance's admin `GET /config` generation;
* one Weir instance is SIGKILLed once mid-run and restarted.

Then it checks and reports (stdout table + JSON): requests, statuses, Weir-caused 5xx (a 5xx that
did not come from the upstream: must be 0 with on_error = "allow"), connection errors outside the
kill window, RSS / fds / threads of each Weir after warm-up and at the end, reloads applied, Redis
restarts and how fast decisions went back to Redis, leases left in Redis after traffic stops and
lease_ttl passes, and whether any process died. Exit status 1 if a check failed, 2 if the soak
could not run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# The bench harness (bench/harness/, standard library only) has one implementation of what both
# drivers need: the process recorder and wait_port (procs.py), the config writer and `weir check`
# (configs.py), the /metrics parser (metrics.py), /proc readings (procstat.py), the Redis client
# (redis_client.py on resp.py). This file keeps only what is the soak's own.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.common import BenchError  # noqa: E402
from harness.configs import weir_check, write_config  # noqa: E402
from harness.metrics import metric_sum, scrape_metrics, total  # noqa: E402
from harness.procs import Proc, Procs, free_port, log_tail, wait_port  # noqa: E402
from harness.procstat import cpu_seconds, proc_status  # noqa: E402
from harness.redis_client import Redis as BenchRedis  # noqa: E402

SOAK_DIR = Path(__file__).resolve().parent
BENCH_DIR = SOAK_DIR.parent
REPO_DIR = BENCH_DIR.parent

# ---- thresholds (documented in bench/README.md, "Soak") --------------------------------------
# RSS may grow by at most max(RSS_GROWTH_MIB, RSS_GROWTH_PCT % of the start) between the sample
# after warm-up and the end of traffic.
RSS_GROWTH_MIB = 8
RSS_GROWTH_PCT = 25
# Open fds other than client connections (listeners, Redis and upstream sockets, epoll, files, …)
# may grow by at most this many between the sample after warm-up (under traffic) and the end
# (traffic stopped); client connections must all be gone at the end.
FD_GROWTH_MAX = 16
# Sockets to Redis one Weir may hold at the end: a decision lane per proxy thread, redis-rs's
# multiplexed connection (limit_conn, probes), and the side connection of the live view's
# fleet sync and key resets. A socket leaked per Redis restart would exceed it after two.
REDIS_SOCKETS_MAX = 5
# After a Redis restart, both instances must be deciding on Redis again within this many seconds.
REDIS_RECOVERY_MAX_S = 15.0
# A reload must show up in GET /config within this many seconds (200 ms debounce + load).
RELOAD_CONFIRM_S = 5.0

# The whole soak ends (as if interrupted) this many seconds after the planned end at the latest.
WATCHDOG_S = 180

LEASE_TTL_S = 3
CLIENT_TIMEOUT_S = 15.0
# How long a started process (Redis, the upstream, a Weir and its admin listener) may take to listen.
PORT_WAIT_S = 30.0


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class SoakError(BenchError):
    """The soak could not run (a process did not start, a tool failed). The harness's own helpers
    raise BenchError, its base: main() answers both with exit status 2."""


# --------------------------------------------------------------------------------------------
# Redis: the bench's client (RESP2, INFO snapshots), with the soak's error type and short timeout
# --------------------------------------------------------------------------------------------


class Redis(BenchRedis):
    error = SoakError

    def __init__(self, port: int, timeout: float = 5.0):
        super().__init__(port, timeout)

    def now_ms(self) -> int:
        sec, usec = self.cmd("TIME")
        return int(sec) * 1000 + int(usec) // 1000

    def script_calls(self) -> int:
        """Successful EVALSHA + EVAL calls since this Redis started."""
        s = self.snapshot()
        return sum(s["calls"].get(c, 0) - s["failed"].get(c, 0) for c in ("evalsha", "eval"))


# --------------------------------------------------------------------------------------------
# /proc readings: RSS, threads, fds by kind (sockets mapped through /proc/net/tcp*)
# --------------------------------------------------------------------------------------------


def tcp_sockets() -> dict[str, tuple[int, int, str]]:
    """inode -> (local port, remote port, state hex) for every TCP socket of this net namespace."""
    out = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10:
                continue
            lport = int(f[1].rsplit(":", 1)[1], 16)
            rport = int(f[2].rsplit(":", 1)[1], 16)
            out[f[9]] = (lport, rport, f[3])
    return out


def unix_sockets() -> set[str]:
    try:
        return {line.split()[6] for line in Path("/proc/net/unix").read_text().splitlines()[1:]
                if len(line.split()) >= 7}
    except OSError:
        return set()


TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN",
              "04": "FIN_WAIT1", "05": "FIN_WAIT2", "09": "LAST_ACK", "07": "CLOSE",
              "0B": "CLOSING", "02": "SYN_SENT", "03": "SYN_RECV"}


def proc_sample(pid: int, ports: dict) -> dict:
    """RSS, threads, CPU seconds and open fds of one process; fds split by kind. `ports`: listen, admin,
    upstream, redis port numbers, to name the sockets."""
    status = proc_status(pid)
    tcp = tcp_sockets()
    unix = unix_sockets()
    kinds: Counter = Counter()
    close_wait = 0
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        m = re.match(r"socket:\[(\d+)\]", target)
        if not m:
            kind = ("pipe" if target.startswith("pipe:")
                    else "anon" if target.startswith("anon_inode:") else "file")
            kinds[kind] += 1
            continue
        info = tcp.get(m.group(1))
        if info is None:
            kinds["unix" if m.group(1) in unix else "socket_other"] += 1
            continue
        lport, rport, state = info
        if state == "0A":
            kinds["listen"] += 1
        elif lport in (ports["listen"], ports["admin"]):
            kinds["clients" if lport == ports["listen"] else "admin_clients"] += 1
            if state == "08":
                close_wait += 1
        elif rport == ports["upstream"]:
            kinds["upstream"] += 1
        elif rport == ports["redis"]:
            kinds["redis"] += 1
        else:
            kinds["socket_other"] += 1
    return {
        "t": round(time.time(), 3),
        "rss_kib": status["VmRSS"],
        "threads": status["Threads"],
        "cpu_s": cpu_seconds([pid]),
        "fds": sum(kinds.values()),
        "fds_non_client": sum(v for k, v in kinds.items() if k not in ("clients", "admin_clients")),
        "fd_kinds": dict(sorted(kinds.items())),
        "client_close_wait": close_wait,
    }


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------

# Two valid variants, alternated by the reload chaos: they differ in their bursts only.
VARIANTS = [{"burst": 5, "key_burst": 10}, {"burst": 6, "key_burst": 12}]


def weir_toml(*, port: int, admin: int, redis: int, upstream: int, variant: int,
              on_error: str = "allow") -> str:
    v = VARIANTS[variant]
    return f"""# generated by bench/soak/soak.py: variant {variant} (per_ip burst {v['burst']})
[server]
listen = ["127.0.0.1:{port}"]
threads = 2
admin = "127.0.0.1:{admin}"

[log]
level = "info"
access_log = false

[store]
kind = "redis"
url = "redis://127.0.0.1:{redis}/0"
timeout = "50ms"                  # a debug build on a shared 2-core machine
key_prefix = "weir:"
on_error = "{on_error}"                # "allow" fails open: no request may get a Weir 5xx because of Redis
fleet_size = 2                    # for on_error = "local"
circuit_breaker_failures = 3
lease_ttl = "{LEASE_TTL_S}s"                  # short, so leftover leases can be checked at the end

[real_ip]
trusted = ["127.0.0.1/32"]
header = "X-Forwarded-For"

[[upstream]]
name = "app"
servers = ["127.0.0.1:{upstream}"]

[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "5r/s"

[[limit_req_zone]]
name = "per_key"
key = "header:X-Api-Key"
rate = "5r/s"

[[limit_conn_zone]]
name = "conn_per_ip"
key = "ip"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [
  {{ zone = "per_ip", burst = {v['burst']}, nodelay = true }},
  {{ zone = "per_key", burst = {v['key_burst']}, nodelay = true }},
]
limit_conn = [ {{ zone = "conn_per_ip", max = 4 }} ]
limit_conn_status = 429           # so that every expected rejection is a 4xx
on_error = "{on_error}"

[[route]]
name = "slow"
path_prefix = "/slow/"
upstream = "app"
limit_req = [ {{ zone = "per_ip", burst = {v['burst']}, delay = 2 }} ]
limit_conn = [ {{ zone = "conn_per_ip", max = 2 }} ]
limit_conn_status = 429
on_error = "{on_error}"

[[route]]
name = "rest"
path_prefix = "/"
upstream = "app"
"""


# --------------------------------------------------------------------------------------------
# Weir instances
# --------------------------------------------------------------------------------------------


@dataclass
class Life:
    """One process of an instance (the killed instance has two)."""
    pid: int
    started: float
    ready: float = 0.0
    start_sample: dict | None = None
    end_sample: dict | None = None
    last_metrics: dict = field(default_factory=dict)
    ended: str = ""  # "", "killed by the soak", "stopped", or how it died


@dataclass
class Instance:
    name: str
    port: int
    admin: int
    conf: Path
    proc: Proc | None = None
    lives: list[Life] = field(default_factory=list)
    up: bool = False

    def ports(self, soak: "Soak") -> dict:
        return {"listen": self.port, "admin": self.admin, "upstream": soak.upstream_port,
                "redis": soak.redis_port}


def admin_get(port: int, path: str, timeout: float = 3.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# Traffic
# --------------------------------------------------------------------------------------------

HOT_IPS = [f"10.200.0.{i}" for i in range(1, 4)]
HOT_KEYS = ["hot-key-1"]
SLOW_IPS = [f"10.150.0.{i}" for i in range(1, 5)]


def pick_request(rng: random.Random) -> tuple[str, str, dict, bytes | None]:
    """(kind, method + path, headers, body) of one request of the mix."""
    r = rng.random()
    ip = f"10.{rng.randrange(1, 100)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
    key = f"key-{rng.randrange(500)}"
    if r < 0.40:    # ordinary API traffic: many clients, rarely limited
        return "api", f"/api/items/{rng.randrange(1000)}", {"X-Forwarded-For": ip, "X-Api-Key": key}, None
    if r < 0.45:    # the same with a small body
        return "api_post", "/api/orders", {"X-Forwarded-For": ip, "X-Api-Key": key}, b"x" * rng.randrange(1, 2048)
    if r < 0.60:    # a few hot clients, far over 5 r/s: mostly 429
        return "hot_ip", "/api/items/1", {"X-Forwarded-For": rng.choice(HOT_IPS), "X-Api-Key": key}, None
    if r < 0.68:    # hot API keys from many addresses: over the per_key zone
        return "hot_key", "/api/items/2", {"X-Forwarded-For": ip, "X-Api-Key": rng.choice(HOT_KEYS)}, None
    if r < 0.82:    # slow requests from a small pool of addresses: they hold limit_conn leases
        return "slow", f"/slow/work?ms={rng.randrange(50, 301)}", {"X-Forwarded-For": rng.choice(SLOW_IPS)}, None
    if r < 0.84:    # very slow: longer than lease_ttl, so leases must be renewed
        return "very_slow", f"/slow/long?ms={rng.randrange(1500, 4001)}", {"X-Forwarded-For": rng.choice(SLOW_IPS)}, None
    if r < 0.87:    # the upstream's own 5xx: not Weir's
        return "upstream_err", "/api/err", {"X-Forwarded-For": ip, "X-Api-Key": key}, None
    if r < 0.89:    # a client that gives up on a slow request (its lease must be released)
        return "aborted", f"/slow/abort?ms={rng.randrange(500, 3001)}", {"X-Forwarded-For": rng.choice(SLOW_IPS)}, None
    return "unlimited", f"/static/{rng.randrange(100)}", {}, None  # the catch-all route, no limits


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent = 0
        self.statuses: Counter = Counter()
        self.by_kind: dict[str, Counter] = {}
        self.by_instance: Counter = Counter()
        self.weir_bodies: Counter = Counter()   # Weir's own answers, by "error" field
        self.weir_5xx: list[dict] = []
        self.weir_5xx_count = 0
        self.weir_5xx_kinds: Counter = Counter()  # by Weir's "error" field, or non-json:<status>
        self.upstream_5xx = 0
        self.conn_errors: list[dict] = []
        self.stale_retries = 0
        self.latency_max_s = 0.0


class Traffic:
    def __init__(self, soak: "Soak", workers: int, think_ms: float, seed: int):
        self.soak = soak
        self.stats = Stats()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.worker, args=(i, seed + i), daemon=True,
                                         name=f"client-{i}") for i in range(workers)]
        self.think_s = think_ms / 1000

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(CLIENT_TIMEOUT_S + 5)

    def worker(self, idx: int, seed: int) -> None:
        rng = random.Random(seed)
        conns: dict[str, http.client.HTTPConnection] = {}
        # Half of the workers keep connections alive (and sometimes drop them); the others open a
        # new connection per request.
        keepalive = idx % 2 == 0
        while not self.stop.is_set():
            inst = rng.choice(self.soak.instances)
            kind, path, headers, body = pick_request(rng)
            if kind == "aborted":
                self.abort(inst, path, headers, rng)
                continue
            method = "POST" if body is not None else "GET"
            conn = conns.get(inst.name) if keepalive else None
            reused = conn is not None
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", inst.port, timeout=CLIENT_TIMEOUT_S)
            t0 = time.time()
            try:
                try:
                    status, rheaders, rbody = self.exchange(conn, method, path, headers, body)
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                    if not reused:
                        raise
                    # A kept-alive connection the server had closed: retry once on a new one (what
                    # HTTP clients do), and count it.
                    conn.close()
                    with self.stats.lock:
                        self.stats.stale_retries += 1
                    conn = http.client.HTTPConnection("127.0.0.1", inst.port, timeout=CLIENT_TIMEOUT_S)
                    status, rheaders, rbody = self.exchange(conn, method, path, headers, body)
                self.record(inst, kind, status, rheaders, rbody, t0, time.time())
                if keepalive and rheaders.get("connection", "").lower() != "close" and rng.random() > 0.02:
                    conns[inst.name] = conn
                else:
                    conn.close()
                    conns.pop(inst.name, None)
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                conns.pop(inst.name, None)
                self.record_error(inst, kind, e, t0, time.time())
                time.sleep(0.05)  # no busy loop against a closed port
            if self.think_s:
                time.sleep(rng.uniform(0, 2 * self.think_s))
        for c in conns.values():
            c.close()

    def abort(self, inst, path, headers, rng) -> None:
        """Sends a slow request on a new connection and closes it after 20-300 ms without reading
        the answer; half of the time with a RST (SO_LINGER 0)."""
        t0 = time.time()
        req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        try:
            with socket.create_connection(("127.0.0.1", inst.port), timeout=CLIENT_TIMEOUT_S) as sock:
                sock.sendall(req.encode())
                time.sleep(rng.uniform(0.02, 0.3))
                if rng.random() < 0.5:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            with self.stats.lock:
                self.stats.sent += 1
                self.stats.statuses["aborted"] += 1
                self.stats.by_kind.setdefault("aborted", Counter())["aborted"] += 1
                self.stats.by_instance[inst.name] += 1
        except OSError as e:
            self.record_error(inst, "aborted", e, t0, time.time())
            time.sleep(0.05)

    @staticmethod
    def exchange(conn, method, path, headers, body):
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data

    def record(self, inst, kind, status, headers, body, t0, t1) -> None:
        s = self.stats
        from_upstream = headers.get("x-soak-upstream") == "1"
        weir_error = None
        if not from_upstream:
            m = re.match(rb'\s*\{"error":"([a-z_]+)"', body)
            weir_error = m.group(1).decode() if m else f"non-json:{status}"
        with s.lock:
            s.sent += 1
            s.statuses[str(status)] += 1
            s.by_kind.setdefault(kind, Counter())[str(status)] += 1
            s.by_instance[inst.name] += 1
            s.latency_max_s = max(s.latency_max_s, t1 - t0)
            if weir_error:
                s.weir_bodies[f"{status} {weir_error}"] += 1
            if status >= 500:
                if from_upstream:
                    s.upstream_5xx += 1
                else:
                    s.weir_5xx_count += 1
                    s.weir_5xx_kinds[weir_error] += 1
                    if len(s.weir_5xx) < 50:
                        s.weir_5xx.append({
                            "t": round(t1 - self.soak.t0, 3), "instance": inst.name, "kind": kind,
                            "status": status, "body": body[:200].decode(errors="replace"),
                            "context": self.soak.context_at(t1)})

    def record_error(self, inst, kind, e, t0, t1) -> None:
        s = self.stats
        with s.lock:
            s.sent += 1
            s.statuses["conn_error"] += 1
            s.by_kind.setdefault(kind, Counter())["conn_error"] += 1
            s.by_instance[inst.name] += 1
            s.conn_errors.append({"t0": t0, "t1": t1, "instance": inst.name, "kind": kind,
                                  "error": f"{type(e).__name__}: {e}"[:160]})


# --------------------------------------------------------------------------------------------
# The soak
# --------------------------------------------------------------------------------------------


class Soak:
    def __init__(self, args):
        self.args = args
        self.workdir = Path(args.workdir)
        # Every process recorded with its start time in <workdir>/pids, for soak.sh's EXIT trap.
        self.procs = Procs(self.workdir, self.workdir / "pids")
        self.duration = args.duration
        self.redis_port = free_port()
        self.upstream_port = free_port()
        self.instances = []
        for name in ("weir-a", "weir-b"):
            d = self.workdir / name
            d.mkdir(exist_ok=True)
            self.instances.append(Instance(name, free_port(), free_port(), d / "weir.toml"))
        self.redis: Proc | None = None
        self.upstream: Proc | None = None
        self.variant = 0
        self.t0 = time.time()
        self.lock = threading.Lock()        # one chaos action at a time on the Weir instances
        self.done = threading.Event()
        self.failures: list[str] = []
        self.events: list[dict] = []
        self.redis_restarts: list[dict] = []
        self.redis_down: list[list[float]] = []
        self.kill_windows: list[list[float]] = []  # [start, end] per Weir kill, by wall clock
        self.reloads = {"written": 0, "confirmed": 0, "unconfirmed": [], "latency_max_s": 0.0}
        self.deaths: list[str] = []
        self.leases_seen_max = 0            # most unexpired leases seen in Redis during the traffic
        self.killed_leases: dict = {}       # the killed instance's leases: at the kill, after lease_ttl
        self.traffic: Traffic | None = None
        self.interrupted = False

    # ---- helpers ---------------------------------------------------------------------------

    def rel(self, t: float) -> float:
        return round(t - self.t0, 3)

    def event(self, what: str, **kw) -> None:
        e = {"t": self.rel(time.time()), "event": what, **kw}
        self.events.append(e)
        log(f"t={e['t']:.1f}s {what} {' '.join(f'{k}={v}' for k, v in kw.items())}")

    def context_at(self, t: float) -> str:
        """What chaos was going on around wall time t (for Weir 5xx samples)."""
        parts = []
        for a, b in self.redis_down:
            if a - 1 <= t <= (b or time.time()) + 3:
                parts.append(f"redis down {self.rel(a)}..{self.rel(b) if b else '?'}")
        for a, b in self.kill_windows:
            if a - 1 <= t <= (b or time.time()) + 3:
                parts.append(f"weir kill {self.rel(a)}..{self.rel(b) if b else '?'}")
        for e in self.events:
            if e["event"] == "config rewritten" and abs(self.t0 + e["t"] - t) < 2:
                parts.append(f"reload at {e['t']}")
        return "; ".join(parts) or "none"

    def sleep_until(self, rel_t: float) -> bool:
        """Sleeps until t0 + rel_t; False if the soak ended first. In slices of at most 0.5 s: a
        signal caught by another thread is only seen by the main thread when its wait returns."""
        while True:
            if self.interrupted:   # set by the signal handler, acted on here, at a safe point
                if threading.current_thread() is threading.main_thread():
                    raise KeyboardInterrupt
                return False
            left = self.t0 + rel_t - time.time()
            if left <= 0:
                return not self.done.is_set()
            if self.done.wait(min(left, 0.5)):
                return False

    # ---- processes -------------------------------------------------------------------------

    def start_redis(self) -> None:
        self.redis = self.procs.start("redis", [
            "redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no",
            "--dir", str(self.workdir)])
        wait_port(self.redis, self.redis_port, PORT_WAIT_S)

    def start_weir(self, inst: Instance) -> None:
        inst.proc = self.procs.start(inst.name, [self.args.weir, "-c", str(inst.conf)])
        life = Life(pid=inst.proc.pid, started=time.time())
        inst.lives.append(life)
        wait_port(inst.proc, inst.port, PORT_WAIT_S)
        wait_port(inst.proc, inst.admin, PORT_WAIT_S, "admin")
        life.ready = time.time()
        inst.up = True

    def write_configs(self) -> None:
        for inst in self.instances:
            write_config(inst.conf, weir_toml(port=inst.port, admin=inst.admin,
                                              redis=self.redis_port, upstream=self.upstream_port,
                                              variant=self.variant, on_error=self.args.on_error))

    def start_all(self) -> None:
        self.start_redis()
        self.upstream = self.procs.start("upstream", [sys.executable, str(SOAK_DIR / "upstream.py"),
                                                      "--port", str(self.upstream_port)])
        wait_port(self.upstream, self.upstream_port, PORT_WAIT_S)
        self.write_configs()
        ok, output = weir_check(self.args.weir, self.instances[0].conf)
        if not ok:
            raise SoakError(f"weir check refused the soak config: {output}")
        for inst in self.instances:
            self.start_weir(inst)
        # Every instance decides on Redis before the clock starts.
        with Redis(self.redis_port) as rd:
            before = rd.script_calls()
            for inst in self.instances:
                c = http.client.HTTPConnection("127.0.0.1", inst.port, timeout=5)
                c.request("GET", "/api/warm", headers={"X-Forwarded-For": "10.250.0.1"})
                c.getresponse().read()
                c.close()
            if rd.script_calls() <= before:
                raise SoakError("Weir made no script call to Redis for a limited request")

    def sample(self, inst: Instance) -> dict | None:
        if not inst.up or inst.proc is None or not inst.proc.alive():
            return None
        try:
            return proc_sample(inst.proc.pid, inst.ports(self))
        except OSError:
            return None

    def scrape(self, inst: Instance) -> dict | None:
        try:
            m = scrape_metrics(inst.admin)   # an answer other than 200 raises too (HTTPError)
        except (OSError, http.client.HTTPException):
            return None
        inst.lives[-1].last_metrics = m
        return m

    # ---- chaos -----------------------------------------------------------------------------

    def redis_schedule(self) -> list[tuple[float, str]]:
        """(time, "kill" | "hang") of every Redis outage. With --redis-hang every second outage is
        a SIGSTOP/SIGCONT (a Redis that hangs: timeouts, not refused connections)."""
        period = self.args.redis_period or min(60.0, max(15.0, self.duration / 3))
        out, k = [], 1
        while period * k <= self.duration - 12:
            out.append((period * k, "hang" if self.args.redis_hang and k % 2 == 0 else "kill"))
            k += 1
        return out

    def redis_chaos(self) -> None:
        down_s = self.args.redis_down
        for at, how in self.redis_schedule():
            if not self.sleep_until(at):
                return
            with Redis(self.redis_port) as rd:
                calls_before = rd.script_calls()
            down_at = time.time()
            self.redis_down.append([down_at, 0.0])
            if how == "kill":
                self.procs.kill(self.redis, signal.SIGKILL)
                self.event("redis SIGKILLed", script_calls=calls_before)
                self.done.wait(down_s)
                self.start_redis()
                calls_base = 0
            else:
                os.kill(self.redis.pid, signal.SIGSTOP)
                self.event("redis SIGSTOPped (hangs)", script_calls=calls_before)
                self.done.wait(down_s)
                os.kill(self.redis.pid, signal.SIGCONT)
                time.sleep(0.3)  # what Weir had queued runs first
                with Redis(self.redis_port) as rd:
                    calls_base = rd.script_calls()
            up_at = time.time()
            self.redis_down[-1][1] = up_at
            self.event("redis restarted" if how == "kill" else "redis SIGCONTed", port=self.redis_port)
            # Decisions back on Redis: script calls on the new Redis, and no instance's circuit open.
            deadline = up_at + REDIS_RECOVERY_MAX_S
            recovered = None
            while time.time() < deadline:
                try:
                    with Redis(self.redis_port) as rd:
                        calls = rd.script_calls()
                except (OSError, SoakError):
                    calls = 0
                open_ = []
                for inst in self.instances:
                    if not inst.up:
                        continue
                    m = self.scrape(inst)
                    if m is None or metric_sum(m, "weir_store_circuit_open") > 0:
                        open_.append(inst.name)
                if calls > calls_base and not open_:
                    recovered = time.time() - up_at
                    break
                time.sleep(0.25)
            rec = {"how": how, "down_at": self.rel(down_at), "up_at": self.rel(up_at),
                   "recovered_after_s": round(recovered, 2) if recovered is not None else None}
            self.redis_restarts.append(rec)
            if recovered is None:
                self.event("redis decisions NOT back", within_s=REDIS_RECOVERY_MAX_S)
            else:
                self.event("redis decisions back", after_s=rec["recovered_after_s"])

    def reload_chaos(self) -> None:
        t = 5.0
        while t <= self.duration - 3:
            if not self.sleep_until(t):
                return
            t += self.args.reload_period
            with self.lock:
                before = {}
                for inst in self.instances:
                    if inst.up:
                        try:
                            before[inst.name] = json.loads(admin_get(inst.admin, "/config")[1])
                        except (OSError, ValueError):
                            pass
                self.variant ^= 1
                self.write_configs()
                written = time.time()
                self.reloads["written"] += 1
                self.event("config rewritten", variant=self.variant)
                pending = dict(before)
                deadline = written + RELOAD_CONFIRM_S
                while pending and time.time() < deadline:
                    time.sleep(0.1)
                    for name, cfg in list(pending.items()):
                        inst = next(i for i in self.instances if i.name == name)
                        try:
                            now = json.loads(admin_get(inst.admin, "/config")[1])
                        except (OSError, ValueError):
                            continue
                        if (now.get("generation", 0) > cfg.get("generation", 0)
                                and now.get("hash") != cfg.get("hash") and not now.get("last_error")):
                            self.reloads["confirmed"] += 1
                            self.reloads["latency_max_s"] = max(self.reloads["latency_max_s"],
                                                                round(time.time() - written, 3))
                            del pending[name]
                for name in pending:
                    self.reloads["unconfirmed"].append({"t": self.rel(written), "instance": name})
                    self.event("reload NOT confirmed", instance=name)

    def weir_chaos(self) -> None:
        at = self.args.kill_at or self.duration * 0.5 + min(15.0, self.duration / 12)
        if not self.sleep_until(at):
            return
        inst = self.instances[1]
        with self.lock:
            life = inst.lives[-1]
            life.end_sample = self.sample(inst)   # its last reading before the kill
            inst.up = False
            start = time.time()
            self.kill_windows.append([start, 0.0])
            self.procs.kill(inst.proc, signal.SIGKILL)
            prefix = f"{life.pid:x}-"
            try:
                self.killed_leases = {"prefix": prefix, "at_kill": self.live_leases(prefix)[2]}
            except (OSError, SoakError) as e:
                self.killed_leases = {"prefix": prefix, "at_kill": None, "error": str(e)}
            life.ended = "killed by the soak (SIGKILL)"
            self.event("weir SIGKILLed", instance=inst.name, pid=life.pid)
            self.done.wait(self.args.weir_down)
            self.start_weir(inst)
            # Connections refused until the new process listens; a margin for requests in flight.
            self.kill_windows[-1][1] = time.time() + 1.0
            self.event("weir restarted", instance=inst.name, pid=inst.proc.pid,
                       down_s=round(time.time() - start, 2))
        # Its leases must be gone once lease_ttl has passed (a crashed proxy never leaks a slot).
        if not self.sleep_until(at + LEASE_TTL_S + 1.5):
            return
        try:
            self.killed_leases["after_ttl"] = self.live_leases(self.killed_leases["prefix"])[2]
        except (OSError, SoakError) as e:
            self.killed_leases["after_ttl"] = None
            self.killed_leases["error"] = str(e)
        # An outage overlapping [kill, now] wiped or hid the leases: the check is then vacuous.
        restarted = [r for r in self.redis_down if r[0] <= time.time() and (not r[1] or r[1] >= start)]
        self.killed_leases["redis_restarted_meanwhile"] = bool(restarted)
        self.event("killed instance's leases", **self.killed_leases)
        # The new process's "start" reading after its own warm-up.
        if self.sleep_until(at + self.args.weir_down + self.warmup):
            inst.lives[-1].start_sample = self.sample(inst)

    def monitor(self) -> None:
        """Notices processes that die on their own; scrapes metrics every few seconds."""
        while not self.done.wait(1.0):
            for inst in self.instances:
                if inst.up and inst.proc is not None and not inst.proc.alive():
                    inst.up = False
                    code = inst.proc.popen.returncode
                    msg = f"{inst.name} (pid {inst.proc.pid}) died: exit {code}"
                    inst.lives[-1].ended = f"died: exit {code}"
                    self.deaths.append(msg)
                    self.event("DIED", instance=inst.name, code=code)
            if not self.upstream.alive():
                self.deaths.append(f"upstream died: exit {self.upstream.popen.returncode}")
                self.event("upstream DIED")
                return
            if int(time.time() - self.t0) % 5 == 0:
                for inst in self.instances:
                    if inst.up:
                        self.scrape(inst)
            if int(time.time() - self.t0) % 2 == 0:
                try:
                    self.leases_seen_max = max(self.leases_seen_max, self.live_leases()[1])
                except (OSError, SoakError):
                    pass  # Redis is down

    # ---- leases ----------------------------------------------------------------------------

    def live_leases(self, prefix: str = "") -> tuple[int, int, int]:
        """(keys, unexpired lease members, of which with ids starting with `prefix`) under
        weir:conn:*. Lease ids are `<pid in hex>-<start ns in hex>:<counter>` (src/proxy/lease.rs)."""
        keys = members = mine = 0
        with Redis(self.redis_port) as rd:
            now = rd.now_ms()
            cursor = b"0"
            while True:
                cursor, batch = rd.cmd("SCAN", cursor, "MATCH", "weir:conn:*", "COUNT", 1000)
                for k in batch:
                    keys += 1
                    live = rd.cmd("ZRANGEBYSCORE", k, f"({now}", "+inf")
                    members += len(live)
                    if prefix:
                        mine += sum(1 for m in live if m.decode(errors="replace").startswith(prefix))
                if cursor in (b"0", "0"):
                    break
        return keys, members, mine

    # ---- run -------------------------------------------------------------------------------

    def run(self) -> dict:
        self.warmup = min(10.0, max(5.0, self.duration * 0.1))
        log(f"workdir {self.workdir}; weir {self.args.weir}; duration {self.duration}s")
        self.start_all()
        log(f"redis :{self.redis_port}, upstream :{self.upstream_port}, " + ", ".join(
            f"{i.name} :{i.port} (admin :{i.admin})" for i in self.instances))
        self.t0 = time.time()
        self.traffic = Traffic(self, self.args.workers, self.args.think_ms, self.args.seed)
        self.traffic.start()
        chaos = [threading.Thread(target=f, daemon=True, name=f.__name__)
                 for f in (self.redis_chaos, self.reload_chaos, self.weir_chaos, self.monitor)]
        for t in chaos:
            t.start()
        self.sleep_until(self.warmup)
        for inst in self.instances:
            inst.lives[-1].start_sample = self.sample(inst)
            self.scrape(inst)
        self.event("warm-up done", **{
            i.name: (f"{i.lives[-1].start_sample['rss_kib'] / 1024:.1f}MiB/"
                     f"{i.lives[-1].start_sample['fds']}fds") if i.lives[-1].start_sample else "?"
            for i in self.instances})
        self.sleep_until(self.duration)
        # Last readings under traffic, then stop the clients.
        loaded_end = {i.name: self.sample(i) for i in self.instances}
        self.done.set()
        self.traffic.join()
        traffic_end = time.time()
        self.event("traffic stopped")
        for t in chaos:
            t.join(REDIS_RECOVERY_MAX_S + 30)
        # Client connections must go away once the clients have closed theirs.
        deadline = time.time() + 5
        while True:
            samples = {i.name: self.sample(i) for i in self.instances}
            if all(s and s["fd_kinds"].get("clients", 0) == 0 for s in samples.values()) \
                    or time.time() > deadline:
                break
            time.sleep(0.25)
        for inst in self.instances:
            inst.lives[-1].end_sample = samples[inst.name]
            self.scrape(inst)
        # Leases: right after the traffic, and until lease_ttl has passed (with a deadline).
        leases_at_stop = self.live_leases()
        lease_deadline = traffic_end + LEASE_TTL_S * 2 + 5
        leases_final = leases_at_stop
        while time.time() < lease_deadline:
            if self.interrupted:
                raise KeyboardInterrupt
            leases_final = self.live_leases()
            if leases_final[1] == 0 and time.time() > traffic_end + LEASE_TTL_S + 0.5:
                break
            time.sleep(0.5)
        for inst in self.instances:
            self.scrape(inst)
        return self.report(loaded_end, leases_at_stop, leases_final)

    # ---- report ----------------------------------------------------------------------------

    def report(self, loaded_end: dict, leases_at_stop, leases_final) -> dict:
        s = self.traffic.stats
        in_window, outside = [], []
        for e in s.conn_errors:
            hit = any(e["instance"] == self.instances[1].name and a <= e["t1"] and e["t0"] <= b
                      for a, b in self.kill_windows)
            (in_window if hit else outside).append(e)
        instances = {}
        checks = []

        def check(name: str, ok: bool, detail: str) -> None:
            checks.append({"check": name, "ok": ok, "detail": detail})
            if not ok:
                self.failures.append(f"{name}: {detail}")

        for inst in self.instances:
            lives = []
            for n, life in enumerate(inst.lives):
                a, b = life.start_sample, life.end_sample
                entry = {"pid": life.pid, "ended": life.ended or "stopped at the end",
                         "start": a, "end": b}
                if a and b:
                    rss_growth = (b["rss_kib"] - a["rss_kib"]) / 1024
                    limit = max(RSS_GROWTH_MIB, a["rss_kib"] / 1024 * RSS_GROWTH_PCT / 100)
                    entry["rss_growth_mib"] = round(rss_growth, 1)
                    entry["fd_growth"] = b["fds_non_client"] - a["fds_non_client"]
                    entry["threads_growth"] = b["threads"] - a["threads"]
                    entry["span_s"] = round(b["t"] - a["t"], 1)
                    check(f"{inst.name}#{n + 1} RSS growth", rss_growth <= limit,
                          f"{a['rss_kib'] / 1024:.1f} -> {b['rss_kib'] / 1024:.1f} MiB "
                          f"({rss_growth:+.1f}; limit +{limit:.0f}) over {entry['span_s']} s")
                    check(f"{inst.name}#{n + 1} fd growth", entry["fd_growth"] <= FD_GROWTH_MAX,
                          f"{a['fds_non_client']} -> {b['fds_non_client']} fds besides client "
                          f"connections ({entry['fd_growth']:+d}; limit +{FD_GROWTH_MAX}); all fds "
                          f"{a['fds']} -> {b['fds']}")
                else:
                    entry["note"] = "no start/end pair (too short a life)"
                m = life.last_metrics
                entry["metrics"] = {
                    "requests": {o: metric_sum(m, "weir_requests_total", outcome=o)
                                 for o in ("passed", "delayed", "rejected", "conn_rejected",
                                           "unlimited", "fail_open", "fail_closed", "upstream_busy")},
                    "store_errors": {c: metric_sum(m, "weir_store_errors_total", cause=c)
                                     for c in ("timeout", "redis", "reply", "circuit_open")},
                    "fallback_allow": metric_sum(m, "weir_store_fallback_total", policy="allow"),
                    "config_generation": metric_sum(m, "weir_config_generation"),
                    "config_reloads": metric_sum(m, "weir_config_reloads_total"),
                    "active_leases": metric_sum(m, "weir_limit_conn_active_leases"),
                }
                lives.append(entry)
            final = inst.lives[-1]
            end = final.end_sample
            if end:
                check(f"{inst.name} client sockets closed", end["fd_kinds"].get("clients", 0) == 0,
                      f"{end['fd_kinds'].get('clients', 0)} client sockets left "
                      f"({end['client_close_wait']} in CLOSE_WAIT) after the clients closed theirs")
                check(f"{inst.name} Redis sockets", end["fd_kinds"].get("redis", 0) <= REDIS_SOCKETS_MAX,
                      f"{end['fd_kinds'].get('redis', 0)} at the end after {len(self.redis_restarts)} "
                      f"Redis restarts (limit {REDIS_SOCKETS_MAX})")
                active = total(final.last_metrics, "weir_limit_conn_active_leases")
                check(f"{inst.name} active leases gauge", not active,
                      f"weir_limit_conn_active_leases = {active} after the traffic")
            instances[inst.name] = {"port": inst.port, "admin": inst.admin, "lives": lives,
                                    "loaded_end": loaded_end.get(inst.name)}
            log_text = (self.workdir / f"{inst.name}.log").read_text(errors="replace")
            panics = log_text.count("panicked")
            instances[inst.name]["log_panics"] = panics
            instances[inst.name]["log_errors"] = sum(1 for l in log_text.splitlines() if " ERROR " in l)
            check(f"{inst.name} no panics", panics == 0, f"{panics} 'panicked' lines in its log")

        check("Weir-caused 5xx", s.weir_5xx_count == 0,
              f"{s.weir_5xx_count} (a 5xx without the upstream's marker header: Weir's JSON errors, "
              f"or Pingora's own error pages as non-json:<status>)"
              + (": " + ", ".join(f"{k} {v}" for k, v in s.weir_5xx_kinds.items()) if s.weir_5xx_kinds else ""))
        check("connection errors outside the kill window", not outside,
              f"{len(outside)} (in the window: {len(in_window)})")
        check("no process died", not self.deaths, "; ".join(self.deaths) or "none")
        check("leases left in Redis", leases_final[1] == 0,
              f"{leases_final[1]} unexpired leases in {leases_final[0]} keys "
              f"(right after the traffic: {leases_at_stop[1]} in {leases_at_stop[0]})")
        kl = self.killed_leases
        check("killed instance's leases expire", kl.get("after_ttl") == 0,
              f"{kl.get('at_kill')} unexpired right after the SIGKILL, {kl.get('after_ttl')} "
              f"{LEASE_TTL_S + 1.5} s later" + (" (Redis restarted meanwhile)"
                                                 if kl.get("redis_restarted_meanwhile") else ""))
        planned = self.redis_schedule()
        check("Redis outages", len(self.redis_restarts) == len(planned) and len(planned) > 0,
              f"{len(self.redis_restarts)} of {len(planned)} scheduled "
              f"({sum(1 for _, h in planned if h == 'kill')} SIGKILL + restart, "
              f"{sum(1 for _, h in planned if h == 'hang')} SIGSTOP/SIGCONT)")
        not_back = [r for r in self.redis_restarts if r["recovered_after_s"] is None]
        check("decisions back on Redis after each restart", not not_back,
              f"max {max((r['recovered_after_s'] or 0) for r in self.redis_restarts) if self.redis_restarts else 0} s"
              f" (limit {REDIS_RECOVERY_MAX_S} s); not back: {len(not_back)}")
        check("reloads confirmed", not self.reloads["unconfirmed"] and self.reloads["confirmed"] > 0,
              f"{self.reloads['confirmed']} confirmed for {self.reloads['written']} rewrites; "
              f"unconfirmed {len(self.reloads['unconfirmed'])}")
        check("Weir instance killed and restarted", len(self.kill_windows) == 1
              and len(self.instances[1].lives) == 2, f"{len(self.instances[1].lives) - 1} restart(s)")
        limited = sum(v for k, v in s.weir_bodies.items() if k.startswith("429"))
        check("limits applied", limited > 0 and s.statuses.get("200", 0) > 0,
              f"{s.statuses.get('200', 0)} passed, {limited} rejected with 429")

        result = {
            "meta": {
                "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "duration_s": self.duration,
                "weir": self.args.weir,
                "commit": git_rev(),
                "on_error": self.args.on_error,
                "workers": self.args.workers, "think_ms": self.args.think_ms, "seed": self.args.seed,
                "lease_ttl_s": LEASE_TTL_S,
                "thresholds": {"rss_growth_mib": RSS_GROWTH_MIB, "rss_growth_pct": RSS_GROWTH_PCT,
                               "fd_growth_max": FD_GROWTH_MAX, "redis_sockets_max": REDIS_SOCKETS_MAX,
                               "redis_recovery_max_s": REDIS_RECOVERY_MAX_S},
                "config_variant_0": weir_toml(port=0, admin=0, redis=0, upstream=0, variant=0,
                                              on_error=self.args.on_error),
            },
            "requests": {
                "sent": s.sent,
                "per_second": round(s.sent / self.duration, 1),
                "statuses": dict(sorted(s.statuses.items())),
                "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(s.by_kind.items())},
                "by_instance": dict(s.by_instance),
                "weir_answers": dict(sorted(s.weir_bodies.items())),
                "weir_5xx": s.weir_5xx_count,
                "weir_5xx_by_error": dict(s.weir_5xx_kinds),
                "weir_5xx_samples": s.weir_5xx,
                "upstream_5xx": s.upstream_5xx,
                "stale_keepalive_retries": s.stale_retries,
                "latency_max_s": round(s.latency_max_s, 3),
                "conn_errors_in_kill_window": len(in_window),
                "conn_errors_outside": len(outside),
                "conn_error_samples_outside": [
                    {**e, "t0": self.rel(e["t0"]), "t1": self.rel(e["t1"]),
                     "context": self.context_at(e["t1"])} for e in outside[:30]],
            },
            "chaos": {
                "redis_restarts": self.redis_restarts,
                "weir_kill_windows": [[self.rel(a), self.rel(b)] for a, b in self.kill_windows],
                "reloads": self.reloads,
            },
            "leases": {"max_seen_during_traffic": self.leases_seen_max,
                       "killed_instance": self.killed_leases,
                       "at_traffic_stop": {"keys": leases_at_stop[0], "live": leases_at_stop[1]},
                       "final": {"keys": leases_final[0], "live": leases_final[1]}},
            "instances": instances,
            "events": self.events,
            "checks": checks,
            "ok": not self.failures,
        }
        return result


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_DIR), "status", "--porcelain", "--", "src", "lua"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def render(r: dict) -> str:
    q = r["requests"]
    out = [f"Weir soak: {r['meta']['duration_s']} s, on_error = {r['meta'].get('on_error', 'allow')}, "
           f"{r['meta']['date']}, {r['meta']['commit']}",
           "",
           f"requests sent        {q['sent']} ({q['per_second']}/s)",
           "statuses             " + ", ".join(f"{k}: {v}" for k, v in q["statuses"].items()),
           "Weir's own answers   " + (", ".join(f"{k}: {v}" for k, v in q["weir_answers"].items()) or "none"),
           f"Weir-caused 5xx      {q['weir_5xx']}   (upstream's own 5xx: {q['upstream_5xx']})",
           f"conn errors          {q['conn_errors_outside']} outside the kill window, "
           f"{q['conn_errors_in_kill_window']} in it; stale keep-alive retries {q['stale_keepalive_retries']}",
           f"Redis outages        {len(r['chaos']['redis_restarts'])}; decisions back after "
           + ", ".join(f"{x['recovered_after_s']} s" + (" (hang)" if x["how"] == "hang" else "")
                       for x in r["chaos"]["redis_restarts"]),
           f"reloads              {r['chaos']['reloads']['confirmed']} confirmed of "
           f"{r['chaos']['reloads']['written']} rewrites (x live instances); max "
           f"{r['chaos']['reloads']['latency_max_s']} s to show in GET /config",
           f"Weir kill window     {r['chaos']['weir_kill_windows']}",
           f"leases in Redis      {r['leases']['at_traffic_stop']['live']} right after the traffic, "
           f"{r['leases']['final']['live']} after lease_ttl (up to "
           f"{r['leases']['max_seen_during_traffic']} live during the traffic; the killed instance "
           f"held {r['leases']['killed_instance'].get('at_kill')}, "
           f"{r['leases']['killed_instance'].get('after_ttl')} left after lease_ttl)",
           "",
           "| instance | pid | start RSS MiB | end RSS MiB | growth | start fds | end fds | threads | end fd kinds |",
           "|---|--:|--:|--:|--:|--:|--:|--:|---|"]
    for name, inst in r["instances"].items():
        for life in inst["lives"]:
            a, b = life["start"], life["end"]
            if not (a and b):
                out.append(f"| {name} | {life['pid']} | – | – | – | – | – | – | {life.get('note', '')} |")
                continue
            out.append(
                f"| {name} | {life['pid']} | {a['rss_kib'] / 1024:.1f} | {b['rss_kib'] / 1024:.1f} | "
                f"{life['rss_growth_mib']:+.1f} | {a['fds']} | {b['fds']} | {a['threads']}→{b['threads']} | "
                + " ".join(f"{k}={v}" for k, v in b["fd_kinds"].items()) + f" ({life['ended']}) |")
    out += ["", "| instance | pid | passed | delayed | rejected | conn_rejected | fail_open | store errors (timeout/redis/reply/circuit_open) | reloads |",
            "|---|--:|--:|--:|--:|--:|--:|---|--:|"]
    for name, inst in r["instances"].items():
        for life in inst["lives"]:
            m = life["metrics"]
            q_ = m["requests"]
            e = m["store_errors"]
            out.append(f"| {name} | {life['pid']} | {q_['passed']:.0f} | {q_['delayed']:.0f} | {q_['rejected']:.0f} | "
                       f"{q_['conn_rejected']:.0f} | {q_['fail_open']:.0f} | {e['timeout']:.0f}/{e['redis']:.0f}/"
                       f"{e['reply']:.0f}/{e['circuit_open']:.0f} | {m['config_reloads']:.0f} |")
    out += ["", "| check | result | detail |", "|---|---|---|"]
    for c in r["checks"]:
        out.append(f"| {c['check']} | {'ok' if c['ok'] else '**FAIL**'} | {c['detail']} |")
    out += ["", "RESULT: " + ("PASS" if r["ok"] else "FAIL")]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weir", required=True, help="the weir binary")
    ap.add_argument("--workdir", required=True, help="configs, logs and the pid file")
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--workers", type=int, default=16, help="client threads (bounded concurrency)")
    ap.add_argument("--think-ms", type=float, default=20, help="mean pause after each request")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--redis-period", type=float, default=0,
                    help="seconds between Redis kills (default: min(60, max(15, duration / 3)))")
    ap.add_argument("--redis-down", type=float, default=2.0, help="seconds Redis stays down")
    ap.add_argument("--redis-hang", action="store_true",
                    help="every second Redis outage is a SIGSTOP/SIGCONT instead of a kill")
    ap.add_argument("--reload-period", type=float, default=10.0)
    ap.add_argument("--on-error", choices=("allow", "deny", "local"), default="allow",
                    help="the failure policy under test (default allow; deny rejects with 429 here)")
    ap.add_argument("--kill-at", type=float, default=0, help="when to SIGKILL weir-b (s)")
    ap.add_argument("--weir-down", type=float, default=3.0, help="seconds weir-b stays down")
    ap.add_argument("--out", default=str(BENCH_DIR / "results"), help="directory for soak-<N>s.json")
    args = ap.parse_args()
    if args.duration < 45:
        ap.error("--duration must be at least 45 s (warm-up, one Redis restart, the kill, reloads)")

    soak = Soak(args)
    def on_signal(signum, _frame):
        # Only a flag: raising here could land inside a lock's bookkeeping. The main thread sees it
        # within 0.5 s (Soak.sleep_until). Later signals (soak.sh's TERM after a Ctrl-C) are
        # ignored while the processes are being stopped.
        log(f"got {signal.Signals(signum).name}: stopping")
        soak.interrupted = True
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    # SIGINT too: a shell starts background jobs with SIGINT ignored, and Ctrl-C must stop us.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def watchdog():
        # Bounded in time whatever happens: past duration + WATCHDOG_S, stop like on Ctrl-C; if
        # that does not finish within 30 s, stop every process and exit.
        time.sleep(args.duration + WATCHDOG_S)
        log(f"watchdog: still running {WATCHDOG_S} s after the planned end; stopping")
        soak.interrupted = True
        time.sleep(30)
        soak.procs.stop_all()
        os._exit(3)

    threading.Thread(target=watchdog, daemon=True, name="watchdog").start()
    try:
        result = soak.run()
    except BenchError as e:   # SoakError, or a harness helper's (a process that did not start)
        log(f"could not run: {e}")
        return 2
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        soak.done.set()
        if soak.traffic:
            soak.traffic.stop.set()
        soak.procs.stop_all()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"soak-{int(args.duration)}s.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    (out / f"soak-{int(args.duration)}s.md").write_text(render(result) + "\n")
    print(render(result))
    log(f"wrote {path}")
    if not result["ok"]:
        for f in soak.failures:
            log(f"FAILED: {f}")
        for name in [i.name for i in soak.instances] + ["redis", "upstream"]:
            t = log_tail(soak.workdir / f"{name}.log", 10)
            if t:
                log(f"--- last lines of {name}.log ---\n{t}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
