"""The reference shard's gRPC service (meshnet.shard.v1.Shard), following the C++ worker.

ShardServer is a native ShardHandler (meshnet.protocol.shard_service converts at the edge).

One Seam stream per upstream peer (the client, or the previous hop): a reader thread decodes
frames, admits them (ADR 0003: route ticket, epoch fence, stream binding; see sessions.py), runs
steps on the engine, forwards activations over one pinned channel per route session to the one
downstream hop its ticket names, and answers upstream through an outgoing queue. The last hop
samples and queues tokens for the session's Results stream, which only the route's client may
read. `serve` / `serve_shard` build the bounded gRPC server around it.
Invariants: a refused frame creates no state; a repeated step is answered from the record, not
recomputed; when a session is released, cancelled, fenced, idle or its upstream stream is lost,
its KV is freed here and the release travels on.
Size: over 400 lines, because it mirrors one C++ class (cpp/worker/service.*) method for method so
the two hop implementations can be read side by side; admission is in sessions.py, the engine in
model.py.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from concurrent import futures
from typing import Iterator, Optional

import grpc
import numpy as np
import torch

from meshnet.identity import tickets
from meshnet.identity.requests import is_supervisor
from meshnet.identity.tls import MAX_MESSAGE_BYTES, bind
from meshnet.protocol import bundle, diag, seam, shard_service, tensors
from meshnet.protocol.errors import ProtocolError, exhausted, invalid
from meshnet.protocol.shard_client import ShardClient
from meshnet.reference.model import ReferenceEngine
from meshnet.reference.sampling import Sampler
from meshnet.reference.sessions import Options, Refusal, ResultsTable, Session, SessionTable, next_hop
from meshnet.wire import seam as t
from meshnet.wire import tracker as tt
from meshnet.wire.status import Status, StatusCode

CREDITS = 8
HIDDEN = "hidden_states"
KEEPALIVE_MS = 2000  # ping a quiet connection this often; close it if the ping is unanswered as long
ZLIB_FEATURE = "compression.zlib"
_CLOSE = object()  # ends a results queue or a stream's replies
_GRPC_CODES = {StatusCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
               StatusCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
               StatusCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
               StatusCode.VERSION_MISMATCH: grpc.StatusCode.INVALID_ARGUMENT}
_REFUSALS = {Refusal.HAS_READER: grpc.StatusCode.ALREADY_EXISTS, Refusal.FULL: grpc.StatusCode.RESOURCE_EXHAUSTED}


class _Stream:
    """One upstream Seam stream; sessions are bound to this object. `verified` once any frame
    on it carried a valid ticket (a stream without one is ended after the auth grace)."""

    def __init__(self) -> None:
        self.replies: queue.Queue = queue.Queue()
        self.verified = threading.Event()


class _Downstream:
    """One Seam stream to the next hop for one session; errors are reported through `on_error`."""

    def __init__(self, hop: t.DownstreamHop, certificate: Optional[bytes], on_error) -> None:
        self.hop = hop
        self._shard = ShardClient.dial(hop.address, certificate)
        self._stream = self._shard.seam(max_queued=256)
        self._on_error = on_error
        self._closed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for native in self._stream:
                if native.status is not None and not native.status.ok:
                    status = native.status
                    self._on_error(dataclasses.replace(status, hop=status.hop or self.hop.node_id))
        except grpc.RpcError as err:
            if not self._closed.is_set():
                self._on_error(Status(StatusCode.UNAVAILABLE, f"next hop {self.hop.node_id} lost: {err.code().name}",
                                      True, self.hop.node_id))

    def send(self, frame: t.SeamFrame) -> None:
        """Sends `frame` with the next hop's own ticket (it admits the session there)."""
        self._stream.send(dataclasses.replace(frame, ticket=self.hop.ticket), timeout=30)

    def close(self) -> None:
        self._closed.set()
        try:
            self._stream.end(timeout=0)
        except queue.Full:
            pass  # a next hop that takes nothing: closing the channel below cancels the stream
        self._shard.close()


@dataclasses.dataclass
class _Live:
    """A session's transport and sampling state (its stream's reader thread, then _finish)."""

    downstream: Optional[_Downstream] = None
    sampler: Optional[Sampler] = None
    generated: int = 0  # tokens sampled in this session (the last hop ends it at max_tokens)
    reassembler: Optional[bundle.Reassembler] = None


class ShardServer:
    """A shard_service.ShardHandler; mounted by `serve`."""

    def __init__(self, engine: ReferenceEngine, node_id: str, idle_seconds: float = 300.0, *,
                 tracker_key: bytes, layers: Optional[tuple[int, int]] = None,
                 compression: bool = False, auth_grace_seconds: float = 10.0, insecure: bool = False,
                 max_fences: int = 4096, results_grace_seconds: float = 10.0, supervisor_token: str = "") -> None:
        self.engine = engine
        self.node_id = node_id
        self.compression = compression  # zlib bundles are accepted (and advertised) only when True
        self.supervisor_token = supervisor_token  # TakeWork needs it ("" refuses every caller)
        self.auth_grace_seconds = auth_grace_seconds  # a Seam stream without a valid ticket by then ends
        self.layers = layers if layers is not None else (engine.shard.start, engine.shard.end)
        self.n_embd = engine.shard.config.hidden_size
        self.table = SessionTable(Options(tracker_key, node_id, self.layers, engine.max_sessions, idle_seconds,
                                          max_fences, engine.shard.last, insecure))
        self.results = ResultsTable(4 * engine.max_sessions, results_grace_seconds)
        self._lock = threading.Lock()
        self._seam_in = [0, 0]  # SeamFrames received, their serialized bytes (Health)
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self) -> None:
        """Frees sessions whose client vanished without release or stream loss (deadline), and
        drops expired fences and unread result queues."""
        idle_seconds = self.table.options.idle_seconds
        while True:
            time.sleep(min(1.0, idle_seconds / 4))
            for key in self.table.idle():
                session = self.table.remove(key)
                if session is not None:
                    self._finish(session, t.FinishReason.ERROR,
                                 Status(StatusCode.DEADLINE_EXCEEDED, f"session idle for over {idle_seconds:g}s"))
            self.table.prune()
            self.results.reap()

    def session_records(self) -> int:
        """Sessions this server tracks (any thread); each holds a slot until it ends."""
        return self.table.count()

    # ---- unary ------------------------------------------------------------------------------

    def hello(self, request: t.HelloRequest, context) -> t.HelloReply:
        features = [f for f in seam.FEATURES if self.compression or f != ZLIB_FEATURE]
        return seam.negotiate(request, self.node_id, features)

    def take_work(self, context) -> tuple[tt.WorkEntry, ...]:
        """Returns and resets the tokens processed per session (the node reports them); only for
        the node's supervisor, which proves itself with the token it gave this server."""
        if not is_supervisor(context.invocation_metadata() or (), self.supervisor_token):
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "TakeWork answers only this node's supervisor")
        return tuple(tt.WorkEntry(t.RouteSession(sid, epoch), prefill, decode)
                     for (sid, epoch), (prefill, decode) in sorted(self.table.take_work().items()))

    def health(self, context) -> t.Health:
        sessions, tokens = self.engine.stats()
        with self._lock:
            frames, size = self._seam_in
        return t.Health(status=Status(StatusCode.OK), active_sessions=sessions, kv_cells_used=tokens,
                        kv_cells_total=self.engine.max_kv_tokens, seam_frames_in=frames, seam_bytes_in=size,
                        fence_entries=self.table.fence_count(), results_readers=self.results.readers())

    # ---- results ----------------------------------------------------------------------------

    def results_stream(self, req: t.ResultsRequest, context) -> Iterator[t.ResultFrame]:
        """The session's tokens, for the client that opened the route (ADR 0003, rule 6)."""
        try:
            seam.check_version(req.version)
            if req.session is None or tickets.session_id_too_long(req.session.session_id):
                raise invalid("results request without a valid route session")
            body = tickets.admitting_body(req.ticket, self.table.options.tracker_key, req.session, self.node_id,
                                          self.layers)
            tickets.check_results_signature(body, req.ticket, req.client_signature)
        except (ProtocolError, tickets.TicketError) as err:
            context.abort(_GRPC_CODES.get(err.status.code, grpc.StatusCode.INVALID_ARGUMENT), err.status.message)
        key = (req.session.session_id, req.session.epoch)
        items, refusal = self.results.attach(key)
        if refusal is not None:
            context.abort(_REFUSALS[refusal], refusal.value)
        closed = False
        try:
            while context.is_active():
                try:
                    item = items.get(timeout=0.5)
                except queue.Empty:
                    continue
                if item is _CLOSE:
                    closed = True
                    return
                yield item
        finally:
            self.results.detach(key, items)
            session = None if closed else self.table.remove(key)
            if session is not None:  # the client stopped reading (failover, disconnect): nowhere to send tokens
                self._finish(session, t.FinishReason.CANCELLED, Status(StatusCode.CANCELLED,
                                                                       "the client stopped reading results"))

    # ---- seam -------------------------------------------------------------------------------

    def seam_stream(self, frames: Iterator[shard_service.ReceivedFrame], context) -> Iterator[t.SeamReply]:
        stream = _Stream()
        threading.Thread(target=self._read_upstream, args=(frames, stream), daemon=True).start()
        deadline = time.monotonic() + self.auth_grace_seconds
        while True:
            wait = None if stream.verified.is_set() else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                context.abort(grpc.StatusCode.UNAUTHENTICATED,
                              f"no valid route ticket within {self.auth_grace_seconds:g}s")
            try:
                item = stream.replies.get(timeout=wait)
            except queue.Empty:
                continue
            if item is _CLOSE:
                return
            yield item

    def _read_upstream(self, frames: Iterator[shard_service.ReceivedFrame], stream: _Stream) -> None:
        try:
            for received in frames:
                with self._lock:
                    self._seam_in[0] += 1
                    self._seam_in[1] += received.size
                reply = self._handle(received, stream)
                if reply is not None:
                    stream.replies.put(reply)
        except grpc.RpcError:
            pass  # the upstream peer is gone
        finally:
            for session in self.table.drop_stream(stream):  # stream loss frees every session bound to it
                self._finish(session, t.FinishReason.ERROR,
                             Status(StatusCode.UNAVAILABLE, f"upstream of {self.node_id} lost", True))
            stream.replies.put(_CLOSE)

    def _handle(self, received: shard_service.ReceivedFrame, stream: _Stream) -> Optional[t.SeamReply]:
        arrived = time.monotonic()
        try:
            frame = received.decode()
            seam.check_version(frame.version)
        except ProtocolError as err:
            return t.SeamReply(seam.PROTOCOL_VERSION, None, 0, 0, None, self._with_hop(err.status))
        if frame.session is None:
            return self._reply(frame, Status(StatusCode.INVALID_ARGUMENT, "frame without a route session"))
        if tickets.session_id_too_long(frame.session.session_id):
            return self._reply(frame, Status(StatusCode.INVALID_ARGUMENT,
                                             f"session id longer than {tickets.MAX_SESSION_ID_BYTES} bytes"))
        if frame.phase not in (t.Phase.PREFILL, t.Phase.DECODE, t.Phase.RELEASE, t.Phase.CANCEL):
            return self._reply(frame, Status(StatusCode.INVALID_ARGUMENT, f"unknown phase {frame.phase}"))
        opens = frame.phase in (t.Phase.PREFILL, t.Phase.DECODE)
        admission = self.table.admit(frame.session, frame.ticket, stream, opens, frame.downstream, _Live)
        if admission.verified:
            stream.verified.set()
        for old in admission.fenced:
            self._finish(old, t.FinishReason.ERROR,
                         Status(StatusCode.STALE_EPOCH, f"fenced by epoch {frame.session.epoch}"))
        session = admission.session
        if not admission.status.ok or session is None:
            return self._reply(frame, admission.status)
        if not opens:
            cancel = frame.phase == t.Phase.CANCEL
            if self.table.remove(session.key, session) is not None:
                self._finish(session, t.FinishReason.CANCELLED if cancel else t.FinishReason.UNSPECIFIED,
                             Status(StatusCode.CANCELLED if cancel else StatusCode.OK), forward=frame)
            return self._reply(frame, Status(StatusCode.OK))
        replayed, status = self.table.replay(session, frame.step)
        if replayed is not None or not status.ok:
            return replayed or self._reply(frame, status)
        deadline = arrived + frame.budget_ms / 1000 if frame.budget_ms else None
        try:
            return self._step(session, frame, deadline)
        except ProtocolError as err:
            if session.last_step == 0 and self.table.remove(session.key, session) is not None:
                # a session whose first step failed holds nothing: free its slot (Results stay open)
                self._finish(session, t.FinishReason.ERROR, err.status, close_results=False)
            return self._reply(frame, err.status)

    def _step(self, session: Session, frame: t.SeamFrame, deadline: Optional[float]) -> Optional[t.SeamReply]:
        live: _Live = session.state
        if frame.span is None or frame.span.count == 0:
            raise invalid("prefill/decode frame without a token span")
        if not self.engine.shard.last and live.downstream is None and not frame.downstream:
            raise invalid("not the last hop, but no downstream hop given")
        start = session.ticket.range.effective_start  # overlapping routes skip layers the previous hop ran
        if frame.sampling is not None and (frame.sampling.grammar or frame.sampling.grammar_tokens) \
                and self.engine.shard.last:
            raise invalid("constrained sampling (a grammar) is served by GGUF nodes only, not the reference backend")
        if start == 0:
            if len(frame.token_ids) != frame.span.count:
                raise invalid(f"{len(frame.token_ids)} token ids for a span of {frame.span.count}")
            out, length = self.engine.step(session.key, frame.span.start, token_ids=torch.tensor(frame.token_ids),
                                           deadline=deadline)
        else:
            hidden = self._hidden(live, frame)
            if hidden is None:
                return None  # more fragments of this step to come
            out, length = self.engine.step(session.key, frame.span.start, hidden=hidden, from_layer=start,
                                           deadline=deadline)
        if frame.sampling is not None:
            live.sampler = Sampler(frame.sampling)
        if self.engine.shard.last:
            self._emit(session, frame, out, length)
        else:
            self._forward(session, frame, out, deadline)
        reply = self._reply(frame, Status(StatusCode.OK), t.CacheState(length))
        self.table.record_step(session, frame.step, reply, frame.phase, frame.span.count)
        return reply

    def _hidden(self, live: _Live, frame: t.SeamFrame) -> Optional[torch.Tensor]:
        """The step's [count, n_embd] activations once its bundle is complete (None before)."""
        fragment, count = frame.fragment, frame.span.count
        if fragment is None:
            raise invalid("hidden states expected")
        limit = min(count * self.n_embd * 4, bundle.DEFAULT_LIMITS.max_bundle_bytes)
        if fragment.header is not None:
            if fragment.header.compression == t.Compression.ZLIB and not self.compression:
                raise invalid("zlib bundle, but this shard does not accept compression")
            if fragment.header.payload_bytes > limit:
                raise exhausted(f"bundle announces {fragment.header.payload_bytes} bytes; a step of {count} "
                                f"tokens carries at most {limit}")
        if live.reassembler is None or not live.reassembler.in_progress:
            wire_slack = limit // 256 + 64 if self.compression else 0  # zlib may expand random bytes slightly
            live.reassembler = bundle.Reassembler(bundle.Limits(max_bundle_bytes=limit + wire_slack))
        parts = live.reassembler.add(fragment)
        if parts is None:
            return None
        hidden = {p.name: p for p in parts}.get(HIDDEN)
        if hidden is None or tuple(hidden.shape) != (count, self.n_embd):
            raise invalid(f"bundle lacks {HIDDEN} of shape ({count}, {self.n_embd})")
        array = np.array(tensors.to_numpy(hidden), dtype=np.float32)
        if not np.isfinite(array).all():
            raise invalid("non-finite activations (NaN or Inf)")
        return torch.from_numpy(array)

    def _forward(self, session: Session, frame: t.SeamFrame, hidden: torch.Tensor, deadline: Optional[float]) -> None:
        """Sends the step's activations downstream, with what is left of its budget (at least
        1 ms: the next hop then answers DEADLINE_EXCEEDED itself)."""
        live: _Live = session.state
        if live.downstream is None:
            body = session.ticket
            certificate = body.downstream_tls_certificate.encode() or None
            upstream = session.stream.replies
            live.downstream = _Downstream(next_hop(body, frame.downstream), certificate, lambda status: upstream.put(
                t.SeamReply(seam.PROTOCOL_VERSION, frame.session, session.last_step, 0, None, status)))
        fragments = bundle.encode_bundle([tensors.from_torch(HIDDEN, hidden.contiguous())], frame.step)
        budget_ms = max(1, int((deadline - time.monotonic()) * 1000)) if deadline is not None else 0
        for fragment in fragments:
            live.downstream.send(dataclasses.replace(
                frame, token_ids=(), fragment=fragment, range=None, downstream=frame.downstream[1:],
                budget_ms=budget_ms))

    def _emit(self, session: Session, frame: t.SeamFrame, logits: torch.Tensor, length: int) -> None:
        live: _Live = session.state
        sampler = live.sampler or Sampler(t.SamplingParams())
        live.sampler = sampler
        token = sampler.sample(logits, length)
        live.generated += 1
        # The last hop decides the end (seam minor 1): a stop token, else the budget reached.
        limit = sampler.params.max_tokens
        finish = (t.FinishReason.STOP if token.token_id in sampler.params.stop_token_ids else
                  t.FinishReason.LENGTH if limit and live.generated >= limit else t.FinishReason.UNSPECIFIED)
        self.results.push(session.key, (t.ResultFrame(seam.PROTOCOL_VERSION, frame.session, frame.step, (token,),
                                                      finish, Status(StatusCode.OK)),))

    def _finish(self, session: Session, reason: t.FinishReason, status: Status, forward: Optional[t.SeamFrame] = None,
                close_results: bool = True) -> None:
        """Frees a session already removed from the table: its KV, its downstream (passing a
        release/cancel on), and its results (unless `close_results` is False: a failed first step
        leaves the client's Results open for a retry)."""
        self.engine.release(session.key)
        live: Optional[_Live] = session.state
        if live is not None and live.downstream is not None:
            if forward is not None:
                live.downstream.send(dataclasses.replace(forward, downstream=forward.downstream[1:]))
            live.downstream.close()
        if self.engine.shard.last and close_results:
            sid, epoch = session.key
            end = t.ResultFrame(seam.PROTOCOL_VERSION, t.RouteSession(sid, epoch), 0, (), reason, status)
            self.results.push(session.key, (end, _CLOSE), close=True)

    def _with_hop(self, status: Status) -> Status:
        return status if status.ok or status.hop else dataclasses.replace(status, hop=self.node_id)

    def _reply(self, frame: t.SeamFrame, status: Status, cache: Optional[t.CacheState] = None) -> t.SeamReply:
        return t.SeamReply(seam.PROTOCOL_VERSION, frame.session, frame.step, CREDITS, cache, self._with_hop(status))


def serve(shard: ShardServer, listen: str, tls: Optional[tuple[bytes, bytes]] = None, *,
          max_workers: Optional[int] = None, max_concurrent_streams: Optional[int] = None) -> tuple[grpc.Server, int]:
    """Starts a bounded gRPC server for `shard` (and the diag service) on `listen`.

    `tls` is (certificate PEM, private key PEM); None serves plaintext (--insecure only). RPCs
    beyond `max_workers` (default 4 x max_sessions + 8) are refused with RESOURCE_EXHAUSTED.
    Returns the started server and its port."""
    workers = max_workers or 4 * shard.engine.max_sessions + 8
    # One connection may hold at most a quarter of the workers (each RPC holds one), so a single
    # peer that opens streams and sends nothing cannot starve the others.
    max_concurrent_streams = max_concurrent_streams or max(2, workers // 4)
    # Keepalive as in the worker (--keepalive_ms): a quiet connection is pinged, and closed when the
    # ping goes unanswered, so the sessions of a peer that vanished (link cut, process stopped) end.
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_concurrent_streams", max_concurrent_streams),
               ("grpc.keepalive_time_ms", KEEPALIVE_MS), ("grpc.keepalive_timeout_ms", KEEPALIVE_MS),
               ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), maximum_concurrent_rpcs=workers,
                         options=options)
    shard_service.add_to_server(server, shard)
    diag.add_to_server(server, shard.node_id)
    port = bind(server, listen, tls)
    server.start()
    return server, port


def serve_shard(engine: ReferenceEngine, node_id: str, tracker_key: bytes,
                listen: str, tls: Optional[tuple[bytes, bytes]] = None, *, layers: Optional[tuple[int, int]] = None,
                compression: bool = False, idle_seconds: float = 300.0, auth_grace_seconds: float = 10.0,
                max_workers: Optional[int] = None, max_concurrent_streams: Optional[int] = None,
                supervisor_token: str = "") -> tuple[grpc.Server, int]:
    """A ShardServer for `engine` served by `serve`; plaintext downstream links only when `tls` is None."""
    shard = ShardServer(engine, node_id, idle_seconds, tracker_key=tracker_key, layers=layers,
                        compression=compression, auth_grace_seconds=auth_grace_seconds, insecure=tls is None,
                        supervisor_token=supervisor_token)
    return serve(shard, listen, tls, max_workers=max_workers, max_concurrent_streams=max_concurrent_streams)
