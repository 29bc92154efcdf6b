"""Optional: where the proxy's CPU goes (perf)."""

from __future__ import annotations

import re
import subprocess

from .common import log
from .configs import OPENRESTY_ROWS
from .procs import record_pid


class Profile:
    """Part of `Bench`: perf profiles of some rows (--profile)."""

    # ---- optional: where the proxy's CPU goes (perf) ----------------------------------------

    def phase_profile(self, rids: list[str] | None = None) -> dict:
        """perf record (cpu-clock, flat) of the proxy, and of Redis for Redis rows, during one
        extra saturated run per row; not part of the medians. Reports in <out>/profile-<row>.txt.
        `rids`: the rows of `--rows` (with `--profile`); else rows 2a, 2, 3, 4 and 7."""
        if subprocess.run(["sh", "-c", "command -v perf"], capture_output=True).returncode:
            return {"skipped": "perf not installed"}
        out = {}
        if rids is None:
            rids = ["passthrough", "memory", "redis", "nginx_limit"]
            if "pingora" in self.targets:
                rids.insert(0, "pingora")  # plain Pingora: what of row 2's profile is Pingora's own
        for rid in rids:
            target = self.targets[rid]
            pids = target.pids()
            if rid.startswith("redis") or rid in OPENRESTY_ROWS:
                pids.append(self.redis_proc.pid)
            data = self.workdir / f"perf-{rid}.data"
            log(f"profile: {rid}")
            perf = subprocess.Popen(
                ["perf", "record", "-F", "999", "-o", str(data), "-p",
                 ",".join(map(str, pids)), "--", "sleep", str(self.duration)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            record_pid(self.procs.pidfile, perf.pid)
            res = self.measure(target, 10_000, self.duration, self.conns)
            perf.wait()
            def report(sort: str, limit: str) -> list[str]:
                cp = subprocess.run(
                    ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", sort,
                     "--percent-limit", limit], capture_output=True, text=True)
                lines = []
                for ln in cp.stdout.splitlines():
                    if ln.strip() and not ln.startswith("#"):
                        ln = re.sub(r"(\s+-)+\s*$", "", ln.rstrip())  # empty trailing columns
                        lines.append(re.sub(r" {3,}", "  ", ln))
                return lines

            by_dso, by_symbol = report("comm,dso", "0.5"), report("comm,dso,symbol", "0.7")
            binary = {"pingora": "pingora_passthrough", "pingora_fwd": "pingora_passthrough",
                      "nginx_limit": "nginx",
                      **dict.fromkeys(OPENRESTY_ROWS, "nginx")}.get(rid, "weir")
            by_crate = crate_totals(report("dso,symbol", "0"), binary)
            text = (f"# perf record -F 999 (cpu-clock) of {rid} at {res['rps']:.0f} req/s, pids "
                    f"{pids}\n\n## by thread and object\n" + "\n".join(by_dso)
                    + "\n\n## the proxy binary's own samples, by the first crate in the symbol\n"
                    + "\n".join(f"{pct:6.2f}%  {crate}" for crate, pct in by_crate)
                    + "\n\n## by symbol\n" + "\n".join(by_symbol) + "\n")
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / f"profile-{rid}.txt").write_text(text)
            out[rid] = {"rps": res["rps"], "by_object": by_dso, "by_crate": by_crate,
                        "top_symbols": by_symbol[:25]}
        return out


def crate_totals(lines: list[str], binary: str = "weir") -> list[tuple[str, float]]:
    """perf report lines `pct%  dso  [.] symbol` of the weir binary, summed by the first
    `crate::` path in the (demangled) symbol: where the proxy's own code spends its time."""
    totals: dict[str, float] = {}
    for ln in lines:
        m = re.match(rf"\s*([\d.]+)%\s+{re.escape(binary)}\s+\[\.\]\s+(.*)", ln)
        if not m:
            continue
        crate = re.search(r"([A-Za-z_][A-Za-z0-9_]*)::", m.group(2))
        name = crate.group(1) if crate else "(other)"
        totals[name] = totals.get(name, 0.0) + float(m.group(1))
    return sorted(((k, round(v, 2)) for k, v in totals.items()), key=lambda kv: -kv[1])[:15]
