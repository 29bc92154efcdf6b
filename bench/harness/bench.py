"""The bench: targets, start-up, and the whole run, made of the parts in the other modules."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
import traceback
from pathlib import Path

from .common import BENCH_DIR, LUA_SCRIPT, REPO_DIR, BenchError, log
from .configs import (OPENRESTY_MODULE, OPENRESTY_ROWS, merge_settings, nginx_conf,
                      parse_settings, weir_check, weir_toml, write_config)
from .fleet import Fleet
from .instructions import Instructions
from .memory import Memory
from .model import Row, Target, Variant
from .procs import Proc, Procs, free_port, http_get, http_head, wait_port
from .profile import Profile
from .redis_client import Redis, capture_eval, redis_delta
from .redis_cost import RedisCost
from .report import render_markdown, rows_json, summarize, targets
from .throughput import Throughput
from .wrk_runs import WrkRuns


class Bench(WrkRuns, Throughput, Profile, RedisCost, Memory, Fleet, Instructions):
    """One benchmark run: its settings, targets, processes and results; each phase is a part."""

    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.workdir = Path(args.workdir)
        # Weir watches the directories of its config and of its certificates, and every write to
        # a file there wakes the watcher: those live apart from the logs (the workdir), or each
        # log line would wake every Weir of the bench (docs/operating.md, "Access log").
        self.confdir = self.workdir / "conf"
        self.confdir.mkdir(parents=True, exist_ok=True)
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
        self.pingora = getattr(args, "pingora", "") or ""
        self.variants = [parse_variant(v) for v in (getattr(args, "variant", None) or [])]
        if len({v.name for v in self.variants}) != len(self.variants):
            raise BenchError("--variant: names must differ")
        self.tls: tuple[str, str] | None = None
        self.openresty: dict = {}
        self.skipped: dict[str, str] = {}  # row id -> why it did not run

    # ---- starting things -------------------------------------------------------------------

    def start_nginx(self, name: str, role: str, port: int, cpus: str | None = None,
                    **kw) -> Proc:
        root = self.workdir / name
        root.mkdir(parents=True, exist_ok=True)
        conf = root / "nginx.conf"
        conf.write_text(nginx_conf(root, port, role=role, **kw))
        proc = self.procs.start(
            name, ["nginx", "-p", str(root), "-c", str(conf), "-g", "daemon off;"],
            cpus or self.sut_cpu)
        wait_port(proc, port)
        return proc

    def start_weir(self, name: str, toml: str, port: int, *, binary: str | None = None,
                   cpus: str | None = None, env: dict | None = None) -> Proc:
        conf = self.confdir / f"{name}.toml"
        write_config(conf, toml)
        proc = self.procs.start(name, [binary or self.weir, "-c", str(conf)],
                                cpus or self.sut_cpu, env=env or {"RUST_LOG": "warn"})
        wait_port(proc, port)
        return proc

    def both_cpus(self) -> str:
        return ",".join(sorted({self.sut_cpu, self.load_cpu}))

    def make_cert(self) -> tuple[str, str]:
        """A self-signed P-256 pair for localhost / 127.0.0.1, made now, for the HTTPS and h2
        rows (Weir and nginx use the same one)."""
        cert, key = self.confdir / "tls.crt", self.confdir / "tls.key"
        cp = subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-days", "2", "-subj", "/CN=localhost", "-addext",
             "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
            capture_output=True, text=True)
        if cp.returncode != 0:
            raise BenchError(f"openssl req failed: {cp.stderr[-300:]}")
        return str(cert), str(key)

    def start_redis(self) -> None:
        port = free_port()
        self.redis_proc = self.procs.start(
            "redis", ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                      "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
            self.redis_cpu)
        wait_port(self.redis_proc, port)
        self.redis_port = port
        self.redis = Redis(port)

    def start_base(self) -> None:
        """Redis and the upstream, and what the weir build accepts (deny cache, access log
        setting): what every mode needs before its proxies."""
        log(f"starting servers (SUT on CPU {self.sut_cpu}, load on CPU {self.load_cpu}, "
            f"Redis on CPU {self.redis_cpu})")
        self.start_redis()
        up = free_port()
        self.upstream_port = up
        upstream = self.start_nginx("upstream", "upstream", up)
        self.targets["upstream"] = Target(up, [upstream], nginx=True)
        self.deny_cache = self.weir_accepts(
            weir_toml(1, up, store="redis", redis_port=self.redis_port, zones=1,
                      deny_cache_size=0))
        # Newer builds log every request at info (RUST_LOG=warn drops the lines); turn the access
        # log off where the build knows the setting, as nginx runs here with access_log off.
        self.access_log = False if self.weir_accepts(weir_toml(1, up, access_log=False)) else None

    def weir_specs(self) -> dict[str, tuple[dict, dict | None]]:
        """The Weir rows' configs (weir_toml's arguments) and environments, by target name:
        rows 2-6b, 4a and 4b (only for a build that knows [log] access_log / access_log_buffer)."""
        flood = dict(zones=1, store="redis", rate="1r/h", burst=0)
        specs: dict[str, tuple[dict, dict | None]] = {
            "passthrough": (dict(zones=0), None),
            "memory": (dict(zones=1), None),
            "redis": (dict(zones=1, store="redis"), None),
            "redis3": (dict(zones=3, store="redis"), None),
            # One key, 1 request per hour, no burst: the first request passes, the rest are 429.
            "flood": (dict(flood, deny_cache_size=0) if self.deny_cache else flood, None),
        }
        if self.deny_cache:
            specs["flood_cache"] = (flood, None)  # the default deny cache
        # Row 4 with the JSON access log on, as in production (to the log file, like stderr
        # to a container's log); only a build that knows [log] access_log.
        if self.access_log is not None:
            specs["redis_log"] = (dict(zones=1, store="redis", access_log=True, log_json=True),
                                  {"RUST_LOG": "warn,weir::access=info"})
            # 4b: the same, buffered (`[log] access_log_buffer`, nginx's `buffer=`), if known.
            buffered = dict(zones=1, store="redis", access_log=True, log_json=True,
                            access_log_buffer=65536)
            probe = dict(buffered, store="memory")  # `weir check` of the setting, no Redis needed
            if self.weir_accepts(weir_toml(1, self.upstream_port, **probe)):
                specs["redis_log_buf"] = (buffered, {"RUST_LOG": "warn,weir::access=info"})
        return specs

    def start_all(self) -> None:
        self.start_base()
        up = self.upstream_port
        echo_port = free_port()
        echo = self.procs.start("echo", [self.weir, "echo", "--listen", f"127.0.0.1:{echo_port}"],
                                self.sut_cpu, env={"RUST_LOG": "warn"})
        wait_port(echo, echo_port)
        self.targets["echo"] = Target(echo_port, [echo])

        specs = self.weir_specs()
        for name, (spec, _) in specs.items():
            if name not in ("redis_log", "redis_log_buf"):
                self.add_weir(name, spec)
        # A/B variants: rows 2-5 again with another binary and/or extra settings (4a below).
        for v in self.variants:
            for name in ("passthrough", "memory", "redis", "redis3"):
                self.add_weir(f"{name}@{v.name}", specs[name][0], binary=v.binary,
                              settings=v.settings)
        if "redis_log" in specs:
            spec, env = specs["redis_log"]
            self.add_weir("redis_log", spec, env=env)
            for v in self.variants:  # row 4a of each variant too: the access log's own A/B
                self.add_weir(f"redis_log@{v.name}", spec, binary=v.binary,
                              settings=v.settings, env=env)
        else:
            self.skipped["redis_log"] = "this build has no [log] access_log setting"
        if "redis_log_buf" in specs:
            spec, env = specs["redis_log_buf"]
            self.add_weir("redis_log_buf", spec, env=env)
        else:
            self.skipped["redis_log_buf"] = "this build has no [log] access_log_buffer setting"
        # Scaling: threads = 2, allowed on both cores (wrk and Redis stay on theirs).
        self.add_weir("scale_redis", dict(zones=1, store="redis", threads=2),
                      cpus=self.both_cpus())
        if not self.quick:
            self.add_weir("scale_passthrough", dict(zones=0, threads=2), cpus=self.both_cpus())
        # HTTPS and h2 over TLS: one Weir and one nginx serve both (ALPN: wrk gets HTTP/1.1,
        # h2load h2).
        self.tls = self.make_cert()
        self.add_weir("tls", dict(zones=0, tls=self.tls), scheme="https")
        roles = [("nginx_limit", "limit", {}), ("nginx_proxy", "proxy", {}),
                 ("nginx_tls", "proxy", {"ssl": self.tls})]
        if not self.quick:
            roles.append(("scale_nginx_limit", "limit", {"workers": 2}))
        for name, role, kw in roles:
            port = free_port()
            cpus = self.both_cpus() if kw.get("workers", 1) > 1 else None
            self.targets[name] = Target(
                port, [self.start_nginx(name, role, port, upstream_port=up, cpus=cpus, **kw)],
                nginx=True, scheme="https" if "ssl" in kw else "http")
        if self.pingora:
            port = free_port()
            proc = self.procs.start("pingora", [self.pingora, f"127.0.0.1:{port}",
                                                f"127.0.0.1:{up}", "1"], self.sut_cpu,
                                    env={"RUST_LOG": "warn"})
            wait_port(proc, port)
            self.targets["pingora"] = Target(port, [proc])
            # Row 2b: the same, also writing X-Forwarded-For and X-Real-IP as Weir does.
            port = free_port()
            proc = self.procs.start("pingora_fwd", [self.pingora, f"127.0.0.1:{port}",
                                                    f"127.0.0.1:{up}", "1", "forwarded"],
                                    self.sut_cpu, env={"RUST_LOG": "warn"})
            wait_port(proc, port)
            self.targets["pingora_fwd"] = Target(port, [proc])
        else:
            self.skipped["pingora"] = ("no examples/pingora_passthrough binary (run.sh builds it "
                                       "unless BENCH_SKIP_BUILD=1)")
            self.skipped["pingora_fwd"] = self.skipped["pingora"]
        self.check_weir_store()
        self.start_openresty()

    def add_weir(self, name: str, spec: dict, *, binary: str | None = None,
                 settings: list | None = None, cpus: str | None = None, env: dict | None = None,
                 scheme: str = "http") -> None:
        """A Weir target: the config of `spec` (weir_toml's arguments), an admin listener for the
        Redis rows (their /metrics), `settings` merged in (a variant's)."""
        port = free_port()
        admin = free_port() if spec.get("store") == "redis" else 0
        toml = self.weir_config(spec, port, admin, settings)
        proc = self.start_weir(f"weir-{name}", toml, port, binary=binary, cpus=cpus, env=env)
        self.targets[name] = Target(port, [proc], scheme=scheme, admin=admin)

    def weir_config(self, spec: dict, port: int, admin: int = 0,
                    settings: list | None = None) -> str:
        """The TOML of a Weir row: `spec` (weir_toml's arguments) on `port`, the access log as
        the build allows (off), an admin listener on `admin` (0: none), `settings` merged in."""
        spec = dict(spec)
        spec.setdefault("access_log", self.access_log)
        toml = weir_toml(port, self.upstream_port, redis_port=self.redis_port, admin_port=admin,
                         **spec)
        return merge_settings(toml, settings) if settings else toml

    def start_openresty(self) -> None:
        """Row 8: nginx + Lua (Debian's libnginx-mod-http-lua) calling lua/limit_req.lua per
        request with the KEYS/ARGV layout Weir sends (captured from row 4's Weir). Row 8b: the
        same, also sending what Weir sends besides its decision (the `RateLimit` fields, the
        forwarded headers), so that row 4 / 8b compares the same work."""
        if not OPENRESTY_MODULE.exists():
            raise BenchError(f"{OPENRESTY_MODULE} missing: install libnginx-mod-http-lua "
                             "(run.sh does)")
        self.capture_openresty_call(self.targets["redis"].port)
        for name, same in OPENRESTY_ROWS.items():
            port = free_port()
            proc = self.start_nginx(
                name, "openresty", port, upstream_port=self.upstream_port,
                lua_dir=BENCH_DIR / "openresty", lua_config=self.openresty_lua_config(same),
                same_headers=same)
            self.targets[name] = Target(port, [proc], nginx=True)
            # It decides: one request, one EVALSHA, a 200 (with the fields in 8b).
            before = self.redis.snapshot()
            status, fields = http_head(port, xff="10.251.0.3")
            d = redis_delta(before, self.redis.snapshot())
            what = (f"status {status}, Redis saw {d['calls']} (failed {d['failed']}); its log:\n"
                    f"{proc.log_tail()}")
            if status != 200 or d["failed"]:
                raise BenchError(f"OpenResty + Redis ({name}) does not work: {what}")
            if d["calls"].get("evalsha", 0) + d["calls"].get("eval", 0) < 1:
                self.check_failed(f"OpenResty + Redis ({name}) made no EVALSHA for a request: {what}")
            if same and (fields.get("ratelimit-policy") != self.openresty["policy"]
                         or not re.fullmatch(re.escape(self.openresty["item"]) + r";r=\d+;t=\d+",
                                             fields.get("ratelimit", ""))):
                self.check_failed(f"OpenResty + Redis ({name}) does not send Weir's RateLimit "
                                  f"fields: {fields}")

    def capture_openresty_call(self, weir_port: int) -> None:
        """The EVALSHA a Weir on Redis (listening on `weir_port`) sends, seen with MONITOR:
        OpenResty sends the same SHA and ARGV layout (self.openresty)."""
        call = capture_eval(self.redis_port,
                            lambda i: http_get(weir_port, xff=f"10.252.0.{1 + i % 200}"))
        nkeys = int(call[2])
        sha = self.redis.cmd("SCRIPT", "LOAD", LUA_SCRIPT.read_bytes())
        sha = sha.decode() if isinstance(sha, bytes) else sha
        if sha != call[1]:
            self.warn(f"{LUA_SCRIPT.relative_to(REPO_DIR)} (SHA {sha[:10]}) is not the script "
                      f"this weir build sends ({call[1][:10]}): OpenResty runs the file")
        prefixes = [re.sub(r"\{[^{]*\}$", "{", k) for k in call[3:3 + nkeys]]
        # The fields Weir answers with (row 8b sends the same policy, its item's zone name).
        _, fields = http_head(weir_port, xff="10.252.1.1")
        policy = fields.get("ratelimit-policy", "")
        if not policy:
            self.warn(f"this weir build sends no RateLimit-Policy ({fields}): row 8b sends none")
        self.openresty = {"weir_call": call, "sha": sha, "prefixes": prefixes,
                          "argv": call[3 + nkeys:], "policy": policy,
                          "item": policy.split(";", 1)[0]}

    def openresty_lua_config(self, headers: bool = False) -> dict:
        """weir_limit.configure()'s table for the captured call (capture_openresty_call);
        `headers`: row 8b's `RateLimit` fields too."""
        o = self.openresty
        return {"port": self.redis_port, "sha": o["sha"], "prefixes": o["prefixes"],
                "argv": o["argv"], "script_path": str(LUA_SCRIPT), "timeout_ms": 250, "pool": 64,
                "headers": headers and bool(o.get("policy")), "policy": o.get("policy", ""),
                "item": o.get("item", "")}

    def weir_accepts(self, toml: str) -> bool:
        """Does this weir build accept the config (`weir check`)? For settings that are newer
        than the harness, e.g. store.deny_cache_size."""
        conf = self.confdir / "probe.toml"
        write_config(conf, toml)
        return weir_check(self.weir, conf)[0]

    def check_weir_store(self) -> None:
        """Fail early and clearly if the Redis store is not deciding (e.g. not implemented)."""
        t = self.targets["flood"]
        # A few tries, each with a fresh client: on a busy machine one decision may miss the 25 ms
        # store timeout (and fall back); a store that never limits fails every try.
        for attempt in range(5):
            xff = f"10.250.0.{attempt + 1}"
            before = self.redis.snapshot()
            statuses = [http_get(t.port, xff=xff) for _ in range(3)]
            calls = redis_delta(before, self.redis.snapshot())["calls"]
            evals = calls.get("evalsha", 0) + calls.get("eval", 0)
            self.redis.cmd("DEL", f"weir:z1:{{{xff}}}")
            if statuses[1:] == [429, 429] and evals > 0:
                return
            time.sleep(0.5)
        msg = ("the Redis store does not limit: 3 requests on a 1r/h, burst 0 zone answered "
               f"{statuses}, Redis saw {calls} (5 tries); weir log:\n"
               + self.targets["flood"].procs[0].log_tail())
        if not self.quick:
            raise BenchError(msg)
        self.check_failed(msg)  # --quick: perhaps only a Redis too slow for 25 ms; the rows tell

    def fail(self, msg: str) -> None:
        log(f"FAILED: {msg}")
        self.failures.append(msg)

    def check_failed(self, msg: str) -> None:
        """A sanity check about the measurement (a quiet machine, a fast Redis) failed: a failure
        in a full run, a warning in --quick (CI proves that the harness runs, not that the machine
        is quiet)."""
        if self.quick:
            self.warn(f"{msg} [a failure in a full run]")
        else:
            self.fail(msg)

    def warn(self, msg: str) -> None:
        """Something that makes a number doubtful without failing the run."""
        log(f"WARNING: {msg}")
        self.warnings.append(msg)

    # ---- the whole run ---------------------------------------------------------------------

    def run(self) -> int:
        if getattr(self.args, "instructions", False):
            return self.run_instructions()
        t_start = time.time()
        self.results["meta"] = self.meta()
        self.guarded(self.throughput_run)
        self.results["meta"]["elapsed_s"] = round(time.time() - t_start, 1)
        self.results["failures"] = self.failures
        self.results["warnings"] = self.warnings
        self.results["ok"] = not self.failures
        self.results["skipped"] = self.skipped
        self.results["targets"] = targets(self.results)
        return self.write_report(self.results, t_start)

    def guarded(self, work) -> None:
        """Runs `work`; a failure is reported (a harness bug with its traceback) and the report is
        still written; the servers are stopped either way."""
        try:
            work()
        except BenchError as e:
            self.fail(str(e))
        except Exception as e:  # a bug or an unexpected tool error: still write the report
            self.fail(f"harness error: {e!r}\n{traceback.format_exc()}")
        finally:
            if self.redis:
                self.redis.close()
            self.procs.stop_all()

    def throughput_run(self) -> None:
        """The default mode: the servers, the throughput rows, then the other phases."""
        self.start_all()
        self.results["meta"]["weir_settings"] = {
            "deny_cache_size_supported": self.deny_cache,
            "access_log": ("off" if self.access_log is False
                           else "setting unknown to this build"),
            "configs": {name: (self.confdir / f"{name}.toml").read_text()
                        for name in ("weir-passthrough", "weir-redis", "weir-redis3",
                                     "weir-flood")},
            "nginx_limit_conf": (self.workdir / "nginx_limit" / "nginx.conf").read_text(),
            "openresty": self.openresty,
        }
        for v in self.variants:
            self.results["meta"]["weir_settings"]["configs"][f"weir-redis@{v.name}"] = (
                self.confdir / f"weir-redis@{v.name}.toml").read_text()
        rows = self.phase_throughput()
        self.results["rows"] = rows_json(rows)
        self.results["batch_size"] = self.phase_batch_size(rows)
        if not self.args.rows:
            self.other_phases(rows)
        elif "paced" in self.args.rows.split(",") and any(r.id == "redis" for r in rows):
            self.results["paced"] = self.phase_paced(rows)  # --rows ...,redis,paced
        if self.args.rows and self.args.profile:  # --rows ... --profile: those rows' profiles
            self.results["profile"] = self.phase_profile([r.id for r in rows if r.id in self.targets])

    def stem(self) -> str:
        # A quick run must not overwrite the full run's results (bench/results/*.md quote them).
        return "quick" if self.quick else "latest"

    def write_report(self, results: dict, t_start: float) -> int:
        md = render_markdown(results)
        self.out.mkdir(parents=True, exist_ok=True)
        stem = self.stem()
        (self.out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
        (self.out / f"{stem}.md").write_text(md)
        print(md)
        log(f"wrote {self.out}/{stem}.json and {stem}.md in {time.time() - t_start:.0f} s")
        if self.failures:
            log(f"{len(self.failures)} failure(s):\n  " + "\n  ".join(self.failures))
            return 1
        return 0

    def run_instructions(self) -> int:
        """--instructions: only the callgrind rows (instructions.py). Their section is added to
        <out>/latest.json and latest.md: a previous run's results there are kept (its own
        `instructions` section replaced), so a full run followed by --instructions gives one
        report; otherwise the files hold this section alone."""
        t_start = time.time()
        results = self.previous_results()
        meta = self.meta()
        meta["mode"] = "instructions"
        section: dict = {"meta": meta}

        def measure() -> None:
            self.start_base()
            section.update(self.phase_instructions())

        self.guarded(measure)
        meta["elapsed_s"] = round(time.time() - t_start, 1)
        section.update(failures=self.failures, warnings=self.warnings, skipped=self.skipped,
                       ok=not self.failures)
        if not results:
            results = {"meta": meta, "failures": [], "warnings": [], "ok": not self.failures}
        results["instructions"] = section
        results["targets"] = targets(results)
        return self.write_report(results, t_start)

    def previous_results(self) -> dict:
        """The results a previous run left in <out>/<stem>.json, {} if none (or unreadable)."""
        path = self.out / f"{self.stem()}.json"
        try:
            prev = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log(f"{path}: not readable ({e}): written anew")
            return {}
        if not isinstance(prev, dict) or "meta" not in prev:
            log(f"{path}: not a bench result: written anew")
            return {}
        log(f"adding the instructions section to {path} (its other sections kept)")
        return prev

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
            except Exception as e:  # e.g. a socket timeout: report it, go on with the next part
                self.fail(f"{name}: harness error: {e!r}\n{traceback.format_exc()}")

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
            "variants": [{"name": v.name, "binary": v.binary, "spec": v.spec,
                          "settings": [f"{t}.{k} = {val}" for t, k, val in v.settings]}
                         for v in self.variants],
            "pingora_example": self.pingora or None,
        }


def parse_variant(spec: str) -> Variant:
    """`NAME=BINARY[,table.key=value;...]`; an empty BINARY (or `-`) is the baseline's binary."""
    name, sep, rest = spec.partition("=")
    binary, _, settings = rest.partition(",")
    binary = binary.strip()
    if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", name):
        raise BenchError(f"--variant {spec!r}: expected NAME=PATH_TO_WEIR[,table.key=value;...] "
                         "(NAME: letters, digits, _ . -)")
    if binary in ("", "-"):
        binary = ""
    else:
        path = Path(binary).resolve()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BenchError(f"--variant {name}: {binary} is not an executable file")
        binary = str(path)
    parsed = parse_settings(settings)
    if not binary and not parsed:
        raise BenchError(f"--variant {name}: neither another binary nor settings")
    return Variant(name, binary, parsed, spec)
