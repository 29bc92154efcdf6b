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

    def ms(r, q):
        v = r["latency_us"].get(q)
        return None if v is None else v / 1000

    return {
        "rps": med(rps),
        "rps_min": min(rps), "rps_max": max(rps),
        "p50_ms": med(ms(r, "p50") for r in runs),
        "p99_ms": med(ms(r, "p99") for r in runs),
        "p99_9_ms": med(ms(r, "p99_9") for r in runs),
        "mean_ms": med(ms(r, "mean") for r in runs),
        "proxy_cpu_s_per_1k": med(r["proxy_cpu_s_per_1k"] for r in runs),
        "proxy_core_util_pct": med(r["proxy_core_util_pct"] for r in runs),
        "proxy_ctx_switches_per_req": med(r["proxy_ctx_switches_per_req"] for r in runs),
        "redis_inner_cmds_per_req": med(r["redis_inner_cmds_per_req"] for r in runs),
        "redis_evalsha_per_req": med(r["redis_evalsha_per_req"] for r in runs),
        "redis_decisions_per_req": med(r.get("redis_decisions_per_req") for r in runs),
        "redis_cpu_ms_per_1k": med(r["redis_cpu_ms_per_1k"] for r in runs),
        "redis_cpu_us_per_req": med(r.get("redis_cpu_us_per_req") for r in runs),
        "wrk_core_pct": med(100 * r["wrk_cpu_s"] / r["wall_s"] for r in runs if r["wall_s"]),
        "admitted_pct": med(r["admitted_pct"] for r in runs),
        "other_load_pct": med(r["other_load_pct"] for r in runs),
        "discarded_runs": sum(len(r.get("discarded", [])) for r in runs),
        "other_load_pct_max": max(r["other_load_pct"] for r in runs),
        "core_busy_pct": {c: med(r["core_busy_pct"][c] for r in runs)
                          for c in runs[0]["core_busy_pct"]},
    }


def summarize(row: Row) -> dict:
    return summarize_runs(row.runs)


# The nginx row each row is held against ("ratio to nginx"): nginx proxy_pass for passthroughs,
# nginx limit_req for limiting rows, the TLS twins for the TLS rows.
NGINX_TWIN = {
    "pingora": "nginx_proxy", "pingora_fwd": "nginx_proxy", "passthrough": "nginx_proxy",
    "scale_passthrough": "nginx_proxy",
    "memory": "nginx_limit", "redis": "nginx_limit", "redis3": "nginx_limit",
    "redis_log": "nginx_limit", "redis_log_buf": "nginx_limit", "openresty": "nginx_limit", "openresty_hdr": "nginx_limit", "scale_redis": "scale_nginx_limit",
    "https_weir": "https_nginx", "h2_weir": "h2_nginx",
}
VARIANT_KINDS = ("passthrough", "memory", "redis", "redis_log", "redis3")


def rows_json(rows: list[Row]) -> list[dict]:
    med_rps = {r.id: summarize(r)["rps"] for r in rows}
    base = med_rps.get("passthrough")
    out = []
    for r in rows:
        s = summarize(r)
        kind = r.kind or r.id
        twin = NGINX_TWIN.get(kind)
        if kind == "scale_redis" and not med_rps.get(twin):
            twin = "nginx_limit"
        s["ratio_to_passthrough"] = (s["rps"] / base) if (s["rps"] and base) else None
        s["nginx_twin"] = twin
        s["ratio_to_nginx"] = (s["rps"] / med_rps[twin]) if (s["rps"] and med_rps.get(twin)) \
            else None
        s["ratio_to_baseline_row"] = ((s["rps"] / med_rps[r.kind])
                                      if (r.variant and s["rps"] and med_rps.get(r.kind))
                                      else None)
        if r.variant:
            # Paired by round: run i of the variant came right after run i of the baseline's row,
            # so their ratio cancels the machine's slow drifts (other engineers' builds).
            base_runs = next((b.runs for b in rows if b.id == r.kind), [])
            pairs = [v["rps"] / b["rps"] for v, b in zip(r.runs, base_runs) if b["rps"]]
            s["paired_ratios"] = [round(x, 3) for x in pairs]
            s["paired_ratio"] = med(pairs)
        s["proxy_us_per_req"] = (s["proxy_cpu_s_per_1k"] * 1000
                                 if s.get("proxy_cpu_s_per_1k") is not None else None)
        out.append({"id": r.id, "label": r.label, "keys": r.keys, "note": r.note,
                    "kind": kind, "variant": r.variant, "tool": r.tool,
                    "median": s, "runs": r.runs})
    return out


def weir_ratios(rows: dict[str, dict], suffix: str = "") -> dict:
    """Issue 12's ratios of one Weir (the baseline, or a variant's rows `<id>@NAME`)."""
    def g(rid, key="rps"):
        return (rows.get(rid + suffix) or {}).get(key)

    def ratio(a, b):
        return a / b if (a is not None and b) else None

    def diff(a, b):
        return a - b if (a is not None and b is not None) else None

    p_us, m_us = g("passthrough", "proxy_us_per_req"), g("memory", "proxy_us_per_req")
    r_us, r3_us = g("redis", "proxy_us_per_req"), g("redis3", "proxy_us_per_req")
    dec1, dec3 = diff(r_us, p_us), diff(r3_us, p_us)
    return {
        "passthrough_over_nginx_proxy": ratio(g("passthrough"), g("nginx_proxy")),
        "redis_over_nginx_limit": ratio(g("redis"), g("nginx_limit")),
        "memory_over_passthrough": ratio(g("memory"), g("passthrough")),
        "redis_over_openresty": ratio(g("redis"), g("openresty")),
        "redis_over_openresty_hdr": ratio(g("redis"), g("openresty_hdr")),
        # Per proxy core: the inverse ratio of the proxies' CPU per request (issue 40).
        "redis_over_openresty_hdr_cpu": ratio(g("openresty_hdr", "proxy_us_per_req"), r_us),
        "passthrough_us": p_us, "memory_decision_us": diff(m_us, p_us),
        "redis_decision_us": dec1, "redis3_decision_us": dec3,
        "redis_cpu_us_per_decision": g("redis", "redis_cpu_us_per_req"),
        "redis3_cpu_us_per_decision": g("redis3", "redis_cpu_us_per_req"),
        "zones3_over_1_proxy": ratio(dec3, dec1) if (dec1 or 0) > 0 else None,
        "zones3_over_1_redis": ratio(g("redis3", "redis_cpu_us_per_req"),
                                     g("redis", "redis_cpu_us_per_req")),
        # Row 4a against 4: what the JSON access log costs.
        "access_log_cost": (1 - ratio(g("redis_log"), g("redis"))
                            if ratio(g("redis_log"), g("redis")) is not None else None),
        "access_log_us": diff(g("redis_log", "proxy_us_per_req"), r_us),
    }


def targets(res: dict) -> list[dict]:
    """The issues' targets, each with the measured value and met / not met (None: reported, no
    target)."""
    rows = {r["id"]: r["median"] for r in res.get("rows", [])}
    for s in rows.values():  # results from before µs per request were stored
        if s.get("proxy_us_per_req") is None and s.get("proxy_cpu_s_per_1k") is not None:
            s["proxy_us_per_req"] = s["proxy_cpu_s_per_1k"] * 1000
        if s.get("redis_cpu_us_per_req") is None and s.get("redis_cpu_ms_per_1k") is not None:
            s["redis_cpu_us_per_req"] = s["redis_cpu_ms_per_1k"]  # ms per 1k EVALSHA = µs per
    out = []
    w = weir_ratios(rows)

    def pct(v):
        return f"{100 * v:.0f}%"

    def add(target, value, met, issue="12"):
        out.append({"issue": issue, "target": target, "value": value, "met": met})

    def rps(rid):
        return rows.get(rid, {}).get("rps")

    def us(rid):
        return rows.get(rid, {}).get("proxy_us_per_req")

    if w["passthrough_over_nginx_proxy"] is not None:
        add("Weir passthrough ≥ 0.9× nginx proxy_pass (row 2 / 7b)",
            f"{w['passthrough_over_nginx_proxy']:.2f} ({rps('passthrough'):,.0f} vs "
            f"{rps('nginx_proxy'):,.0f} req/s; {us('passthrough'):.1f} vs "
            f"{us('nginx_proxy'):.1f} µs of proxy CPU per request)",
            w["passthrough_over_nginx_proxy"] >= 0.9)
    if w["redis_over_nginx_limit"] is not None:
        add("Weir Redis, 1 zone ≥ 1.0× nginx limit_req (row 4 / 7)",
            f"{w['redis_over_nginx_limit']:.2f} ({rps('redis'):,.0f} vs "
            f"{rps('nginx_limit'):,.0f} req/s)", w["redis_over_nginx_limit"] >= 1.0)
    if w["memory_over_passthrough"] is not None:
        add("memory store ≥ 0.95× Weir passthrough (row 3 / 2)",
            f"{w['memory_over_passthrough']:.2f} (decision {w['memory_decision_us']:+.1f} µs)",
            w["memory_over_passthrough"] >= 0.95)
    if w["redis_decision_us"] is not None:
        add("Redis decision ≤ 3 µs of proxy CPU (row 4 − row 2)",
            f"{w['redis_decision_us']:.1f} µs ({us('redis'):.1f} − {us('passthrough'):.1f})",
            w["redis_decision_us"] <= 3.0)
    if w["redis_cpu_us_per_decision"] is not None:
        add("≤ 6 µs of Redis CPU per decision (row 4)",
            f"{w['redis_cpu_us_per_decision']:.1f} µs", w["redis_cpu_us_per_decision"] <= 6.0)
    if w["zones3_over_1_proxy"] is not None:
        add("3 zones ≤ 1.5× the proxy CPU of a 1-zone decision ((5 − 2) / (4 − 2))",
            f"{w['zones3_over_1_proxy']:.2f} ({w['redis3_decision_us']:.1f} vs "
            f"{w['redis_decision_us']:.1f} µs)", w["zones3_over_1_proxy"] <= 1.5)
    if w["zones3_over_1_redis"] is not None:
        add("3 zones ≤ 1.5× the Redis CPU of a 1-zone decision (row 5 / 4)",
            f"{w['zones3_over_1_redis']:.2f} ({w['redis3_cpu_us_per_decision']:.1f} vs "
            f"{w['redis_cpu_us_per_decision']:.1f} µs)", w["zones3_over_1_redis"] <= 1.5)
    for rid, what in (("redis_log", "JSON access log on"), ("redis_log_buf", "JSON access log, buffered,")):
        if rps(rid) and rps("redis"):
            cost = 1 - rps(rid) / rps("redis")
            add(f"{what} costs ≤ 5% of row 4's req/s (row {ROW_NUMBER[rid]} vs 4)",
                f"{pct(cost)} ({rps(rid):,.0f} vs {rps('redis'):,.0f} req/s; "
                f"{us(rid) - us('redis'):+.1f} µs per request)", cost <= 0.05)
    if w["redis_over_openresty"] is not None:
        add("Weir Redis, 1 zone ≥ OpenResty + Redis, the distributed peer (row 4 / 8)",
            f"{w['redis_over_openresty']:.2f} ({rps('redis'):,.0f} vs {rps('openresty'):,.0f} "
            f"req/s; {us('redis'):.1f} vs {us('openresty'):.1f} µs)",
            w["redis_over_openresty"] >= 1.0)
    if w["redis_over_openresty_hdr_cpu"] is not None:
        add("Weir Redis, 1 zone ≥ 1.05× OpenResty + Redis sending the same headers, per proxy core "
            "(row 4 / 8b, CPU per request)",
            f"{w['redis_over_openresty_hdr_cpu']:.2f} ({us('openresty_hdr'):.1f} vs {us('redis'):.1f} µs; "
            f"req/s {w['redis_over_openresty_hdr']:.2f})",
            w["redis_over_openresty_hdr_cpu"] >= 1.05, "40")
    for a, b, what in (("scale_redis", "redis", "Weir Redis 1 zone, threads 2 / threads 1 "
                        "(row 9b / 4)"),
                       ("scale_passthrough", "passthrough", "Weir passthrough, threads 2 / "
                        "threads 1 (row 9 / 2)"),
                       ("scale_nginx_limit", "nginx_limit", "nginx limit_req, 2 workers / 1 "
                        "(row 9c / 7)")):
        if rps(a) and rps(b):
            wrk = rows[a].get("wrk_core_pct")
            add(f"scaling: {what}", f"{rps(a) / rps(b):.2f}× ({rps(a):,.0f} vs {rps(b):,.0f} "
                f"req/s; wrk took {wrk:.0f}% of its core)" if wrk is not None else
                f"{rps(a) / rps(b):.2f}×", None)
    if rps("pingora") and rps("passthrough"):
        add("Weir passthrough / plain Pingora (row 2 / 2a)",
            f"{rps('passthrough') / rps('pingora'):.2f} ({us('pingora'):.1f} µs Pingora's own, "
            f"{us('passthrough') - us('pingora'):+.1f} µs Weir's per request; plain Pingora / "
            f"nginx proxy {rps('pingora') / rps('nginx_proxy'):.2f})"
            if rps("nginx_proxy") else f"{rps('passthrough') / rps('pingora'):.2f}", None)
    # Issue 40: per proxy core (the inverse ratio of CPU per request) against plain Pingora.
    for rid, goal in (("passthrough", 0.95), ("memory", 0.91), ("redis", 0.87)):
        if us("pingora") and us(rid):
            add(f"Weir row {ROW_NUMBER[rid]} / plain Pingora (2a) per proxy core ≥ {goal}",
                f"{us('pingora') / us(rid):.2f} ({us('pingora'):.1f} vs {us(rid):.1f} µs per request)",
                us("pingora") / us(rid) >= goal, "40")
    if rps("pingora_fwd") and rps("passthrough"):
        add("Weir passthrough / plain Pingora sending the same forwarded headers (row 2 / 2b)",
            f"{rps('passthrough') / rps('pingora_fwd'):.2f} ({us('pingora_fwd'):.1f} µs vs "
            f"{us('passthrough'):.1f} µs per request)", None)
    for a, b, what in (("https_weir", "https_nginx", "HTTPS: Weir / nginx (row 10 / 10b)"),
                       ("h2_weir", "h2_nginx", "h2 over TLS: Weir / nginx (row 11 / 11b)")):
        if rps(a) and rps(b):
            add(what, f"{rps(a) / rps(b):.2f} ({rps(a):,.0f} vs {rps(b):,.0f} req/s; "
                f"{us(a):.1f} vs {us(b):.1f} µs)", None)

    # Issue 4's targets, still reported.
    redis, nginx = rows.get("redis", {}), rows.get("nginx_limit", {})
    if redis.get("ratio_to_passthrough") is not None:
        add("Redis all-passing ≥ 85% of passthrough req/s (row 4 / 2)",
            pct(redis["ratio_to_passthrough"]), redis["ratio_to_passthrough"] >= 0.85, "4")
    paced = res.get("paced", {})
    if "added_p99_ms" in paced:
        add("added p99 of a Redis decision at half of peak ≤ 1 ms",
            f"{paced['added_p99_ms']:.2f} ms (p99 {paced['redis']['p99_ms']:.2f} vs "
            f"{paced['passthrough']['p99_ms']:.2f} ms at {paced['redis']['rps']:.0f} r/s)",
            paced["added_p99_ms"] <= 1.0, "4")
    flood, cached = rows.get("flood", {}), rows.get("flood_cache")
    if cached and cached.get("redis_evalsha_per_req") is not None:
        add("one-key flood with deny cache ≤ 0.01 Redis calls/request",
            f"{cached['redis_evalsha_per_req']:.4f} (without: "
            f"{flood.get('redis_evalsha_per_req', 0):.3f})",
            cached["redis_evalsha_per_req"] <= 0.01, "4")
    elif flood.get("redis_evalsha_per_req") is not None:
        add("one-key flood with deny cache ≤ 0.01 Redis calls/request",
            f"{flood['redis_evalsha_per_req']:.3f} (deny cache: not implemented yet)",
            flood["redis_evalsha_per_req"] <= 0.01, "4")
    fleet = res.get("fleet", {}).get("runs", [])
    weir_runs = [r for r in fleet if r["kind"] == "weir"]
    if weir_runs:
        worst = max(weir_runs, key=lambda r: abs(r["admitted_minus_ideal"]))
        add("fleet accuracy: admitted within ±1 of burst + 1 + rate × t, all N",
            ", ".join(f"N={r['instances']}: {r['admitted_minus_ideal'] + 0.0:+.1f}"
                      for r in weir_runs),
            abs(worst["admitted_minus_ideal"]) <= 1.0, "4")
    return out


def fmt(v, spec: str, none: str = "–") -> str:
    return none if v is None else format(v, spec)


def render_markdown(res: dict) -> str:
    m = res["meta"]
    out = []
    if res.get("rows") or not res.get("instructions"):
        out.append(f"### Weir benchmark ({m['mode']}, {m['date']}, {m['git']})\n")
    if res.get("rows"):
        out.append(
            f"{m['host']['cpus']} CPUs ({m['host']['cpu_model']}); proxy + upstream pinned to "
            f"CPU {m['pinning']['proxy_and_upstream_cpu']}, wrk (1 thread, {m['connections']} "
            f"connections) to CPU {m['pinning']['wrk_cpu']}, Redis to CPU "
            f"{m['pinning']['redis_cpu']}; Weir threads = 1, nginx worker_processes 1. "
            f"Median of {m['reps']} × {m['duration_s']} s runs per row, rows interleaved "
            f"round-robin, backwards every other repetition ({m['warmup_s']} s warm-up before each row's first run). Upstream: "
            f"{m['upstream']}.\n")
    rows = res.get("rows", [])
    if rows:
        out.append("| row | req/s | ratio to row 2 | ratio to nginx | p50 ms | p99 ms | p99.9 ms "
                   "| proxy CPU µs/req | Redis calls/req | Redis CPU µs/decision | 2xx % "
                   "| CPU0/CPU1 busy % | other load % |")
        out.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        for r in rows:
            s = r["median"]
            if s["rps"] is None:
                out.append(f"| {r['label']} | failed | | | | | | | | | | | |")
                continue
            spread = 100 * (s["rps_max"] - s["rps_min"]) / s["rps"] / 2
            busy = s["core_busy_pct"]
            decided = s.get("redis_decisions_per_req") or s["redis_evalsha_per_req"]
            redis_cols = (f"{fmt(s['redis_evalsha_per_req'], '.2f')} | "
                          f"{fmt(s.get('redis_cpu_us_per_req'), '.1f')}"
                          if decided and decided > 0.01 else "– | –")
            twin = ""
            if s.get("ratio_to_nginx") is not None:
                twin = f"{s['ratio_to_nginx']:.2f} ({ROW_NUMBER.get(s['nginx_twin'], '')})"
            out.append(
                f"| {r['label']} | {s['rps']:,.0f} ±{spread:.0f}% | "
                f"{fmt(s['ratio_to_passthrough'], '.2f')} | {twin or '–'} | "
                f"{fmt(s['p50_ms'], '.2f')} | {fmt(s['p99_ms'], '.2f')} | "
                f"{fmt(s['p99_9_ms'], '.2f')} | {fmt(s.get('proxy_us_per_req'), '.1f')} | "
                f"{redis_cols} | {s['admitted_pct']:.1f} | "
                f"{busy.get('cpu0', 0):.0f}/{busy.get('cpu1', 0):.0f} | "
                f"{s['other_load_pct']:.0f} |")
        out.append("")
        out.append("±: half the spread (max − min) of the repetitions. Ratio to nginx: to nginx "
                   "proxy_pass (7b) for passthroughs, nginx limit_req (7) for limiting rows, the "
                   "2-worker nginx (9c) for 9b, the nginx TLS twin for 10 and 11. Proxy CPU: "
                   "utime+stime of the proxy process(es) per request (row 1: the upstream "
                   "itself). Redis calls: EVALSHA per request (INFO commandstats; the GET/TIME/SET "
                   "the script runs inside are in the JSON). Redis CPU: used_cpu_user+sys per "
                   "request decided in Redis (EVALSHA, or the decisions of weir_redis_batch_size "
                   "when the build batches). CPU busy: all processes, from /proc/stat. Other "
                   "load: CPU of processes outside the benchmark during the run, in % of one core "
                   "(noise from a shared machine). h2load rows (11, 11b) have no percentiles (mean in the "
                   "JSON).\n")
        rerun = sum(r["median"].get("discarded_runs", 0) for r in rows)
        if rerun:
            out.append(f"{rerun} run(s) disturbed by other processes (> {DISTURBED_PCT}% of a "
                       "core) were run again; the JSON keeps them under `discarded`.\n")
        notes = [f"{r['label'].split('.')[0]}: {r['note']}" for r in rows if r.get("note")]
        byid = {r["id"]: r["median"] for r in rows}
        for rid in ("scale_redis", "scale_passthrough"):
            if byid.get(rid, {}).get("wrk_core_pct") is not None:
                s = byid[rid]
                notes.append(
                    f"{ROW_NUMBER[rid]}: Weir may use both cores, but wrk (1 thread, "
                    f"{s['wrk_core_pct']:.0f}% of a core here) and Redis stay on CPU "
                    f"{m['pinning']['wrk_cpu']} and the upstream on CPU "
                    f"{m['pinning']['proxy_and_upstream_cpu']}: the load generator takes CPU from "
                    "the proxy's second thread, so this is a lower bound of what 2 threads do")
        if notes:
            out.append("Notes: " + "; ".join(notes) + ".\n")
    if res.get("skipped"):
        out.append("Not run: " + "; ".join(f"`{k}` ({v})" for k, v in res["skipped"].items())
                   + ".\n")
    variants = m.get("variants") or []
    if variants and rows:
        out += render_variants(rows, variants)
    batch = res.get("batch_size")
    if batch is not None and rows:
        out += render_batch(batch)
    paced = res.get("paced")
    if paced and "redis" in paced:
        out.append(f"**Below saturation** (offered ≈ {paced['target_rps']:,} r/s = half of row "
                   f"4's peak; {paced['connections']} connections × {paced['delay_ms']} ms think "
                   "time):\n")
        out.append("| row | req/s | p50 ms | p99 ms | p99.9 ms | proxy CPU µs/req |")
        out.append("|---|--:|--:|--:|--:|--:|")
        for rid, label in (("passthrough", "2. Weir, no limits"),
                           ("redis", "4. Weir, Redis, 1 zone")):
            s = paced[rid]
            out.append(f"| {label} | {s['rps']:,.0f} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} | "
                       f"{s['p99_9_ms']:.2f} | {s['proxy_cpu_s_per_1k'] * 1000:.1f} |")
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
    if res.get("instructions"):
        out += render_instructions(res["instructions"])
    if res.get("targets"):
        out.append("**Targets**:\n")
        out.append("| issue | target | measured | met |")
        out.append("|---|---|---|---|")
        for t in res["targets"]:
            met = "–" if t["met"] is None else ("yes" if t["met"] else "**no**")
            out.append(f"| #{t.get('issue', '')} | {t['target']} | {t['value']} | {met} |")
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


ROW_NUMBER = {
    "upstream": "1", "echo": "1b", "pingora": "2a", "pingora_fwd": "2b", "passthrough": "2",
    "memory": "3",
    "redis": "4", "redis_log": "4a", "redis_log_buf": "4b", "redis3": "5", "flood": "6", "flood_cache": "6b",
    "nginx_limit": "7", "nginx_proxy": "7b", "openresty": "8", "openresty_hdr": "8b",
    "scale_passthrough": "9",
    "scale_redis": "9b", "scale_nginx_limit": "9c", "https_weir": "10", "https_nginx": "10b",
    "h2_weir": "11", "h2_nginx": "11b",
}


def render_variants(rows: list[dict], variants: list[dict]) -> list[str]:
    """The A/B table: rows 2-5 and 4a of the baseline and of each --variant, side by side."""
    byid = {r["id"]: r["median"] for r in rows}
    out = ["**A/B variants** (rows 2–5 and 4a of each, interleaved with the others; baseline = "
           "`--weir`):\n"]
    for v in variants:
        out.append(f"- `{v['name']}`: {v['binary'] or 'the baseline binary'}"
                   + (f", settings `{'; '.join(v['settings'])}`" if v["settings"] else ""))
    out.append("")
    out.append("| row | build | req/s | vs baseline's row (paired: median, range) "
               "| ratio to baseline row 2 "
               "| ratio to nginx | proxy CPU µs/req | decision µs (− row 2) "
               "| Redis CPU µs/decision |")
    out.append("|---|---|--:|--:|--:|--:|--:|--:|--:|")
    names = [""] + [v["name"] for v in variants]
    for kind in VARIANT_KINDS:
        for name in names:
            rid = f"{kind}@{name}" if name else kind
            s = byid.get(rid)
            if not s or s.get("rps") is None:
                continue
            p = byid.get(f"passthrough@{name}" if name else "passthrough", {})
            dec = (s["proxy_us_per_req"] - p["proxy_us_per_req"]
                   if kind != "passthrough" and p.get("proxy_us_per_req") is not None else None)
            out.append(
                f"| {ROW_NUMBER[kind]} | {name or 'baseline'} | {s['rps']:,.0f} | "
                f"{paired(s) if name else '1.00'} | "
                f"{fmt(s['ratio_to_passthrough'], '.2f')} | {fmt(s.get('ratio_to_nginx'), '.2f')} "
                f"| {fmt(s.get('proxy_us_per_req'), '.1f')} | {fmt(dec, '+.1f')} | "
                f"{fmt(s.get('redis_cpu_us_per_req') if kind.startswith('redis') else None, '.1f')}"
                " |")
    out.append("")
    out.append("| issue 12 ratio | " + " | ".join(n or "baseline" for n in names) + " |")
    out.append("|---|" + "--:|" * len(names))
    ratios = []
    for n in names:
        # A variant's rows under the baseline's ids, next to the baseline's nginx and OpenResty.
        sub = dict(byid) if not n else {
            **{k: byid[k] for k in ("nginx_proxy", "nginx_limit", "openresty") if k in byid},
            **{k.split("@")[0]: v for k, v in byid.items() if k.endswith(f"@{n}")}}
        ratios.append(weir_ratios(sub))
    lines = (("passthrough / nginx proxy_pass (≥ 0.9)", "passthrough_over_nginx_proxy", ".2f"),
             ("Redis 1 zone / nginx limit_req (≥ 1.0)", "redis_over_nginx_limit", ".2f"),
             ("memory / passthrough (≥ 0.95)", "memory_over_passthrough", ".2f"),
             ("Redis decision, µs of proxy CPU (≤ 3)", "redis_decision_us", ".1f"),
             ("Redis CPU µs per decision (≤ 6)", "redis_cpu_us_per_decision", ".1f"),
             ("3 zones / 1 zone, proxy (≤ 1.5)", "zones3_over_1_proxy", ".2f"),
             ("3 zones / 1 zone, Redis (≤ 1.5)", "zones3_over_1_redis", ".2f"),
             ("Redis 1 zone / OpenResty + Redis", "redis_over_openresty", ".2f"),
             ("JSON access log, share of row 4's req/s lost (≤ 0.05)", "access_log_cost", ".3f"),
             ("JSON access log, µs of proxy CPU (row 4a − 4)", "access_log_us", "+.1f"))
    for label, key, spec in lines:
        out.append(f"| {label} | " + " | ".join(fmt(r.get(key), spec) for r in ratios) + " |")
    out.append("")
    return out


def paired(s: dict) -> str:
    """A variant row against the baseline's: the median of the per-round ratios and their range
    (the ratio of the medians if there are none)."""
    pairs = s.get("paired_ratios") or []
    if not pairs:
        return fmt(s.get("ratio_to_baseline_row"), ".2f")
    if len(pairs) == 1:
        return f"{pairs[0]:.2f}"
    return f"{s['paired_ratio']:.2f} ({min(pairs):.2f}–{max(pairs):.2f})"


def render_batch(batch: dict) -> list[str]:
    """weir_redis_batch_size of the Redis rows' Weirs, or why there is none."""
    out = []
    present = {k: v for k, v in batch.items() if v.get("present")}
    if not present:
        why = next((v["error"] for v in batch.values() if "error" in v), None)
        out.append("**Redis batch sizes** (`weir_redis_batch_size` on the admin `/metrics` of the "
                   "Redis rows' Weirs): not exposed by this build"
                   + (f" (scrape failed: {why})" if why else "") + ".\n")
        return out
    out.append("**Redis batch sizes** (`weir_redis_batch_size` from the admin `/metrics` of each "
               "Redis row's Weir, over all its runs, warm-ups included):\n")
    for target, h in present.items():
        calls = h["calls"] or 1
        out.append(f"- `{target}`: {h['calls']:,.0f} Redis calls, {h['decisions']:,.0f} "
                   f"decisions, mean {fmt(h['mean'], '.2f')} per call; "
                   + ", ".join(f"≤ {b['le']}: {100 * b['calls'] / calls:.1f}%"
                               for b in h["buckets"] if b["calls"]))
    out.append("")
    return out


def render_instructions(ins: dict) -> list[str]:
    """The --instructions section: instructions per request of the proxy process (callgrind)."""
    m = ins.get("meta", {})
    out = [f"### Instructions per request (callgrind; {m.get('date')}, {m.get('git')})\n"]
    rows = ins.get("rows") or []
    if rows:
        conns, (short, long) = ins["connections"], ins["windows_s"]
        out.append(
            f"Each row's proxy alone under `valgrind --tool=callgrind` ({ins.get('valgrind')}; "
            f"nginx with `master_process off`), the upstream and Redis native, the throughput "
            f"rows' configs; wrk (1 thread, {conns} connections, the same keys) for "
            f"{ins['warmup_s']} s of warm-up, then two windows on the same process, "
            f"{short} s and {long} s, each between `callgrind_control -z` and `-d`, and one "
            f"of {ins.get('idle_s', '?')} s without load; proxy "
            f"and upstream on CPU {m['pinning']['proxy_and_upstream_cpu']}, wrk on CPU "
            f"{m['pinning']['wrk_cpu']}, Redis on CPU {m['pinning']['redis_cpu']}; Weir threads "
            "= 1. "
            "Instructions per request = (Ir of the long window − Ir of the short one − the "
            "idle window's Ir per second × the difference in seconds) / (their difference in "
            "completed requests): the cost of a wrk run's connections and of the requests cut at "
            "its stop cancels out, and the process's own background (timer threads ticking, "
            "column 'idle k/s'), which would add background / rate to every request at the "
            "100–3000 req/s of valgrind, is left out. Busy %: the share of the long window the "
            "proxy was on a CPU or waiting for one (schedstat); below 90 % it waited for "
            "requests (wrk or Redis starved by other load), batched fewer events and counted "
            "more, so the row is run again (the JSON keeps the discarded counts).\n")
        byid = {r["id"]: r for r in rows}

        def ir(rid):
            return (byid.get(rid) or {}).get("ir_per_req")

        def ratio(a, b):
            return f"{a / b:.2f}" if (a is not None and b) else "–"

        out.append("| row | instructions/req | vs plain Pingora (2a) | vs Pingora + forwarded "
                   "headers (2b) | vs nginx | − row 2 "
                   "(same build) | vs baseline's row | syscalls/req (native, strace) "
                   "| Redis decisions/call | req/s under valgrind | busy % | idle k/s "
                   "| requests counted |")
        out.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        for r in rows:
            kind, v = r["kind"], r["variant"]
            twin = NGINX_TWIN.get(kind)
            vs_nginx = ratio(r["ir_per_req"], ir(twin)) if twin else "–"
            if vs_nginx != "–":
                vs_nginx += f" ({ROW_NUMBER[twin]})"
            p2 = ir(f"passthrough@{v}" if v else "passthrough")
            over2 = (f"{r['ir_per_req'] - p2:+,.0f}"
                     if p2 is not None and kind in ("memory", "redis", "redis_log", "redis3")
                     else "–")
            sc = r.get("syscalls") or {}
            batch = r.get("redis_batch_mean")
            counted = r["windows"][1]["requests"] - r["windows"][0]["requests"]
            out.append(
                f"| {r['label']} | {r['ir_per_req']:,.0f} | {ratio(r['ir_per_req'], ir('pingora'))}"
                f" | {ratio(r['ir_per_req'], ir('pingora_fwd'))} | {vs_nginx} | {over2} | {ratio(r['ir_per_req'], ir(kind)) if v else '–'} | "
                f"{fmt(sc.get('per_req'), '.2f')} | {fmt(batch, '.2f')} | "
                f"{r['rps_under_valgrind']:,.0f} | {fmt(r.get('proxy_busy_pct'), '.0f')} | "
                f"{fmt(r.get('background_ir_per_s') and r['background_ir_per_s'] / 1e3, ',.0f')} | "
                f"{counted:,} |")
        out.append("")
        out.append(
            "What this counts: user-space instructions (Ir) of the proxy process, all its "
            "threads, libc and the allocator included. Not counted: the kernel (syscalls, TCP, "
            "epoll; hence syscalls per request, from a separate native run of the same config "
            f"under `strace -c -f` for {ins.get('strace_s')} s: strace slows each syscall, which "
            "changes how many events one epoll_wait returns, so a rough figure), the upstream, "
            "Redis and wrk; nor cache misses, branch mispredictions or memory stalls: an "
            "instruction is not a time. Requests counted: the long window's completed requests "
            "minus the short one's. Redis decisions/call: mean `weir_redis_batch_size` during "
            "the long window. Coalescing depends on the concurrency and on the proxy's speed: "
            "under valgrind (~50-100× slower; req/s column) batches differ from native runs, "
            "and so do the Redis rows' instructions per request; compare Redis rows at similar "
            "batch sizes. Keys: the throughput rows' 10k addresses, but only a few thousand "
            "requests per row, so most limit keys are decided once or twice (and, at the "
            "rows' rates, a key's state has always expired by its next request). The JSON "
            "keeps per row the difference without the background correction "
            "(`ir_per_req_with_background`), the plain long-window total / requests "
            "(`ir_per_req_long_window`), the per-run cost (`ir_fixed_per_run`), the dumps' names "
            "and the top syscalls.\n")
    if ins.get("skipped"):
        out.append("Not counted: " + "; ".join(f"`{k}` ({v})" for k, v in ins["skipped"].items())
                   + ".\n")
    for key, title in (("warnings", "Warnings (instructions)"),
                       ("failures", "Failures (instructions)")):
        if ins.get(key):
            out.append(f"**{title}**:\n")
            out += [f"- {w}" for w in ins[key]]
            out.append("")
    return out
