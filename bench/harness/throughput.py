"""Phase 1, the throughput rows; phase 2, the paced pair (latency at half of the Redis peak)."""

from __future__ import annotations

from .common import DISTURBED_PCT, BenchError, log
from .metrics import batch_histogram, scrape_metrics
from .model import Row
from .report import VARIANT_KINDS, summarize, summarize_runs


class Throughput:
    """Part of `Bench`: the throughput rows and the paced pair."""

    # ---- phase 1: throughput rows ------------------------------------------------------------

    def rows(self) -> list[Row]:
        """The throughput rows this run measures: those whose target started, `--rows`'s."""
        rows = [r for r in self.row_catalog() if r.target in self.targets]
        if self.quick:
            rows = [r for r in rows if r.id != "echo"]
        return self.select_rows(rows)

    def row_catalog(self) -> list[Row]:
        """Every row, each variant's rows 2-5 right after the baseline's."""
        rows = [
            Row("upstream", "1. upstream direct (nginx `return 200`)", "upstream"),
            Row("echo", "1b. upstream direct (`weir echo`, for reference)", "echo"),
            Row("pingora", "2a. plain Pingora proxy (examples/pingora_passthrough)", "pingora"),
            Row("pingora_fwd", "2b. plain Pingora + X-Forwarded-For / X-Real-IP (as Weir sends)",
                "pingora_fwd"),
            Row("passthrough", "2. Weir, no limits (Pingora passthrough)", "passthrough"),
            Row("memory", "3. Weir, memory store, 1 zone, 10k keys", "memory"),
            Row("redis", "4. Weir, Redis store, 1 zone, 10k keys", "redis", redis=True),
            Row("redis_log", "4a. Weir, Redis store, 1 zone, JSON access log on", "redis_log",
                redis=True),
            Row("redis_log_buf", "4b. Weir, Redis store, 1 zone, JSON access log, buffered (64 KiB)",
                "redis_log_buf", redis=True),
            Row("redis3", "5. Weir, Redis store, 3 zones, 10k keys", "redis3", redis=True),
            Row("flood", "6. Weir, Redis, one-key flood (all 429), no deny cache", "flood",
                keys=1, expect="reject", redis=True,
                note="deny_cache_size = 0" if self.deny_cache
                else "deny cache: not implemented yet"),
            Row("flood_cache", "6b. Weir, Redis, one-key flood (all 429), deny cache",
                "flood_cache", keys=1, expect="reject", note="default deny_cache_size"),
            Row("nginx_limit", "7. nginx limit_req, 1 zone, 10k keys", "nginx_limit"),
            Row("nginx_proxy", "7b. nginx proxy, no limits", "nginx_proxy"),
            Row("openresty", "8. OpenResty + Redis (lua/limit_req.lua per request), 1 zone, "
                "10k keys", "openresty", redis=True),
            Row("openresty_hdr", "8b. OpenResty + Redis, 1 zone, 10k keys, + RateLimit fields "
                "and forwarded headers (as Weir sends)", "openresty_hdr", redis=True),
            Row("scale_passthrough", "9. Weir, no limits, threads = 2 on both cores",
                "scale_passthrough"),
            Row("scale_redis", "9b. Weir, Redis store, 1 zone, threads = 2 on both cores",
                "scale_redis", redis=True),
            Row("scale_nginx_limit", "9c. nginx limit_req, 2 workers on both cores",
                "scale_nginx_limit"),
            Row("https_weir", "10. Weir, HTTPS (HTTP/1.1 over TLS), no limits", "tls"),
            Row("https_nginx", "10b. nginx, HTTPS (`listen ssl`), no limits", "nginx_tls"),
            Row("h2_weir", "11. Weir, h2 over TLS (h2load), no limits", "tls", tool="h2load"),
            Row("h2_nginx", "11b. nginx, `http2` over TLS (h2load), no limits", "nginx_tls",
                tool="h2load"),
        ]
        # A/B variants: rows 2-5 and 4a of each, right after the baseline's, so that they are
        # measured next to each other in every round.
        out = []
        for r in rows:
            out.append(r)
            if r.id in VARIANT_KINDS:
                for v in self.variants:
                    out.append(Row(f"{r.id}@{v.name}", f"{r.label} [{v.name}]",
                                   f"{r.id}@{v.name}", redis=r.redis, kind=r.id,
                                   variant=v.name))
        return out

    def select_rows(self, rows: list[Row]) -> list[Row]:
        """`--rows ID,ID` (with `ab`: rows 2-5 of the baseline and every variant, 7, 7b, 8)."""
        if self.args.rows:
            wanted = set(self.args.rows.split(","))
            if "ab" in wanted:  # the A/B set: rows 2-5 (every variant's too) and their peers
                wanted |= set(VARIANT_KINDS) | {"nginx_proxy", "nginx_limit", "openresty",
                           "openresty_hdr"}
                wanted |= {r.id for r in rows if r.variant}
            rows = [r for r in rows if r.id in wanted]
        return rows

    def phase_throughput(self) -> list[Row]:
        rows = self.rows()
        for rep in range(self.reps):
            # Every other repetition runs the rows backwards: a row measured right after another
            # pays for what that one left behind (the first Weir row after plain Pingora read
            # 1-2 µs a request more than the same binary a row later, 2026-11-27), so no row may
            # always follow the same one, and an A/B pair swaps which of its two goes first.
            for row in (rows if rep % 2 == 0 else rows[::-1]):
                log(f"rep {rep + 1}/{self.reps}: {row.label}")
                try:
                    res = self.measure_retrying(
                        self.targets[row.target], row.keys, self.duration, self.conns,
                        key_offset=2_000_000 if row.keys == 1 else 0, warm=rep == 0,
                        tool=row.tool)
                except BenchError as e:
                    self.fail(f"{row.id}: {e}")
                    continue
                except OSError as e:  # a tool or socket error the harness did not foresee
                    self.fail(f"{row.id}: {e!r}")
                    continue
                row.runs.append(res)
                self.check_row(row, res)
        return rows

    def check_row(self, row: Row, res: dict) -> None:
        """Sanity checks of one run. A row that cannot run at all fails; what a busy machine or
        a slow Redis can cause goes through check_failed (a warning in --quick)."""
        n = res["requests"]
        sock_errors = sum(v for k, v in res["errors"].items() if k != "status")
        if n == 0:
            self.fail(f"{row.id}: no request completed")
        if sock_errors > 0.01 * max(n, 1):
            self.check_failed(f"{row.id}: {sock_errors} socket errors / {n} requests: "
                              f"{res['errors']}")
        if row.expect == "pass" and res["admitted_pct"] < 99.0:
            self.check_failed(f"{row.id}: only {res['admitted_pct']:.2f}% of requests got 2xx")
        if row.expect == "reject" and res["admitted_pct"] > 1.0:
            self.check_failed(f"{row.id}: {res['admitted_pct']:.2f}% got 2xx, expected all "
                              "rejected")
        decided = res["redis_decisions_per_req"]
        if row.redis and decided < 0.2:
            self.check_failed(f"{row.id}: {decided:.3f} Redis decisions (EVALSHA) per request: "
                              "is the Redis store deciding?")
        if row.redis and res["redis_failed_calls"] > 0.01 * max(n, 1):
            self.check_failed(f"{row.id}: {res['redis_failed_calls']} failed script calls in "
                              f"Redis ({res['redis_failed']})")
        if res["other_load_pct"] > DISTURBED_PCT:
            self.warn(f"{row.id}: other processes used {res['other_load_pct']:.0f}% of a core "
                      "during a run (shared machine): its numbers are noisy")
        if row.redis and 0.2 <= decided < 0.95:
            self.warn(f"{row.id}: only {decided:.2f} Redis decisions per request: "
                      "decisions were made without Redis")
        if res.get("proxy_log_store_failures"):
            self.warn(f"{row.id}: the proxy logged {res['proxy_log_store_failures']} failed "
                      f"Redis decisions in one run (e.g. {res['proxy_log_sample'][0][:160]})")

    # ---- after the rows: Weir's Redis batch sizes --------------------------------------------

    def phase_batch_size(self, rows: list[Row]) -> dict:
        """The `weir_redis_batch_size` histogram of the Redis rows' Weirs (/metrics), over all
        their runs: how many decisions went to Redis together (coalescing). Absent: not exposed by
        this build."""
        out = {}
        for r in rows:
            t = self.targets[r.target]
            if not (r.redis and t.admin) or r.target in out:
                continue
            try:
                metrics = scrape_metrics(t.admin)
            except OSError as e:
                out[r.target] = {"error": str(e)}
                continue
            out[r.target] = batch_histogram(metrics)
        return out

    # ---- phase 2: latency at half of the Redis row's peak ----------------------------------

    def phase_paced(self, rows: list[Row]) -> dict:
        """Rows 2 and 4 at the same offered rate, half of row 4's peak: wrk has no rate control,
        so C connections each wait D ms after every response (about C*1000/(D+latency) r/s)."""
        peak = summarize(next(r for r in rows if r.id == "redis"))["rps"]
        if not peak:
            return {"skipped": "row 4 has no result"}
        target_rps = peak / 2
        delay_ms = 10
        conns = max(2, round(target_rps * (delay_ms + 0.3) / 1000))
        env = {"WRK_DELAY_MS": str(delay_ms)}
        # Calibrate once on row 4: scale the connection count to the measured rate.
        probe = self.measure(self.targets["redis"], 10_000, 2, conns, env)
        conns = max(2, round(conns * target_rps / max(probe["rps"], 1)))
        log(f"paced: target {target_rps:.0f} r/s = {conns} connections x {delay_ms} ms delay")
        paced = {"passthrough": [], "redis": []}
        for rep in range(self.reps):
            for rid in ("passthrough", "redis"):
                log(f"rep {rep + 1}/{self.reps}: paced {rid}")
                paced[rid].append(self.measure_retrying(
                    self.targets[rid], 10_000, self.duration, conns, env, warm=rep == 0))
        out = {
            "target_rps": round(target_rps), "connections": conns, "delay_ms": delay_ms,
            "runs": paced,
            "passthrough": summarize_runs(paced["passthrough"]),
            "redis": summarize_runs(paced["redis"]),
        }
        out["added_p99_ms"] = out["redis"]["p99_ms"] - out["passthrough"]["p99_ms"]
        out["added_p50_ms"] = out["redis"]["p50_ms"] - out["passthrough"]["p50_ms"]
        return out
