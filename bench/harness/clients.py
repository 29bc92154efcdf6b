"""Small loopback clients and servers of the cost curves (bench/curves.sh): pipelined HTTP/1.1
probes, idle keep-alive connections, raw HTTP/2 (h2c) streams, and an upstream that never
answers (to hold streams open)."""

from __future__ import annotations

import re
import selectors
import socket
import threading
import time

from .common import BenchError

# ---- HTTP/1.1 ------------------------------------------------------------------------------


def addr(i: int) -> str:
    """Address number i as wrk/client.lua makes it: 10.a.b.c."""
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def read_responses(sock: socket.socket, n: int, buf: bytearray) -> list[int]:
    """Reads `n` HTTP/1.1 responses with Content-Length bodies; their status codes. `buf` keeps
    what was read past the last one."""
    statuses = []
    while len(statuses) < n:
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            chunk = sock.recv(65536)
            if not chunk:
                raise BenchError(f"connection closed after {len(statuses)} of {n} responses")
            buf += chunk
            continue
        head = bytes(buf[:end])
        m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
        if not m:
            raise BenchError(f"not an HTTP response: {head[:80]!r}")
        cl = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
        if not cl:
            raise BenchError(f"a response without Content-Length: {head[:200]!r}")
        total = end + 4 + int(cl.group(1))
        while len(buf) < total:
            chunk = sock.recv(65536)
            if not chunk:
                raise BenchError("connection closed inside a response body")
            buf += chunk
        del buf[:total]
        statuses.append(int(m.group(1)))
    return statuses


def probe(port: int, first: int, count: int, descending: bool = False,
          batch: int = 64) -> dict[int, int]:
    """One request per address first .. first+count-1 (or back down from the last),
    pipelined `batch` at a time on one keep-alive connection, so strictly in that order; counts
    of each status."""
    order = list(range(first, first + count))
    if descending:
        order.reverse()
    counts: dict[int, int] = {}
    buf = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for i in range(0, len(order), batch):
            keys = order[i:i + batch]
            s.sendall(b"".join(
                f"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-For: {addr(k)}\r\n\r\n"
                .encode() for k in keys))
            for st in read_responses(s, len(keys), buf):
                counts[st] = counts.get(st, 0) + 1
    return counts


def open_idle_h1(port: int, n: int) -> list[socket.socket]:
    """`n` HTTP/1.1 connections, each after one completed GET (keep-alive): what an idle client
    connection holds once it has served a request."""
    socks = []
    try:
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            socks.append(s)
            s.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-For: {addr(i)}\r\n\r\n"
                      .encode())
            st = read_responses(s, 1, bytearray())[0]
            if st != 200:
                raise BenchError(f"idle connection {i}: status {st}")
    except (OSError, BenchError):
        close_all(socks)
        raise
    return socks


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


# ---- HTTP/2 with prior knowledge (h2c): just enough to open streams ------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS, HEADERS = 4, 1
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([ftype, flags]) + stream.to_bytes(4, "big") \
        + payload


def get_headers_block() -> bytes:
    """HPACK of GET http://127.0.0.1/: static-table entries (:method GET 2, :scheme http 6,
    :path / 4) and :authority (name 1) as a literal without indexing, no Huffman."""
    authority = b"127.0.0.1"
    return bytes([0x82, 0x86, 0x84, 0x01, len(authority)]) + authority


class H2Conn:
    """One h2c connection: the preface and settings exchanged, then streams opened on demand
    (each a GET with END_STREAM whose answer is never read)."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.next_stream = 1
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        self._ack_server_settings()

    def _ack_server_settings(self) -> None:
        """Reads frames until the server's SETTINGS (not an ACK) and acknowledges it."""
        buf = b""
        deadline = time.time() + 10
        while time.time() < deadline:
            while len(buf) >= 9:
                length = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + length:
                    break
                ftype, flags = buf[3], buf[4]
                buf = buf[9 + length:]
                if ftype == SETTINGS and not flags & ACK:
                    self.sock.sendall(frame(SETTINGS, ACK, 0))
                    return
                if ftype == 7:  # GOAWAY
                    raise BenchError("the server sent GOAWAY during the h2c handshake")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise BenchError("the server closed the h2c connection during the handshake")
            buf += chunk
        raise BenchError("no SETTINGS from the server within 10 s (is h2c on?)")

    def open_streams(self, n: int) -> None:
        block = get_headers_block()
        frames = []
        for _ in range(n):
            frames.append(frame(HEADERS, END_STREAM | END_HEADERS, self.next_stream, block))
            self.next_stream += 2
        self.sock.sendall(b"".join(frames))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


# ---- an upstream that reads requests and never answers -------------------------------------


class SilentUpstream:
    """A loopback server (a thread with epoll) that accepts connections, reads what they send and
    never answers: each request forwarded to it stays in flight. `held()` counts connections on
    which a whole request head arrived."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4096)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ)
        self.conns: dict[socket.socket, bytes] = {}
        self._held = 0
        self.lock = threading.Lock()
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def held(self) -> int:
        with self.lock:
            return self._held

    def _serve(self) -> None:
        while not self.stopping:
            for key, _ in self.sel.select(0.1):
                sock = key.fileobj
                if sock is self.listener:
                    try:
                        conn, _ = self.listener.accept()
                    except OSError:
                        continue
                    conn.setblocking(False)
                    self.sel.register(conn, selectors.EVENT_READ)
                    self.conns[conn] = b""
                    continue
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self._drop(sock)
                    continue
                seen = self.conns.get(sock, b"")
                if b"\r\n\r\n" not in seen:
                    seen = (seen + data)[-8192:]
                    self.conns[sock] = seen
                    if b"\r\n\r\n" in seen:
                        with self.lock:
                            self._held += 1

    def _drop(self, sock: socket.socket) -> None:
        seen = self.conns.pop(sock, b"")
        if b"\r\n\r\n" in seen:
            with self.lock:
                self._held -= 1
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()

    def close(self) -> None:
        self.stopping = True
        self.thread.join(timeout=5)
        for sock in list(self.conns):
            self._drop(sock)
        self.sel.close()
        self.listener.close()


def poll(condition, timeout: float, what: str) -> None:
    """Until `condition()` is true; BenchError naming `what` after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise BenchError(f"{what}: not reached within {timeout:.0f} s")
