"""An ASGI app served by uvicorn on a daemon thread: the small read-only HTTP side of a role
(the tracker's /metrics and /status, a node's /metrics) beside its gRPC server.

Why uvicorn rather than prometheus_client's start_http_server (a ThreadingHTTPServer: one
thread per connection, without limit): one event-loop thread whatever the number of
connections, and the bounds of http_bounds.py: a complete request within a few seconds of
connecting (or of the previous response), a cap on connections per peer and in all, and at most
MAX_IN_FLIGHT requests being handled (more get 503), idle connections not counted. Handlers
that block (a Health RPC, a ledger query) are sync Starlette endpoints, which Starlette runs on
its worker threads, never on the loop.
Started and stopped by the role's main thread. The socket is bound in the constructor, so port 0
works and `port` is known before the server thread runs.
"""

from __future__ import annotations

import socket
import threading
import time


# /metrics and /status: scrapers and a few browsers, from few addresses.
BOUNDS = dict(request_timeout=5.0, max_connections=256, max_per_peer=16, max_in_flight=32, max_head_bytes=16 << 10)


def parse_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port); ValueError if malformed."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {listen!r}")
    return host.strip("[]"), int(port)


class WebServer:
    def __init__(self, app, listen: str, *, name: str = "web") -> None:
        host, port = parse_listen(listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
        except OSError:
            self._socket.close()
            raise
        self.host, self.port = host, self._socket.getsockname()[1]
        import uvicorn  # here, not at import: parse_listen's users (a lean node) need no HTTP stack

        from meshnet.http_bounds import ConnectionCounts, HttpBounds, uvicorn_config

        self.counts = ConnectionCounts()
        self._server = uvicorn.Server(uvicorn_config(app, HttpBounds(**BOUNDS), self.counts, loop="asyncio",
                                                     log_config=None))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True,
                                        name=name)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> "WebServer":
        """Serves on the daemon thread; returns once it accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._socket.close()
