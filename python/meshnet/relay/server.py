"""The relay role (ADR 0007): a public address for a node that takes no inbound connections.

A relayed node dials out and holds `Attach` open. The relay opens a TCP listener for it (its
allocation: `public_host:port`, which the node registers with the tracker as its address) and,
for every connection a peer makes to that listener, sends the node an `Incoming`; the node opens
a `Pipe` for it, and the relay copies bytes between the peer's TCP connection and the Pipe,
unchanged, both ways. Peers speak TLS to the node itself (they pin the node's registered
certificate), so what crosses the relay is the node's TLS records with the seam's serialized
frames inside: the relay can drop or delay them, cannot read them, and a changed byte fails the
record's authentication at the node or the peer.

Who may ask: every call is signed with the caller's node key (identity/requests.py); a Pipe is
accepted only from the key that owns the allocation. With `token` set (the tracker passes its
node role's token) the caller must also hold it. Bounds, checked before anything is allocated:
at most `max_nodes` allocations and `max_nodes_per_peer` attached from one address, an
allocation closed unless its node registers at it with the tracker within `register_seconds`
(when the relay can ask: `registered`), `max_connections_per_node` open connections per
allocation, and connections the node has not answered yet (its first bytes back) at most
`max_connections_per_peer` from one address and `max_connections_per_prefix` from one /24 or /64
and `max_unanswered_per_node` in all, though a prefix with none may always add one (more are
closed at once: issue 55, findings 11 and 18, one byte got a connection piped and then held by
the node's half-open handshake, and 8 addresses filled an allocation; now they can hold at most
part of it, and a prefix they do not hold still gets through). A connection that sends nothing within `hello_seconds` is closed
before the node hears of it, one the node does not pipe within `accept_seconds` is closed, and a
Chunk is at most CHUNK_BYTES. A node that
attaches again (its agent reconnected, or it restarted) gets the port its last allocation had,
when that port is still free, so the address it registered stays good (issue 35). The relay runs
its own asyncio loop in a thread, so the tracker or a node can host it beside their synchronous
gRPC servers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import secrets
import threading
from typing import Callable, Optional

import grpc

from meshnet.identity import keys
from meshnet.identity.requests import RequestAuthError, bearer_token, verify_request
from meshnet.peers import grpc_peer_host, peer_prefix
from meshnet.process import log
from meshnet.relay.v1 import relay_pb2, relay_pb2_grpc

CHUNK_BYTES = 64 * 1024
ATTACH = "/meshnet.relay.v1.Relay/Attach"
PIPE = "/meshnet.relay.v1.Relay/Pipe"
PING = "/meshnet.relay.v1.Relay/Ping"
CONNECTION_METADATA = "x-meshnet-connection"
KEEPALIVE_MS = 10_000  # an agent pings its relay this often, calls or not
MAX_PORTS_REMEMBERED = 1024  # nodes whose last allocation's port is offered again on re-attach


def agent_options(keepalive_ms: int = KEEPALIVE_MS) -> list[tuple[str, int]]:
    """The agent's channel: a ping every `keepalive_ms`, even while idle."""
    return [("grpc.max_receive_message_length", CHUNK_BYTES + 1024), ("grpc.keepalive_time_ms", keepalive_ms),
            ("grpc.keepalive_timeout_ms", 10_000), ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0)]


def relay_options(keepalive_ms: int = KEEPALIVE_MS) -> list[tuple[str, int]]:
    """The relay's server, in agreement with agent_options (issue 35, finding 9): gRPC servers by
    default take a ping without data at most every 5 minutes and answer the third early one with
    GOAWAY too_many_pings, which cut every idle agent off about every 30 s. Pings half as far
    apart as the agents' are accepted; faster ones still earn strikes."""
    return [("grpc.max_receive_message_length", CHUNK_BYTES + 1024), ("grpc.keepalive_time_ms", keepalive_ms),
            ("grpc.keepalive_timeout_ms", 10_000), ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", keepalive_ms // 2)]  # what it accepts


@dataclasses.dataclass(frozen=True)
class RelayLimits:
    max_nodes: int = 256  # allocations at once
    max_connections_per_node: int = 64  # open connections to one allocation
    keepalive_ms: int = KEEPALIVE_MS  # the agents' ping interval, which the relay accepts
    accept_seconds: float = 10.0  # a connection the node has not piped by then is closed
    hello_seconds: float = 5.0  # a peer's first bytes (its TLS ClientHello) must come by then, or it is closed
    max_connections_per_peer: int = 8  # connections from one IP address the node has not answered yet
    max_connections_per_prefix: int = 16  # the same, from one /24 (IPv4) or /64 (IPv6)
    max_unanswered_per_node: int = 32  # the same, to one allocation from everyone (a prefix with none may add one)
    max_nodes_per_peer: int = 4  # allocations held from one IP address (one host's nodes)
    register_seconds: float = 30.0  # with a registration check: an allocation no node registered by then is closed


@dataclasses.dataclass
class RelayStats:
    """Counters of the relay's work (read them from any thread; written on the relay's loop)."""

    attached: int = 0  # allocations now
    connections: int = 0  # connections piped, in total
    refused: int = 0  # connections closed at once (over the per-node cap) or never piped
    bytes_to_nodes: int = 0
    bytes_from_nodes: int = 0


class _Connection:
    """A peer's TCP connection to an allocation, waiting for (then joined to) the node's Pipe."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        self.reader, self.writer, self.peer, self.prefix = reader, writer, peer, peer_prefix(peer)
        self.answered = False  # the node has sent its first bytes back
        self.first = b""  # the peer's first bytes, read before the node hears of the connection
        loop = asyncio.get_running_loop()
        self.claimed: asyncio.Future = loop.create_future()  # set when the node's Pipe takes it
        self.done: asyncio.Future = loop.create_future()  # set when the Pipe ends


class _Allocation:
    def __init__(self, node_id: str, key: bytes, limits: RelayLimits, peer: str = "") -> None:
        self.node_id, self.key, self.peer = node_id, key, peer  # peer: the attaching IP address
        self.events: asyncio.Queue = asyncio.Queue()  # Incoming events; None ends the Attach
        self.pending: dict[int, _Connection] = {}
        self.open: set[_Connection] = set()
        self.server: Optional[asyncio.AbstractServer] = None
        self.limits = limits

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for conn in list(self.open):
            conn.writer.close()
        for conn in self.pending.values():
            conn.claimed.cancel()  # its connection handler ends now, not at accept_seconds
        self.events.put_nowait(None)


class RelayServer(relay_pb2_grpc.RelayServicer):
    def __init__(self, listen: str, public_host: str, *, tls: Optional[tuple[bytes, bytes]] = None, token: str = "",
                 limits: RelayLimits = RelayLimits(),
                 registered: Optional[Callable[[str, str], bool]] = None) -> None:
        """`listen`: host:port of the Relay service (port 0 picks one); allocations listen on the
        same host. `public_host`: the host peers dial (allocations are `public_host:port`).
        `tls`: (certificate PEM, key PEM) of the Relay service; None = plaintext (development).
        `registered(node_id, address)`: whether that node is registered with the tracker at that
        address (a relay inside the tracker asks its registry); with it, an allocation that its
        node has not registered within `limits.register_seconds` is closed (issue 35, finding 8)."""
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"relay listen address must be host:port, got {listen!r}")
        self._listen, self._bind_host, self._public_host = listen, host.strip("[]"), public_host
        self._tls, self._token, self.limits, self._registered = tls, token, limits, registered
        self.stats = RelayStats()
        self._allocations: dict[str, _Allocation] = {}
        # node id -> the port of its last allocation, offered again when it re-attaches; bounded
        # (oldest dropped past MAX_PORTS_REMEMBERED), relay loop only.
        self._last_port: dict[str, int] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._server: Optional[grpc.aio.Server] = None
        self._thread: Optional[threading.Thread] = None
        self._stopped: Optional[asyncio.Event] = None
        self.port = 0

    @property
    def address(self) -> str:
        """host:port where relayed nodes attach."""
        return f"{self._public_host}:{self.port}"

    # -- lifecycle (any thread) ------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> "RelayServer":
        """Serves in a background thread; returns once bound (raises OSError if it cannot bind)."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self._main(ready))
            except BaseException as err:  # noqa: BLE001 (handed to start())
                failure.append(err)
                ready.set()

        self._thread = threading.Thread(target=run, name="meshnet-relay", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise OSError(f"relay did not start within {timeout} s")
        if failure:
            raise OSError(f"relay cannot serve on {self._listen}: {failure[0]}")
        log("relay_listening", address=self.address, tls=self._tls is not None)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            try:
                self._loop.call_soon_threadsafe(self._stopped.set)
            except RuntimeError:  # stopped already
                pass
        if self._thread is not None:
            self._thread.join(timeout=10)

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._server = grpc.aio.server(options=relay_options(self.limits.keepalive_ms))
        relay_pb2_grpc.add_RelayServicer_to_server(self, self._server)
        if self._tls is not None:
            cert, key = self._tls
            self.port = self._server.add_secure_port(self._listen, grpc.ssl_server_credentials([(key, cert)]))
        else:
            self.port = self._server.add_insecure_port(self._listen)
        if not self.port:
            raise OSError(f"cannot bind {self._listen}")
        await self._server.start()
        ready.set()
        await self._stopped.wait()
        for allocation in list(self._allocations.values()):
            allocation.close()
        await self._server.stop(grace=1)

    # -- the data path (hook for the test-only tampering relay) ----------------------------

    def forward_to_node(self, data: bytes) -> bytes:
        """The bytes a peer sent, as the relay passes them on to the node: unchanged."""
        return data

    # -- RPCs (on the relay's loop) ---------------------------------------------------------

    async def _caller(self, context: grpc.aio.ServicerContext, method: str, payload: bytes) -> bytes:
        metadata = tuple(context.invocation_metadata() or ())
        if self._token and not hmac.compare_digest(bearer_token(metadata).encode(), self._token.encode()):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this relay serves only nodes of its swarm "
                                                                   "(the node role's token is missing or wrong)")
        try:
            return verify_request(metadata, method, payload)
        except RequestAuthError as err:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(err))
        raise AssertionError("unreachable")  # abort raises

    async def Ping(self, request, context):  # noqa: N802 (gRPC method name)
        await self._caller(context, PING, request.SerializeToString())
        return relay_pb2.PingReply(unix_nanos=request.unix_nanos)

    async def Attach(self, request, context):  # noqa: N802 (gRPC method name)
        key = await self._caller(context, ATTACH, request.SerializeToString())
        node_id = keys.node_id(key)
        if request.node_id != node_id:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"node {request.node_id!r} is not the id of the signing key ({node_id})")
        peer = grpc_peer_host(context.peer())
        others = [a for a in self._allocations.values() if a.node_id != node_id]
        if sum(a.peer == peer for a in others) >= self.limits.max_nodes_per_peer:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"this relay holds its maximum of "
                                f"{self.limits.max_nodes_per_peer} nodes attached from {peer}")
        if len(others) >= self.limits.max_nodes:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"this relay holds its maximum of {self.limits.max_nodes} nodes")
        previous = self._allocations.pop(node_id, None)
        if previous is not None:  # the same key attaching again (a restarted node): the newer one wins
            previous.close()
        allocation = _Allocation(node_id, key, self.limits, peer)
        try:
            allocation.server = await self._listen_for(allocation)
        except OSError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the relay cannot open a port: {err}")
        port = allocation.server.sockets[0].getsockname()[1]
        self._last_port.pop(node_id, None)
        self._last_port[node_id] = port  # the most recent last
        while len(self._last_port) > MAX_PORTS_REMEMBERED:
            del self._last_port[next(iter(self._last_port))]
        self._allocations[node_id] = allocation
        self.stats.attached = len(self._allocations)
        address = f"{self._public_host}:{port}"
        log("relay_attached", node=node_id, allocation=address, peer=context.peer())
        deadline = asyncio.ensure_future(self._expect_registration(allocation, address))
        try:
            await context.write(relay_pb2.RelayEvent(allocation=relay_pb2.Allocation(address=address)))
            while (event := await allocation.events.get()) is not None:
                await context.write(event)
        finally:
            deadline.cancel()
            if self._allocations.get(node_id) is allocation:
                del self._allocations[node_id]
            allocation.close()
            self.stats.attached = len(self._allocations)
            log("relay_detached", node=node_id, allocation=address)

    async def _listen_for(self, allocation: _Allocation) -> asyncio.AbstractServer:
        """The allocation's listener: on its node's last port when that is free, else a new one."""
        def serve(r, w):
            return self._on_connection(allocation, r, w)
        port = self._last_port.get(allocation.node_id)
        if port is not None:
            try:
                return await asyncio.start_server(serve, self._bind_host, port)
            except OSError:  # taken meanwhile (by another allocation, or another program)
                pass
        return await asyncio.start_server(serve, self._bind_host, 0)

    async def _expect_registration(self, allocation: _Allocation, address: str) -> None:
        """Closes `allocation` unless its node registered with the tracker at `address` within
        register_seconds: an allocation serves a node of the swarm, not a fresh key's squat."""
        if self._registered is None:
            return
        await asyncio.sleep(self.limits.register_seconds)
        registered = await asyncio.get_running_loop().run_in_executor(None, self._registered, allocation.node_id,
                                                                      address)
        if not registered:
            log("relay_unregistered", node=allocation.node_id, allocation=address,
                reason=f"no registration at this address within {self.limits.register_seconds:g} s")
            allocation.close()

    async def Pipe(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        metadata = dict(context.invocation_metadata() or ())
        raw = metadata.get(CONNECTION_METADATA, "")
        if not raw.isdigit() or len(raw) > 20:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{CONNECTION_METADATA} must name a connection")
        key = await self._caller(context, PIPE, raw.encode())
        allocation = self._allocations.get(keys.node_id(key))
        conn = allocation.pending.pop(int(raw), None) if allocation is not None else None
        if conn is None:  # not this key's, already piped, or given up on
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no connection {raw} waits for this node")
        conn.claimed.set_result(None)
        try:
            await self._pump(conn, context)
        finally:
            conn.writer.close()
            conn.done.set_result(None)

    async def _pump(self, conn: _Connection, context) -> None:
        async def to_node() -> None:
            data = conn.first
            while data:
                self.stats.bytes_to_nodes += len(data)
                await context.write(relay_pb2.Chunk(data=self.forward_to_node(data)))
                data = await conn.reader.read(CHUNK_BYTES)

        async def from_node() -> None:
            while (chunk := await context.read()) is not grpc.aio.EOF:
                self.stats.bytes_from_nodes += len(chunk.data)
                conn.answered = True
                conn.writer.write(chunk.data)
                await conn.writer.drain()

        tasks = {asyncio.ensure_future(to_node()), asyncio.ensure_future(from_node())}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # a reset peer ends the pipe, quietly

    @staticmethod
    def _refuses(allocation: _Allocation, peer: str) -> bool:
        """Past the per-peer or per-prefix cap on connections the node has not answered (an honest
        peer's are answered at once, so a gateway or hop with many streams to the node is not held
        to it; silent and half-open ones are), past the per-node cap on unanswered connections
        unless the peer's prefix has none, or past the per-node cap on open connections."""
        limits, prefix = allocation.limits, peer_prefix(peer)
        if len(allocation.open) >= limits.max_connections_per_node:
            return True
        unanswered = [c for c in allocation.open if not c.answered]
        mine = sum(c.peer == peer for c in unanswered)
        ours = sum(c.prefix == prefix for c in unanswered)
        if mine >= limits.max_connections_per_peer or ours >= limits.max_connections_per_prefix:
            return True
        return ours > 0 and len(unanswered) >= limits.max_unanswered_per_node

    async def _on_connection(self, allocation: _Allocation, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        """A peer's connection to `allocation`: refused at once when `_refuses` says so; closed if
        it sends nothing within hello_seconds (issue 35, finding 8: silent connections filled an
        allocation); then offered to the node, which must pipe it within accept_seconds."""
        limits = allocation.limits
        address = writer.get_extra_info("peername")
        peer = address[0] if address else ""
        if self._refuses(allocation, peer):
            self.stats.refused += 1
            writer.close()
            return
        conn = _Connection(reader, writer, peer)
        allocation.open.add(conn)
        try:
            conn.first = await asyncio.wait_for(reader.read(CHUNK_BYTES), limits.hello_seconds)
        except (asyncio.TimeoutError, ConnectionError):
            conn.first = b""
        if not conn.first:
            self.stats.refused += 1
            allocation.open.discard(conn)
            writer.close()
            return
        connection_id = secrets.randbits(63)
        allocation.pending[connection_id] = conn
        allocation.events.put_nowait(relay_pb2.RelayEvent(incoming=relay_pb2.Incoming(
            connection_id=connection_id, peer=f"{address[0]}:{address[1]}" if address else "")))
        try:
            await asyncio.wait_for(asyncio.shield(conn.claimed), allocation.limits.accept_seconds)
            self.stats.connections += 1
            await conn.done
        except asyncio.TimeoutError:
            self.stats.refused += 1
        finally:
            allocation.pending.pop(connection_id, None)
            allocation.open.discard(conn)
            writer.close()
