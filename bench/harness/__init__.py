"""Weir benchmark harness (issue 4), as a package. Started by bench/run.sh (`python3 bench/harness
...`, which runs `__main__.py`); Python 3.11 standard library only.

One run measures, on this machine, side by side:

* throughput rows: upstream direct, plain Pingora, Weir passthrough, Weir with the memory and
  Redis stores (and the JSON access log on), a one-key flood, nginx proxy_pass and limit_req,
  OpenResty + Redis, threads = 2, HTTPS and h2 twins, and rows 2-5 and 4a of each `--variant` (A/B);
  each repeated and interleaved round-robin, medians reported, issue 12's ratios computed;
* a paced pair (Weir passthrough and Weir on Redis at half of the Redis row's peak) for the
  latency a Redis decision adds below saturation;
* Redis cost: EVALSHA calls per request and Redis CPU per decision (from INFO deltas), and the
  redis-benchmark ceiling of lua/limit_req.lua on one Redis core;
* memory: Redis bytes per active key, Weir RSS with many distinct keys in the memory store;
* fleet accuracy: N Weir instances on one Redis against N independent nginx instances.

Results go to <out>/latest.json and <out>/latest.md (--quick: quick.json and quick.md), and the
markdown is printed. The exit status is 1 if any part failed to run or, in a full run, a sanity
check failed (e.g. a "Redis" row that made no Redis calls, an "all passing" row that was limited);
with --quick those checks are warnings (Bench.check_failed).

Modules, in the order a run uses them:

* `common`: paths, the limits every part shares, `log`, `BenchError`;
* `procs`: starting and stopping processes (pid file for run.sh's trap), ports, one HTTP GET;
* `procstat`: /proc readings (CPU, context switches, RSS, other load);
* `redis_client`: a minimal RESP2 client, INFO deltas, capturing Weir's EVALSHA with MONITOR;
* `configs`: the Weir TOML and nginx configs of every target, a variant's settings merged in;
* `metrics`: Weir's admin /metrics, the weir_redis_batch_size histogram;
* `bench`: the `Bench` (targets, start-up, the whole run), made of the parts below;
* `wrk_runs`: one measured wrk run with its counters, re-run when disturbed;
* `throughput`: the throughput rows and their checks, the paced pair;
* `profile`: optional perf profiles;
* `redis_cost`: the redis-benchmark ceiling of the script;
* `memory`: Redis bytes per key, Weir RSS per key;
* `fleet`: fleet accuracy against independent nginx instances;
* `report`: medians, the issue's targets, the markdown;
* `cli`: the command line (`main`).
"""
