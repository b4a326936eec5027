"""Bounds on an HTTP surface served by uvicorn, so that peers who send nothing, or send it slowly,
cannot take it from everyone else (issue 35, finding 1).

uvicorn alone counts idle connections against `limit_concurrency` and sets no deadline on a
request's head: a thousand silent sockets, or a few sending one byte every two seconds, make it
answer 503 to everyone for as long as they are held. Here, instead:

- a connection must deliver a complete request (head and body) within `request_timeout` of
  being opened, or of the end of its previous response; it is closed otherwise, whatever it
  trickles meanwhile (uvicorn's keep-alive timer restarts on every byte);
- at most `max_per_peer` connections from one IP address, `max_per_prefix` from one network
  prefix (/24, /64: peers.py) and `max_connections` in all: more are closed as soon as they are
  accepted, before anything is read; but a prefix holding fewer than `reserved_per_prefix` may
  still connect past `max_connections`, up to `overflow` more in all, so that peers with many
  prefixes cannot shut out one they do not hold (issue 55, finding 10: 13 addresses did);
- only requests being handled count against the overload limit (`max_in_flight`, 503 past it,
  with Retry-After), never connections that wait.

`uvicorn_config` builds the uvicorn Config with all three; the protocol class is made per server
(`bounded_protocol`), so two servers in one process keep separate counts. Everything here runs
on the server's event loop thread: no locks.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Optional

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from meshnet.peers import ConnectionCaps, ConnectionCounts


@dataclasses.dataclass(frozen=True)
class HttpBounds:
    request_timeout: float = 10.0  # seconds to a complete request, from connect or the last response
    max_connections: int = 512  # open connections from all peers (keep it under the fd limit)
    max_per_peer: int = 32  # open connections from one IP address
    max_per_prefix: int = 128  # open connections from one /24 (IPv4) or /64 (IPv6)
    reserved_per_prefix: int = 4  # connections a prefix may open even when max_connections are open
    overflow: int = 64  # how many more than max_connections the reserved shares may open in all
    max_in_flight: int = 64  # requests being handled; more are answered 503
    max_head_bytes: int = 16 << 10  # h11's bound on an incomplete request head

    def __post_init__(self) -> None:
        if self.request_timeout <= 0 or min(self.max_connections, self.max_per_peer, self.max_per_prefix,
                                            self.max_in_flight, self.max_head_bytes) < 1 \
                or min(self.reserved_per_prefix, self.overflow) < 0:
            raise ValueError(f"HTTP bounds must be positive: {self}")

    @property
    def caps(self) -> ConnectionCaps:
        return ConnectionCaps(self.max_connections, self.max_per_peer, self.max_per_prefix,
                              self.reserved_per_prefix, self.overflow)


def bounded_protocol(bounds: HttpBounds, counts: Optional[ConnectionCounts] = None) -> type:
    """An H11Protocol subclass enforcing `bounds`' connection caps and request deadline, with
    its own `counts` (a fresh ConnectionCounts if None; the class's `counts` attribute)."""
    shared = counts if counts is not None else ConnectionCounts()
    caps = bounds.caps

    class BoundedH11Protocol(H11Protocol):
        counts = shared

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._deadline: Optional[asyncio.TimerHandle] = None
            self._peer = self.client[0] if self.client else ""
            if shared.admit(caps, self._peer) is not None:
                transport.abort()
            else:
                self._arm()

        def connection_lost(self, exc: Optional[Exception]) -> None:
            self._disarm()
            shared.release(self._peer)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
                self._disarm()  # the whole request is in: the app's time is the app's business

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
                self._arm()  # the next request has the same deadline as the first

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(bounds.request_timeout, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing() and self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
                shared.timed_out += 1
                self.transport.abort()  # an app reading the body sees the client gone

    return BoundedH11Protocol


class InFlightLimit:
    """ASGI middleware: at most `limit` HTTP requests being handled at once; past it, 503 with
    Retry-After before the app sees the request. Connections that wait are not counted."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit, self.active, self.refused = app, limit, 0, 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.active >= self.limit:
            self.refused += 1
            body = b'{"error": {"message": "overloaded: too many requests in flight; retry", "type": "overloaded"}}'
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1


def uvicorn_config(app, bounds: HttpBounds, counts: Optional[ConnectionCounts] = None, **options) -> uvicorn.Config:
    """A uvicorn Config serving `app` under `bounds` (h11; keep-alive idles end with the request
    deadline); `options` are passed on (log settings, loop, ...)."""
    return uvicorn.Config(InFlightLimit(app, bounds.max_in_flight), http=bounded_protocol(bounds, counts),
                          ws="none", lifespan="off", access_log=False, server_header=False, limit_concurrency=None,
                          timeout_keep_alive=int(max(1, bounds.request_timeout)),
                          h11_max_incomplete_event_size=bounds.max_head_bytes, **options)
