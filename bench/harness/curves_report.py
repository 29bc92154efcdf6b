"""The cost curves' report: the figures each curve is read by, the markdown tables, and PNG plots
(matplotlib when it is installed; without it the report is the tables alone).

Also runnable on a saved result: `python3 bench/harness/curves_report.py RESULTS.json` rewrites
the .md and the PNGs beside it."""

from __future__ import annotations

import statistics
from pathlib import Path


def med(runs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v, digits: int = 0, unit: str = "") -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}{unit}"


# ---- figures -----------------------------------------------------------------------------


def keys_figures(k: dict) -> dict:
    """Bytes per key of each point (from the first point) and between points (the slope)."""
    out = {}
    for name in ("weir", "nginx_rss"):
        pts = (k.get(name) or {}).get("points") or []
        if not pts:
            continue
        base = pts[0]
        first = pts[1] if len(pts) > 1 else base
        rows = []
        prev = base
        for p in pts[1:]:
            dk_first = (p["keys"] or 0) - (first["keys"] or 0)
            keys = (p["keys"] or p.get("requests") or 0) - (base["keys"] or 0)
            dk = (p["keys"] or 0) - (prev["keys"] or 0)
            rows.append({
                "keys": p["keys"], "rss_mib": p["rss_kib"] / 1024,
                "bytes_per_key": (p["rss_kib"] - base["rss_kib"]) * 1024 / keys if keys else None,
                "slope": (p["rss_kib"] - prev["rss_kib"]) * 1024 / dk if dk else None,
                "since_first": ((p["rss_kib"] - first["rss_kib"]) * 1024 / dk_first
                                if dk_first else None),
                "seconds": p.get("seconds")})
            prev = p
        out[name] = {"base_mib": base["rss_kib"] / 1024, "base_keys": base["keys"],
                     "rows": rows}
    zones = k.get("nginx_zone") or []
    per_state = [z["bytes_per_state"] for z in zones if z.get("bytes_per_state")]
    if per_state:
        out["nginx_zone_bytes_per_state"] = per_state[-1]  # the largest zone: least page overhead
    return out


def at(rows: list[dict], keys: int) -> dict | None:
    """The row nearest `keys`, if within 10 %."""
    best = min(rows, key=lambda r: abs(r["keys"] - keys), default=None)
    if best and abs(best["keys"] - keys) <= 0.1 * keys:
        return best
    return None


# ---- markdown ------------------------------------------------------------------------------


def render_curves(res: dict, plots: list[str]) -> str:
    m = res.get("meta", {})
    lines = [f"### Weir cost curves ({m.get('mode')}, {m.get('date')}, {m.get('git')})", ""]
    pin = m.get("pinning", {})
    lines += [
        f"{(m.get('host') or {}).get('cpus')} CPUs ({(m.get('host') or {}).get('cpu_model')}); "
        f"unless a part says otherwise the proxy and the upstream (nginx `return 200`) run on CPU "
        f"{pin.get('proxy_and_upstream_cpu')}, wrk (1 thread, {m.get('connections')} connections) "
        f"and Redis on CPU {pin.get('wrk_cpu')}; the release binary; {m.get('reps')} × "
        f"{m.get('duration_s')} s per throughput point, points interleaved. "
        f"{m.get('versions', {}).get('nginx')}; {m.get('versions', {}).get('redis')}. "
        f"Run took {fmt(m.get('elapsed_s'))} s.", ""]
    if plots:
        lines += [" ".join(f"![{Path(p).stem}]({Path(p).name})" for p in plots), ""]
    if "keys" in res:
        lines += render_keys(res["keys"])
    if "connections" in res:
        lines += render_connections(res["connections"])
    if "zones" in res:
        lines += render_zones(res["zones"])
    if "threads" in res:
        lines += render_threads(res["threads"])
    if "cluster" in res:
        lines += render_cluster(res["cluster"])
    if res.get("warnings"):
        lines += ["**Warnings**:", ""] + [f"- {w}" for w in res["warnings"]] + [""]
    if res.get("failures"):
        lines += ["**Failures**:", ""] + [f"- {f}" for f in res["failures"]] + [""]
    return "\n".join(lines) + "\n"


def render_keys(k: dict) -> list[str]:
    f = keys_figures(k)
    out = ["**1. Memory per key** (one zone keyed on the client address, every key's first "
           "request; Weir: memory store, 1 r/h burst 10, `max_keys` above the fill, RSS of the "
           "process and the store's `weir_memory_keys`; nginx: `limit_req` 1r/m burst 10 in a "
           "zone that never fills, RSS of its worker, which counts the zone pages it touched):",
           "", "| proxy | keys | RSS MiB | bytes/key from start | bytes/key since the first point "
           "| bytes/key since the previous point | fill s |", "|---|--:|--:|--:|--:|--:|--:|"]
    for name, label in (("weir", "Weir memory store"), ("nginx_rss", "nginx limit_req")):
        if name not in f:
            continue
        out.append(f"| {label} | {f[name]['base_keys'] or 0:,} | {f[name]['base_mib']:.1f} "
                   "| | | | |")
        for r in f[name]["rows"]:
            out.append(f"| {label} | {r['keys']:,} | {r['rss_mib']:.1f} | "
                       f"{fmt(r['bytes_per_key'])} | {fmt(r['since_first'])} | {fmt(r['slope'])} | "
                       f"{fmt(r['seconds'])} |")
    out.append("")
    zones = k.get("nginx_zone") or []
    if zones:
        out += ["nginx zone capacity (filled with twice its docs' 8k states per MiB, then asked "
                "again newest first: a state still held rejects):", "",
                "| zone | keys offered | states held | bytes per state |", "|--:|--:|--:|--:|"]
        for z in zones:
            out.append(f"| {z['zone_mib']} MiB | {z['keys_offered']:,} | {z['states_held']:,} | "
                       f"{fmt(z['bytes_per_state'], 1)} |")
        out.append("")
    w = f.get("weir", {}).get("rows", [])
    per_state = f.get("nginx_zone_bytes_per_state")
    for n in (1_000_000, 10_000_000):
        r = at(w, n)
        if r:
            zone = (f"; an nginx zone for {n:,} keys needs {per_state * n / 2**20:,.0f} MiB "
                    f"({per_state:.0f} B per state)" if per_state else "")
            out.append(f"- At {n:,} keys Weir's memory store takes {r['bytes_per_key']:.0f} B per "
                       f"key of RSS{zone}.")
    out.append("")
    return out


def render_connections(c: dict) -> list[str]:
    out = ["**2. Memory per connection and per stream** (RSS growth of the proxy process (Weir) "
           "or its worker (nginx) divided by the count; kernel socket buffers are not in RSS):",
           "", "| what | Weir B | nginx B | count |", "|---|--:|--:|--:|"]
    h1 = c.get("h1_idle", {})
    if h1:
        n = (h1.get("weir") or h1.get("nginx") or {}).get("connections")
        out.append(f"| idle HTTP/1.1 keep-alive connection (after one request) | "
                   f"{fmt((h1.get('weir') or {}).get('bytes_per_connection'))} | "
                   f"{fmt((h1.get('nginx') or {}).get('bytes_per_connection'))} | {fmt(n)} |")
    if (h1.get("pingora") or {}).get("bytes_per_connection") is not None:
        out.append(f"| the same, plain Pingora 0.9.1 (examples/pingora_passthrough) | "
                   f"{fmt(h1['pingora']['bytes_per_connection'])} | | "
                   f"{fmt(h1['pingora'].get('connections'))} |")
    h2 = c.get("h2", {})
    if h2:
        w, g = h2.get("weir") or {}, h2.get("nginx") or {}
        out.append(f"| idle h2c connection (settings exchanged, no stream) | "
                   f"{fmt(w.get('bytes_per_connection'))} | {fmt(g.get('bytes_per_connection'))} "
                   f"| {fmt(w.get('connections') or g.get('connections'))} |")
        out.append(f"| open HTTP/2 stream (a GET whose upstream never answers: the stream and its "
                   f"upstream connection) | {fmt(w.get('bytes_per_stream'))} | "
                   f"{fmt(g.get('bytes_per_stream'))} | {fmt(w.get('streams_held_upstream'))} / "
                   f"{fmt(g.get('streams_held_upstream'))} |")
    out.append("")
    return out


def render_zones(z: dict) -> list[str]:
    runs = z.get("runs", {})
    out = ["**3. CPU per request against zones per route** (10k client addresses, every request "
           "passing; each zone keyed on the client address; Redis: one script call per request "
           "for all its zones):", "",
           "| zones | Weir memory µs/req | Weir Redis µs/req | Redis CPU µs/req | requests per "
           "Redis call | nginx µs/req | Weir memory req/s | Weir Redis req/s | nginx req/s |",
           "|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for n in (1, 3, 8):
        mem, red, ngx = runs.get(f"mem{n}", []), runs.get(f"redis{n}", []), runs.get(f"nginx{n}", [])
        out.append(f"| {n} | {fmt(med(mem, 'proxy_cpu_us_per_req'), 1)} | "
                   f"{fmt(med(red, 'proxy_cpu_us_per_req'), 1)} | "
                   f"{fmt(med(red, 'redis_cpu_us_per_request'), 1)} | "
                   f"{fmt(per_call(red), 1)} | "
                   f"{fmt(med(ngx, 'proxy_cpu_us_per_req'), 1)} | {fmt(med(mem, 'rps'))} | "
                   f"{fmt(med(red, 'rps'))} | {fmt(med(ngx, 'rps'))} |")
    out.append("")
    per = []
    for name, label in (("mem", "Weir memory"), ("redis", "Weir Redis"), ("nginx", "nginx")):
        a, b = med(runs.get(f"{name}1", []), "proxy_cpu_us_per_req"), \
            med(runs.get(f"{name}8", []), "proxy_cpu_us_per_req")
        if a is not None and b is not None:
            per.append(f"{label} {(b - a) / 7:+.2f}")
    a, b = med(runs.get("redis1", []), "redis_cpu_us_per_request"), \
        med(runs.get("redis8", []), "redis_cpu_us_per_request")
    if a is not None and b is not None:
        per.append(f"Redis's own {(b - a) / 7:+.2f}")
    if per:
        out += [f"Each zone from 1 to 8 adds (µs of CPU per request): {', '.join(per)}.", ""]
    return out


def per_call(runs: list[dict]) -> float | None:
    """Requests per Redis script call (the lane's batch), median over runs."""
    return med([{"v": 1 / r["redis_evalsha_per_req"]} for r in runs
                if r.get("redis_evalsha_per_req")], "v")


def render_threads(t: dict) -> list[str]:
    runs = t.get("runs", {})
    out = ["**4. threads = 2 against threads = 1** (Weir memory store, 1 zone; nginx limit_req, "
           "worker_processes 1 and 2; the 2-thread servers may use both cores, wrk (1 thread) "
           "stays on CPU 1 and the upstream on CPU 0, so the second core is shared with the "
           "load generator):", "",
           "| server | req/s | ratio 2 / 1 | proxy CPU µs/req | proxy cores busy | wrk % of a core "
           "| CPU0/CPU1 busy % |", "|---|--:|--:|--:|--:|--:|--:|"]
    for a, b, label in (("weir_t1", "weir_t2", "Weir"), ("nginx_w1", "nginx_w2", "nginx")):
        base = med(runs.get(a, []), "rps")
        for name, n in ((a, 1), (b, 2)):
            rs = runs.get(name, [])
            rps = med(rs, "rps")
            wrk = med([{"v": 100 * r["wrk_cpu_s"] / r["wall_s"]} for r in rs if r.get("wall_s")],
                      "v")
            busy = rs[len(rs) // 2]["core_busy_pct"] if rs else {}
            ratio = fmt(rps / base, 2) if rps and base else "–"
            out.append(f"| {label}, {n} {'thread' if label == 'Weir' else 'worker'}"
                       f"{'s' if n > 1 else ''} | {fmt(rps)} | {ratio} | "
                       f"{fmt(med(rs, 'proxy_cpu_us_per_req'), 1)} | "
                       f"{fmt((med(rs, 'proxy_core_util_pct') or 0) / 100, 2)} | {fmt(wrk)} | "
                       f"{busy.get('cpu0', '–')}/{busy.get('cpu1', '–')} |")
    out.append("")
    return out


def render_cluster(c: dict) -> list[str]:
    out = ["**5. Redis decisions per second: plain Redis and Redis Cluster** (Weir threads = 2 on "
           "both cores, 1 zone, 10k addresses, all passing: one decision per request; every Redis "
           "node and wrk on CPU 1, the upstream on CPU 0; Cluster without replicas):", "",
           "| store | masters | decisions/s | Weir cores busy | Redis CPU µs/decision | "
           "decisions per script call | each master's CPU % | wrk % of a core | "
           "CPU0/CPU1 busy % |",
           "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for name, label in (("plain", "plain Redis"), ("cluster1", "Cluster"), ("cluster3", "Cluster")):
        e = c.get(name)
        if not e:
            continue
        rs = e["runs"]
        mid = sorted(rs, key=lambda r: r["rps"])[len(rs) // 2] if rs else {}
        redis_us = med([{"v": r["redis_cpu_s_all"] * 1e6 / max(r["requests"], 1)} for r in rs],
                       "v")
        wrk = med([{"v": 100 * r["wrk_cpu_s"] / r["wall_s"]} for r in rs if r.get("wall_s")], "v")
        nodes = " / ".join(f"{n['cpu_pct']:.0f}" for n in mid.get("nodes", []))
        batch = med([{"v": r["requests"] / sum(n["evalsha"] for n in r["nodes"])} for r in rs
                     if sum(n["evalsha"] for n in r["nodes"])], "v")
        busy = mid.get("core_busy_pct", {})
        out.append(f"| {label} | {e['masters']} | {fmt(med(rs, 'rps'))} | "
                   f"{fmt((med(rs, 'proxy_core_util_pct') or 0) / 100, 2)} | {fmt(redis_us, 1)} | "
                   f"{fmt(batch, 1)} | {nodes} | {fmt(wrk)} | {busy.get('cpu0', '–')}/{busy.get('cpu1', '–')} |")
    out.append("")
    return out


# ---- plots -------------------------------------------------------------------------------


def write_plots(res: dict, out: Path, stem: str) -> list[str]:
    """PNGs beside the report; [] when matplotlib is missing (the tables say it all)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []

    def save(fig, name: str) -> None:
        path = out / f"{stem}-{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))

    if "keys" in res:
        f = keys_figures(res["keys"])
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for name, label, style in (("weir", "Weir memory store (RSS)", "o-"),
                                   ("nginx_rss", "nginx limit_req worker (RSS)", "s-")):
            if name in f:
                xs = [0] + [r["keys"] / 1e6 for r in f[name]["rows"]]
                ys = [0] + [r["rss_mib"] - f[name]["base_mib"] for r in f[name]["rows"]]
                ax.plot(xs, ys, style, label=label, markersize=4)
        per_state = f.get("nginx_zone_bytes_per_state")
        if per_state and "weir" in f and f["weir"]["rows"]:
            top = f["weir"]["rows"][-1]["keys"]
            ax.plot([0, top / 1e6], [0, per_state * top / 2**20], "--",
                    label=f"nginx zone size needed ({per_state:.0f} B/state, measured)")
        if "weir" in f and f["weir"]["rows"]:
            # The memory store's zone has 64 shards (src/store/memory/limit_req.rs) once max_keys
            # allows; hashbrown grows a table when it is 7/8 full, and evenly filled shards all
            # grow at once: 64 × 7/8 × 2^k keys.
            top = f["weir"]["rows"][-1]["keys"]
            steps = [x for x in (64 * 7 / 8 * 2 ** k for k in range(10, 30)) if top / 20 <= x <= top]
            for i, x in enumerate(steps):
                ax.axvline(x / 1e6, color="grey", linestyle=":", linewidth=0.8,
                           label="Weir's 64 shard tables double" if i == 0 else None)
        ax.set_xlabel("distinct keys (millions)")
        ax.set_ylabel("memory added (MiB)")
        ax.set_title("1. Memory per limit key")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, "keys")

    if "zones" in res:
        runs = res["zones"]["runs"]
        fig, ax = plt.subplots(figsize=(7, 4.2))
        xs = [1, 3, 8]
        for name, label, style in (("mem", "Weir memory store", "o-"),
                                   ("redis", "Weir Redis store (proxy)", "s-"),
                                   ("nginx", "nginx limit_req", "^-")):
            ys = [med(runs.get(f"{name}{n}", []), "proxy_cpu_us_per_req") for n in xs]
            if all(y is not None for y in ys):
                ax.plot(xs, ys, style, label=label)
        ys = [med(runs.get(f"redis{n}", []), "redis_cpu_us_per_request") for n in xs]
        if all(y is not None for y in ys):
            ax.plot(xs, ys, "s--", label="Redis's own CPU (Weir Redis store)")
        ax.set_xticks(xs)
        ax.set_xlabel("limit_req zones per route")
        ax.set_ylabel("CPU µs per request")
        ax.set_ylim(bottom=0)
        ax.set_title("3. CPU per request against zones")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, "zones")

    bars = []
    if "threads" in res:
        r = res["threads"]["runs"]
        bars.append(("4. req/s, threads / workers", [
            ("Weir 1", med(r.get("weir_t1", []), "rps")), ("Weir 2", med(r.get("weir_t2", []), "rps")),
            ("nginx 1", med(r.get("nginx_w1", []), "rps")),
            ("nginx 2", med(r.get("nginx_w2", []), "rps"))]))
    if "cluster" in res:
        c = res["cluster"]
        bars.append(("5. Redis decisions/s (Weir, 2 threads)", [
            (label, med(c[name]["runs"], "rps")) for name, label in
            (("plain", "plain"), ("cluster1", "Cluster 1"), ("cluster3", "Cluster 3"))
            if name in c]))
    if "connections" in res:
        c = res["connections"]
        h1, h2 = c.get("h1_idle", {}), c.get("h2", {})
        bars.append(("2. bytes per idle h1 conn / h2 stream", [
            ("Weir h1", (h1.get("weir") or {}).get("bytes_per_connection")),
            ("nginx h1", (h1.get("nginx") or {}).get("bytes_per_connection")),
            ("Weir h2 stream", (h2.get("weir") or {}).get("bytes_per_stream")),
            ("nginx h2 stream", (h2.get("nginx") or {}).get("bytes_per_stream"))]))
    bars = [(t, [(lab, v) for lab, v in items if v is not None]) for t, items in bars]
    bars = [b for b in bars if b[1]]
    if bars:
        fig, axes = plt.subplots(1, len(bars), figsize=(4.2 * len(bars), 4))
        if len(bars) == 1:
            axes = [axes]
        for ax, (title, items) in zip(axes, bars):
            labels = [lab for lab, _ in items]
            vals = [v for _, v in items]
            ax.bar(range(len(vals)), vals, color=["#4c72b0" if "Weir" in lab or "luster" in lab
                                                  or lab == "plain" else "#dd8452"
                                                  for lab in labels])
            ax.set_xticks(range(len(vals)))
            ax.set_xticklabels(labels, rotation=20, fontsize=8)
            for i, v in enumerate(vals):
                ax.annotate(f"{v:,.0f}", (i, v), ha="center", va="bottom", fontsize=8)
            ax.set_title(title, fontsize=9)
            ax.grid(axis="y", alpha=0.3)
        save(fig, "bars")
    return written


PARTS = ("keys", "connections", "zones", "threads", "cluster")


def merge(sources: list[dict]) -> dict:
    """Several runs' results (each with some of the parts) as one: a later run's part replaces an
    earlier one's; the meta of the run with the throughput parts (else the first), with the runs
    listed under meta.merged_from."""
    out: dict = {"failures": [], "warnings": [], "ok": True}
    runs, meta = [], None
    for d in sources:
        parts = [p for p in PARTS if p in d]
        for p in parts:
            out[p] = d[p]
        runs.append({"parts": parts, "date": d["meta"]["date"],
                     "elapsed_s": d["meta"]["elapsed_s"]})
        out["failures"] += d.get("failures", [])
        out["warnings"] += d.get("warnings", [])
        out["ok"] = out["ok"] and d.get("ok", False)
        if meta is None or "zones" in parts:
            meta = dict(d["meta"])
    meta = meta or {}
    meta["elapsed_s"] = round(sum(r["elapsed_s"] for r in runs), 1)
    meta["merged_from"] = runs
    out["meta"] = meta
    return out


if __name__ == "__main__":
    import json
    import sys

    args = sys.argv[1:]
    if len(args) >= 3 and args[0] == "--merge":
        dst = Path(args[1])
        dst.write_text(json.dumps(merge([json.loads(Path(a).read_text()) for a in args[2:]]),
                                  indent=2) + "\n")
        args = [str(dst)]
    if len(args) != 1:
        sys.exit("usage: curves_report.py [--merge OUT.json IN.json ...] RESULTS.json\n"
                 "(with --merge: the parts of several runs into OUT.json, then its report)")
    src = Path(args[0])
    data = json.loads(src.read_text())
    pngs = write_plots(data, src.parent, src.stem)
    src.with_suffix(".md").write_text(render_curves(data, pngs))
    print(src.with_suffix(".md"))
