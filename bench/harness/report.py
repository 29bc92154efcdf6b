"""Summaries (medians), the issue's targets, and the markdown report."""

from __future__ import annotations

import statistics

from .common import DISTURBED_PCT
from .model import Row


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize_runs(runs: list[dict]) -> dict:
    if not runs:
        return {"rps": None}
    rps = [r["rps"] for r in runs]
    return {
        "rps": med(rps),
        "rps_min": min(rps), "rps_max": max(rps),
        "p50_ms": med(r["latency_us"]["p50"] / 1000 for r in runs),
        "p99_ms": med(r["latency_us"]["p99"] / 1000 for r in runs),
        "p99_9_ms": med(r["latency_us"]["p99_9"] / 1000 for r in runs),
        "proxy_cpu_s_per_1k": med(r["proxy_cpu_s_per_1k"] for r in runs),
        "proxy_core_util_pct": med(r["proxy_core_util_pct"] for r in runs),
        "proxy_ctx_switches_per_req": med(r["proxy_ctx_switches_per_req"] for r in runs),
        "redis_inner_cmds_per_req": med(r["redis_inner_cmds_per_req"] for r in runs),
        "redis_evalsha_per_req": med(r["redis_evalsha_per_req"] for r in runs),
        "redis_cpu_ms_per_1k": med(r["redis_cpu_ms_per_1k"] for r in runs),
        "admitted_pct": med(r["admitted_pct"] for r in runs),
        "other_load_pct": med(r["other_load_pct"] for r in runs),
        "discarded_runs": sum(len(r.get("discarded", [])) for r in runs),
        "other_load_pct_max": max(r["other_load_pct"] for r in runs),
        "core_busy_pct": {c: med(r["core_busy_pct"][c] for r in runs)
                          for c in runs[0]["core_busy_pct"]},
    }


def summarize(row: Row) -> dict:
    return summarize_runs(row.runs)


def rows_json(rows: list[Row]) -> list[dict]:
    base = next((summarize(r)["rps"] for r in rows if r.id == "passthrough"), None)
    out = []
    for r in rows:
        s = summarize(r)
        s["ratio_to_passthrough"] = (s["rps"] / base) if (s["rps"] and base) else None
        out.append({"id": r.id, "label": r.label, "keys": r.keys, "note": r.note,
                    "median": s, "runs": r.runs})
    return out


def targets(res: dict) -> list[dict]:
    """The issue's targets, each with the measured value and met / not met."""
    rows = {r["id"]: r["median"] for r in res.get("rows", [])}
    out = []
    redis, nginx = rows.get("redis", {}), rows.get("nginx_limit", {})
    if redis.get("ratio_to_passthrough") is not None:
        out.append({"target": "Redis all-passing ≥ 85% of passthrough req/s",
                    "value": f"{100 * redis['ratio_to_passthrough']:.0f}%",
                    "met": redis["ratio_to_passthrough"] >= 0.85})
    if redis.get("rps") and nginx.get("rps"):
        out.append({"target": "Redis all-passing ≥ nginx limit_req req/s",
                    "value": f"{redis['rps']:.0f} vs {nginx['rps']:.0f} "
                             f"({100 * redis['rps'] / nginx['rps']:.0f}%)",
                    "met": redis["rps"] >= nginx["rps"]})
    paced = res.get("paced", {})
    if "added_p99_ms" in paced:
        out.append({"target": "added p99 of a Redis decision at half of peak ≤ 1 ms",
                    "value": f"{paced['added_p99_ms']:.2f} ms (p99 {paced['redis']['p99_ms']:.2f}"
                             f" vs {paced['passthrough']['p99_ms']:.2f} ms at "
                             f"{paced['redis']['rps']:.0f} r/s)",
                    "met": paced["added_p99_ms"] <= 1.0})
    flood, cached = rows.get("flood", {}), rows.get("flood_cache")
    if cached and cached.get("redis_evalsha_per_req") is not None:
        out.append({"target": "one-key flood with deny cache ≤ 0.01 Redis calls/request",
                    "value": f"{cached['redis_evalsha_per_req']:.4f} (without: "
                             f"{flood.get('redis_evalsha_per_req', 0):.3f})",
                    "met": cached["redis_evalsha_per_req"] <= 0.01})
    elif flood.get("redis_evalsha_per_req") is not None:
        out.append({"target": "one-key flood with deny cache ≤ 0.01 Redis calls/request",
                    "value": f"{flood['redis_evalsha_per_req']:.3f} (deny cache: not implemented "
                             "yet)",
                    "met": flood["redis_evalsha_per_req"] <= 0.01})
    fleet = res.get("fleet", {}).get("runs", [])
    weir_runs = [r for r in fleet if r["kind"] == "weir"]
    if weir_runs:
        worst = max(weir_runs, key=lambda r: abs(r["admitted_minus_ideal"]))
        out.append({"target": "fleet accuracy: admitted within ±1 of burst + 1 + rate × t, all N",
                    "value": ", ".join(f"N={r['instances']}: {r['admitted_minus_ideal'] + 0.0:+.1f}"
                                       for r in weir_runs),
                    "met": abs(worst["admitted_minus_ideal"]) <= 1.0})
    return out


def fmt(v, spec: str, none: str = "–") -> str:
    return none if v is None else format(v, spec)


def render_markdown(res: dict) -> str:
    m = res["meta"]
    out = []
    out.append(f"### Weir benchmark ({m['mode']}, {m['date']}, {m['git']})\n")
    out.append(
        f"{m['host']['cpus']} CPUs ({m['host']['cpu_model']}); proxy + upstream pinned to CPU "
        f"{m['pinning']['proxy_and_upstream_cpu']}, wrk (1 thread, {m['connections']} "
        f"connections) to CPU {m['pinning']['wrk_cpu']}, Redis to CPU "
        f"{m['pinning']['redis_cpu']}; Weir threads = 1, nginx worker_processes 1. "
        f"Median of {m['reps']} × {m['duration_s']} s runs per row, rows interleaved round-robin "
        f"({m['warmup_s']} s warm-up before each row's first run). Upstream: {m['upstream']}.\n")
    rows = res.get("rows", [])
    if rows:
        out.append("| row | req/s | ratio to row 2 | p50 ms | p99 ms | p99.9 ms "
                   "| proxy CPU s/1k req | Redis calls/req | Redis CPU ms/1k | 2xx % "
                   "| CPU0/CPU1 busy % | other load % |")
        out.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        for r in rows:
            s = r["median"]
            if s["rps"] is None:
                out.append(f"| {r['label']} | failed | | | | | | | | | | |")
                continue
            spread = 100 * (s["rps_max"] - s["rps_min"]) / s["rps"] / 2
            busy = s["core_busy_pct"]
            redis_cols = (f"{fmt(s['redis_evalsha_per_req'], '.2f')} | "
                          f"{fmt(s['redis_cpu_ms_per_1k'], '.1f')}"
                          if s["redis_evalsha_per_req"] and s["redis_evalsha_per_req"] > 0.01
                          else "– | –")
            out.append(
                f"| {r['label']} | {s['rps']:,.0f} ±{spread:.0f}% | "
                f"{fmt(s['ratio_to_passthrough'], '.2f')} | {s['p50_ms']:.2f} | "
                f"{s['p99_ms']:.2f} | {s['p99_9_ms']:.2f} | {s['proxy_cpu_s_per_1k']:.4f} | "
                f"{redis_cols} | {s['admitted_pct']:.1f} | "
                f"{busy.get('cpu0', 0):.0f}/{busy.get('cpu1', 0):.0f} | "
                f"{s['other_load_pct']:.0f} |")
        out.append("")
        out.append("±: half the spread (max − min) of the repetitions. Proxy CPU: utime+stime "
                   "of the proxy process(es) (row 1: the upstream itself). Redis calls: EVALSHA "
                   "per request (INFO commandstats; the GET/TIME/SET the script runs inside are "
                   "in the JSON). Redis CPU: used_cpu_user+sys per 1k EVALSHA. CPU busy: all "
                   "processes, from /proc/stat. "
                   "Other load: CPU of processes outside the benchmark during the run, in % of "
                   "one core (noise from a shared machine).\n")
        rerun = sum(r["median"].get("discarded_runs", 0) for r in rows)
        if rerun:
            out.append(f"{rerun} run(s) disturbed by other processes (> {DISTURBED_PCT}% of a "
                       "core) were run again; the JSON keeps them under `discarded`.\n")
        notes = [f"{r['label'].split('.')[0]}: {r['note']}" for r in rows if r.get("note")]
        if notes:
            out.append("Notes: " + "; ".join(notes) + ".\n")
    paced = res.get("paced")
    if paced and "redis" in paced:
        out.append(f"**Below saturation** (offered ≈ {paced['target_rps']:,} r/s = half of row "
                   f"4's peak; {paced['connections']} connections × {paced['delay_ms']} ms think "
                   "time):\n")
        out.append("| row | req/s | p50 ms | p99 ms | p99.9 ms | proxy CPU s/1k req |")
        out.append("|---|--:|--:|--:|--:|--:|")
        for rid, label in (("passthrough", "2. Weir, no limits"),
                           ("redis", "4. Weir, Redis, 1 zone")):
            s = paced[rid]
            out.append(f"| {label} | {s['rps']:,.0f} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} | "
                       f"{s['p99_9_ms']:.2f} | {s['proxy_cpu_s_per_1k']:.4f} |")
        out.append(f"\nAdded by a Redis decision: p50 {paced['added_p50_ms']:+.2f} ms, "
                   f"p99 {paced['added_p99_ms']:+.2f} ms.\n")
    ceiling = res.get("redis_ceiling")
    if ceiling:
        if "skipped" in ceiling:
            out.append(f"**Redis ceiling**: skipped ({ceiling['skipped']}).\n")
        else:
            call = " ".join(a if a and " " not in a else f'"{a}"' for a in ceiling["call_1_zone"])
            out.append("**Redis ceiling** (`redis-benchmark` EVALSHA of `lua/limit_req.lua` with "
                       "the arguments Weir sends, seen through MONITOR, and random client keys "
                       f"(`-r 10000`); 50 clients; Redis on CPU {ceiling['redis_cpu']}, "
                       f"redis-benchmark on CPU {ceiling['redis_benchmark_cpu']}): "
                       f"`{call}`\n")
            out.append("| zones per call | pipeline | EVALSHA/s | Redis CPU µs/call |")
            out.append("|--:|--:|--:|--:|")
            for r in ceiling["runs"]:
                out.append(f"| {r['zones']} | {r['pipeline']} | {r['ops_per_s']:,.0f} | "
                           f"{r['redis_cpu_us_per_call']:.1f} |")
            out.append("")
    mem = res.get("memory") or {}
    if mem:
        out.append("**Memory**:\n")
    if "redis" in mem:
        rs, rf = mem["redis"]["sample"], mem["redis"]["fill"]
        out.append(f"- Redis, one key as Weir wrote it (`{rs['key']}` = `{rs['value']}`, TTL "
                   f"{rs['pttl_ms'] / 1000:.0f} s): MEMORY USAGE {rs['memory_usage_bytes']} B.")
        out.append(f"- Redis, {rf['dbsize']:,} such keys ({rf['method']}): used_memory "
                   f"+{(rf['used_memory_after'] - rf['used_memory_before']) / 2**20:.1f} MiB = "
                   f"{rf['bytes_per_key']:.0f} B per active key (dict and expiry overhead "
                   "included).")
    if "weir" in mem:
        w = mem["weir"]
        out.append(f"- Weir memory store, {w['keys']:,} distinct keys: RSS "
                   f"{w['rss_after_first_request_kib'] / 1024:.1f} MiB after startup → "
                   f"{w['rss_after_keys_kib'] / 1024:.1f} MiB = {w['bytes_per_key']:.0f} B per key "
                   f"(peak {w['hwm_kib'] / 1024:.1f} MiB).")
    if mem:
        out.append("")
    fleet = res.get("fleet")
    if fleet and fleet.get("runs"):
        out.append(f"**Fleet accuracy** (one key, rate {fleet['rate_rps']} r/s, burst "
                   f"{fleet['burst']} nodelay, {fleet['duration_s']} s of overload; ideal = "
                   "burst + "
                   "1 + rate × window, the window running from the first to the last admitted "
                   "request by the upstream's clock):\n")
        out.append("| instances | admitted | window s | ideal | admitted − ideal "
                   "| admitted / ideal "
                   "| offered r/s (× limit) |")
        out.append("|---|--:|--:|--:|--:|--:|--:|")
        for r in fleet["runs"]:
            what = "Weir on one Redis" if r["kind"] == "weir" else "nginx, local state each"
            out.append(f"| {r['instances']} × {what} | {r['admitted']} | {r['window_s']:.3f} | "
                       f"{r['ideal']:.1f} | "
                       f"{r['admitted_minus_ideal'] + 0.0:+.1f} | {r['admitted_over_ideal']:.2f} | "
                       f"{r['offered_rps']:,} ({r['overload_x']}×) |")
        out.append("")
    if res.get("targets"):
        out.append("**Targets**:\n")
        out.append("| target | measured | met |")
        out.append("|---|---|---|")
        for t in res["targets"]:
            out.append(f"| {t['target']} | {t['value']} | {'yes' if t['met'] else '**no**'} |")
        out.append("")
    if res.get("warnings"):
        out.append("**Warnings**:\n")
        out += [f"- {w}" for w in res["warnings"]]
        out.append("")
    if res.get("failures"):
        out.append("**Failures**:\n")
        out += [f"- {f}" for f in res["failures"]]
        out.append("")
    return "\n".join(out) + "\n"
