"""The command line: `python3 bench/harness --weir BIN --workdir DIR [--quick] ...`."""

from __future__ import annotations

import argparse
import signal

from .bench import Bench
from .curves import PARTS, Curves
from .common import BENCH_DIR, BenchError

DESCRIPTION = ("Weir benchmark harness (issues 4 and 12). Started by bench/run.sh; Python 3.11 "
               "standard library only.")


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench/harness", description=DESCRIPTION)
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 repetition, 2 s rows")
    ap.add_argument("--reps", type=int, default=0, help="repetitions per row (default 4; quick 1)")
    ap.add_argument("--duration", type=int, default=0, help="seconds per run (default 5; quick 2)")
    ap.add_argument("--weir", required=True, help="the weir binary")
    ap.add_argument("--workdir", required=True, help="scratch directory (configs, logs, pids)")
    ap.add_argument("--out", default=str(BENCH_DIR / "results"), help="where latest.* go")
    ap.add_argument("--rows", default="",
                    help="only these throughput rows (ids, comma-separated), no other part: for "
                         "experiments (ids: upstream echo pingora passthrough memory redis "
                         "redis_log redis_log_buf redis3 flood flood_cache nginx_limit nginx_proxy openresty openresty_hdr "
                         "scale_passthrough scale_redis scale_nginx_limit https_weir https_nginx "
                         "h2_weir h2_nginx, and a variant's as passthrough@NAME, ...; `ab`: rows 2-5 "
                         "of the baseline and every variant, nginx_proxy, nginx_limit, openresty; "
                         "add paced, with passthrough and redis, for the paced pair)")
    ap.add_argument("--profile", action="store_true",
                    help="also perf-profile rows 2a, 2, 3, 4 and 7, or those of --rows (extra runs, "
                         "results/profile-*.txt)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=BIN[,k=v;...]",
                    help="A/B: rows 2-5 and 4a again for another weir binary and/or extra settings "
                         "merged into its configs, interleaved with the others, e.g. "
                         "--variant A=/tmp/weir-A or --variant nows=,server.work_stealing=false "
                         "(empty BIN: the baseline's binary); repeatable")
    ap.add_argument("--instructions", action="store_true",
                    help="instead of the throughput rows: instructions per request of the proxy "
                         "process under valgrind's callgrind (rows 2a, 2, 3, 4, 4a, 5, 7, 7b, 8 "
                         "and rows 2-5 of every --variant; --rows picks among them), ~25 s a "
                         "row; with syscalls per request from a native run under strace -c. Added "
                         "to <out>/latest.{json,md}, next to what a previous run left there")
    ap.add_argument("--curves", action="store_true",
                    help="instead of the throughput rows: the cost curves (bench/curves.sh), "
                         "written to <out>/curves-latest.{json,md} and PNGs (quick: curves-quick)")
    ap.add_argument("--parts", default="",
                    help=f"with --curves: only these curves, comma-separated ({', '.join(PARTS)})")
    ap.add_argument("--pingora", default="",
                    help="examples/pingora_passthrough binary: the plain Pingora row (run.sh)")
    args = ap.parse_args()
    try:
        bench = Curves(args) if args.curves else Bench(args)
    except BenchError as e:
        ap.error(str(e))

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        return bench.run()
    except KeyboardInterrupt:
        bench.procs.stop_all()
        return 130
