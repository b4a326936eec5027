"""The tracker's gRPC port as the network sees it: a TCP front that counts connections per peer,
per prefix and in all, and closes one past its caps before reading a byte of it (issue 55,
finding 4).

grpc.aio has no hook at accept: one unauthenticated peer kept 1,500 idle TLS connections open
on the tracker's port, and at a soft file limit of 1,024 new nodes and clients timed out. The
gRPC server's own handshake deadline and idle timeout close such connections after a while; what
bounds how many one peer, or one /24 or /64, holds at once is this front:

- it listens on the tracker's public address; each connection it admits (`ConnectionCounts`,
  shared with the HTTP surfaces) is joined to the gRPC server, which listens on loopback only,
  and the bytes are passed both ways unchanged: TLS is still end to end, between the peer and
  the gRPC server;
- gRPC then sees every connection as coming from 127.0.0.1. The front records the loopback
  port of each connection it opens to the server, and `peer_of` maps the peer gRPC reports back
  to the address that connected, so the per-peer and per-prefix call caps (grpc_server.py) keep
  counting real peers;
- a connection closed on either side is closed on the other, so the server's deadlines (the
  handshake, an idle connection) end the peer's connection too.

A process on the tracker's own host can reach the loopback port directly; it is counted as
127.0.0.1. Runs on the gRPC server's event loop: no locks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Optional

from meshnet.peers import ConnectionCaps, ConnectionCounts

log = logging.getLogger("meshnet.tracker.connection_front")

UPSTREAM_HOST = "127.0.0.1"
CHUNK_BYTES = 64 << 10  # read at most this much from one side before writing it to the other
UPSTREAM_CONNECT_TIMEOUT = 5.0  # seconds to reach the gRPC server on loopback


def split_listen(listen: str) -> tuple[Optional[str], int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port). An empty host or '[::]' gives None: every
    address of both families, as gRPC's dual-stack '[::]' did."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {listen!r} is not HOST:PORT")
    host = host.strip("[]")
    return (None if host in ("", "::") else host), int(port)


class ConnectionFront:
    """Accepts on the public address under `caps`, joins each admitted connection to the gRPC
    server at UPSTREAM_HOST:`upstream_port`."""

    def __init__(self, caps: ConnectionCaps, upstream_port: int, grpc_peer: Callable[[str], str]) -> None:
        self.caps, self.counts = caps, ConnectionCounts()
        self._upstream_port = upstream_port
        self._grpc_peer = grpc_peer  # gRPC's peer string -> its address, for connections not made here
        self._peers: dict[int, str] = {}  # loopback port of a connection to the server -> the peer's address
        self._server: Optional[asyncio.base_events.Server] = None
        self._joined: set[asyncio.Task] = set()

    async def start(self, listen: str) -> int:
        """Listens on `listen` (HOST:PORT; port 0 picks one); returns the port."""
        host, port = split_listen(listen)
        self._server = await asyncio.start_server(self._accept, host=host, port=port,
                                                  reuse_address=True, backlog=1024)
        chosen = self._server.sockets[0].getsockname()[1]
        if port == 0 and len(self._server.sockets) > 1:  # every address family on one port
            self._server.close()
            self._server = await asyncio.start_server(self._accept, host=host, port=chosen,
                                                      reuse_address=True, backlog=1024)
        return chosen

    def peer_of(self, grpc_peer: str) -> str:
        """The address that opened the connection gRPC names 'ipv4:127.0.0.1:PORT'."""
        kind, _, rest = grpc_peer.partition(":")
        host, _, port = rest.rpartition(":")
        if kind == "ipv4" and host == UPSTREAM_HOST and port.isdigit() and int(port) in self._peers:
            return self._peers[int(port)]
        return self._grpc_peer(grpc_peer)

    async def stop(self) -> None:
        """Stops accepting and closes every joined connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._joined):
            task.cancel()
        if self._joined:
            await asyncio.gather(*self._joined, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        peer = str(peername[0]) if peername else ""
        why = self.counts.admit(self.caps, peer)
        task = asyncio.current_task()
        self._joined.add(task)
        try:
            if why is not None:
                log.debug("connection from %s closed at accept: %s", peer, why)
                writer.transport.abort()
                return
            await self._join(peer, reader, writer)
        finally:
            self._joined.discard(task)
            self.counts.release(peer)

    async def _join(self, peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(UPSTREAM_HOST, self._upstream_port), UPSTREAM_CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as e:
            log.warning("connection from %s closed: the gRPC server cannot be reached (%s)", peer, e)
            writer.transport.abort()
            return
        port = up_writer.get_extra_info("sockname")[1]
        self._peers[port] = peer  # before a byte passes, so the server's first call finds it
        try:
            await asyncio.gather(_pass(reader, up_writer), _pass(up_reader, writer))
        finally:
            self._peers.pop(port, None)
            writer.transport.abort()
            up_writer.transport.abort()


async def _pass(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copies `source` to `sink` until `source` ends (then half-closes `sink`) or either side
    fails (then closes `sink`, which ends the other direction too)."""
    try:
        while data := await source.read(CHUNK_BYTES):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof() and not sink.is_closing():
            sink.write_eof()
    except (OSError, asyncio.IncompleteReadError):
        sink.transport.abort()
