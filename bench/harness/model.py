"""What the bench measures: targets wrk can hit, the throughput rows, and A/B variants."""

from __future__ import annotations

from dataclasses import dataclass, field

from .procs import Proc
from .procstat import children_of


@dataclass
class Target:
    """Something wrk (or h2load) can hit: a port and the processes whose CPU counts as "the
    proxy". `admin`: Weir's admin port (its /metrics), 0 if none."""
    port: int
    procs: list[Proc]
    nginx: bool = False
    scheme: str = "http"
    admin: int = 0

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
    tool: str = "wrk"      # "wrk" (HTTP/1.1, http or https) or "h2load" (HTTP/2 over TLS)
    kind: str = ""         # the baseline row this is a variant of ("passthrough", ...); "" = itself
    variant: str = ""      # the --variant name, "" for the baseline
    runs: list[dict] = field(default_factory=list)


@dataclass
class Variant:
    """`--variant NAME=BINARY[,table.key=value;...]`: another Weir build and/or extra settings,
    measured on the proxy rows 2-5 and 4a next to the baseline's."""
    name: str
    binary: str
    settings: list[tuple[str, str, str]]
    spec: str = ""
