"""A userspace TCP link with one-way delay and a rate limit, for WAN lanes without `sch_netem`.

    proxy = DelayProxy(delay_ms=10, rate_mbit=100)   # listens on 127.0.0.1:<proxy.port>
    proxy.target = ("127.0.0.1", 50051)              # may be set after the proxy exists
    ...                                              # peers dial proxy.address instead
    proxy.close()

Every accepted connection is paired with one to the target. Each direction is a pump: a reader
thread stamps every chunk with its arrival time and queues it; a writer thread sends it no
earlier than arrival + delay, and no faster than the rate (a chunk of n bytes holds the link for
n * 8 / rate seconds, as a serializing link would). The queue per direction is bounded
(`max_queued_bytes`): a full queue stops the reader, so the sender's TCP window closes, as a
router's buffer would. Sockets run with TCP_NODELAY, so the proxy adds no Nagle wait of its own.

TLS and gRPC pass through untouched (the bytes are opaque). Accuracy: sleeping threads wake a
few tens of microseconds late, so the delay is met or exceeded by that much; delay_proxy_test
measures it against the setting.
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from typing import Optional

CHUNK = 64 * 1024


class _Pump:
    """One direction of one connection: src -> (delay, rate) -> dst."""

    def __init__(self, src: socket.socket, dst: socket.socket, delay_s: float, rate_bps: Optional[float],
                 max_queued_bytes: int, on_end) -> None:
        self.src, self.dst = src, dst
        self.delay_s, self.rate_bps, self.max_queued = delay_s, rate_bps, max_queued_bytes
        self.queue: collections.deque = collections.deque()
        self.queued = 0
        self.cond = threading.Condition()
        self.eof = False
        self.on_end = on_end
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.writer = threading.Thread(target=self._write, daemon=True)

    def start(self) -> None:
        self.reader.start()
        self.writer.start()

    def _read(self) -> None:
        try:
            while True:
                data = self.src.recv(CHUNK)
                stamp = time.monotonic()
                with self.cond:
                    if not data:
                        break
                    self.cond.wait_for(lambda: self.queued < self.max_queued or self.eof)
                    if self.eof:
                        return
                    self.queue.append((stamp, data))
                    self.queued += len(data)
                    self.cond.notify_all()
        except OSError:
            pass
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def _write(self) -> None:
        free_at = 0.0  # when the link has finished serializing the previous chunk
        try:
            while True:
                with self.cond:
                    self.cond.wait_for(lambda: self.queue or self.eof)
                    if not self.queue:
                        break
                    stamp, data = self.queue.popleft()
                    self.queued -= len(data)
                    self.cond.notify_all()
                start = max(stamp, free_at)
                hold = len(data) * 8 / self.rate_bps if self.rate_bps else 0.0
                free_at = start + hold
                due = start + hold + self.delay_s
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                self.dst.sendall(data)
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self.on_end()


def _closer(*pair: socket.socket):
    """A callback for both pumps of a connection: the second call closes both sockets."""
    lock, left = threading.Lock(), [2]

    def on_end() -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            for s in pair:
                s.close()

    return on_end


class DelayProxy:
    """Listens on `host`:0; forwards every connection to `target` with the link's delay and rate
    in both directions. `rate_mbit` None or 0: no rate limit."""

    def __init__(self, delay_ms: float, rate_mbit: Optional[float] = None, host: str = "127.0.0.1",
                 target: Optional[tuple[str, int]] = None, max_queued_bytes: int = 4 << 20) -> None:
        if delay_ms < 0:
            raise ValueError("delay_ms must be >= 0")
        self.delay_s = delay_ms / 1000
        self.rate_bps = rate_mbit * 1e6 if rate_mbit else None
        self.max_queued = max_queued_bytes
        self.target = target
        self._listener = socket.create_server((host, 0))
        self.host, self.port = host, self._listener.getsockname()[1]
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.target is None:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
                self.connections += 1
            on_end = _closer(client, upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                _Pump(src, dst, self.delay_s, self.rate_bps, self.max_queued, on_end).start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        self._listener.close()
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def __enter__(self) -> "DelayProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
