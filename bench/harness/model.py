"""What the bench measures: targets wrk can hit and the throughput rows."""

from __future__ import annotations

from dataclasses import dataclass, field

from .procs import Proc
from .procstat import children_of


@dataclass
class Target:
    """Something wrk can hit: a port and the processes whose CPU counts as "the proxy"."""
    port: int
    procs: list[Proc]
    nginx: bool = False

    def pids(self) -> list[int]:
        pids = []
        for p in self.procs:
            pids.append(p.pid)
            if self.nginx:
                pids += children_of(p.pid)
        return pids


@dataclass
class Row:
    id: str
    label: str
    target: str            # key into Bench.targets
    keys: int = 10_000     # distinct XFF addresses
    expect: str = "pass"   # "pass": ≥ 99% 2xx; "reject": ≤ 1% 2xx
    redis: bool = False    # decisions go to Redis: check EVALSHA calls, report Redis cost
    note: str = ""
    runs: list[dict] = field(default_factory=list)
