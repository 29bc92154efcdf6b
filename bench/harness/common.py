"""What every part of the harness shares: paths, limits, logging, the error type."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = BENCH_DIR.parent
WRK_SCRIPT = BENCH_DIR / "wrk" / "client.lua"
LUA_SCRIPT = REPO_DIR / "lua" / "limit_req.lua"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Rates for "all passing" rows: far above what one key sees (10k keys share < 100k r/s).
PASS_RATE_RPS = 100_000
PASS_BURST = 100_000
# Fleet accuracy: the limit every instance enforces on one shared key.
FLEET_RATE_RPS = 50
FLEET_BURST = 10
# A run during which processes outside the bench used more than this (% of one core) is run again
# while the retry budget lasts (Bench.measure_retrying).
DISTURBED_PCT = 20


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A part of the benchmark could not run (a process did not start, a tool failed)."""
