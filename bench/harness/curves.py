"""The cost curves (issue 40 item 3, bench/curves.sh): how Weir's cost grows as the work grows,
next to nginx where nginx can do the same. Five parts, each a list of points:

1. keys: RSS per key of the memory store (1M and 10M keys) against nginx's limit_req zone;
2. connections: RSS per idle HTTP/1.1 keep-alive connection and per open HTTP/2 stream;
3. zones: CPU per request with 1, 3 and 8 zones per route (memory store, Redis, nginx);
4. threads: req/s with threads = 2 against threads = 1 (nginx: worker_processes);
5. cluster: Redis Cluster decisions per second with 1 and 3 masters (and one plain Redis).
"""

from __future__ import annotations

import json
import resource
import shutil
import socket
import subprocess
import time
import traceback

from .bench import Bench
from .clients import (H2Conn, SilentUpstream, close_all, open_idle_h1, poll, probe)
from .common import BenchError, log
from .configs import merge_settings, weir_toml
from .curves_report import render_curves, write_plots
from .metrics import scrape_metrics, total
from .model import Target
from .procs import Proc, free_port, http_get, wait_port
from .procstat import rss_kib
from .redis_client import Redis, redis_delta

PARTS = ("keys", "connections", "zones", "threads", "cluster")
ZONE_COUNTS = (1, 3, 8)
# Each key's state must outlive the fill: 1 request per hour (Weir); nginx's slowest rate is
# 1r/m, and it drops states idle for 60 s (two per new request), so its fills stay under 60 s.
SLOW_RATE_WEIR, SLOW_RATE_NGINX = "1r/h", "1r/m"
WARM_KEYS = 1000  # keys of the warm-up before a memory curve's start point


class Curves(Bench):
    """`bench/curves.sh`: the cost curves, on the same servers and helpers as the bench."""

    def sizes(self) -> dict:
        if self.quick:
            return {"weir_keys": [25_000, 50_000, 100_000], "nginx_keys": [50_000, 100_000],
                    "nginx_zones_mb": [1, 2], "idle_conns": 500, "h2_conns": 10,
                    "h2_streams": 50}
        return {"weir_keys": [250_000, 500_000, 1_000_000, 2_000_000, 3_000_000, 4_000_000,
                              5_000_000, 6_000_000, 7_000_000, 8_000_000, 9_000_000,
                              10_000_000],
                "nginx_keys": [250_000, 500_000, 750_000, 1_000_000],
                "nginx_zones_mb": [1, 4, 16], "idle_conns": 5000, "h2_conns": 20,
                "h2_streams": 100}

    def run(self) -> int:
        t_start = time.time()
        wanted = [p for p in (self.args.parts or ",".join(PARTS)).split(",") if p]
        unknown = set(wanted) - set(PARTS)
        if unknown:
            raise BenchError(f"--parts: unknown {sorted(unknown)}; parts: {', '.join(PARTS)}")
        self.results["meta"] = self.meta()
        self.results["meta"]["sizes"] = self.sizes()
        # Thousands of idle connections and held streams: the fd limit up to the hard limit, for
        # this process (the clients, the silent upstream) and the servers it starts.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        self.results["meta"]["fd_limit"] = hard

        def work():
            self.start_base()
            for part in wanted:
                log(f"curve: {part}")
                t0 = time.time()
                try:
                    self.results[part] = getattr(self, f"curve_{part}")()
                except BenchError as e:
                    self.fail(f"{part}: {e}")
                except Exception as e:  # a harness bug: the other curves still run
                    self.fail(f"{part}: harness error: {e!r}\n{traceback.format_exc()}")
                log(f"curve {part} took {time.time() - t0:.0f} s")

        self.guarded(work)
        self.results["meta"]["elapsed_s"] = round(time.time() - t_start, 1)
        self.results["failures"] = self.failures
        self.results["warnings"] = self.warnings
        self.results["ok"] = not self.failures
        return self.write_curves(t_start)

    def write_curves(self, t_start: float) -> int:
        stem = "curves-quick" if self.quick else "curves-latest"
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"{stem}.json").write_text(json.dumps(self.results, indent=2) + "\n")
        plots = write_plots(self.results, self.out, stem)
        md = render_curves(self.results, plots)
        (self.out / f"{stem}.md").write_text(md)
        print(md)
        log(f"wrote {self.out}/{stem}.json and {stem}.md in {time.time() - t_start:.0f} s")
        if self.failures:
            log(f"{len(self.failures)} failure(s):\n  " + "\n  ".join(self.failures))
            return 1
        return 0

    # ---- helpers -------------------------------------------------------------------------

    def weir_curve(self, name: str, spec: dict, *, cpus: str | None = None,
                   admin: bool = False, settings: list | None = None,
                   upstream_port: int = 0) -> Target:
        """A Weir of `spec` (weir_toml's arguments), optionally with an admin port (/metrics)
        and `settings` merged in ([server] options the generator has no argument for)."""
        port = free_port()
        admin_port = free_port() if admin else 0
        spec = dict(spec)
        spec.setdefault("access_log", self.access_log)
        spec.setdefault("redis_port", self.redis_port)
        toml = weir_toml(port, upstream_port or self.upstream_port, admin_port=admin_port,
                         **spec)
        if settings:
            toml = merge_settings(toml, settings)
        proc = self.start_weir(f"weir-{name}", toml, port, cpus=cpus)
        if admin_port:
            wait_port(proc, admin_port, what="admin")
        target = Target(port, [proc], admin=admin_port)
        self.targets[name] = target
        return target

    def nginx_curve(self, name: str, role: str, *, cpus: str | None = None, **kw) -> Target:
        port = free_port()
        kw.setdefault("upstream_port", self.upstream_port)
        target = Target(port, [self.start_nginx(name, role, port, cpus=cpus, **kw)], nginx=True)
        self.targets[name] = target
        return target

    def stop_target(self, name: str) -> None:
        target = self.targets.pop(name, None)
        if target:
            self.procs.stop(*target.procs)

    @staticmethod
    def rss_of(target: Target) -> int:
        """VmRSS of the proxy in KiB: Weir's process, or nginx's workers (the master does not
        grow; the workers' RSS counts the zone's shared pages they touched)."""
        pids = target.pids()
        if target.nginx:
            pids = [p for p in pids if p != target.procs[0].pid]
        return sum(rss_kib(p).get("VmRSS", 0) for p in pids)

    def fill(self, target: Target, first: int, until: int, rate: float,
             cpus: str) -> tuple[int, float, int]:
        """wrk with fresh addresses (sequential, from `first`) until about `until` requests:
        (the next unused address, the last rate, limited responses)."""
        sent, limited = first, 0
        while sent < until:
            dur = max(1, min(30, int((until - sent) / max(rate, 1000))))
            res = self.wrk(target.port, dur, self.conns,
                           {"WRK_SEQUENTIAL": "1", "WRK_KEYS": "16000000",
                            "WRK_KEY_OFFSET": str(sent)}, cpus=cpus)
            if res["requests"] == 0:
                raise BenchError(f"wrk made no request to {target.port}: {res['errors']}")
            sent += res["requests"]
            rate = res["rps"]
            limited += res["errors"]["status"]
        return sent, rate, limited

    # ---- 1. memory per key ---------------------------------------------------------------

    def curve_keys(self) -> dict:
        out = {}
        for name, fn in (("weir", self.keys_weir), ("nginx_rss", self.keys_nginx_rss),
                         ("nginx_zone", self.keys_nginx_zone)):
            try:
                out[name] = fn()
            except BenchError as e:
                self.fail(f"keys ({name}): {e}")
        return out

    def keys_weir(self) -> dict:
        """A memory-store Weir (1 zone keyed on the client address, 1 r/h, burst 10, room for
        every key) filled with distinct addresses; RSS and the store's key count at each point."""
        checkpoints = self.sizes()["weir_keys"]
        cpus = self.both_cpus()
        # threads = 2 on both cores: the fill is twice as fast; memory per key is the store's.
        target = self.weir_curve(
            "keys", dict(zones=1, rate=SLOW_RATE_WEIR, burst=10, threads=2,
                         max_keys=max(checkpoints) * 2), cpus=cpus, admin=True)
        self.warm_connections(target, cpus)
        base = self.rss_of(target)
        points = [{"keys": self.memory_keys(target), "requests": 0, "rss_kib": base}]
        sent, rate, limited = 0, 20_000.0, 0
        t0 = time.time()
        for goal in checkpoints:
            sent, rate, lim = self.fill(target, sent, goal, rate, cpus)
            limited += lim
            time.sleep(0.3)
            points.append({"keys": self.memory_keys(target), "requests": sent,
                           "rss_kib": self.rss_of(target),
                           "hwm_kib": rss_kib(target.procs[0].pid).get("VmHWM"),
                           "seconds": round(time.time() - t0, 1), "fill_rps": round(rate)})
            log(f"  weir: {points[-1]['keys']:,} keys, RSS {points[-1]['rss_kib'] / 1024:.1f} MiB")
        self.stop_target("keys")
        if limited:
            self.check_failed(f"keys (weir): {limited} fill requests were limited (a key seen "
                              "twice within its burst is not; the fill is wrong)")
        return {"points": points, "limited": limited,
                "config": (self.confdir / "weir-keys.toml").read_text()}

    def warm_connections(self, target: Target, cpus: str) -> None:
        """One second of the fill's load on a few keys of their own (addresses from 15M up), so
        that the start point already has wrk's connections, their buffers and the upstream pool:
        what the points add is then the keys'."""
        self.wrk(target.port, 1, self.conns, {"WRK_KEYS": str(WARM_KEYS),
                                              "WRK_KEY_OFFSET": "15000000"}, cpus=cpus)
        time.sleep(0.3)

    def memory_keys(self, target: Target) -> int | None:
        try:
            v = total(scrape_metrics(target.admin), "weir_memory_keys")
        except OSError:
            return None
        return int(v) if v is not None else None

    def keys_nginx_rss(self) -> dict:
        """nginx limit_req (1 worker, one zone large enough never to evict) filled the same way:
        the worker's RSS (the zone's shared pages it touched) at each point. Within 60 s, since
        nginx drops states idle that long."""
        checkpoints = self.sizes()["nginx_keys"]
        cpus = self.both_cpus()
        target = self.nginx_curve("nginx_keys", "limit", rate=SLOW_RATE_NGINX, burst=10,
                                  zone_size=f"{max(checkpoints) * 400 // 1_000_000 + 8}m",
                                  cpus=self.sut_cpu)
        self.warm_connections(target, cpus)
        base = self.rss_of(target)
        points = [{"keys": WARM_KEYS, "rss_kib": base}]
        sent, rate, limited = 0, 40_000.0, 0
        t0 = time.time()
        for goal in checkpoints:
            sent, rate, lim = self.fill(target, sent, goal, rate, cpus)
            limited += lim
            points.append({"keys": sent, "rss_kib": self.rss_of(target),
                           "seconds": round(time.time() - t0, 1), "fill_rps": round(rate)})
            log(f"  nginx: {sent:,} keys, worker RSS {points[-1]['rss_kib'] / 1024:.1f} MiB")
        took = time.time() - t0
        self.stop_target("nginx_keys")
        if took > 55:
            self.warn(f"keys (nginx RSS): the fill took {took:.0f} s; states idle for 60 s may "
                      "have been dropped, so the last points undercount")
        return {"points": points, "limited": limited, "fill_seconds": round(took, 1)}

    def keys_nginx_zone(self) -> list[dict]:
        """How many states an nginx zone of S MiB holds: fill it with twice what its docs promise
        (8 thousand 128-byte states per MiB on 64-bit), then ask again in reverse order, one
        pipelined connection: a state still in the zone rejects (burst 0), an evicted one passes
        (and evicts the least recently used, which was asked already)."""
        out = []
        for mb in self.sizes()["nginx_zones_mb"]:
            name = f"nginx_zone_{mb}m"
            target = self.nginx_curve(name, "limit", rate=SLOW_RATE_NGINX, burst=0,
                                      zone_size=f"{mb}m")
            keys = mb * 16_384
            first = 1_000_000 * mb  # fresh addresses per zone
            t0 = time.time()
            fill_counts = probe(target.port, first, keys)
            again = probe(target.port, first, keys, descending=True)
            took = time.time() - t0
            self.stop_target(name)
            held = again.get(429, 0)
            out.append({"zone_mib": mb, "keys_offered": keys, "fill_statuses": fill_counts,
                        "probe_statuses": again, "states_held": held,
                        "bytes_per_state": mb * 1024 * 1024 / held if held else None,
                        "seconds": round(took, 1)})
            log(f"  nginx zone {mb} MiB: {held:,} states")
            if fill_counts.get(200, 0) != keys:
                self.check_failed(f"keys (nginx zone {mb}m): the fill was answered "
                                  f"{fill_counts}, not {keys} × 200")
            if not held or held >= keys:
                self.check_failed(f"keys (nginx zone {mb}m): {held} of {keys} states held: the "
                                  "zone never filled or never evicted")
        return out

    # ---- 2. memory per connection and per stream -----------------------------------------

    def curve_connections(self) -> dict:
        sizes = self.sizes()
        out = {"h1_idle": {}, "h2": {}}
        server = [("server", "max_connections", "50000")]
        # Idle keep-alive connections (HTTP/1.1): Weir passthrough and nginx proxy_pass.
        weir = self.weir_curve("conn_h1", dict(zones=0), settings=server)
        nginx = self.nginx_curve("nginx_conn_h1", "proxy")
        for name, target in (("weir", weir), ("nginx", nginx)):
            out["h1_idle"][name] = self.idle_h1(target, sizes["idle_conns"])
            self.stop_target("conn_h1" if name == "weir" else "nginx_conn_h1")
        # Plain Pingora (examples/pingora_passthrough, when run.sh built it): whose cost is it?
        if self.pingora:
            port = free_port()
            proc = self.procs.start("pingora_conn_h1", [self.pingora, f"127.0.0.1:{port}",
                                                        f"127.0.0.1:{self.upstream_port}", "1"],
                                    self.sut_cpu, env={"RUST_LOG": "warn"})
            wait_port(proc, port)
            self.targets["pingora_conn_h1"] = Target(port, [proc])
            out["h1_idle"]["pingora"] = self.idle_h1(self.targets["pingora_conn_h1"],
                                                     sizes["idle_conns"])
            self.stop_target("pingora_conn_h1")
        # HTTP/2 streams held open: the upstream never answers.
        silent = SilentUpstream()
        try:
            weir = self.weir_curve("conn_h2", dict(zones=0),
                                   settings=server + [("server", "h2c", "true")],
                                   upstream_port=silent.port)
            out["h2"]["weir"] = self.h2_streams(weir, silent, sizes["h2_conns"],
                                                sizes["h2_streams"])
            self.stop_target("conn_h2")
            poll(lambda: silent.held() == 0, 20, "the upstream's held requests closed")
            nginx = self.nginx_curve("nginx_conn_h2", "proxy", upstream_port=silent.port,
                                     h2c=True)
            out["h2"]["nginx"] = self.h2_streams(nginx, silent, sizes["h2_conns"],
                                                 sizes["h2_streams"])
            self.stop_target("nginx_conn_h2")
        finally:
            silent.close()
        return out

    def idle_h1(self, target: Target, n: int) -> dict:
        http_get(target.port)
        time.sleep(0.3)
        before = self.rss_of(target)
        socks = open_idle_h1(target.port, n)
        try:
            time.sleep(0.5)
            after = self.rss_of(target)
        finally:
            close_all(socks)
        per = (after - before) * 1024 / n
        log(f"  h1 idle: {per:,.0f} B per connection")
        return {"connections": n, "rss_before_kib": before, "rss_after_kib": after,
                "bytes_per_connection": per}

    def h2_streams(self, target: Target, silent: SilentUpstream, nconns: int,
                   per_conn: int) -> dict:
        H2Conn(target.port).close()  # warms the process (its upstream never answers a GET)
        time.sleep(0.3)
        r0 = self.rss_of(target)
        conns = []
        try:
            for _ in range(nconns):
                conns.append(H2Conn(target.port))
            time.sleep(0.5)
            r1 = self.rss_of(target)
            held0 = silent.held()
            for c in conns:
                c.open_streams(per_conn)
            want = held0 + nconns * per_conn
            try:
                poll(lambda: silent.held() >= want, 30,
                     f"{want - held0} streams reaching the upstream")
            except BenchError as e:
                self.warn(f"connections (h2): {e}; {silent.held() - held0} arrived")
            time.sleep(0.5)
            r2 = self.rss_of(target)
            streams = silent.held() - held0
        finally:
            for c in conns:
                c.close()
        res = {"connections": nconns, "streams_opened": nconns * per_conn,
               "streams_held_upstream": streams, "rss_before_kib": r0,
               "rss_connections_kib": r1, "rss_streams_kib": r2,
               "bytes_per_connection": (r1 - r0) * 1024 / nconns,
               "bytes_per_stream": (r2 - r1) * 1024 / streams if streams else None}
        log(f"  h2: {res['bytes_per_connection']:,.0f} B per connection, "
            f"{res['bytes_per_stream'] or 0:,.0f} B per stream ({streams} held)")
        return res

    # ---- 3. CPU per request against zones per route --------------------------------------

    def curve_zones(self) -> dict:
        names = []
        for n in ZONE_COUNTS:
            self.weir_curve(f"mem{n}", dict(zones=n))
            self.weir_curve(f"redis{n}", dict(zones=n, store="redis"), admin=True)
            self.nginx_curve(f"nginx{n}", "limit", zones=n)
            names += [f"mem{n}", f"redis{n}", f"nginx{n}"]
        runs: dict[str, list[dict]] = {n: [] for n in names}
        for rep in range(self.reps):
            for name in names:
                res = self.measure_retrying(self.targets[name], 10_000, self.duration, self.conns,
                                            warm=(rep == 0))
                runs[name].append(slim(res))
                if res["admitted_pct"] < 99:
                    self.check_failed(f"zones: {name} limited {100 - res['admitted_pct']:.1f}% "
                                      "of an all-passing load")
                if name.startswith("redis") and res["redis_decisions_per_req"] < 0.2:
                    self.check_failed(f"zones: {name} made {res['redis_decisions_per_req']:.2f} "
                                      "Redis decisions per request")
        for name in names:
            self.stop_target(name)
        return {"runs": runs}

    # ---- 4. threads = 2 against threads = 1 ----------------------------------------------

    def curve_threads(self) -> dict:
        both = self.both_cpus()
        specs = [("weir_t1", lambda: self.weir_curve("weir_t1", dict(zones=1))),
                 ("weir_t2", lambda: self.weir_curve("weir_t2", dict(zones=1, threads=2),
                                                     cpus=both)),
                 ("nginx_w1", lambda: self.nginx_curve("nginx_w1", "limit")),
                 ("nginx_w2", lambda: self.nginx_curve("nginx_w2", "limit", workers=2,
                                                       cpus=both))]
        for _, start in specs:
            start()
        runs: dict[str, list[dict]] = {name: [] for name, _ in specs}
        for rep in range(self.reps):
            for name, _ in specs:
                res = self.measure_retrying(self.targets[name], 10_000, self.duration, self.conns,
                                            warm=(rep == 0))
                runs[name].append(slim(res))
        for name, _ in specs:
            self.stop_target(name)
        return {"runs": runs}

    # ---- 5. Redis Cluster decisions per second -------------------------------------------

    def curve_cluster(self) -> dict:
        """Weir (threads = 2 on both cores, 1 zone, all passing) on a plain Redis, a 1-master
        and a 3-master Cluster (no replicas); Redis nodes and wrk on the load CPU."""
        both = self.both_cpus()
        out = {}
        setups = [("plain", None), ("cluster1", 1), ("cluster3", 3)]
        for name, masters in setups:
            nodes: list[tuple[Proc, int]] = []
            try:
                if masters is None:
                    ports = [self.redis_port]
                    url = f"redis://127.0.0.1:{self.redis_port}/0"
                else:
                    nodes = self.start_cluster(name, masters)
                    ports = [p for _, p in nodes]
                    url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)
                target = self.weir_curve(
                    f"weir_{name}", dict(zones=1, store="redis", threads=2), cpus=both,
                    admin=True, settings=[("store", "url", f'"{url}"')])
                clients = [Redis(p) for p in ports]
                runs = []
                for rep in range(self.reps):
                    s0 = [c.snapshot() for c in clients]
                    res = self.measure_retrying(target, 10_000, self.duration, self.conns,
                                                warm=(rep == 0))
                    s1 = [c.snapshot() for c in clients]
                    deltas = [redis_delta(a, b) for a, b in zip(s0, s1)]
                    wall = res["wall_s"]
                    run = slim(res)
                    run["nodes"] = [{"port": p, "cpu_pct": round(100 * d["cpu_s"] / wall, 1),
                                     "evalsha": d["calls"].get("evalsha", 0)}
                                    for p, d in zip(ports, deltas)]
                    run["redis_cpu_s_all"] = round(sum(d["cpu_s"] for d in deltas), 3)
                    runs.append(run)
                    if res["admitted_pct"] < 99:
                        self.check_failed(f"cluster: {name} limited an all-passing load")
                    if not any(n["evalsha"] for n in run["nodes"]):
                        self.check_failed(f"cluster: {name}: no EVALSHA reached Redis")
                for c in clients:
                    c.close()
                self.stop_target(f"weir_{name}")
                out[name] = {"masters": masters or 1, "cluster": masters is not None,
                             "runs": runs}
            finally:
                if nodes:
                    self.procs.stop(*[p for p, _ in nodes])
        return out

    def start_cluster(self, name: str, masters: int) -> list[tuple[Proc, int]]:
        nodes = []
        for i in range(masters):
            port = cluster_port()
            d = self.workdir / f"{name}-{port}"
            d.mkdir(parents=True, exist_ok=True)
            proc = self.procs.start(
                f"{name}-{i}",
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(d), "--cluster-enabled", "yes",
                 "--cluster-config-file", f"nodes-{port}.conf", "--cluster-node-timeout", "5000"],
                self.redis_cpu)
            wait_port(proc, port)
            nodes.append((proc, port))
        cli = shutil.which("redis-cli") or "redis-cli"
        if masters == 1:
            port = nodes[0][1]
            cp = subprocess.run([cli, "-p", str(port), "CLUSTER", "ADDSLOTSRANGE", "0", "16383"],
                                capture_output=True, text=True, timeout=30)
        else:
            cp = subprocess.run([cli, "--cluster", "create",
                                 *[f"127.0.0.1:{p}" for _, p in nodes],
                                 "--cluster-replicas", "0", "--cluster-yes"],
                                capture_output=True, text=True, timeout=60,
                                stdin=subprocess.DEVNULL)
        if cp.returncode != 0 or "ERR" in cp.stdout:
            raise BenchError(f"cluster {name}: {cp.stdout[-400:]} {cp.stderr[-400:]}")

        def ready() -> bool:
            for _, p in nodes:
                c = Redis(p)
                try:
                    info = c.cmd("CLUSTER", "INFO").decode()
                finally:
                    c.close()
                if "cluster_state:ok" not in info:
                    return False
            return True

        poll(ready, 30, f"cluster {name}: cluster_state:ok on every node")
        return nodes


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise BenchError("no free port pair for a cluster node")


def slim(res: dict) -> dict:
    """What the curves keep of a measured run."""
    keys = ("requests", "rps", "proxy_cpu_s", "proxy_cpu_s_per_1k", "proxy_core_util_pct",
            "wrk_cpu_s", "wall_s", "core_busy_pct", "other_load_pct", "admitted_pct",
            "redis_cpu_s", "redis_cpu_us_per_req", "redis_evalsha_per_req",
            "redis_decisions_per_req", "latency_us")
    out = {k: res.get(k) for k in keys}
    n = max(res.get("requests") or 1, 1)
    out["proxy_cpu_us_per_req"] = (res.get("proxy_cpu_s") or 0) * 1e6 / n
    out["redis_cpu_us_per_request"] = (res.get("redis_cpu_s") or 0) * 1e6 / n
    return out

