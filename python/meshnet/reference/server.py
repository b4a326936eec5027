"""The reference shard's gRPC service (meshnet.shard.v1.Shard), as the C++ worker will serve it.

One Seam stream per upstream peer (the client, or the previous hop): a reader thread decodes
frames, runs steps on the engine, forwards activations to the next hop over one long-lived
downstream Seam stream per route session, and answers upstream through an outgoing queue. The
last hop samples and pushes tokens to the session's Results stream, which the client opened.
Invariants: a frame of an older epoch than the newest seen for its session is refused; a
repeated step is answered from the record, not recomputed; when a session is released,
cancelled, or its upstream stream is lost, its KV is freed here and the release travels on.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Iterator, Optional

import grpc
import numpy as np
import torch

from meshnet.protocol import bundle, seam, tensors
from meshnet.protocol.errors import ProtocolError
from meshnet.reference.model import ReferenceEngine
from meshnet.reference.sampling import Sampler
from meshnet.shard.v1 import shard_pb2, shard_pb2_grpc
from meshnet.types import seam as t
from meshnet.types.status import Status, StatusCode

CREDITS = 8
HIDDEN = "hidden_states"
_CLOSE = object()


@dataclasses.dataclass
class _Session:
    key: tuple[str, int]  # (session id, epoch)
    upstream: "queue.Queue"  # replies to whoever sends this session's frames
    downstream: Optional["_Downstream"] = None
    sampler: Optional[Sampler] = None
    last_step: int = 0
    last_reply: Optional[t.SeamReply] = None
    last_active: float = dataclasses.field(default_factory=time.monotonic)
    reassembler: bundle.Reassembler = dataclasses.field(default_factory=bundle.Reassembler)


class _Downstream:
    """One Seam stream to the next hop for one session; errors are reported through `on_error`."""

    def __init__(self, hop: t.DownstreamHop, on_error) -> None:
        self.hop = hop
        self._channel = grpc.insecure_channel(hop.address)
        self._frames: queue.Queue = queue.Queue(maxsize=256)
        self._call = shard_pb2_grpc.ShardStub(self._channel).Seam(iter(self._frames.get, _CLOSE))
        self._on_error = on_error
        self._closed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for reply in self._call:
                native = seam.from_proto(reply)
                if native.status is not None and not native.status.ok:
                    status = native.status
                    self._on_error(dataclasses.replace(status, hop=status.hop or self.hop.node_id))
        except grpc.RpcError as err:
            if not self._closed.is_set():
                self._on_error(Status(StatusCode.UNAVAILABLE, f"next hop {self.hop.node_id} lost: {err.code().name}",
                                      True, self.hop.node_id))

    def send(self, frame: t.SeamFrame) -> None:
        self._frames.put(seam.to_proto(frame), timeout=30)

    def close(self) -> None:
        self._closed.set()
        self._frames.put(_CLOSE)
        self._channel.close()


class ShardServer(shard_pb2_grpc.ShardServicer):
    def __init__(self, engine: ReferenceEngine, node_id: str, fingerprints: Optional[t.Fingerprints] = None,
                 idle_seconds: float = 300.0) -> None:
        self.engine = engine
        self.node_id = node_id
        self.fingerprints = fingerprints
        self.idle_seconds = idle_seconds  # a session with no frame for this long is freed
        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, int], _Session] = {}
        self._epochs: dict[str, int] = {}
        self._results: dict[tuple[str, int], queue.Queue] = {}
        self._work: dict[tuple[str, int], list[int]] = {}  # (prefill, decode) tokens not yet taken
        self._seam_in = [0, 0]  # SeamFrames received, their serialized bytes (Health)
        threading.Thread(target=self._reap_idle, daemon=True).start()

    def _reap_idle(self) -> None:
        """Frees sessions whose client vanished without release or stream loss (deadline)."""
        while True:
            time.sleep(min(1.0, self.idle_seconds / 4))
            now = time.monotonic()
            with self._lock:
                idle = [k for k, s in self._sessions.items() if now - s.last_active > self.idle_seconds]
            for key in idle:
                self._end(key, t.FinishReason.ERROR, Status(StatusCode.DEADLINE_EXCEEDED,
                                                            f"session idle for over {self.idle_seconds:g}s"))

    def session_records(self) -> int:
        """Sessions this server tracks (any thread); each holds a slot until it ends."""
        with self._lock:
            return len(self._sessions)

    # ---- unary ------------------------------------------------------------------------------

    def Hello(self, request, context):  # noqa: N802
        return seam.to_proto(seam.negotiate(seam.from_proto(request), self.node_id))

    def TakeWork(self, request, context):  # noqa: N802
        """Returns and resets the tokens processed per session (the node reports them)."""
        with self._lock:
            taken, self._work = self._work, {}
        reply = shard_pb2.TakeWorkReply()
        for (sid, epoch), (prefill, decode) in sorted(taken.items()):
            reply.work.add(session=shard_pb2.RouteSession(session_id=sid, epoch=epoch), prefill_tokens=prefill,
                           decode_tokens=decode)
        return reply

    def Health(self, request, context):  # noqa: N802
        sessions, tokens = self.engine.stats()
        with self._lock:
            frames, size = self._seam_in
        return shard_pb2.HealthReply(status=shard_pb2.Status(code=StatusCode.OK), active_sessions=sessions,
                                     kv_cells_used=tokens, kv_cells_total=self.engine.max_kv_tokens,
                                     seam_frames_in=frames, seam_bytes_in=size)

    # ---- results ----------------------------------------------------------------------------

    def _result_queue(self, key: tuple[str, int]) -> queue.Queue:
        with self._lock:
            return self._results.setdefault(key, queue.Queue())

    def Results(self, request, context):  # noqa: N802
        req = seam.from_proto(request)
        key = (req.session.session_id, req.session.epoch)
        results = self._result_queue(key)
        try:
            while context.is_active():
                try:
                    item = results.get(timeout=0.5)
                except queue.Empty:
                    continue
                if item is _CLOSE:
                    return
                yield seam.to_proto(item)
        finally:
            with self._lock:
                self._results.pop(key, None)

    def _push_result(self, key, frame: t.ResultFrame, close: bool = False) -> None:
        results = self._result_queue(key)
        results.put(frame)
        if close:
            results.put(_CLOSE)

    # ---- seam -------------------------------------------------------------------------------

    def Seam(self, request_iterator, context):  # noqa: N802
        replies: queue.Queue = queue.Queue()
        owned: set[tuple[str, int]] = set()
        threading.Thread(target=self._read_upstream, args=(request_iterator, replies, owned), daemon=True).start()
        while True:
            item = replies.get()
            if item is _CLOSE:
                return
            yield seam.to_proto(item)

    def _read_upstream(self, frames: Iterator, replies: queue.Queue, owned: set) -> None:
        try:
            for message in frames:
                with self._lock:
                    self._seam_in[0] += 1
                    self._seam_in[1] += message.ByteSize()
                reply = self._handle(message, replies, owned)
                if reply is not None:
                    replies.put(reply)
        except grpc.RpcError:
            pass  # the upstream peer is gone
        finally:
            for key in list(owned):  # stream loss frees every session that came through it
                self._end(key, t.FinishReason.ERROR,
                          Status(StatusCode.UNAVAILABLE, f"upstream of {self.node_id} lost", True))
            replies.put(_CLOSE)

    def _handle(self, message, replies: queue.Queue, owned: set) -> Optional[t.SeamReply]:
        try:
            frame = seam.from_proto(message)
            seam.check_version(frame.version)
        except ProtocolError as err:
            return t.SeamReply(seam.PROTOCOL_VERSION, None, 0, 0, None, err.status)
        if frame.session is None:
            return self._reply(frame, Status(StatusCode.INVALID_ARGUMENT, "frame without a route session"))
        sid, epoch = frame.session.session_id, frame.session.epoch
        key = (sid, epoch)
        with self._lock:
            newest = self._epochs.get(sid, 0)
            if epoch < newest:
                return self._reply(frame, Status(StatusCode.STALE_EPOCH, f"epoch {epoch} is fenced by {newest}"))
            self._epochs[sid] = epoch
            older = [k for k in self._sessions if k[0] == sid and k[1] < epoch]
        for old in older:
            self._end(old, t.FinishReason.ERROR, Status(StatusCode.STALE_EPOCH, f"fenced by epoch {epoch}"))
        if frame.fingerprints is not None and self.fingerprints is not None and frame.fingerprints != self.fingerprints:
            return self._reply(frame, Status(StatusCode.FINGERPRINT_MISMATCH, "frame's fingerprints differ from this node's"))
        if frame.phase in (t.Phase.RELEASE, t.Phase.CANCEL):
            reason = t.FinishReason.CANCELLED if frame.phase == t.Phase.CANCEL else t.FinishReason.UNSPECIFIED
            self._end(key, reason, Status(StatusCode.CANCELLED if frame.phase == t.Phase.CANCEL else StatusCode.OK),
                      forward=frame)
            owned.discard(key)
            return self._reply(frame, Status(StatusCode.OK))
        if frame.phase not in (t.Phase.PREFILL, t.Phase.DECODE):
            return self._reply(frame, Status(StatusCode.INVALID_ARGUMENT, f"unknown phase {frame.phase}"))
        session = self._session(key, frame, replies, owned)
        session.last_active = time.monotonic()
        if frame.step <= session.last_step:
            if frame.step == session.last_step and session.last_reply is not None:
                return dataclasses.replace(session.last_reply, replayed=True)
            return self._reply(frame, Status(StatusCode.INVALID_ARGUMENT, f"step {frame.step} is older than "
                                                                          f"{session.last_step}"))
        try:
            return self._step(session, frame)
        except ProtocolError as err:
            if session.last_step == 0:  # a session whose first step failed holds nothing: free its slot
                self._end(key, t.FinishReason.ERROR, err.status, close_results=False)
                owned.discard(key)
            return self._reply(frame, err.status)

    def _session(self, key, frame: t.SeamFrame, replies: queue.Queue, owned: set) -> _Session:
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                session = _Session(key, replies)
                self._sessions[key] = session
                owned.add(key)
            return session

    def _step(self, session: _Session, frame: t.SeamFrame) -> Optional[t.SeamReply]:
        if frame.span is None or frame.span.count == 0:
            raise ProtocolError(StatusCode.INVALID_ARGUMENT, "prefill/decode frame without a token span")
        if self.engine.shard.first:
            if len(frame.token_ids) != frame.span.count:
                raise ProtocolError(StatusCode.INVALID_ARGUMENT,
                                    f"{len(frame.token_ids)} token ids for a span of {frame.span.count}")
            out, length = self.engine.step(session.key, frame.span.start, token_ids=torch.tensor(frame.token_ids))
        else:
            if frame.fragment is None:
                raise ProtocolError(StatusCode.INVALID_ARGUMENT, "hidden states expected")
            parts = session.reassembler.add(frame.fragment)
            if parts is None:
                return None  # more fragments of this step to come
            hidden = {p.name: p for p in parts}.get(HIDDEN)
            if hidden is None or hidden.shape[0] != frame.span.count:
                raise ProtocolError(StatusCode.INVALID_ARGUMENT, f"bundle lacks {HIDDEN} for {frame.span.count} tokens")
            out, length = self.engine.step(session.key, frame.span.start, hidden=torch.from_numpy(
                np.array(tensors.to_numpy(hidden), dtype=np.float32)))
        if frame.sampling is not None:
            session.sampler = Sampler(frame.sampling)
        if self.engine.shard.last:
            self._emit(session, frame, out, length)
        else:
            self._forward(session, frame, out)
        reply = self._reply(frame, Status(StatusCode.OK), t.CacheState(length))
        session.last_step, session.last_reply = frame.step, reply
        with self._lock:
            counts = self._work.setdefault(session.key, [0, 0])
            counts[1 if frame.phase == t.Phase.DECODE else 0] += frame.span.count
        return reply

    def _forward(self, session: _Session, frame: t.SeamFrame, hidden: torch.Tensor) -> None:
        if session.downstream is None:
            if not frame.downstream:
                raise ProtocolError(StatusCode.INVALID_ARGUMENT, "not the last hop, but no downstream hop given")
            session.downstream = _Downstream(frame.downstream[0], lambda status: session.upstream.put(
                t.SeamReply(seam.PROTOCOL_VERSION, frame.session, session.last_step, 0, None, status)))
        nxt = session.downstream.hop
        fragments = bundle.encode_bundle([tensors.from_torch(HIDDEN, hidden.contiguous())], frame.step)
        for fragment in fragments:
            session.downstream.send(dataclasses.replace(
                frame, token_ids=(), fragment=fragment, range=nxt.range, downstream=frame.downstream[1:]))

    def _emit(self, session: _Session, frame: t.SeamFrame, logits: torch.Tensor, length: int) -> None:
        sampler = session.sampler or Sampler(t.SamplingParams())
        session.sampler = sampler
        token = sampler.sample(logits, length)
        finish = t.FinishReason.STOP if token.token_id in sampler.params.stop_token_ids else t.FinishReason.UNSPECIFIED
        self._push_result(session.key, t.ResultFrame(seam.PROTOCOL_VERSION, frame.session, frame.step, (token,), finish,
                                                     Status(StatusCode.OK)))

    def _end(self, key, reason: t.FinishReason, status: Status, forward: Optional[t.SeamFrame] = None,
             close_results: bool = True) -> None:
        """Frees the session's KV, passes a release/cancel on, and closes its results (unless
        `close_results` is False: a failed first step leaves the client's Results open for a retry)."""
        with self._lock:
            session = self._sessions.pop(key, None)
        self.engine.release(key)
        if session is not None and session.downstream is not None:
            if forward is not None:
                session.downstream.send(dataclasses.replace(forward, downstream=forward.downstream[1:]))
            session.downstream.close()
        if self.engine.shard.last and close_results:
            self._push_result(key, t.ResultFrame(seam.PROTOCOL_VERSION, t.RouteSession(key[0], key[1]), 0, (), reason,
                                                 status), close=True)

    def _reply(self, frame: t.SeamFrame, status: Status, cache: Optional[t.CacheState] = None) -> t.SeamReply:
        if not status.ok and not status.hop:
            status = dataclasses.replace(status, hop=self.node_id)
        return t.SeamReply(seam.PROTOCOL_VERSION, frame.session, frame.step, CREDITS, cache, status)
