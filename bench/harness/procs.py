"""Processes and ports: the recorder of every process the bench or the soak starts (bench/soak/
soak.py uses this module too), waiting for a port, a log's last lines."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .common import BenchError, log
from .procstat import children_of


# --------------------------------------------------------------------------------------------
# Processes: every server is started in its own process group, and every process (wrk runs too)
# is recorded in a pid file, so that bench/run.sh's EXIT trap can end what is left even if this
# script dies without cleaning up.
# --------------------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 15) -> str:
        return log_tail(self.log_path, n)


def log_tail(path: Path, n: int = 15) -> str:
    """The last `n` lines of a log file ("" if it cannot be read)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


class Procs:
    """Starts processes, each leading its own process group and logging to <workdir>/<name>.log,
    records them in the pid file, and stops them. Safe to use from several threads (the soak's
    chaos threads kill and restart processes while others run)."""

    def __init__(self, workdir: Path, pidfile: Path):
        self.workdir = workdir
        self.pidfile = pidfile
        self.procs: list[Proc] = []
        self.lock = threading.Lock()

    def start(self, name: str, argv: list[str], cpus: str | None = None,
              env: dict | None = None) -> Proc:
        if cpus is not None:
            argv = ["taskset", "-c", cpus] + argv  # taskset execs: the pid is the program's
        log_path = self.workdir / f"{name}.log"
        out = open(log_path, "ab")
        full_env = dict(os.environ)
        full_env.update(env or {})
        popen = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, start_new_session=True,
        )
        out.close()
        proc = Proc(name, popen, log_path)
        with self.lock:
            record_pid(self.pidfile, popen.pid)
            self.procs.append(proc)
        return proc

    def ours(self) -> set[int]:
        """Our pids: this script, every process it started, and their children (nginx workers)."""
        pids = {os.getpid()}
        try:
            for line in self.pidfile.read_text().splitlines():
                pids.add(int(line.split()[0]))
        except OSError:
            pass
        for pid in list(pids):
            pids.update(children_of(pid))
        return pids

    def stop(self, *procs: Proc, grace: float = 5.0) -> None:
        """SIGTERM to each process group (nginx workers included), all at once (Weir takes about
        a second to drain); SIGKILL to whatever is left after `grace` seconds."""
        for proc in procs:
            self._signal(proc, signal.SIGTERM)
        deadline = time.time() + grace
        for proc in procs:
            try:
                proc.popen.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                # Not reaped yet, so the group id is still this process's own.
                log(f"{proc.name} ignored SIGTERM for {grace}s: SIGKILL")
                self._signal(proc, signal.SIGKILL)
                proc.popen.wait()
            self._forget(proc)

    def kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        """`sig` (SIGKILL: a crash) to the process group at once, then reaps the process."""
        self._signal(proc, sig)
        proc.popen.wait()
        self._forget(proc)

    def _forget(self, proc: Proc) -> None:
        with self.lock:
            if proc in self.procs:
                self.procs.remove(proc)

    @staticmethod
    def _signal(proc: Proc, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # the group was created for it: start_new_session
        except (ProcessLookupError, PermissionError):
            pass

    def stop_all(self, grace: float = 5.0) -> None:
        with self.lock:
            procs = list(reversed(self.procs))
        self.stop(*procs, grace=grace)


def record_pid(pidfile: Path, pid: int) -> None:
    """Appends "pid starttime" (field 22 of /proc/pid/stat): run.sh's trap checks the start time
    so that it never signals an unrelated process that reused the pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        start = stat[stat.rindex(")") + 2:].split()[19]
    except (OSError, IndexError):
        start = "?"
    with open(pidfile, "a") as f:
        f.write(f"{pid} {start}\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(proc: Proc, port: int, timeout: float = 15.0, what: str = "") -> None:
    """Until `port` accepts connections on loopback; BenchError (with the log's tail) if the
    process exits first or `timeout` passes. `what` names the port in the error ("admin")."""
    name = f"{proc.name} {what}".strip()
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not proc.alive():
            raise BenchError(f"{name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise BenchError(f"{name} not listening on {port} after {timeout}s:\n{proc.log_tail()}")


def http_get(port: int, xff: str | None = None, path: str = "/") -> int:
    """One HTTP/1.1 GET; returns the status code."""
    return http_head(port, xff, path)[0]


def http_head(port: int, xff: str | None = None, path: str = "/") -> tuple[int, dict[str, str]]:
    """One HTTP/1.1 GET; returns the status code and the response's header fields (names in
    lower case)."""
    req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    if xff:
        req += f"X-Forwarded-For: {xff}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall((req + "\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
    if not m:
        raise BenchError(f"no HTTP response on port {port}: {data[:80]!r}")
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    fields = dict((k.strip().lower(), v.strip()) for k, _, v in (f.partition(":") for f in head))
    return int(m.group(1)), fields
