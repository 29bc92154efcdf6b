#!/usr/bin/env python3
"""Per-function instructions per request of two `--instructions` rows, side by side.

    python3 bench/fndiff.py OUT ROW [OTHER_ROW] [--other-out OUT2] [--top N]

ROW and OTHER_ROW are row ids as in the run's `latest.json` (`memory`, `memory@before`; the
default OTHER_ROW is `ROW@before`). Each function's self cost (`callgrind_annotate
--inclusive=no`) is taken as the long window's minus the short window's, over the requests
between them, as the row's total is: a plain long-window total / requests would carry the run's
fixed cost (connections opened and closed), which differs between rows that completed different
numbers of requests. Rows from runs before the short window's dump was kept fall back to the long
window alone (and say so).
"""

import argparse
import collections
import json
import re
import subprocess
import sys

LINE = re.compile(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*)$")


def row(out: str, rid: str) -> dict:
    rows = json.load(open(f"{out}/latest.json"))["instructions"]["rows"]
    for r in rows:
        if r["id"] == rid:
            return r
    sys.exit(f"no row {rid} in {out}: {[r['id'] for r in rows]}")


def self_costs(dump: str) -> collections.Counter:
    text = subprocess.run(
        ["callgrind_annotate", "--threshold=100", "--inclusive=no", dump],
        capture_output=True, text=True, check=True,
    ).stdout
    costs = collections.Counter()
    for line in text.splitlines():
        m = LINE.match(line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        name = re.sub(r" \[[^\]]*\]$", "", m.group(2))
        name = name.split(":", 1)[1] if name.startswith(("???:", "./", "/")) else name
        costs[name] += int(m.group(1).replace(",", ""))
    return costs


def per_request(r: dict) -> tuple[collections.Counter, str]:
    short, long = r["windows"][0], r["windows"][1]
    costs = self_costs(r["callgrind_dump"])
    if "callgrind_dump_short" not in r:
        return collections.Counter({k: v / long["requests"] for k, v in costs.items()}), "long window only"
    base = self_costs(r["callgrind_dump_short"])
    dn = long["requests"] - short["requests"]
    names = set(costs) | set(base)
    return collections.Counter({k: (costs[k] - base[k]) / dn for k in names}), f"{dn} requests between the windows"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("row")
    ap.add_argument("other", nargs="?")
    ap.add_argument("--other-out")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    other = a.other or f"{a.row}@before"
    mine, how_a = per_request(row(a.out, a.row))
    theirs, how_b = per_request(row(a.other_out or a.out, other))
    print(f"{a.row}: {how_a}, total {sum(mine.values()):,.0f}; {other}: {how_b}, total {sum(theirs.values()):,.0f}")
    diff = {k: mine[k] - theirs[k] for k in set(mine) | set(theirs)}
    # Callgrind's self cost of the thread entry points is the whole thread (inclusive, cycles).
    for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[: a.top]:
        print(f"{v:+9.1f} {mine[k]:9.1f} {theirs[k]:9.1f}  {k[:160]}")


if __name__ == "__main__":
    main()
