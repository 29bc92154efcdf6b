#!/usr/bin/env python3
"""Adaptive concurrency, side by side (issue 37): one upstream process per configuration whose
capacity is known and changes during the run, behind three Weirs — no limit, a static `max_conns`
set for the good day, and `adaptive = {}` — under the same open-loop offered load.

The upstream (asyncio, standard library) processes `K` requests at once for a service time each;
the rest wait in its FIFO queue, the shape of a thread-pool server. It records its own latency
(arrival to answer: queue + service). The load generator sends Poisson arrivals, a quarter on a
high-priority route and the rest on a low-priority one, with a client timeout.

Phases (full; `--quick` shrinks every phase to a third). The issue's targets are for about 2x
overload, so the offered load follows the capacity: 2x in good/drop/rise. High priority is 15 % of
the offered load, so that it stays well below the lowest capacity (24/s at most against 40/s): with
the old 25 % at 160/s, high priority alone was the whole capacity during the drop and ">= 99 % of
high priority served" was impossible by construction. The 4x drop of earlier runs stays as an
extra phase at the end.
  good     K=8, offered 2x capacity (160/s)   (goodput, upstream p50/p99, per-priority success)
  drop     K=4, offered 2x (80/s)             (time to converge after the drop)
  rise     K=8, offered 2x (160/s)            (time to converge after the rise)
  below    K=8, offered 0.6x (48/s)           (share of requests shed below capacity)
  drop 4x  K=4, offered 160/s                 (extra: the earlier runs' 4x overload)

Prints a Markdown report; `--out FILE` writes it too. Every process it starts is stopped at the end
(also on Ctrl-C). Standard library only.
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVICE = 0.100  # seconds per request at the upstream
GOOD_K, BAD_K = 8, 4
SLO = 2 * SERVICE  # goodput counts 200s answered within twice the unloaded latency
CLIENT_TIMEOUT = 2.0
HIGH_SHARE = 0.15  # of the offered load, on the high-priority route
MAX_OPEN = 600  # the load generator's own cap on requests in flight per configuration


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------
# The upstream
# --------------------------------------------------------------------------------------------


class Upstream:
    """Runs in a process of its own (its timings must not wait for the load generator's loop).
    `capacity` is shared with the parent; `records` come back through a pipe at the end."""

    def __init__(self, capacity):
        self.shared_capacity = multiprocessing.Value("i", capacity)
        self.port = free_port()
        self.records = []
        self.parent_end, self.child_end = multiprocessing.Pipe()
        self.stop = multiprocessing.Event()
        self.proc = multiprocessing.Process(target=self._run, daemon=True)

    def set_capacity(self, k):
        self.shared_capacity.value = k

    def start(self):
        self.proc.start()
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("the bench upstream did not start")

    def finish(self):
        self.stop.set()
        self.records = self.parent_end.recv()
        self.proc.join(timeout=10)

    # In the child process:

    def _run(self):
        asyncio.run(self._serve())

    async def _serve(self):
        self.busy = 0
        self.waiting = []
        records = []
        loop = asyncio.get_running_loop()

        def wake():
            while self.waiting and self.busy < self.shared_capacity.value:
                fut = self.waiting.pop(0)
                if not fut.done():
                    self.busy += 1
                    fut.set_result(None)

        async def handle(reader, writer):
            try:
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    arrived = time.monotonic()
                    if self.busy < self.shared_capacity.value and not self.waiting:
                        self.busy += 1
                    else:
                        fut = loop.create_future()
                        self.waiting.append(fut)
                        await fut
                    await asyncio.sleep(SERVICE)
                    self.busy -= 1
                    wake()
                    done = time.monotonic()
                    records.append((done, done - arrived))
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", self.port, backlog=1024)
        # A raised capacity wakes the queue too.
        while not self.stop.is_set():
            wake()
            await asyncio.sleep(0.01)
        server.close()
        self.child_end.send(records)


# --------------------------------------------------------------------------------------------
# Weir
# --------------------------------------------------------------------------------------------

CONFIGS = {
    "no limit": "",
    "static max_conns": f"max_conns = {GOOD_K}",
    "adaptive": "adaptive = {}",
    "adaptive, fleet of 2": "adaptive = {}",
}
# Two Weirs in front of one upstream, each given half of the requests: they must not fight.
FLEET = {"adaptive, fleet of 2": 2}


def weir_config(listen, admin, upstream_port, upstream_extra):
    return f"""[server]
listen = ["127.0.0.1:{listen}"]
admin = "127.0.0.1:{admin}"
threads = 1

[log]
access_log = false

[[upstream]]
name = "app"
servers = ["127.0.0.1:{upstream_port}"]
keepalive = 1024
read_timeout = "30s"
{upstream_extra}

[[route]]
name = "high"
path_prefix = "/high"
upstream = "app"
priority = "high"

[[route]]
name = "low"
path_prefix = "/"
upstream = "app"
priority = "low"
"""


def start_weir(binary, tmp, name, upstream_port, extra):
    listen, admin = free_port(), free_port()
    path = os.path.join(tmp, name.replace(" ", "_") + ".toml")
    with open(path, "w") as f:
        f.write(weir_config(listen, admin, upstream_port, extra))
    log = open(os.path.join(tmp, name.replace(" ", "_") + ".log"), "w")
    proc = subprocess.Popen([binary, "-c", path], stdout=log, stderr=log, start_new_session=True)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=1).read()
            return proc, listen, admin
        except Exception:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"weir ({name}) did not become ready; see {log.name}")


def adaptive_state(admin):
    """(limit, ideal latency in ms, in flight) from /metrics; None when unreadable."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=1).read().decode()
    except Exception:
        return None
    limit = ideal = None
    in_flight = 0.0
    for line in text.splitlines():
        if line.startswith('weir_adaptive_in_flight{upstream="app"}'):
            in_flight = float(line.split()[-1])
        if line.startswith('weir_adaptive_limit{upstream="app"}'):
            limit = float(line.split()[-1])
        elif line.startswith('weir_adaptive_ideal_latency_seconds{upstream="app"}'):
            ideal = float(line.split()[-1]) * 1000
    return None if limit is None else (limit, ideal or 0.0, in_flight)


# --------------------------------------------------------------------------------------------
# Load
# --------------------------------------------------------------------------------------------


class Client:
    """Open-loop requests over a pool of kept-alive connections to one Weir."""

    def __init__(self, port):
        self.port = port
        self.idle = []
        self.open = 0
        self.results = []  # (sent_at, path, status, latency); status 0: timeout/error/overflow

    async def one(self, path):
        sent = time.monotonic()
        if self.open >= MAX_OPEN:
            self.results.append((sent, path, 0, 0.0))
            return
        self.open += 1
        conn = self.idle.pop() if self.idle else None
        try:
            if conn is None:
                conn = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), CLIENT_TIMEOUT)
            reader, writer = conn
            writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLIENT_TIMEOUT - (time.monotonic() - sent))
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length:
                await asyncio.wait_for(reader.readexactly(length), CLIENT_TIMEOUT)
            self.results.append((sent, path, status, time.monotonic() - sent))
            if b"connection: close" in head.lower():
                writer.close()
            else:
                self.idle.append(conn)
        except Exception:
            self.results.append((sent, path, 0, time.monotonic() - sent))
            if conn is not None:
                conn[1].close()
        finally:
            self.open -= 1


async def offer(clients, rate, seconds, rng):
    """Poisson arrivals at `rate`/s for `seconds`, to the clients in turn; HIGH_SHARE high priority."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    next_at = loop.time()
    tasks = set()
    turn = 0
    while next_at < end:
        now = loop.time()
        if next_at > now:
            await asyncio.sleep(next_at - now)
        path = "/high" if rng.random() < HIGH_SHARE else "/low"
        c = clients[turn % len(clients)]
        turn += 1
        t = asyncio.ensure_future(c.one(path))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
        next_at += rng.expovariate(rate)
    return tasks


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def pct(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(p * len(v) + 0.5)) - 1))]


def phase_figures(client, upstream, start, end, capacity_rps):
    res = [r for r in client.results if start <= r[0] < end]
    seconds = end - start
    good = sum(1 for r in res if r[2] == 200 and r[3] <= SLO)
    shed = sum(1 for r in res if r[2] == 503)
    ups = [lat for (done, lat) in upstream.records if start <= done < end]
    by_prio = {}
    for prio in ("/high", "/low"):
        mine = [r for r in res if r[1] == prio]
        ok = sum(1 for r in mine if r[2] == 200)
        by_prio[prio] = (ok / len(mine)) if mine else float("nan")
    return {
        "goodput": good / seconds,
        "goodput_share": good / seconds / capacity_rps,
        "sent": len(res),
        "shed_share": shed / len(res) if res else float("nan"),
        "up_p50": pct(ups, 0.5),
        "up_p99": pct(ups, 0.99),
        "high_ok": by_prio["/high"],
        "low_ok": by_prio["/low"],
    }


def converge_time(client, upstream, change_at, end, capacity_rps):
    """After a change at `change_at`, in 1-s windows sliding by 0.25 s: (seconds until the first
    window with goodput >= 90 % of capacity and the upstream's p99 within 2x its unloaded latency
    (5 % slack), share of the later windows that miss it). None when never reached."""
    windows = []
    t = change_at
    while t + 1.0 <= end:
        f = phase_figures(client, upstream, t, t + 1.0, capacity_rps)
        windows.append((t, f["goodput_share"] >= 0.9 and f["up_p99"] <= 2 * SERVICE * 1.05))
        t += 0.25
    for i, (t, ok) in enumerate(windows):
        if ok:
            later = windows[i:]
            return t + 1.0 - change_at, sum(1 for _, o in later if not o) / len(later)
    return None


def client_main(ports, schedule, start_at, seed, conn):
    """One configuration's load generator, in a process of its own (the no-limit configuration's
    thousands of timed-out requests must not slow the others' clocks)."""

    async def run():
        clients = [Client(port) for port in ports]
        rng = random.Random(seed)
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        for rate, seconds in schedule:
            await offer(clients, rate, seconds, rng)
        await asyncio.sleep(CLIENT_TIMEOUT + 0.5)
        return [r for c in clients for r in c.results]

    conn.send(asyncio.run(run()))


def main_run(args):
    binary = args.weir
    scale = 1 / 3 if args.quick else 1.0
    good_rps = GOOD_K / SERVICE
    # (phase, K, offered/s, seconds)
    phases = [("good", GOOD_K, 2.0 * good_rps, 24 * scale), ("drop", BAD_K, 2.0 * BAD_K / SERVICE, 18 * scale),
              ("rise", GOOD_K, 2.0 * good_rps, 18 * scale), ("below", GOOD_K, 0.6 * good_rps, 15 * scale),
              ("drop 4x", BAD_K, 2.0 * good_rps, 18 * scale)]
    schedule = [(rate, seconds) for (_, _, rate, seconds) in phases]
    upstreams = {name: Upstream(GOOD_K) for name in CONFIGS}
    for u in upstreams.values():
        u.start()
    tmp = tempfile.mkdtemp(prefix="weir-adaptive-bench-")
    procs = {}
    loaders = {}
    results = {}
    limits = []
    fleet_limits = []
    marks = []
    try:
        for name, extra in CONFIGS.items():
            procs[name] = [start_weir(binary, tmp, f"{name}-{i}", upstreams[name].port, extra)
                           for i in range(FLEET.get(name, 1))]
        t0 = time.monotonic() + 1.0
        for name in CONFIGS:
            parent, child = multiprocessing.Pipe()
            ports = [listen for (_, listen, _) in procs[name]]
            proc = multiprocessing.Process(target=client_main, args=(ports, schedule, t0, 37, child), daemon=True)
            proc.start()
            loaders[name] = (proc, parent)
        at = t0
        for (phase, k, _, seconds), (rate, _) in zip(phases, schedule):
            time.sleep(max(0.0, at - time.monotonic()))
            for u in upstreams.values():
                u.set_capacity(k)
            marks.append((phase, at, k, rate))
            at += seconds
            while time.monotonic() < at:
                now = time.monotonic() - t0
                limits.append((now, adaptive_state(procs["adaptive"][0][2])))
                fleet_limits.append((now, [adaptive_state(admin) for (_, _, admin) in procs["adaptive, fleet of 2"]]))
                time.sleep(0.25)
        end_all = at + CLIENT_TIMEOUT + 0.5
        for name, (proc, parent) in loaders.items():
            results[name] = parent.recv()
            proc.join(timeout=10)
    finally:
        for proc, _, _ in [p for group in procs.values() for p in group]:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            except Exception:
                proc.kill()
        for u in upstreams.values():
            u.finish()
    clients = {}
    for name in CONFIGS:
        clients[name] = Client(0)
        clients[name].results = results.get(name, [])

    # Report.
    out = []
    w = out.append
    w(f"# Adaptive concurrency, side by side ({'quick' if args.quick else 'full'} run)\n")
    w(f"Upstream: K requests at once x {SERVICE*1000:.0f} ms, the rest queued inside it; K = {GOOD_K} "
      f"(capacity {good_rps:.0f}/s) on the good day, {BAD_K} ({BAD_K/SERVICE:.0f}/s) during `drop`. "
      f"Offered: Poisson, {HIGH_SHARE*100:.0f} % high priority (`/high`), the rest low; 2x the capacity in "
      f"good/drop/rise ({2*good_rps:.0f}/s, {2*BAD_K/SERVICE:.0f}/s, {2*good_rps:.0f}/s), {0.6*good_rps:.0f}/s in "
      f"`below`, {2*good_rps:.0f}/s (4x) in `drop 4x`. Goodput: 200s within {SLO*1000:.0f} ms (2x unloaded) per second. "
      f"Weir: `{os.path.relpath(binary, ROOT)}`, one thread each; the configurations run at the same time, each "
      f"with its own upstream; `adaptive, fleet of 2` is two Weirs in front of one upstream, each sent every "
      f"other request.\n")
    bounds = []
    for i, (phase, start, k, rate) in enumerate(marks):
        stop = marks[i + 1][1] if i + 1 < len(marks) else end_all - CLIENT_TIMEOUT - 0.5
        bounds.append((phase, start, stop, k, rate))
    w("| phase | config | offered/s | capacity/s | goodput/s | goodput / capacity | upstream p50 ms | upstream p99 ms | shed % | high 200 % | low 200 % |")
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    for (phase, start, stop, k, rate) in bounds:
        cap = k / SERVICE
        # The first 5 s of a phase are convergence (reported below), the rest steady state.
        steady_from = start + min(5.0, (stop - start) / 2)
        for name in CONFIGS:
            f = phase_figures(clients[name], upstreams[name], steady_from, stop, cap)
            w(f"| {phase} | {name} | {rate:.0f} | {cap:.0f} | {f['goodput']:.0f} | {f['goodput_share']*100:.0f} % | "
              f"{f['up_p50']*1000:.0f} | {f['up_p99']*1000:.0f} | {f['shed_share']*100:.2f} | "
              f"{f['high_ok']*100:.1f} | {f['low_ok']*100:.1f} |")
    w("")
    w("Time to converge after each capacity change: until the first 1-s window with goodput >= 90 % of the "
      "new capacity and the upstream's p99 <= 2x unloaded; in parentheses the share of the phase's later "
      "windows that miss it (`never`: not within the phase):\n")
    w("| change | " + " | ".join(CONFIGS) + " |")
    w("|---|" + "---|" * len(CONFIGS))
    for (phase, start, stop, k, rate) in bounds:
        if phase not in ("drop", "rise", "drop 4x"):
            continue
        cells = []
        for name in CONFIGS:
            c = converge_time(clients[name], upstreams[name], start, stop, k / SERVICE)
            cells.append("never" if c is None else f"{c[0]:.2f} s ({c[1]*100:.0f} % missed)")
        w(f"| {phase} (K -> {k}) | " + " | ".join(cells) + " |")
    w("")
    w("Fleet: the two Weirs' limits (`weir_adaptive_limit`) in each phase's steady part: mean, min-max, "
      "and their sum's min-max:\n")
    w("| phase | Weir 1 mean (min-max) | Weir 2 mean (min-max) | sum min-max |")
    w("|---|---|---|---|")
    for (phase, start, stop, k, rate) in bounds:
        lo, hi = start - t0 + min(5.0, (stop - start) / 2), stop - t0
        rows = [pair for (t, pair) in fleet_limits if lo <= t < hi and all(x is not None for x in pair)]
        if not rows:
            continue
        one = [r[0][0] for r in rows]
        two = [r[1][0] for r in rows]
        sums = [a + b for a, b in zip(one, two)]
        w(f"| {phase} (K={k}) | {statistics.mean(one):.1f} ({min(one):.0f}-{max(one):.0f}) | "
          f"{statistics.mean(two):.1f} ({min(two):.0f}-{max(two):.0f}) | {min(sums):.0f}-{max(sums):.0f} |")
    w("")
    step = max(1, len(limits) // 40)
    series = " ".join(f"{t:.0f}s:{s[0]:.0f}/{s[1]:.0f}ms" for t, s in limits[::step] if s is not None)
    w(f"`weir_adaptive_limit` / learned ideal latency over the run (every {step * 0.25:.1f} s): {series}\n")
    report = "\n".join(out)
    if args.series:
        # For bench/adaptive/plot.py: the phases, the adaptive Weirs' state over time and each
        # adaptive upstream's own latencies (seconds since the start of the load).
        with open(args.series, "w") as f:
            json.dump({
                "service_s": SERVICE,
                "phases": [(phase, start - t0, stop - t0, k, rate) for (phase, start, stop, k, rate) in bounds],
                "adaptive": [(t, s) for t, s in limits if s is not None],
                "fleet": [(t, pair) for t, pair in fleet_limits if all(x is not None for x in pair)],
                "upstream": {name: [(done - t0, lat) for (done, lat) in upstreams[name].records]
                             for name in ("adaptive", "adaptive, fleet of 2")},
                "served": {name: [(sent - t0, status, lat) for (sent, _, status, lat) in clients[name].results]
                           for name in ("adaptive", "adaptive, fleet of 2")},
            }, f)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="every phase a third as long (< 60 s in all)")
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    p.add_argument("--weir", default=os.path.join(target, "debug", "weir"),
                   help="the weir binary (default: the debug build; behaviour, not speed, is measured)")
    p.add_argument("--out", help="also write the report here")
    p.add_argument("--series", help="write the time series for bench/adaptive/plot.py here (JSON)")
    args = p.parse_args()
    if not os.path.exists(args.weir):
        sys.exit(f"no weir binary at {args.weir}: cargo build first")
    main_run(args)


if __name__ == "__main__":
    main()
