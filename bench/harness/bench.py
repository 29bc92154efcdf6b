"""The bench: targets, start-up, and the whole run, made of the parts in the other modules."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

from .common import REPO_DIR, BenchError, log
from .configs import nginx_conf, weir_toml
from .fleet import Fleet
from .memory import Memory
from .model import Row, Target
from .procs import Proc, Procs, free_port, http_get, wait_port
from .profile import Profile
from .redis_client import Redis, redis_delta
from .redis_cost import RedisCost
from .report import render_markdown, rows_json, summarize, targets
from .throughput import Throughput
from .wrk_runs import WrkRuns


class Bench(WrkRuns, Throughput, Profile, RedisCost, Memory, Fleet):
    """One benchmark run: its settings, targets, processes and results; each phase is a part."""

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

    def fail(self, msg: str) -> None:
        log(f"FAILED: {msg}")
        self.failures.append(msg)

    def warn(self, msg: str) -> None:
        """Something that makes a number doubtful without failing the run."""
        log(f"WARNING: {msg}")
        self.warnings.append(msg)

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
