"""Weir's admin /metrics (Prometheus text): scraping and parsing (the bench and the soak), sums over
labels, and the Redis batch-size histogram."""

from __future__ import annotations

import math
import re
import urllib.request

BATCH_METRIC = "weir_redis_batch_size"
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def scrape_metrics(admin_port: int, timeout: float = 3.0) -> dict[tuple[str, str], float]:
    """(name, labels) -> value of every sample on the admin listener's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=timeout) as r:
        return parse_metrics(r.read().decode(errors="replace"))


def parse_metrics(text: str) -> dict[tuple[str, str], float]:
    """(name, labels as written, e.g. '{zone="z1"}' or '') -> value of every sample."""
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            try:
                out[(m.group(1), m.group(2) or "")] = float(m.group(3))
            except ValueError:
                pass
    return out


def total(metrics: dict, name: str) -> float | None:
    """The sum of every series of `name`; None if the metric is absent."""
    vals = [v for (n, _), v in metrics.items() if n == name]
    return sum(vals) if vals else None


def metric_sum(metrics: dict, name: str, **labels) -> float:
    """The sum of the series of `name` whose labels include every `label="value"` given; 0 when
    none does (a counter not yet incremented is absent)."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum((v for (n, ls), v in metrics.items() if n == name and all(w in ls for w in want)),
               0.0)


def batch_histogram(metrics: dict) -> dict:
    """The distribution of `weir_redis_batch_size` (decisions per Redis call), summed over its
    label sets: per bucket the calls whose batch had at most `le` decisions (non-cumulative)."""
    count = total(metrics, f"{BATCH_METRIC}_count")
    if count is None:
        return {"present": False}
    cumulative: dict[float, float] = {}
    for (name, labels), v in metrics.items():
        if name != f"{BATCH_METRIC}_bucket":
            continue
        m = re.search(r'le="([^"]+)"', labels)
        if m:
            le = math.inf if m.group(1) in ("+Inf", "inf") else float(m.group(1))
            cumulative[le] = cumulative.get(le, 0.0) + v
    buckets, prev = [], 0.0
    for le in sorted(cumulative):
        buckets.append({"le": "+Inf" if le == math.inf else f"{le:g}",
                        "calls": cumulative[le] - prev})
        prev = cumulative[le]
    s = total(metrics, f"{BATCH_METRIC}_sum") or 0.0
    return {"present": True, "calls": count, "decisions": s,
            "mean": (s / count) if count else None, "buckets": buckets}
