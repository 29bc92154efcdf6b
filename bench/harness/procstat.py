"""/proc readings: CPU time, context switches, core utilisation, RSS."""

from __future__ import annotations

import re
from pathlib import Path

from .common import CLK_TCK


def children_of(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes (all threads), in seconds."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5)
    return total / CLK_TCK


def ctx_switches(pids: list[int]) -> int:
    """Voluntary + involuntary context switches of every thread of the processes."""
    total = 0
    for pid in pids:
        for status in Path(f"/proc/{pid}/task").glob("*/status"):
            try:
                for line in status.read_text().splitlines():
                    if "ctxt_switches:" in line:
                        total += int(line.split()[1])
            except OSError:
                pass
    return total


def core_times() -> dict[str, tuple[int, int]]:
    """Per CPU: (busy, total) jiffies from /proc/stat."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if re.match(r"cpu\d+ ", line):
            name, *vals = line.split()
            v = [int(x) for x in vals]
            idle = v[3] + v[4]
            out[name] = (sum(v[:8]) - idle, sum(v[:8]))
    return out


def core_busy(before: dict, after: dict) -> dict[str, float]:
    out = {}
    for name in after:
        db = after[name][0] - before[name][0]
        dt = after[name][1] - before[name][1]
        out[name] = round(100.0 * db / dt, 1) if dt > 0 else 0.0
    return out


def task_cpu_s() -> float:
    """CPU seconds spent in tasks (user + nice + system, all CPUs; no irq, softirq or steal)
    since boot, from /proc/stat."""
    f = Path("/proc/stat").read_text().splitlines()[0].split()
    return (int(f[1]) + int(f[2]) + int(f[3])) / CLK_TCK


def per_pid_cpu(pids: set[int]) -> dict[int, float]:
    return {pid: cpu_seconds([pid]) for pid in pids}


def ours_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(after[p] - before[p] for p in before if p in after)


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (KiB) and Threads of a process, from /proc/<pid>/status."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:", "Threads:")):
            key, val = line.split(":", 1)
            out[key] = int(val.split()[0])
    return out


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB."""
    status = proc_status(pid)
    return {k: status[k] for k in ("VmRSS", "VmHWM") if k in status}
