"""RouteClient: generation through a tracker-issued chain of shards, with failover.

The client asks the tracker for a route (a signed ticket per hop), opens one Seam stream to the
first hop and a Results stream on the last hop, each over TLS pinned to the hop's registered
certificate, presents the first hop's ticket (the others travel with the frame, one per hop) and
proves with its key that it opened the route when it reads results; it prefills the prompt.
The route's shape is the tracker's alone (docs/adr/0021-the-route-decided-once.md): the first
frame carries the other hops' tickets in route order, and each hop dials what its own ticket
names. When the route reply says the route rings, the client asks for ring decode
(docs/adr/0005-ring-decode.md): the last hop sends each sampled token straight to the first hop
as the next step, so the client is off the per-token path and only reads Results. Otherwise
(a reference hop on the route, or GenerationParams.ring off) it sends one decode step per token
it receives. Either way the last hop decides the end: the client stops at the finish reason it
reports with a token (STOP or LENGTH), which `finish_reason` then holds.
On a hop failure it reports the failing node, takes the new epoch's route and replays prompt +
tokens already delivered as a fresh prefill, so the caller sees every token exactly once.
Blame: the client reports a hop as failed only when it saw that hop fail (its own stream to it
broke, or the hop's status names itself or a hop of the route, i.e. a hop reporting about its
own downstream). A failure it cannot attribute (a token that does not come, the last hop losing
its upstream) is attributed by probing every hop's Health at once: the first hop of the route
that does not answer within `probe_timeout` is blamed; if all answer, nobody is (the tracker
issues a new epoch without banning anyone).
While it waits for tokens it renews the route's lease (a third of the way through each lease);
the tracker being briefly unreachable costs neither tokens nor a clean finish: renewals and the
final CloseRoute are retried or left to the lease, never raised to the caller. A failure report
that finds the tracker unreachable is retried for `route_wait`; one that finds it has forgotten
the route session (restarted with its state in memory) opens a new route session and replays
there, as for any failover.
Thread ownership: a RouteClient is used by one caller thread; two reader threads per
connection only feed its event queue.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Optional, Sequence

import grpc

from meshnet.identity import tickets
from meshnet.process import log
from meshnet.protocol import seam
from meshnet.protocol.shard_client import ShardClient
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.wire import seam as t
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.status import Status, StatusCode

MAX_QUEUED_FRAMES = 8  # frames waiting for the first hop's stream; the client has at most ~3 in flight
INITIAL_CREDITS = 4  # frames the client may send before the first hop's first reply says how many


class MeshnetError(Exception):
    """Generation failed for a reason failover cannot fix; `status` says why."""

    def __init__(self, status: Status) -> None:
        super().__init__(f"{status.code.name}: {status.message}")
        self.status = status


class _HopFailure(Exception):
    """A failure of the route; `node_id` is the hop to blame, or "" when it is not yet known."""

    def __init__(self, node_id: str, status: Status) -> None:
        super().__init__(f"hop {node_id or '?'}: {status.message}")
        self.node_id, self.status = node_id, status


@dataclasses.dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 64  # new tokens, counted across failovers
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0
    top_p: float = 0.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    first_token_timeout: float = 120.0  # seconds to wait for the first token (the prefill)
    token_timeout: float = 10.0  # seconds without a token before the hops are probed (then again as often)
    stall_timeout: float = 60.0  # seconds without a later token, all hops answering, before failing over
    probe_timeout: float = 1.0  # seconds a hop has to answer Health when a failure is attributed
    route_wait: float = 30.0  # seconds to keep asking for a new route while none is available (retryable)
    top_logprobs: int = 0  # alternatives the last hop returns per token (stream() yields them)
    ring: bool = True  # ring decode where every hop supports it; False: the client drives each token
    speculate: int = 0  # ring decode only: the most tokens the first hop drafts per step (prompt lookup; 0 = off)
    grammar: str = ""  # GBNF every sampled token must continue (constrained sampling on the last hop; "" = off)


class _Connection:
    """The streams of one route epoch."""

    def __init__(self, route: tt.RouteReply, tracker: TrackerClient, insecure: bool) -> None:
        self.route = route.session
        self.hops = route.hops
        self.rings = route.ring  # the tracker's word: the last hop's ticket names the first hop
        self.events: queue.Queue = queue.Queue()
        # Flow control: frames sent and not yet answered stay below the first hop's last credits.
        self._credit = threading.Condition()
        self._in_flight, self._credits, self._ended = 0, INITIAL_CREDITS, False
        self.frames_sent = 0  # Seam frames this client wrote (ring decode: prefill and release only)
        first, last = self.hops[0], self.hops[-1]
        for hop in (first, last):
            if hop.ticket is None:
                raise MeshnetError(Status(StatusCode.UNAUTHENTICATED, f"the tracker sent no ticket for {hop.node.node_id}"))
            if not hop.node.tls_certificate and not insecure:
                raise MeshnetError(Status(StatusCode.PERMISSION_DENIED, f"hop {hop.node.node_id} registered no TLS "
                                          "certificate; plaintext needs insecure=True"))
        self._shards = [ShardClient.dial(first.node.address, first.node.tls_certificate.encode() or None)]
        if last is not first:
            self._shards.append(ShardClient.dial(last.node.address, last.node.tls_certificate.encode() or None))
        self._seam = self._shards[0].seam(MAX_QUEUED_FRAMES)
        request = t.ResultsRequest(seam.PROTOCOL_VERSION, self.route, last.ticket,
                                   tickets.results_signature(tracker.identity, last.ticket))
        self._results = self._shards[-1].results(request)
        threading.Thread(target=self._read_seam, daemon=True).start()
        threading.Thread(target=self._read_results, daemon=True).start()

    def _on_route(self, node_id: str) -> str:
        """`node_id` if it is a hop of this route, else "" (unattributed)."""
        return node_id if any(h.node.node_id == node_id for h in self.hops) else ""

    def _read_seam(self) -> None:
        first = self.hops[0].node.node_id
        try:
            for native in self._seam:
                with self._credit:
                    self._in_flight = max(0, self._in_flight - 1)
                    if native.credits:
                        self._credits = min(native.credits, MAX_QUEUED_FRAMES)
                    self._credit.notify_all()
                if native.status is not None and not native.status.ok:
                    # A hop names itself, or its downstream (relayed upstream to us): take it if on the route.
                    blamed = self._on_route(native.status.hop) if native.status.hop else first
                    self.events.put(_HopFailure(blamed, native.status))
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                self.events.put(_HopFailure(first, Status(StatusCode.UNAVAILABLE, f"first hop lost: {err.code().name}", True)))
        finally:
            with self._credit:
                self._ended = True  # nothing more will be answered: senders stop waiting
                self._credit.notify_all()

    def _read_results(self) -> None:
        last = self.hops[-1].node.node_id
        try:
            for native in self._results:
                if native.status is not None and not native.status.ok and native.status.code != StatusCode.CANCELLED:
                    # The last hop failing itself is observed; its upstream being lost says nothing
                    # about which hop failed upstream: leave that to the Health probe.
                    blamed = last if native.status.hop in ("", last) and native.status.code not in (
                        StatusCode.UNAVAILABLE, StatusCode.DEADLINE_EXCEEDED) else ""
                    self.events.put(_HopFailure(blamed, native.status))
                    return
                self.events.put(native)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                self.events.put(_HopFailure(last, Status(StatusCode.UNAVAILABLE, f"last hop lost: {err.code().name}", True)))

    def send(self, frame: t.SeamFrame, timeout: float = 5.0) -> None:
        """Sends a frame to the first hop once it has credit for it; a first hop that grants no
        credit or takes no frame for `timeout` fails."""
        with self._credit:
            if not self._credit.wait_for(lambda: self._ended or self._in_flight < self._credits, timeout):
                raise _HopFailure(self.hops[0].node.node_id, Status(
                    StatusCode.UNAVAILABLE, f"the first hop granted no credit for {timeout:g}s", True))
            self._in_flight += 1
            self.frames_sent += 1
        try:
            self._seam.send(frame, timeout=timeout)
        except queue.Full:
            raise _HopFailure(self.hops[0].node.node_id, Status(
                StatusCode.UNAVAILABLE, f"the first hop took no frame for {timeout:g}s", True)) from None

    def attribute(self, failure: "_HopFailure", timeout: float) -> "_HopFailure":
        """The failure with a hop to blame: the first hop of the route that does not answer
        Health within `timeout` (all are asked at once), or "" if every hop answers."""
        def answers(hop: tt.Hop) -> bool:
            shard = ShardClient.dial(hop.node.address, hop.node.tls_certificate.encode() or None)
            try:
                shard.ping(timeout=timeout)
                return True
            except grpc.RpcError:
                return False
            finally:
                shard.close()

        with ThreadPoolExecutor(max_workers=len(self.hops)) as pool:
            alive = list(pool.map(answers, self.hops))
        for hop, ok in zip(self.hops, alive):
            if not ok:
                return _HopFailure(hop.node.node_id, Status(
                    failure.status.code, f"{failure.status.message}; hop {hop.node.node_id} did not answer Health "
                                         f"within {timeout:g}s", failure.status.retryable, hop.node.node_id))
        return failure

    def close(self) -> None:
        try:
            self._seam.end(timeout=1.0)
        except queue.Full:
            self._seam.cancel()  # the stream is stuck: end it
        self._results.cancel()
        for shard in self._shards:
            shard.close()


class RouteClient:
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
        self.frames_sent = 0  # Seam frames written to first hops, all epochs (ring decode: 2 per epoch)
        # What the last hop reported with the final token (STOP or LENGTH); None until then, or
        # when the generation ended otherwise (cancelled, failed, the caller stopped reading).
        self.finish_reason: Optional[t.FinishReason] = None
        self._lease_seconds = 0.0  # the current route's lease (0: none given)
        self._renew_at = float("inf")  # monotonic time of the next lease renewal

    def cancel(self) -> None:
        """Abandons the generation: a CANCEL travels the chain and every hop frees the KV."""
        self._cancelled.set()
        conn = self._connection
        if conn is not None:
            try:
                conn.send(t.SeamFrame(seam.PROTOCOL_VERSION, conn.route, t.Phase.CANCEL, 1 << 62), timeout=1.0)
            except _HopFailure:
                pass  # the first hop takes no frames: the generation ends on the cancelled flag anyway

    def generate(self, prompt_ids: Sequence[int], params: GenerationParams = GenerationParams()) -> Iterator[int]:
        """Yields new token ids as they arrive (each exactly once, across failovers)."""
        with contextlib.closing(self.stream(prompt_ids, params)) as tokens:
            for token in tokens:
                yield token.token_id

    def stream(self, prompt_ids: Sequence[int], params: GenerationParams = GenerationParams()) -> Iterator[t.SampledToken]:
        """As generate(), with each token's log-probability and its top alternatives."""
        if not prompt_ids:
            raise ValueError("empty prompt")
        started = time.perf_counter()
        self.finish_reason = None
        delivered: list[int] = []
        request = tt.OpenRouteRequest(self._model, self._client_id, len(prompt_ids) + params.max_tokens)
        reply = self._open_route(request, params.route_wait)
        while True:
            if not reply.status.ok and reply.status.retryable and reply.session is not None and reply.session.epoch > 1:
                reply = self._await_route(reply, params.route_wait)  # a failover found no route yet
            if reply.status.code == StatusCode.NOT_FOUND and reply.session is not None:
                # The tracker no longer knows the route session (it restarted with its state in
                # memory, or the lease lapsed): a new one, replayed from token zero like any failover.
                # The hops that failed it are avoided (the new tracker banned none of them).
                log("route_session_lost", session=reply.session.session_id, message=reply.status.message)
                avoid = tuple(dict.fromkeys(NodeId(node) for _, node in self.failovers if node))
                reply = self._open_route(dataclasses.replace(request, avoid_node_ids=avoid), params.route_wait)
            if not reply.status.ok:
                raise MeshnetError(reply.status)
            self._lease_seconds = reply.lease_ms / 1000
            self._renew_at = time.monotonic() + self._lease_seconds / 3 if reply.lease_ms else float("inf")
            conn = self._connection = _Connection(reply, self._tracker, self._insecure)
            try:
                for token in self._run(conn, list(prompt_ids) + delivered, params, params.max_tokens - len(delivered),
                                       tuple(delivered)):
                    if self.ttft is None:
                        self.ttft = time.perf_counter() - started
                    delivered.append(token.token_id)
                    yield token
                self._finish(conn, tt.Delivery(len(prompt_ids), len(delivered)))
                return
            except GeneratorExit:  # the caller stopped iterating: release the route everywhere
                self._finish(conn, tt.Delivery(len(prompt_ids), len(delivered)))
                raise
            except _HopFailure as failure:
                conn.close()
                if self._cancelled.is_set():
                    self._close_route(conn.route, tt.Delivery(len(prompt_ids), len(delivered)))
                    return
                if self.finish_reason is not None or len(delivered) >= params.max_tokens:
                    # A failure after the last token (the RELEASE found no credit): nothing to replay.
                    self.finish_reason = self.finish_reason or t.FinishReason.LENGTH
                    self._close_route(conn.route, tt.Delivery(len(prompt_ids), len(delivered)))
                    return
                if failure.status.code in (StatusCode.RESOURCE_EXHAUSTED, StatusCode.INVALID_ARGUMENT,
                                           StatusCode.VERSION_MISMATCH, StatusCode.FINGERPRINT_MISMATCH):
                    self._close_route(conn.route, tt.Delivery(len(prompt_ids), len(delivered)))
                    raise MeshnetError(failure.status) from None
                log("hop_failed", session=conn.route.session_id, epoch=conn.route.epoch, node=failure.node_id,
                    status=failure.status.code.name, message=failure.status.message)
                if len(self.failovers) >= self._max_failovers:
                    raise MeshnetError(failure.status) from None
                reply = self._report_failure(conn.route, NodeId(failure.node_id), failure.status, params.route_wait)
                self.failovers.append((reply.session.epoch if reply.session else 0, failure.node_id))
            finally:
                self.frames_sent += conn.frames_sent
                self._connection = None

    def _run(self, conn: _Connection, ids: list[int], params: GenerationParams,
             budget: int, delivered: tuple[int, ...]) -> Iterator[t.SampledToken]:
        ring = params.ring and conn.rings
        # The last hop counts the tokens and knows the stop tokens: it decides the end.
        # A grammar is fed the tokens delivered before a failover, so that it goes on where it was.
        sampling = t.SamplingParams(params.temperature, params.top_k, params.top_p, params.seed,
                                    budget, tuple(params.stop_token_ids), params.top_logprobs,
                                    params.grammar, delivered if params.grammar else ())
        # The other hops' tickets in route order (each hop dials the node its own ticket names);
        # in the ring, last the first hop's, with which the last hop binds the ring.
        later = conn.hops[1:] + (conn.hops[:1] if ring else ())
        downstream = tuple(t.DownstreamHop("", "", None, h.ticket) for h in later)
        step = itertools.count(1)
        position = len(ids)
        conn.send(t.SeamFrame(seam.PROTOCOL_VERSION, conn.route, t.Phase.PREFILL, next(step),
                              span=t.TokenSpan(0, len(ids)), token_ids=tuple(ids), sampling=sampling,
                              downstream=downstream, ticket=conn.hops[0].ticket, ring=ring,
                              draft_max=params.speculate if ring else 0))
        for produced in range(budget):
            event = self._next_event(conn, params.first_token_timeout if produced == 0 else params.stall_timeout,
                                     params.token_timeout, params.probe_timeout)
            sampled = event.tokens[0]
            if event.finish_reason in (t.FinishReason.STOP, t.FinishReason.LENGTH):
                self.finish_reason = event.finish_reason  # set before the last token is yielded
            yield sampled
            if self.finish_reason is not None:
                return
            if produced + 1 == budget:
                break  # all the client asked for: no step past it
            if ring:
                continue  # the last hop sent this token on to the first hop itself
            conn.send(t.SeamFrame(seam.PROTOCOL_VERSION, conn.route, t.Phase.DECODE, next(step),
                                  span=t.TokenSpan(position, 1), token_ids=(sampled.token_id,)))
            position += 1
        # Only a 1.0 last hop, which reported LENGTH in the ring alone, gets here: the budget the
        # client asked for bounds what it reads either way.
        log("finish_unreported", session=conn.route.session_id, tokens=budget)
        self.finish_reason = t.FinishReason.LENGTH

    def _next_event(self, conn: _Connection, timeout: float, probe_every: float,
                    probe_timeout: float) -> t.ResultFrame:
        """The next token frame. While waiting longer than `probe_every` (a long prefill, a loaded
        route), the hops' Health is probed every `probe_every` seconds: a hop that does not
        answer fails the route at once; at `timeout` the route fails, blamed on a silent hop if
        there is one, else on no one."""
        deadline = time.monotonic() + timeout
        next_probe = time.monotonic() + probe_every
        while True:
            if self._cancelled.is_set():
                raise _HopFailure("", Status(StatusCode.CANCELLED, "cancelled by the caller"))
            if time.monotonic() >= self._renew_at:
                self._renew(conn.route)
            try:
                event = conn.events.get(timeout=0.25)
            except queue.Empty:
                now = time.monotonic()
                if now < next_probe and now < deadline:
                    continue
                stalled = _HopFailure("", Status(StatusCode.DEADLINE_EXCEEDED,
                                                 f"no token for {probe_every if now < deadline else timeout:g}s", True))
                failure = conn.attribute(stalled, probe_timeout)
                if failure.node_id or time.monotonic() >= deadline:
                    raise failure from None
                next_probe = time.monotonic() + probe_every
                continue
            if isinstance(event, _HopFailure):
                raise event if event.node_id else conn.attribute(event, probe_timeout)
            if event.tokens:
                return event

    def _finish(self, conn: _Connection, delivery: tt.Delivery) -> None:
        conn.send(t.SeamFrame(seam.PROTOCOL_VERSION, conn.route, t.Phase.RELEASE, 1 << 62))
        conn.close()  # the release is queued ahead of the stream's end
        self._close_route(conn.route, delivery)

    def _open_route(self, request: tt.OpenRouteRequest, wait: float) -> tt.RouteReply:
        """OpenRoute, riding out a tracker that cannot be reached for up to `wait` seconds (a
        restart: the channel refuses calls while it waits to reconnect). UNAVAILABLE is what a
        call that could not be sent gets; should one have reached a tracker that then died, the
        route it opened is freed when its lease lapses."""
        deadline = time.monotonic() + wait
        while True:
            try:
                return self._tracker.open_route(request)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                log("tracker_unavailable", call="OpenRoute", error=err.details())
                time.sleep(0.2)

    def _await_route(self, reply: tt.RouteReply, wait: float) -> tt.RouteReply:
        """While no route is available (retryable: replicas banned, restarting or at capacity),
        asks again with backoff for up to `wait` seconds; each ask is a new epoch, blaming no one."""
        deadline, pause = time.monotonic() + wait, 0.25
        while not reply.status.ok and reply.status.retryable and reply.session is not None:
            if self._cancelled.is_set() or time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
            pause = min(2.0, pause * 2)
            log("route_retry", session=reply.session.session_id, epoch=reply.session.epoch,
                status=reply.status.code.name, message=reply.status.message)
            reply = self._report_failure(reply.session, NodeId(""), reply.status, wait)
        return reply

    def _report_failure(self, route: t.RouteSession, node: NodeId, status: Status, wait: float) -> tt.RouteReply:
        """ReportFailure, riding out a tracker that cannot be reached for up to `wait` seconds (a
        restart, as in _open_route). A tracker that no longer knows the session answers
        NOT_FOUND, with the session it was asked about: stream() then opens a new route."""
        deadline = time.monotonic() + wait
        while True:
            try:
                reply = self._tracker.report_failure(route, node, status)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                log("tracker_unavailable", call="ReportFailure", error=err.details())
                time.sleep(0.2)
                continue
            if reply.status.code == StatusCode.NOT_FOUND and reply.session is None:
                reply = dataclasses.replace(reply, session=route)
            return reply

    def _renew(self, route: t.RouteSession) -> None:
        """Renews the route's lease; if the tracker cannot be reached, tries again in a second,
        and if it refused (no hop has reported work yet: a long prefill), a sixth of a lease later
        (the hops keep serving meanwhile: their tickets, not the lease, admit the frames)."""
        retry = 1.0
        try:
            reply = self._tracker.renew_route(route)
            ok = reply.status.ok
            detail = f"{reply.status.code.name}: {reply.status.message}"
            retry = self._lease_seconds / 6
        except grpc.RpcError as err:
            ok, detail = False, f"{err.code().name}: {err.details()}"
        if ok:
            self._renew_at = time.monotonic() + self._lease_seconds / 3
        else:
            log("route_renewal_failed", session=route.session_id, epoch=route.epoch, error=detail)
            self._renew_at = time.monotonic() + retry

    def _close_route(self, route: t.RouteSession, delivery: tt.Delivery) -> None:
        """Tells the tracker the route is done and what it delivered (the hops' credit is capped
        by it); if it cannot be told, the route's lease ends it."""
        try:
            self._tracker.close_route(route, delivery)
        except grpc.RpcError as err:
            log("route_close_failed", session=route.session_id, epoch=route.epoch, error=err.code().name)
