"""Phase 5, fleet accuracy: N Weirs on one Redis against N independent nginx instances."""

from __future__ import annotations

from .common import FLEET_BURST, FLEET_RATE_RPS, log
from .configs import weir_toml
from .model import Target
from .procs import free_port


class Fleet:
    """Part of `Bench`: fleet accuracy."""

    # ---- phase 5: fleet accuracy ----------------------------------------------------------

    def phase_fleet(self) -> dict:
        ns = [1, 2] if self.quick else [1, 2, 4]
        duration = 1 if self.quick else 10
        nmax = max(ns)
        rate = f"{FLEET_RATE_RPS}r/s"
        weirs, nginxes = [], []
        for i in range(nmax):
            port = free_port()
            toml = weir_toml(port, self.upstream_port, store="redis", redis_port=self.redis_port,
                             zones=1, rate=rate, burst=FLEET_BURST, access_log=self.access_log)
            weirs.append(Target(port, [self.start_weir(f"weir-fleet{i}", toml, port)]))
            port = free_port()
            nginxes.append(Target(port, [self.start_nginx(
                f"nginx-fleet{i}", "limit", port, upstream_port=self.upstream_port, rate=rate,
                burst=FLEET_BURST)], nginx=True))
        out = {"rate_rps": FLEET_RATE_RPS, "burst": FLEET_BURST, "duration_s": duration,
               "runs": []}
        offset = 3_000_000
        for kind, fleet in (("weir", weirs), ("nginx", nginxes)):
            for n in ns:
                offset += 1  # a fresh client address, so every run starts on an empty bucket
                log(f"fleet: {n} x {kind}, one key, {duration} s")
                env = {"WRK_KEYS": "1", "WRK_KEY_OFFSET": str(offset), "WRK_COUNT": "1",
                       "WRK_DELAY_MS": "1"}
                popens = [self.wrk(t.port, duration, 2, env, background=True, path="/fleet")
                          for t in fleet[:n]]
                results = [self.wrk_result(p, duration) for p in popens]
                admitted = sum(r["status"]["200"] for r in results)
                rejected = sum(r["status"]["429"] for r in results)
                other = sum(r["status"]["other"] for r in results)
                # The window: first to last admitted request, by the upstream's clock (its
                # X-Upstream-Msec), so that wrk start-up and the tail after the last admission do
                # not count. An exact fleet admits burst + 1 at once, then rate × window.
                firsts = [r["upstream_s"]["first"] for r in results if r["upstream_s"]["first"] > 0]
                lasts = [r["upstream_s"]["last"] for r in results if r["upstream_s"]["last"] > 0]
                window = (max(lasts) - min(firsts)) if firsts else 0.0
                wrk_s = max(r["duration_us"] for r in results) / 1e6
                ideal = FLEET_BURST + 1 + FLEET_RATE_RPS * window
                offered = sum(r["requests"] for r in results) / wrk_s
                run = {
                    "kind": kind, "instances": n, "window_s": round(window, 3),
                    "wrk_duration_s": round(wrk_s, 3),
                    "admitted": admitted, "rejected": rejected, "other": other,
                    "ideal": round(ideal, 1), "admitted_minus_ideal": round(admitted - ideal, 1),
                    "admitted_over_ideal": round(admitted / ideal, 2),
                    "offered_rps": round(offered), "overload_x": round(offered / FLEET_RATE_RPS),
                }
                out["runs"].append(run)
                log(f"  admitted {admitted}, ideal {ideal:.1f}, offered {offered:.0f} r/s")
                if other:
                    self.check_failed(f"fleet {kind} x{n}: {other} responses neither 200 nor 429")
                if run["overload_x"] < 10:
                    self.check_failed(f"fleet {kind} x{n}: overload only {run['overload_x']}x")
        self.procs.stop(*(t.procs[0] for t in weirs + nginxes))
        return out
