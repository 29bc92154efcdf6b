"""Phase 3, Redis cost: the redis-benchmark ceiling of lua/limit_req.lua with Weir's own arguments."""

from __future__ import annotations

import csv
import io
import subprocess

from .common import LUA_SCRIPT, REPO_DIR, log
from .procs import http_get
from .redis_client import capture_eval, rand_keys, redis_delta


class RedisCost:
    """Part of `Bench`: what a decision costs Redis at most."""

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
            call = capture_eval(self.redis_port,
                                lambda i: http_get(port, xff=f"10.251.0.{1 + i % 200}"))
            calls[zones] = rand_keys(call, "rb")
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
