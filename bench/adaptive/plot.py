#!/usr/bin/env python3
"""Plots a run of bench/adaptive/run.py (its `--series` JSON): for the single adaptive Weir, the
learned limit and the requests in flight, the upstream's own p50/p99 latency per second against
twice its unloaded latency, and goodput against capacity; the phases shaded. Needs matplotlib.

    python3 bench/adaptive/plot.py SERIES.json OUT.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def per_second(points, end):
    """Buckets (t, value) into whole seconds: {second: [values]}."""
    out = {}
    for t, v in points:
        if 0 <= t < end:
            out.setdefault(int(t), []).append(v)
    return out


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(p * len(v) + 0.5)) - 1))]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        data = json.load(f)
    service_ms = data["service_s"] * 1000
    phases = data["phases"]
    end = phases[-1][2]
    fig, (ax_limit, ax_lat, ax_good) = plt.subplots(3, 1, figsize=(11, 8.5), sharex=True)
    for ax in (ax_limit, ax_lat, ax_good):
        for i, (name, start, stop, k, rate) in enumerate(phases):
            if i % 2:
                ax.axvspan(start, stop, color="0.93", lw=0)
    for name, start, stop, k, rate in phases:
        ax_limit.text(start + 0.3, 1.0, f"{name}\nK={k}, {rate:.0f}/s", va="top", fontsize=8,
                      transform=ax_limit.get_xaxis_transform())

    t = [p[0] for p in data["adaptive"]]
    ax_limit.step(t, [p[1][0] for p in data["adaptive"]], where="post", label="limit (weir_adaptive_limit)")
    ax_limit.plot(t, [p[1][2] for p in data["adaptive"]], ".", ms=3, label="in flight (weir_adaptive_in_flight)")
    ax_limit.step([start for _, start, _, _, _ in phases] + [end], [k for *_, k, _ in phases] + [phases[-1][3]],
                  where="post", color="k", lw=0.8, ls="--", label="K (served at once by the upstream)")
    ax_limit.set_ylabel("requests")
    ax_limit.set_ylim(0, None)
    ax_limit.legend(loc="upper right", fontsize=8)
    ax_limit.set_title("Adaptive concurrency, one Weir (bench/adaptive/run.py)")

    lat = per_second(data["upstream"]["adaptive"], end)
    secs = sorted(lat)
    ax_lat.plot([s + 0.5 for s in secs], [pct(lat[s], 0.5) * 1000 for s in secs], label="upstream p50")
    ax_lat.plot([s + 0.5 for s in secs], [pct(lat[s], 0.99) * 1000 for s in secs], label="upstream p99")
    ideal = [(p[0], p[1][1]) for p in data["adaptive"] if p[1][1] > 0]
    ax_lat.step([p[0] for p in ideal], [p[1] for p in ideal], where="post", lw=0.8, label="learned ideal latency")
    ax_lat.axhline(2 * service_ms, color="r", lw=0.8, ls="--", label="2x unloaded")
    ax_lat.set_ylabel("ms")
    ax_lat.set_ylim(0, 4 * service_ms)
    ax_lat.legend(loc="upper right", fontsize=8)

    served = per_second([(t, 1 if status == 200 and lat <= 2 * data["service_s"] else 0)
                         for t, status, lat in data["served"]["adaptive"]], end)
    secs = sorted(served)
    ax_good.plot([s + 0.5 for s in secs], [sum(served[s]) for s in secs], label="goodput (200 within 2x unloaded)/s")
    cap_t, cap = [], []
    for _, start, stop, k, _ in phases:
        cap_t += [start, stop]
        cap += [0.9 * k / data["service_s"]] * 2
    ax_good.plot(cap_t, cap, color="r", lw=0.8, ls="--", label="90 % of capacity")
    ax_good.set_ylabel("requests/s")
    ax_good.set_xlabel("seconds")
    ax_good.set_ylim(0, None)
    ax_good.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=90)


if __name__ == "__main__":
    main()
