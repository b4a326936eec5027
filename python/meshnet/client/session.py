"""RouteSession: generation through a tracker-issued chain of shards, with failover.

The client asks the tracker for a route (a signed ticket per hop), opens one Seam stream to the
first hop and a Results stream on the last hop, each over TLS pinned to the hop's registered
certificate, presents the first hop's ticket (the others travel with the frame, one per hop) and
proves with its key that it opened the route when it reads results; it prefills the prompt,
then sends one decode step per token it receives.
On a hop failure it reports the failing node, takes the new epoch's route and replays prompt +
tokens already delivered as a fresh prefill, so the caller sees every token exactly once.
While it waits for tokens it renews the route's lease (a third of the way through each lease);
the tracker being briefly unreachable costs neither tokens nor a clean finish: renewals and the
final CloseRoute are retried or left to the lease, never raised to the caller.
Thread ownership: a RouteSession is used by one caller thread; two reader threads per
connection only feed its event queue.
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
import time
from typing import Iterator, Optional, Sequence

import grpc

from meshnet.identity import tickets
from meshnet.process import log
from meshnet.identity.tls import pinned_channel
from meshnet.protocol import seam
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.shard.v1 import shard_pb2_grpc
from meshnet.types import seam as t
from meshnet.types import tracker as tt
from meshnet.types.ids import NodeId
from meshnet.types.status import Status, StatusCode

_CLOSE = object()


class MeshnetError(Exception):
    """Generation failed for a reason failover cannot fix; `status` says why."""

    def __init__(self, status: Status) -> None:
        super().__init__(f"{status.code.name}: {status.message}")
        self.status = status


class _HopFailure(Exception):
    def __init__(self, node_id: str, status: Status) -> None:
        super().__init__(f"hop {node_id}: {status.message}")
        self.node_id, self.status = node_id, status


@dataclasses.dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 64  # new tokens, counted across failovers
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0
    top_p: float = 0.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    token_timeout: float = 60.0  # seconds to wait for one token before blaming the route


class _Connection:
    """The streams of one route epoch."""

    def __init__(self, route: tt.RouteReply, tracker: TrackerClient, insecure: bool) -> None:
        self.route = route.session
        self.hops = route.hops
        self.events: queue.Queue = queue.Queue()
        self._frames: queue.Queue = queue.Queue()
        first, last = self.hops[0], self.hops[-1]
        for hop in (first, last):
            if hop.ticket is None:
                raise MeshnetError(Status(StatusCode.UNAUTHENTICATED, f"the tracker sent no ticket for {hop.node.node_id}"))
            if not hop.node.tls_certificate and not insecure:
                raise MeshnetError(Status(StatusCode.PERMISSION_DENIED, f"hop {hop.node.node_id} registered no TLS "
                                          "certificate; plaintext needs insecure=True"))
        self._channels = [pinned_channel(first.node.address, first.node.tls_certificate.encode() or None)]
        if last is not first:
            self._channels.append(pinned_channel(last.node.address, last.node.tls_certificate.encode() or None))
        self._seam = shard_pb2_grpc.ShardStub(self._channels[0]).Seam(iter(self._frames.get, _CLOSE))
        request = t.ResultsRequest(seam.PROTOCOL_VERSION, self.route, last.ticket,
                                   tickets.results_signature(tracker.identity, last.ticket))
        self._results = shard_pb2_grpc.ShardStub(self._channels[-1]).Results(seam.to_proto(request))
        threading.Thread(target=self._read_seam, daemon=True).start()
        threading.Thread(target=self._read_results, daemon=True).start()

    def _read_seam(self) -> None:
        first = self.hops[0].node.node_id
        try:
            for reply in self._seam:
                native = seam.from_proto(reply)
                if native.status is not None and not native.status.ok:
                    self.events.put(_HopFailure(native.status.hop or first, native.status))
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                self.events.put(_HopFailure(first, Status(StatusCode.UNAVAILABLE, f"first hop lost: {err.code().name}", True)))

    def _read_results(self) -> None:
        last = self.hops[-1].node.node_id
        try:
            for frame in self._results:
                native = seam.from_proto(frame)
                if native.status is not None and not native.status.ok and native.status.code != StatusCode.CANCELLED:
                    # The last hop lost its upstream: blame the hop before it.
                    blamed = self.hops[-2].node.node_id if len(self.hops) > 1 else last
                    self.events.put(_HopFailure(blamed, native.status))
                    return
                self.events.put(native)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                self.events.put(_HopFailure(last, Status(StatusCode.UNAVAILABLE, f"last hop lost: {err.code().name}", True)))

    def send(self, frame: t.SeamFrame) -> None:
        self._frames.put(seam.to_proto(frame))

    def close(self) -> None:
        self._frames.put(_CLOSE)
        self._results.cancel()
        for channel in self._channels:
            channel.close()


class RouteSession:
    def __init__(self, tracker: TrackerClient, model: str, *, client_id: str = "meshnet-client",
                 max_failovers: int = 3, insecure: bool = False) -> None:
        """`insecure` allows hops without a TLS certificate (plaintext; loopback development)."""
        self._tracker = tracker
        self._insecure = insecure
        self._model = model
        self._client_id = client_id
        self._max_failovers = max_failovers
        self._connection: Optional[_Connection] = None
        self._cancelled = threading.Event()
        self.failovers: list[tuple[int, str]] = []  # (new epoch, failed node) per failover
        self.ttft: Optional[float] = None  # seconds from generate() to the first token
        self._lease_seconds = 0.0  # the current route's lease (0: none given)
        self._renew_at = float("inf")  # monotonic time of the next lease renewal

    def cancel(self) -> None:
        """Abandons the generation: a CANCEL travels the chain and every hop frees the KV."""
        self._cancelled.set()
        conn = self._connection
        if conn is not None:
            conn.send(t.SeamFrame(seam.PROTOCOL_VERSION, conn.route, t.Phase.CANCEL, 1 << 62))

    def generate(self, prompt_ids: Sequence[int], params: GenerationParams = GenerationParams()) -> Iterator[int]:
        """Yields new token ids as they arrive (each exactly once, across failovers)."""
        if not prompt_ids:
            raise ValueError("empty prompt")
        started = time.perf_counter()
        delivered: list[int] = []
        reply = self._tracker.open_route(tt.OpenRouteRequest(self._model, self._client_id,
                                                             len(prompt_ids) + params.max_tokens))
        while True:
            if not reply.status.ok:
                raise MeshnetError(reply.status)
            self._lease_seconds = reply.lease_ms / 1000
            self._renew_at = time.monotonic() + self._lease_seconds / 3 if reply.lease_ms else float("inf")
            conn = self._connection = _Connection(reply, self._tracker, self._insecure)
            try:
                for token in self._run(conn, list(prompt_ids) + delivered, params, params.max_tokens - len(delivered)):
                    if self.ttft is None:
                        self.ttft = time.perf_counter() - started
                    delivered.append(token)
                    yield token
                self._finish(conn)
                return
            except GeneratorExit:  # the caller stopped iterating: release the route everywhere
                self._finish(conn)
                raise
            except _HopFailure as failure:
                conn.close()
                if self._cancelled.is_set():
                    self._close_route(conn.route)
                    return
                if failure.status.code in (StatusCode.RESOURCE_EXHAUSTED, StatusCode.INVALID_ARGUMENT,
                                           StatusCode.VERSION_MISMATCH, StatusCode.FINGERPRINT_MISMATCH):
                    self._close_route(conn.route)
                    raise MeshnetError(failure.status) from None
                if len(self.failovers) >= self._max_failovers:
                    raise MeshnetError(failure.status) from None
                reply = self._tracker.report_failure(conn.route, NodeId(failure.node_id), failure.status)
                self.failovers.append((reply.session.epoch if reply.session else 0, failure.node_id))
            finally:
                self._connection = None

    def _run(self, conn: _Connection, ids: list[int], params: GenerationParams, budget: int) -> Iterator[int]:
        sampling = t.SamplingParams(params.temperature, params.top_k, params.top_p, params.seed, 0,
                                    tuple(params.stop_token_ids))
        downstream = tuple(t.DownstreamHop(h.node.node_id, h.node.address,
                                           t.ShardRange(h.node.layers.start, h.node.layers.end, h.layers.start),
                                           h.ticket)
                           for h in conn.hops[1:])
        first = conn.hops[0]
        step = itertools.count(1)
        position = len(ids)
        conn.send(t.SeamFrame(seam.PROTOCOL_VERSION, conn.route, t.Phase.PREFILL, next(step),
                              range=t.ShardRange(first.node.layers.start, first.node.layers.end, first.layers.start),
                              span=t.TokenSpan(0, len(ids)), token_ids=tuple(ids), expected_cache=t.CacheState(0),
                              sampling=sampling, downstream=downstream, ticket=first.ticket))
        for produced in range(budget):
            event = self._next_event(conn, params.token_timeout)
            token = event.tokens[0].token_id
            yield token
            if event.finish_reason == t.FinishReason.STOP or token in params.stop_token_ids or produced + 1 == budget:
                return
            conn.send(t.SeamFrame(seam.PROTOCOL_VERSION, conn.route, t.Phase.DECODE, next(step),
                                  span=t.TokenSpan(position, 1), token_ids=(token,),
                                  expected_cache=t.CacheState(position)))
            position += 1

    def _next_event(self, conn: _Connection, timeout: float) -> t.ResultFrame:
        while True:
            if self._cancelled.is_set():
                raise _HopFailure("", Status(StatusCode.CANCELLED, "cancelled by the caller"))
            if time.monotonic() >= self._renew_at:
                self._renew(conn.route)
            try:
                event = conn.events.get(timeout=min(timeout, 0.5))
            except queue.Empty:
                timeout -= 0.5
                if timeout <= 0:
                    raise _HopFailure(conn.hops[-1].node.node_id,
                                      Status(StatusCode.DEADLINE_EXCEEDED, "no token in time", True)) from None
                continue
            if isinstance(event, _HopFailure):
                raise event
            if event.tokens:
                return event

    def _finish(self, conn: _Connection) -> None:
        conn.send(t.SeamFrame(seam.PROTOCOL_VERSION, conn.route, t.Phase.RELEASE, 1 << 62))
        conn.close()  # the release is queued ahead of the stream's end
        self._close_route(conn.route)

    def _renew(self, route: t.RouteSession) -> None:
        """Renews the route's lease; if the tracker cannot be reached, tries again in a second
        (the hops keep serving meanwhile: their tickets, not the lease, admit the frames)."""
        try:
            reply = self._tracker.renew_route(route)
            ok = reply.status.ok
            detail = reply.status.message
        except grpc.RpcError as err:
            ok, detail = False, f"{err.code().name}: {err.details()}"
        if ok:
            self._renew_at = time.monotonic() + self._lease_seconds / 3
        else:
            log("route_renewal_failed", session=route.session_id, epoch=route.epoch, error=detail)
            self._renew_at = time.monotonic() + 1.0

    def _close_route(self, route: t.RouteSession) -> None:
        """Tells the tracker the route is done; if it cannot be told, the route's lease ends it."""
        try:
            self._tracker.close_route(route)
        except grpc.RpcError as err:
            log("route_close_failed", session=route.session_id, epoch=route.epoch, error=err.code().name)
