"""One measured wrk run, with the CPU, core, Redis and log counters around it."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time

from .common import DISTURBED_PCT, WRK_SCRIPT, BenchError, log
from .model import Target
from .procs import record_pid
from .procstat import core_busy, core_times, cpu_seconds, ctx_switches, ours_delta, per_pid_cpu, task_cpu_s
from .redis_client import redis_delta


class WrkRuns:
    """Part of `Bench`: wrk runs and their measurements."""

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
