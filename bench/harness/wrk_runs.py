"""One measured wrk run, with the CPU, core, Redis and log counters around it."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import time

from .common import DISTURBED_PCT, WRK_SCRIPT, BenchError, log
from .metrics import BATCH_METRIC, scrape_metrics, total
from .model import Target
from .procs import record_pid
from .procstat import core_busy, core_times, cpu_seconds, ctx_switches, ours_delta, per_pid_cpu, task_cpu_s
from .redis_client import redis_delta


class WrkRuns:
    """Part of `Bench`: wrk runs and their measurements."""

    def wrk(self, port: int, duration: int, conns: int, env: dict | None = None,
            cpus: str | None = None, background: bool = False, path: str = "/",
            scheme: str = "http"):
        argv = ["taskset", "-c", cpus or self.load_cpu, "wrk", "-t1", f"-c{conns}",
                f"-d{duration}s", "--timeout", "5s", "-s", str(WRK_SCRIPT),
                f"{scheme}://127.0.0.1:{port}{path}"]
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

    def h2load(self, port: int, duration: int, conns: int) -> dict:
        """One h2load run (HTTP/2 over TLS, ALPN h2): conns / H2_STREAMS connections with
        H2_STREAMS concurrent streams each, one thread, on the load CPU. Returns the fields of a
        wrk result that h2load has (no latency percentiles: it prints min/max/mean)."""
        clients = max(1, conns // H2_STREAMS)
        argv = ["taskset", "-c", self.load_cpu, "h2load", "-t1", f"-c{clients}",
                f"-m{H2_STREAMS}", "-D", str(duration), "-H", "X-Forwarded-For: 10.0.0.1",
                f"https://127.0.0.1:{port}/"]
        popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        record_pid(self.procs.pidfile, popen.pid)
        try:
            out, err = popen.communicate(timeout=duration + 30)
        except subprocess.TimeoutExpired:
            popen.kill()
            out, err = popen.communicate()
        return parse_h2load(out, err, popen.returncode)

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
                extra_env: dict | None = None, key_offset: int = 0, warm: bool = True,
                tool: str = "wrk") -> dict:
        """(Warm up, then) one measured wrk (or h2load) run with CPU, core, Redis and Weir
        metrics counters around it."""
        env = {"WRK_KEYS": str(keys), "WRK_KEY_OFFSET": str(key_offset)}
        env.update(extra_env or {})

        def load(seconds: int) -> dict:
            if tool == "h2load":
                return self.h2load(target.port, seconds, conns)
            return self.wrk(target.port, seconds, conns, env, scheme=target.scheme)

        self.wait_quiet()
        if warm and self.warmup:
            load(self.warmup)
        pids = target.pids()
        up_pids = self.targets["upstream"].pids()
        ex = self.procs.ours()
        o0, q0 = task_cpu_s(), per_pid_cpu(ex)
        w0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        logs0 = {p.log_path: p.log_path.stat().st_size for p in target.procs}
        r0, c0, u0, k0 = (self.redis.snapshot(), cpu_seconds(pids), cpu_seconds(up_pids),
                          core_times())
        x0 = ctx_switches(pids)
        m0 = self.weir_metrics(target)
        t0 = time.time()
        res = load(duration)
        wall = time.time() - t0
        m1 = self.weir_metrics(target)
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
        logged, access_lines = [], 0
        for path, size in logs0.items():
            with open(path, "rb") as f:
                f.seek(size)
                text = f.read().decode(errors="replace")
            for ln in text.splitlines():
                if "weir::access" in ln:  # row 4a's access log: counted, not read
                    access_lines += 1
                elif ln.strip():
                    logged.append(ln)
        # wrk and h2load close their connections with requests in flight when they stop: Pingora
        # logs those as "Downstream ConnectionClosed" / "Downstream H2Error". And wrk sends the
        # address as TLS SNI, which rustls warns about. Not problems of the proxy; counted apart.
        hangups = [ln for ln in logged if any(b in ln for b in BENIGN_LOG)]
        logged = [ln for ln in logged if not any(b in ln for b in BENIGN_LOG)]
        store_failures = sum(1 for ln in logged if "limit store" in ln)  # failed, or circuit open
        # Other load: task CPU of the whole machine minus ours (servers, this script, wrk).
        other = max(0.0, (o1 - o0) - ours_delta(q0, q1) - wrk_cpu)
        # Decisions that reached Redis: EVALSHA calls, or, once Weir coalesces decisions into one
        # call, the decisions its weir_redis_batch_size histogram counted.
        batched = None
        if m0 and m1:
            b0, b1 = total(m0, f"{BATCH_METRIC}_sum"), total(m1, f"{BATCH_METRIC}_sum")
            # An empty histogram (`coalesce = false`): every decision was its own EVALSHA.
            if b0 is not None and b1 is not None and b1 > b0:
                batched = b1 - b0
        failed = sum(v for k, v in rd["failed"].items() if k in ("evalsha", "eval"))
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
            "redis_decisions_per_req": (batched / n) if batched is not None else evals / n,
            "redis_batched_decisions": batched,
            "redis_failed_calls": failed,
            "redis_failed": rd["failed"],
            # Redis CPU per request that Redis decided (the others were decided by the failure
            # policy): µs per decision.
            "redis_cpu_us_per_req": (rd["cpu_s"] * 1e6 / (batched if batched else evals)
                                     if (batched or evals) else None),
            "redis_inner_cmds_per_req": (sum(rd["calls"].values()) - evals) / n,
            "redis_cpu_s": round(rd["cpu_s"], 3),
            "redis_cpu_ms_per_1k": (rd["cpu_s"] * 1e3 / evals * 1000) if evals else None,
            "admitted_pct": 100.0 * (res["requests"] - res["errors"]["status"]) / n,
            "proxy_log_lines": len(logged),
            "proxy_log_sample": [ln[:300] for ln in logged[:3]],
            "proxy_log_store_failures": store_failures,
            "proxy_log_client_hangups": len(hangups),
            "proxy_access_log_lines": access_lines,
            "tool": tool,
        })
        if logged:
            log(f"  the proxy logged {len(logged)} line(s), e.g. {logged[0][:200]}")
        if res["other_load_pct"] > 10:
            log(f"  note: other processes used {res['other_load_pct']:.0f}% of a core meanwhile")
        return res

    def weir_metrics(self, target: Target) -> dict | None:
        if not target.admin:
            return None
        try:
            return scrape_metrics(target.admin)
        except OSError:
            return None

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


BENIGN_LOG = ("Downstream ConnectionClosed", "Downstream H2Error",
              "Illegal SNI extension: ignoring IP address")

# h2load: streams per connection (64 connections of wrk = 16 h2 connections x 4 streams).
H2_STREAMS = 4
_UNITS_US = {"us": 1.0, "ms": 1e3, "s": 1e6}


def parse_h2load(out: str, err: str, rc: int | None) -> dict:
    """h2load's summary as a wrk-like result: requests (done), duration, errors, status counts,
    latency mean and max (µs; no percentiles)."""
    fin = re.search(r"finished in ([\d.]+)(ms|s),", out)
    req = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                    r"(\d+) failed, (\d+) errored, (\d+) timeout", out)
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if not (fin and req and codes):
        raise BenchError(f"h2load gave no result (exit {rc}): {out[-500:]} {err[-300:]}")
    secs = float(fin.group(1)) / (1000 if fin.group(2) == "ms" else 1)
    done, failed, errored, timeout = (int(req.group(i)) for i in (3, 5, 6, 7))
    ok2xx, c429 = int(codes.group(1)), 0
    lat = re.search(r"time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+"
                    r"([\d.]+)(us|ms|s)", out)

    def us(i: int):
        return float(lat.group(i)) * _UNITS_US[lat.group(i + 1)] if lat else None

    res = {
        "requests": done, "duration_us": int(secs * 1e6), "bytes": 0,
        "errors": {"connect": 0, "read": errored, "write": 0, "timeout": timeout,
                   "status": done - ok2xx},
        "latency_us": {"mean": us(5), "max": us(3), "p50": None, "p75": None, "p90": None,
                       "p99": None, "p99_9": None},
        "status": {"200": ok2xx, "429": c429, "other": done - ok2xx},
        "h2load_failed": failed,
    }
    res["rps"] = done / secs if secs else 0.0
    return res
