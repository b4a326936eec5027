"""The tracker's gRPC server: grpc.aio on an event-loop thread of its own, in front of the
synchronous TrackerService (issue 35, finding 2).

The synchronous grpc.server gave each call a pool thread as soon as it arrived, and the thread
then waited for the call's message: a few dozen calls that never send one, from anyone, held
every thread, so Coverage timed out and every node's lease lapsed. Here:

- a call waits for its message on the event loop, which costs no thread, and for at most
  `message_timeout` (DEADLINE_EXCEEDED);
- a call whose bearer token grants no role allowed for its method is refused from its metadata
  alone (UNAUTHENTICATED or PERMISSION_DENIED), before its message is read;
- the methods run on worker threads, node methods (Register, Heartbeat, ...) on a pool of their
  own, so that client calls cannot starve heartbeats;
- at most `max_calls_per_peer` calls in progress per IP address, waiting ones included
  (RESOURCE_EXHAUSTED past it), `max_streams_per_connection` per HTTP/2 connection, `max_calls`
  in all;
- issue 55, finding 3 (a few addresses starved the tracker): a method that needs no role
  (TrackerKey) is answered without reading its message, so a call without a token holds nothing;
  calls are also counted per network prefix (/24 for IPv4, /64 for IPv6: one host owns a whole
  /64); calls waiting for their message have caps of their own, per prefix and in all, far below
  `max_calls`, and node methods wait under caps apart from everyone else's; `node_reserve` of
  `max_calls` is kept for node methods, so that no number of clients starves heartbeats.

Issue 55, finding 4: the public port is a `ConnectionFront` (connection_front.py), which caps
connections per peer, per prefix and in all before reading from them; the gRPC server itself
listens on loopback, and the front tells the calls' caps which peer each connection came from.

`TrackerServer` keeps the synchronous server's surface its callers use: `port`, and
`stop(grace)` returning an event to `.wait()` on.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Mapping, Optional

import grpc

from meshnet.identity import requests
from meshnet.identity import tls as tls_material
from meshnet.peers import ConnectionCaps, grpc_peer_host, peer_prefix
from meshnet.tracker.connection_front import UPSTREAM_HOST, ConnectionFront
from meshnet.tracker.v1 import tracker_pb2_grpc
from meshnet.weights.piece_service import PieceService, PublishedModels
from meshnet.weights.v1 import weights_pb2_grpc

log = logging.getLogger("meshnet.tracker.grpc_server")

SERVICE = "meshnet.tracker.v1.Tracker"
NODE_METHODS = frozenset({"Register", "Heartbeat", "Drain", "Deregister", "ReportWork", "Assign"})
# Methods that need no role token and still read their message, under the bounds of every other
# call (a public method, TrackerKey, is answered without reading it).
OPEN_METHODS = frozenset({"RedeemInvite"})


class Refused(Exception):
    """A call refused before it is handled (authentication); the server aborts it with `code`."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    node_workers: int = 8  # threads for node methods
    call_workers: int = 16  # threads for every other method
    max_calls_per_peer: int = 64  # calls in progress from one IP address, waiting for their message included
    message_timeout: float = 10.0  # seconds from a call's start to its request message
    max_streams_per_connection: int = 32  # concurrent calls on one HTTP/2 connection
    max_calls: int = 1024  # calls in progress in all
    max_calls_per_prefix: int = 256  # calls in progress from one /24 (IPv4) or /64 (IPv6)
    max_waiting: int = 256  # calls waiting for their message, in all (node methods: as many again, apart)
    max_waiting_per_prefix: int = 64  # calls waiting for their message from one prefix (node methods apart)
    node_reserve: int = 256  # of max_calls, kept for node methods (other calls: max_calls - node_reserve)
    handshake_timeout: float = 5.0  # seconds a connection has to finish its TLS handshake (gRPC's default: 120)
    connection_idle: float = 300.0  # seconds a connection with no call in progress is kept (then GOAWAY)
    connections: ConnectionCaps = ConnectionCaps(max_connections=2048, max_per_peer=64, max_per_prefix=256,
                                                 reserved_per_prefix=4, overflow=256)  # on the public port


class _Counts:
    """Calls counted per key and in all; the loop thread only."""

    def __init__(self) -> None:
        self.per: collections.Counter = collections.Counter()
        self.total = 0

    def add(self, key: str, n: int) -> None:
        self.per[key] += n
        self.total += n
        if self.per[key] <= 0:
            del self.per[key]


class _Gate(grpc.aio.ServerInterceptor):
    """Every Tracker call passes here before its message is read: refused from its metadata
    alone when its bearer token grants no role allowed for its method; refused when its peer
    already has max_calls_per_peer calls in progress (waiting ones included); cut when its
    message has not arrived within message_timeout. Then the method runs. A method that needs no
    role is answered at once, without its message (it has none worth waiting for)."""

    def __init__(self, method_roles: Mapping[str, frozenset[str]], role_of: Callable[[str], Optional[str]],
                 on_refused: Callable[[str, Refused, float], None], limits: ServerLimits,
                 peer_of: Callable[[str], str] = grpc_peer_host) -> None:
        self._roles, self._role_of, self._on_refused, self._limits = method_roles, role_of, on_refused, limits
        self.peer_of = peer_of  # gRPC's peer string -> the address that connected
        self._in_progress: collections.Counter = collections.Counter()  # per peer; the loop thread only
        self._per_prefix = _Counts()  # calls in progress per prefix
        self._others = _Counts()  # calls in progress that are not node methods (per prefix)
        self._waiting = {True: _Counts(), False: _Counts()}  # waiting for their message, node methods apart

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        service, _, method = details.method.lstrip("/").partition("/")
        if service != SERVICE:
            return await continuation(details)
        if method in self._roles:
            role = self._role_of(requests.bearer_token(tuple(details.invocation_metadata or ())))
            if role is None:
                return self._refusal(method, Refused(grpc.StatusCode.UNAUTHENTICATED, "missing or unknown role token"))
            if role not in self._roles[method]:
                return self._refusal(method, Refused(grpc.StatusCode.PERMISSION_DENIED,
                                                     f"role {role!r} may not call {method}"))
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        if method not in self._roles and method not in OPEN_METHODS:  # public: its message never read
            behaviour = functools.partial(self._public, handler.unary_unary, handler.request_deserializer(b""))
        else:
            behaviour = functools.partial(self._bounded, method, handler.unary_unary)
        return grpc.stream_unary_rpc_method_handler(behaviour, request_deserializer=handler.request_deserializer,
                                                    response_serializer=handler.response_serializer)

    @staticmethod
    async def _public(behaviour, empty_request, request_iterator, context: grpc.aio.ServicerContext):
        return await behaviour(empty_request, context)

    def _over(self, method: str, peer: str, prefix: str) -> Optional[str]:
        """Why a call from `peer` to `method` is refused now, or None."""
        limits, node = self._limits, method in NODE_METHODS
        waiting = self._waiting[node]
        if self._in_progress[peer] >= limits.max_calls_per_peer:
            return f"{limits.max_calls_per_peer} calls in progress from {peer}"
        if self._per_prefix.per[prefix] >= limits.max_calls_per_prefix:
            return f"{limits.max_calls_per_prefix} calls in progress from {prefix}"
        if not node and self._others.total >= limits.max_calls - limits.node_reserve:
            return f"{self._others.total} calls in progress (the rest is kept for nodes)"
        if waiting.per[prefix] >= limits.max_waiting_per_prefix:
            return f"{limits.max_waiting_per_prefix} calls from {prefix} are waiting for their message"
        if waiting.total >= limits.max_waiting:
            return f"{limits.max_waiting} calls are waiting for their message"
        return None

    async def _bounded(self, method: str, behaviour, request_iterator, context: grpc.aio.ServicerContext):
        peer = self.peer_of(context.peer())
        prefix, node = peer_prefix(peer), method in NODE_METHODS
        why = self._over(method, peer, prefix)
        if why is not None:
            await self._abort(context, method, Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{why}; retry later"))
        counts = [self._per_prefix] + ([] if node else [self._others])
        self._in_progress[peer] += 1
        for count in counts:
            count.add(prefix, 1)
        try:
            request = await self._message(method, context, self._waiting[node], prefix)
            return await behaviour(request, context)
        finally:
            self._in_progress[peer] -= 1
            if self._in_progress[peer] <= 0:
                del self._in_progress[peer]
            for count in counts:
                count.add(prefix, -1)

    async def _message(self, method: str, context: grpc.aio.ServicerContext, waiting: _Counts, prefix: str):
        """The call's request message, counted in `waiting` until it arrives; aborts the call past
        message_timeout or when there is none."""
        waiting.add(prefix, 1)
        try:
            request = await asyncio.wait_for(context.read(), self._limits.message_timeout)
        except asyncio.TimeoutError:
            request = None
        finally:
            waiting.add(prefix, -1)
        if request is None:
            await self._abort(context, method, Refused(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no request message within {self._limits.message_timeout:g} s of the call"))
        if request is grpc.aio.EOF:
            await self._abort(context, method, Refused(grpc.StatusCode.INVALID_ARGUMENT, "no request message"))
        return request

    async def _abort(self, context: grpc.aio.ServicerContext, method: str, refused: Refused) -> None:
        self._on_refused(method, refused, time.perf_counter())
        await context.abort(refused.code, refused.message)

    def _refusal(self, method: str, refused: Refused) -> grpc.RpcMethodHandler:
        self._on_refused(method, refused, time.perf_counter())

        async def refuse(request_iterator, context: grpc.aio.ServicerContext) -> None:
            await context.abort(refused.code, refused.message)  # the message is never read

        return grpc.stream_unary_rpc_method_handler(refuse)


class _AsyncTracker(tracker_pb2_grpc.TrackerServicer):
    """Every Tracker method: the synchronous one, run on a pool (node methods on their own)."""

    def __init__(self, service, limits: ServerLimits) -> None:
        self._service = service
        self._node_pool = ThreadPoolExecutor(limits.node_workers, thread_name_prefix="tracker-node")
        self._call_pool = ThreadPoolExecutor(limits.call_workers, thread_name_prefix="tracker-call")

    async def _call(self, method: str, request, context: grpc.aio.ServicerContext):
        pool = self._node_pool if method in NODE_METHODS else self._call_pool
        handler = functools.partial(getattr(self._service, method), request, context)
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, handler)
        except Refused as refused:
            await context.abort(refused.code, refused.message)

    def shutdown(self) -> None:
        self._node_pool.shutdown(wait=False, cancel_futures=True)
        self._call_pool.shutdown(wait=False, cancel_futures=True)


def _method(name: str):
    async def call(self: _AsyncTracker, request, context):
        return await self._call(name, request, context)
    call.__name__ = name
    return call


for _name in (*NODE_METHODS, "Coverage", "OpenRoute", "ReportFailure", "CloseRoute", "RenewRoute", "TakeAudit",
              "ReportAudit", "TrackerKey", *OPEN_METHODS):
    setattr(_AsyncTracker, _name, _method(_name))


class TrackerServer:
    """The aio server on its own event-loop thread; started by the constructor."""

    def __init__(self, service, method_roles: Mapping[str, frozenset[str]], listen: str,
                 tls: Optional[tuple[bytes, bytes]], limits: ServerLimits,
                 published: Optional[PublishedModels] = None) -> None:
        # published: models whose pieces the Pieces service serves beside the Tracker (issue 50)
        self._published = published
        self._servicer = _AsyncTracker(service, limits)
        self._service_role = service.role
        self.service = service  # what the tracker's other surfaces read (its HTTP side)
        self._gate = _Gate(method_roles, service.role, service.refused, limits)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="tracker-grpc")
        self._thread.start()
        self._stopped = threading.Event()
        self._stopping = False
        try:
            self.port = asyncio.run_coroutine_threadsafe(self._start(listen, tls, limits), self._loop).result()
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._servicer.shutdown()
            raise

    async def _start(self, listen: str, tls: Optional[tuple[bytes, bytes]], limits: ServerLimits) -> int:
        self._server = grpc.aio.server(interceptors=[self._gate], maximum_concurrent_rpcs=limits.max_calls,
                                       options=[("grpc.max_concurrent_streams", limits.max_streams_per_connection),
                                                ("grpc.server_handshake_timeout_ms", int(limits.handshake_timeout * 1000)),
                                                ("grpc.max_connection_idle_ms", int(limits.connection_idle * 1000))])
        tracker_pb2_grpc.add_TrackerServicer_to_server(self._servicer, self._server)
        if self._published is not None:  # its own token checks and caps (weights/piece_service.py)
            weights_pb2_grpc.add_PiecesServicer_to_server(
                PieceService(self._published, self._service_role, lambda peer: self.front.peer_of(peer)), self._server)
        upstream = tls_material.bind(self._server, f"{UPSTREAM_HOST}:0", tls)
        await self._server.start()
        self.front = ConnectionFront(within_file_limit(limits.connections), upstream, grpc_peer_host)
        self._gate.peer_of = self.front.peer_of
        try:
            return await self.front.start(listen)
        except BaseException:
            await self._server.stop(None)
            raise

    def stop(self, grace: Optional[float] = None) -> threading.Event:
        """Stops serving (calls in progress get `grace` seconds); the event is set once stopped."""
        if not self._stopping:
            self._stopping = True

            async def stop() -> None:
                try:
                    await self.front.stop()
                    await self._server.stop(grace)
                finally:
                    self._servicer.shutdown()
                    self._stopped.set()
                    self._loop.stop()

            asyncio.run_coroutine_threadsafe(stop(), self._loop)
        return self._stopped


FDS_PER_CONNECTION = 3  # the peer's socket and the front's to the server, and the server's end of that
FDS_KEPT = 256  # descriptors left for everything else (the ledger, probes, logs, the HTTP surface)


def within_file_limit(caps: ConnectionCaps) -> ConnectionCaps:
    """`caps`, with max_connections lowered (and a warning) where the soft file limit cannot hold
    them all, so that a full front never takes the descriptors the tracker needs itself."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return caps
    room = max(1, (soft - FDS_KEPT) // FDS_PER_CONNECTION - caps.overflow)
    if room >= caps.max_connections:
        return caps
    log.warning("the file limit (%d) holds %d connections on the tracker's port, not %d: raise the hard limit",
                soft, room, caps.max_connections)
    return dataclasses.replace(caps, max_connections=room)
