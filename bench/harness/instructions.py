"""`--instructions`: instructions per request of the proxy process, counted by valgrind's callgrind.

Wall-clock rows on a shared 2-core VM vary by ±20 % between repetitions; instruction counts under
callgrind repeat to well under 1 %. Each selected row starts its proxy alone under
`valgrind --tool=callgrind` (nginx with `master_process off`: one process), with the upstream and
Redis native as in the throughput rows and the same configs, warms it up with wrk, then measures
two windows on the same process: `callgrind_control -z`, wrk for SHORT_S (then LONG_S) seconds,
`callgrind_control -d`, the dump's total Ir. Every wrk run opens and closes its connections and
stops with requests in flight, a cost per run, not per request; the difference of the two windows
cancels it. A third window without load (IDLE_S) gives what the process does per second on its own
(timer threads: 0.1-0.5 M instructions a second under valgrind), which is taken out too, since the
rate under valgrind, and so that background's share per request, depends on the machine's load:

    instructions per request = (Ir(long) - Ir(short) - background/s x (t(long) - t(short)))
                               / (requests(long) - requests(short))

Only user-space instructions of the proxy process are counted (all its threads); the kernel's work
(syscalls, TCP) is not: a separate native run under `strace -c -f` gives syscalls per request.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .common import BENCH_DIR, BenchError, log
from .configs import OPENRESTY_MODULE, OPENRESTY_ROWS, nginx_conf, write_config
from .metrics import BATCH_METRIC, scrape_metrics, total
from .model import Row
from .procs import Proc, free_port, record_pid, wait_port
from .redis_client import redis_delta

# The rows counted (by kind: a variant's rows 2-5 count too).
INS_KINDS = ("pingora", "pingora_fwd", "passthrough", "memory", "redis", "redis_log", "redis3", "nginx_proxy",
             "nginx_limit", *OPENRESTY_ROWS)
WEIR_KINDS = ("passthrough", "memory", "redis", "redis_log", "redis3")
INS_CONNS = 16        # wrk connections (the proxy is the bottleneck under valgrind anyway)
WARMUP_S = 3          # code translated, connections to the upstream and Redis open
SHORT_S, LONG_S = 2, 10
IDLE_S = 3            # the idle window: the process's background (timer ticks) per second
# Saturation: the proxy on a CPU or waiting for one (schedstat) at least this share of the long
# window; below, the row is run again (at most MAX_RETRIES times in a run).
BUSY_PCT = 90
MAX_RETRIES = 4
START_TIMEOUT_S = 120  # valgrind starting a Pingora binary takes several seconds
STRACE_S = 2           # the native run under strace -c
# No --fair-sched=yes: with its ticket lock plain Pingora ran 2-10x slower (~100-500 req/s instead
# of ~1000), left idle between requests, which also counted ~3 % more instructions per request.
# Dumps per function, no line or instruction detail: enough for callgrind_annotate.
CALLGRIND_OPTS = ["--tool=callgrind", "--dump-instr=no", "--dump-line=no"]


class Instructions:
    """Part of `Bench`: the callgrind rows (--instructions)."""

    def phase_instructions(self) -> dict:
        rows = self.instruction_rows()
        if not rows:
            raise BenchError(f"--instructions: no row to count (--rows {self.args.rows!r}; "
                             f"rows: {', '.join(INS_KINDS)}, a variant's as redis@NAME)")
        log(f"instructions: {len(rows)} rows under callgrind, ~25 s each")
        out = []
        retries = MAX_RETRIES
        for row in rows:
            log(f"instructions: {row.label}")
            try:
                res = self.instructions_row(row)
                discarded = []
                # A proxy that waited for requests (wrk or Redis starved by the machine's other
                # load) batched fewer events and counted more per request: run it again.
                while res["proxy_busy_pct"] < BUSY_PCT and retries > 0:
                    retries -= 1
                    log(f"  the proxy was busy only {res['proxy_busy_pct']:.0f}% of the long "
                        "window (not saturated): running the row again")
                    discarded.append({k: res[k] for k in ("ir_per_req", "proxy_busy_pct",
                                                          "rps_under_valgrind")})
                    res = self.instructions_row(row)
                res["discarded"] = discarded
                if res["proxy_busy_pct"] < BUSY_PCT:
                    self.warn(f"instructions {row.id}: the proxy was busy only "
                              f"{res['proxy_busy_pct']:.0f}% of the long window: it waited for "
                              "requests, its count per request is too high")
                out.append(res)
            except BenchError as e:
                self.fail(f"instructions {row.id}: {e}")
            except OSError as e:
                self.fail(f"instructions {row.id}: {e!r}")
        return {"connections": INS_CONNS, "warmup_s": WARMUP_S, "windows_s": [SHORT_S, LONG_S],
                "idle_s": IDLE_S,
                "valgrind": valgrind_version(), "callgrind_options": CALLGRIND_OPTS,
                "strace_s": STRACE_S, "rows": out}

    def instruction_rows(self) -> list[Row]:
        rows = [r for r in self.row_catalog() if (r.kind or r.id) in INS_KINDS]
        if not self.pingora:
            self.skipped["pingora"] = "no examples/pingora_passthrough binary (--pingora)"
            self.skipped["pingora_fwd"] = self.skipped["pingora"]
            rows = [r for r in rows if r.id not in ("pingora", "pingora_fwd")]
        if not OPENRESTY_MODULE.exists():
            self.skipped.update((rid, f"{OPENRESTY_MODULE} missing") for rid in OPENRESTY_ROWS)
            rows = [r for r in rows if r.id not in OPENRESTY_ROWS]
        if "redis_log" not in self.weir_specs():
            self.skipped["redis_log"] = "this build has no [log] access_log setting"
            rows = [r for r in rows if r.id != "redis_log"]
        return self.select_rows(rows)

    # ---- one row ---------------------------------------------------------------------------

    def proxy_argv(self, row: Row, port: int, admin: int) -> tuple[list[str], dict | None, str]:
        """The proxy's command line, environment and name for `row` (configs written to the
        workdir): Weir with the throughput row's config, plain Pingora, or nginx in one process."""
        kind = row.kind or row.id
        if kind in ("pingora", "pingora_fwd"):
            mode = ["forwarded"] if kind == "pingora_fwd" else []
            return ([self.pingora, f"127.0.0.1:{port}", f"127.0.0.1:{self.upstream_port}", "1",
                     *mode], {"RUST_LOG": "warn"}, kind)
        if kind in ("nginx_proxy", "nginx_limit", *OPENRESTY_ROWS):
            root = self.workdir / f"ins-{row.id}"
            root.mkdir(parents=True, exist_ok=True)
            conf = root / "nginx.conf"
            role = {"nginx_proxy": "proxy", "nginx_limit": "limit"}.get(kind, "openresty")
            lua = {}
            if kind in OPENRESTY_ROWS:
                if not self.openresty:
                    self.openresty_call()
                same = OPENRESTY_ROWS[kind]
                lua = dict(lua_dir=BENCH_DIR / "openresty", same_headers=same,
                           lua_config=self.openresty_lua_config(same))
            conf.write_text(nginx_conf(root, port, role=role, upstream_port=self.upstream_port,
                                       **lua))
            return (["nginx", "-p", str(root), "-c", str(conf), "-g",
                     "daemon off; master_process off;"], None, "nginx")
        spec, env = self.weir_specs()[kind]
        variant = next((v for v in self.variants if v.name == row.variant), None)
        toml = self.weir_config(spec, port, admin, variant.settings if variant else None)
        # In the config directory, not next to the logs and dumps: Weir watches its config's
        # directory, and a line written beside it would wake the watcher (and count).
        conf = self.confdir / f"ins-{row.id}.toml"
        write_config(conf, toml)
        binary = (variant.binary if variant and variant.binary else self.weir)
        return [binary, "-c", str(conf)], env or {"RUST_LOG": "warn"}, "weir"

    def openresty_call(self) -> None:
        """Row 8 sends the EVALSHA row 4's Weir sends: a native Weir on Redis, started for the
        capture (start_openresty's way) and stopped."""
        port = free_port()
        toml = self.weir_config(self.weir_specs()["redis"][0], port)
        proc = self.start_weir("weir-capture", toml, port)
        try:
            self.capture_openresty_call(port)
        finally:
            self.procs.stop(proc)

    def instructions_row(self, row: Row) -> dict:
        port = free_port()
        redis_row = row.redis
        admin = free_port() if redis_row and (row.kind or row.id) in WEIR_KINDS else 0
        argv, env, what = self.proxy_argv(row, port, admin)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", row.id)
        vg = ["valgrind", *CALLGRIND_OPTS,
              f"--callgrind-out-file={self.workdir}/cg.{safe}.%p"]
        t0 = time.time()
        proc = self.procs.start(f"cg-{safe}", vg + argv, self.sut_cpu, env=env)
        try:
            wait_port(proc, port, timeout=START_TIMEOUT_S)
            if admin:
                wait_port(proc, admin, timeout=START_TIMEOUT_S)
            started_s = time.time() - t0
            wenv = {"WRK_KEYS": str(row.keys), "WRK_KEY_OFFSET": "0"}
            self.wrk(port, WARMUP_S, INS_CONNS, wenv)
            log_start = proc.log_path.stat().st_size
            short = self.callgrind_window(proc, safe, port, SHORT_S, wenv)
            m0 = scrape_metrics(admin) if admin else None
            r0 = self.redis.snapshot()
            long = self.callgrind_window(proc, safe, port, LONG_S, wenv)
            r1 = self.redis.snapshot()
            m1 = scrape_metrics(admin) if admin else None
            time.sleep(1.0)  # connections closed, requests cut at wrk's stop finished
            idle = self.callgrind_window(proc, safe, port, IDLE_S, None)
            with open(proc.log_path, "rb") as f:  # what the proxy logged in the windows
                f.seek(log_start)
                log_lines = f.read().decode(errors="replace")
        finally:
            self.procs.stop(proc, grace=20.0)
        dn = long["requests"] - short["requests"]
        if dn < 100:
            raise BenchError(f"the long window completed only {dn} requests more than the short "
                             f"one ({short['requests']} vs {long['requests']})")
        raw = (long["ir"] - short["ir"]) / dn
        # What the process does per second without requests (timer threads ticking, ~0.1-0.5 M
        # instructions a second under valgrind for Pingora and Weir): spread over requests it
        # would add background / rate, and the rate under valgrind depends on how busy the
        # machine is (100-700 req/s), so it is taken out.
        background = idle["ir"] / idle["wall_s"]
        per_req = raw - background * (long["wall_s"] - short["wall_s"]) / dn
        # The long window's dump, for `callgrind_annotate <out>/callgrind/<row>.out`.
        keep = self.out / "callgrind" / f"{safe}.out"
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.workdir / long["dump"], keep)
        # And the short one's: a per-function diff of the two (`bench/fndiff.py`) takes the run's
        # fixed cost out of each function as the total does.
        keep_short = keep.with_suffix(".short.out")
        shutil.copyfile(self.workdir / short["dump"], keep_short)
        res = {
            "id": row.id, "label": row.label, "kind": row.kind or row.id, "variant": row.variant,
            "proxy": what, "start_s": round(started_s, 1),
            "ir_per_req": per_req,
            "ir_per_req_with_background": raw,
            "background_ir_per_s": background,
            # What a plain total / requests gives: the run's fixed cost (connections opened and
            # closed, requests cut at wrk's stop) spread over its requests.
            "ir_per_req_long_window": long["ir"] / max(long["requests"], 1),
            "ir_fixed_per_run": long["ir"] - per_req * long["requests"],
            "windows": [short, long, idle],
            "callgrind_dump": str(keep),
            "callgrind_dump_short": str(keep_short),
            "requests": long["requests"] + short["requests"],
            "rps_under_valgrind": long["requests"] / LONG_S,
            "proxy_busy_pct": long["busy_pct"],
        }
        errors = sum(sum(w["errors"].values()) for w in (short, long))
        if errors:
            self.warn(f"instructions {row.id}: {errors} wrk errors ({short['errors']}, "
                      f"{long['errors']})")
        if redis_row:
            res.update(self.redis_window(row, long["requests"], r0, r1, m0, m1))
        # A decision that missed the store's 250 ms under valgrind went to the failure policy:
        # cheaper than a real one.
        stored = [ln for ln in log_lines.splitlines() if "limit store" in ln]
        res["store_failures_logged"] = len(stored)
        if stored:
            self.warn(f"instructions {row.id}: the proxy logged {len(stored)} failed Redis "
                      f"decisions in the windows, e.g. {stored[0][:160]}")
        res["syscalls"] = self.syscalls(row, argv, env, port, admin)
        log(f"  {per_req:,.0f} instructions per request ({dn} requests between the windows, "
            f"{res['rps_under_valgrind']:.0f} req/s under valgrind)")
        return res

    def callgrind_window(self, proc: Proc, safe: str, port: int, seconds: int,
                         env: dict | None) -> dict:
        """Zero the counters, one wrk run (env None: no load, a pause), dump: the dump's total
        Ir, wrk's requests, and the seconds from the zeroing to the dump."""
        callgrind_control("-z", proc.pid)
        t0, busy0 = time.time(), busy_ns(proc.pid)
        if env is None:
            time.sleep(seconds)
            res = {"requests": 0, "errors": {}, "status": {}}
        else:
            res = self.wrk(port, seconds, INS_CONNS, env)
        wall, busy = time.time() - t0, busy_ns(proc.pid) - busy0
        before = set(self.workdir.glob(f"cg.{safe}.{proc.pid}.*"))
        callgrind_control("-d", proc.pid)
        dump = newest_dump(self.workdir, f"cg.{safe}.{proc.pid}.", before)
        return {"seconds": seconds, "wall_s": wall, "busy_pct": 100 * busy / 1e9 / wall,
                "requests": res["requests"],
                "ir": dump_total(dump), "errors": res["errors"], "status": res["status"],
                "dump": dump.name}

    def redis_window(self, row: Row, requests: int, r0: dict, r1: dict, m0: dict | None,
                     m1: dict | None) -> dict:
        """Redis decisions and batch sizes during the long window: coalescing depends on the
        concurrency and on the proxy's speed, which valgrind changes."""
        rd = redis_delta(r0, r1)
        evals = rd["calls"].get("evalsha", 0) + rd["calls"].get("eval", 0)
        # Without the histogram (OpenResty, a build that does not batch) every EVALSHA is one
        # decision.
        out = {"redis_evalsha_per_req": evals / max(requests, 1),
               "redis_batch_mean": 1.0 if evals else None,
               "redis_decisions_per_req": evals / max(requests, 1)}
        if m0 and m1:
            s0, s1 = total(m0, f"{BATCH_METRIC}_sum"), total(m1, f"{BATCH_METRIC}_sum")
            c0, c1 = total(m0, f"{BATCH_METRIC}_count"), total(m1, f"{BATCH_METRIC}_count")
            if None not in (s0, s1, c0, c1) and c1 > c0:
                out["redis_batch_mean"] = (s1 - s0) / (c1 - c0)
                out["redis_decisions_per_req"] = (s1 - s0) / max(requests, 1)
        if out["redis_decisions_per_req"] < 0.95:
            self.warn(f"instructions {row.id}: only {out['redis_decisions_per_req']:.2f} Redis "
                      "decisions per request under valgrind: decisions were made without Redis")
        return out

    # ---- syscalls: a native run under strace -c ---------------------------------------------

    def syscalls(self, row: Row, argv: list[str], env: dict | None, port: int,
                 admin: int) -> dict | None:
        """The same proxy started natively, warmed up, `strace -c -f -p` during STRACE_S s of
        wrk: syscalls per request (strace slows every syscall down, which changes how many
        events one epoll_wait returns: a rough figure)."""
        proc = self.procs.start(f"strace-{row.id}", argv, self.sut_cpu, env=env)
        out_file = self.workdir / f"strace.{re.sub(r'[^A-Za-z0-9_.-]', '_', row.id)}.txt"
        try:
            wait_port(proc, port, timeout=30)
            if admin:
                wait_port(proc, admin, timeout=30)
            wenv = {"WRK_KEYS": str(row.keys), "WRK_KEY_OFFSET": "0"}
            self.wrk(port, 1, INS_CONNS, wenv)
            st = subprocess.Popen(["strace", "-c", "-f", "-o", str(out_file), "-p",
                                   str(proc.pid)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
            record_pid(self.procs.pidfile, st.pid)
            time.sleep(1.0)  # attached to every thread
            res = self.wrk(port, STRACE_S, INS_CONNS, wenv)
            st.send_signal(signal.SIGINT)
            try:
                st.wait(15)
            except subprocess.TimeoutExpired:
                st.kill()
                st.wait()
        except (BenchError, OSError) as e:
            self.warn(f"instructions {row.id}: no syscall count ({e})")
            return None
        finally:
            self.procs.stop(proc)
        calls = parse_strace(out_file.read_text() if out_file.exists() else "")
        if not calls or not res["requests"]:
            self.warn(f"instructions {row.id}: strace -c gave no counts")
            return None
        n = res["requests"]
        top = sorted(((k, v) for k, v in calls.items() if k != "total"), key=lambda kv: -kv[1])
        return {"requests": n, "per_req": calls["total"] / n,
                "top_per_req": {k: round(v / n, 3) for k, v in top[:8]}}


def busy_ns(pid: int) -> int:
    """Nanoseconds the process's threads spent on a CPU or runnable waiting for one
    (/proc/<pid>/task/*/schedstat). Under valgrind one thread runs at a time (the others wait for
    its lock, asleep), so over a window this is the share of it the proxy had work."""
    total = 0
    for f in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            run, wait = f.read_text().split()[:2]
        except (OSError, ValueError):
            continue
        total += int(run) + int(wait)
    return total


def callgrind_control(flag: str, pid: int) -> None:
    cp = subprocess.run(["callgrind_control", flag, str(pid)], capture_output=True, text=True,
                        timeout=120)
    if cp.returncode != 0 or "OK" not in cp.stdout:
        raise BenchError(f"callgrind_control {flag} {pid} failed (exit {cp.returncode}): "
                         f"{(cp.stdout + cp.stderr)[-300:]}")


def newest_dump(workdir: Path, prefix: str, before: set[Path]) -> Path:
    """The dump `callgrind_control -d` just wrote: <prefix><n>, the highest new n."""
    new = [p for p in workdir.glob(f"{prefix}*") if p not in before
           and p.name[len(prefix):].isdigit()]
    if not new:
        raise BenchError(f"callgrind_control -d wrote no {prefix}<n> in {workdir}")
    return max(new, key=lambda p: int(p.name[len(prefix):]))


def dump_total(path: Path) -> int:
    """Total Ir of a callgrind dump: its `summary:` line (`totals:` if there is none)."""
    found = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"(summary|totals):\s+(\d+)", line)
            if m:
                found[m.group(1)] = int(m.group(2))
    if not found:
        raise BenchError(f"{path}: no summary: or totals: line")
    return found.get("summary", found.get("totals"))


def parse_strace(text: str) -> dict[str, int]:
    """`strace -c` table -> {syscall: calls, ..., "total": their sum} (the table's own total line
    may lack the usecs/call column, so it is not read)."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if (len(f) >= 5 and f[-1] != "total" and re.fullmatch(r"[\d.]+", f[0])
                and f[3].isdigit()):
            out[f[-1]] = int(f[3])
    if out:
        out["total"] = sum(out.values())
    return out


def valgrind_version() -> str | None:
    try:
        return subprocess.run(["valgrind", "--version"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except OSError:
        return None
