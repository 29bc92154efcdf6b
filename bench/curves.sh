#!/usr/bin/env bash
# Weir's cost curves (issue 40): how cost grows as work grows, next to nginx where nginx can do
# the same. See bench/README.md, "Cost curves".
#
#   bench/curves.sh            full run (~20 min after the build): memory per key up to 10M keys,
#                              per connection and per h2 stream, CPU per request with 1/3/8 zones,
#                              threads 2 vs 1, Redis Cluster with 1 and 3 masters; writes
#                              bench/results/curves-latest.{json,md} and curves-latest-*.png
#   bench/curves.sh --quick    the same parts, CI-sized (100k keys, 1 × 2 s per point; ~2 min
#                              after the build); writes bench/results/curves-quick.* (git-ignored)
#   extra options go to the harness: --parts keys,connections,zones,threads,cluster, --reps N,
#   --duration S, --out DIR
#
# Tools, the release build, pinning (BENCH_SUT_CPU, BENCH_LOAD_CPU, ...), BENCH_SKIP_BUILD and the
# cleanup of every process it started are bench/run.sh's: this is `bench/run.sh --curves`.
# Plots need matplotlib (`pip install matplotlib`); without it the report has the tables only.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash bench/run.sh --curves "$@"
