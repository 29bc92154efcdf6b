"""Phase 4, memory per key: Redis bytes per active key, Weir RSS per key in the memory store."""

from __future__ import annotations

import hashlib
import re
import time

from .common import LUA_SCRIPT, BenchError, log
from .configs import weir_toml
from .procs import free_port, http_get
from .procstat import rss_kib
from .redis_client import capture_eval


class Memory:
    """Part of `Bench`: memory per key."""

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
            call = capture_eval(self.redis_port,
                                lambda i: http_get(port, xff=f"10.1.2.{3 + i % 200}"))
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
        nkeys = 10_000 if self.quick else 1_000_000
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
        nkeys = 10_000 if self.quick else 1_000_000
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
                self.check_failed(f"weir memory RSS: {res['errors']['status']} requests were "
                                  "limited")
        time.sleep(0.5)
        rss1 = rss_kib(proc.pid)
        self.procs.stop(proc)
        return {
            "keys": sent, "seconds": round(time.time() - t0, 1),
            "rss_after_start_kib": rss0["VmRSS"], "rss_after_first_request_kib": rss_warm["VmRSS"],
            "rss_after_keys_kib": rss1["VmRSS"], "hwm_kib": rss1["VmHWM"],
            "bytes_per_key": (rss1["VmRSS"] - rss_warm["VmRSS"]) * 1024 / max(sent, 1),
        }
