#!/usr/bin/env python3
"""Draws docs/algorithms.png: the same bursty traffic through each rate-limiting algorithm.

Usage (from anywhere in the repository):

    python3 docs/plot_algorithms.py              # runs `cargo run --example algorithm_trace`
    python3 docs/plot_algorithms.py trace.csv    # or reads its CSV output (`-` for stdin)

Needs matplotlib: `pip install matplotlib`.

The CSV has one row per request and algorithm: `algorithm,t_ms,admitted` (admitted is 0 or 1).
The top panel is cumulative admitted requests over time, one line per algorithm, with the
requests offered and the ideal (the sustained 1 r/s that all settings share); the bottom panel
counts the admissions in the trailing 10 s, which the window algorithms promise to keep at or
under 10.
"""

import csv
import io
import os
import subprocess
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_algorithms.py needs matplotlib: pip install matplotlib")

DOCS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(DOCS)
OUT = os.path.join(DOCS, "algorithms.png")

# Must match examples/algorithm_trace.rs.
RATE_PER_S = 1.0
WINDOW_S = 10.0
LIMIT = 10
DURATION_S = 60.0

STYLE = {
    "leaky_bucket": dict(color="tab:blue", linewidth=3.0, linestyle="-"),
    "token_bucket": dict(color="tab:cyan", linewidth=1.4, linestyle="--"),
    "fixed_window": dict(color="tab:red", linewidth=1.8, linestyle="-"),
    "sliding_log": dict(color="tab:green", linewidth=1.8, linestyle="-"),
    "sliding_window": dict(color="tab:orange", linewidth=1.8, linestyle="-"),
}


def read_trace(argv):
    if len(argv) > 1:
        text = sys.stdin.read() if argv[1] == "-" else open(argv[1], encoding="utf-8").read()
    else:
        cmd = ["cargo", "run", "--quiet", "--example", "algorithm_trace"]
        done = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True)
        sys.stderr.write(done.stderr)
        text = done.stdout
    offered = {}
    admitted = {}
    for row in csv.DictReader(io.StringIO(text)):
        algo, t = row["algorithm"], int(row["t_ms"]) / 1000.0
        offered.setdefault(algo, []).append(t)
        admitted.setdefault(algo, [])
        if row["admitted"] == "1":
            admitted[algo].append(t)
    if not offered:
        sys.exit("plot_algorithms.py: the trace is empty")
    return offered, admitted


def cumulative(times):
    """Step points (x, y) of a cumulative count of sorted event times, from 0 to DURATION_S."""
    xs, ys = [0.0], [0]
    for i, t in enumerate(sorted(times), start=1):
        xs += [t, t]
        ys += [i - 1, i]
    xs.append(DURATION_S)
    ys.append(len(times))
    return xs, ys


def trailing(times, span, step=0.005):
    """Admissions in (t - span, t] for t on a grid."""
    times = sorted(times)
    xs, ys = [], []
    lo = hi = 0
    n = int(DURATION_S / step) + 1
    for k in range(n):
        t = k * step
        while hi < len(times) and times[hi] <= t + 1e-9:
            hi += 1
        while lo < hi and times[lo] <= t - span + 1e-9:
            lo += 1
        xs.append(t)
        ys.append(hi - lo)
    return xs, ys


def main():
    offered, admitted = read_trace(sys.argv)
    algos = list(offered)
    some = offered[algos[0]]

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, 9), sharex=True, gridspec_kw=dict(height_ratios=[3, 2])
    )

    x, y = cumulative(some)
    top.plot(x, y, color="0.6", linestyle=":", linewidth=1.5, label=f"offered ({len(some)})")
    top.plot(
        [0, DURATION_S],
        [0, RATE_PER_S * DURATION_S],
        color="black",
        linestyle="--",
        linewidth=1.0,
        label="ideal: 1 r/s sustained (10 per 10 s)",
    )
    for algo in algos:
        x, y = cumulative(admitted[algo])
        style = STYLE.get(algo, {})
        top.plot(x, y, label=f"{algo} ({len(admitted[algo])})", **style)
    for b in range(10, int(DURATION_S), 10):
        top.axvline(b, color="0.85", linewidth=0.8, zorder=0)
        bottom.axvline(b, color="0.85", linewidth=0.8, zorder=0)
    top.set_ylabel("cumulative requests admitted")
    top.set_title(
        "Same traffic, five algorithms: windows of 10 per 10 s, buckets at 1 r/s with burst 9 (nodelay)"
    )
    top.legend(loc="upper left", fontsize=9)
    top.grid(axis="y", alpha=0.3)
    for t, label in [(0, "burst 30"), (29.5, "burst 40\nacross 30 s"), (45, "burst 20")]:
        top.annotate(label, xy=(t, 1), xytext=(t + 0.4, 3), fontsize=8, color="0.35")

    for algo in algos:
        x, y = trailing(admitted[algo], WINDOW_S)
        style = dict(STYLE.get(algo, {}))
        style["linewidth"] = max(1.0, style.get("linewidth", 1.5) - 0.4)
        bottom.plot(x, y, label=f"{algo} (max {max(y)})", **style)
    bottom.axhline(LIMIT, color="black", linestyle="--", linewidth=1.0, label=f"limit: {LIMIT} per 10 s")
    bottom.set_ylabel("admitted in the last 10 s")
    bottom.set_xlabel("time (s); grey lines: fixed-window boundaries (epoch-aligned)")
    bottom.set_xlim(0, DURATION_S)
    bottom.set_ylim(0, 27)
    bottom.legend(loc="upper center", fontsize=8, ncol=4)
    bottom.grid(axis="y", alpha=0.3)

    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {os.path.relpath(OUT, os.getcwd())}")


if __name__ == "__main__":
    main()
