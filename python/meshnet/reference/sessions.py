"""The reference shard's session state: admission by route ticket, epoch fences, stream bindings,
idle sessions, and the result queues clients read. No gRPC, no model.

Mirrors cpp/worker/sessions.h under ADR 0003 ("Route tickets", "Bounded state before
admission"). Called by meshnet.reference.server from gRPC threads and its reaper. Invariants:
- nothing is created for a frame unless its (id, epoch) is bound to its stream, or its ticket
  verified and admitted it; a refused frame changes nothing;
- at most `max_sessions` sessions exist, including ones whose first step has not run;
- at most `max_fences` epoch fences; a fence is dropped once every ticket it could refuse has
  expired (tickets of newer epochs expire later, so the newest expiry decides);
- a session is bound to the stream that created it; other streams cannot act on it;
- at most `max_results` result queues; a closed queue nobody reads is dropped after the grace.
Deterministic given its clocks. Threading: every method is thread-safe (one lock per table; no
callbacks and no signature checks under it).
"""

from __future__ import annotations

import dataclasses
import enum
import queue
import threading
import time
from typing import Callable, Hashable, Optional

from meshnet.identity import tickets
from meshnet.wire import seam as t
from meshnet.wire.status import OK, Status, StatusCode

Key = tuple[str, int]  # (session id, epoch)


@dataclasses.dataclass(frozen=True)
class Options:
    tracker_key: bytes  # the tracker's Ed25519 ticket key (32 bytes)
    node_id: str  # tickets must name this node
    layers: tuple[int, int]  # ... and this registered range
    max_sessions: int = 16  # the engine's session slots
    idle_seconds: float = 300.0  # no frame for this long: the session is reapable
    max_fences: int = 4096  # session ids with an epoch fence
    last_hop: bool = True  # this shard ends the model: it forwards nowhere
    insecure: bool = False  # a ticket may name a downstream without a TLS certificate (plaintext)


@dataclasses.dataclass
class Session:
    key: Key
    stream: Hashable  # the stream that created it; only it may act on the session
    ticket: t.TicketBody  # the ticket that admitted it (names the only downstream)
    last_active: float  # table clock
    last_step: int = 0  # newest completed step (0: none yet)
    last_reply: Optional[t.SeamReply] = None
    state: object = None  # the caller's (transport, sampler); never read here


@dataclasses.dataclass(frozen=True)
class Admission:
    status: Status
    session: Optional[Session] = None  # None with OK: a RELEASE/CANCEL of an unknown session
    created: bool = False  # the session was created for this frame
    fenced: tuple[Session, ...] = ()  # older epochs this frame fenced; the caller ends them
    verified: bool = False  # the frame carried a ticket that verified and admitted it


@dataclasses.dataclass
class _Fence:
    epoch: int  # newest epoch admitted for the session id
    expires_unix_ms: int  # newest expiry among the tickets that raised it


def _error(code: StatusCode, message: str, retryable: bool = False) -> Status:
    return Status(code, message, retryable)


def check_downstream(body: t.TicketBody, downstream: tuple[t.DownstreamHop, ...], last_hop: bool,
                     insecure: bool) -> Status:
    """ADR 0003 rule 5 as seam minor 1 reads it (docs/adr/0021-the-route-decided-once.md): a hop
    forwards only to the node its ticket names, so the frame's downstream list carries the later
    hops' tickets and nothing else in it counts. A last-hop ticket admits no downstream list; a
    hop that is not the last needs a ticket that names a downstream (with a certificate, unless
    insecure) and, in the list, that hop's ticket to present."""
    if downstream and not body.downstream_node_id:
        return _error(StatusCode.PERMISSION_DENIED, "a last-hop ticket admits no downstream hop")
    if last_hop:
        return OK
    if not body.downstream_node_id:
        return _error(StatusCode.PERMISSION_DENIED, "not the last hop, but the ticket names no downstream hop")
    if downstream and downstream[0].ticket is None:
        return _error(StatusCode.INVALID_ARGUMENT, "the downstream list carries no ticket for the next hop")
    if not body.downstream_tls_certificate and not insecure:
        return _error(StatusCode.PERMISSION_DENIED, "the ticket names no downstream certificate (plaintext "
                                                    "needs --insecure)")
    return OK


def next_hop(body: t.TicketBody, downstream: tuple[t.DownstreamHop, ...]) -> t.DownstreamHop:
    """The hop to dial: the node and address the verified ticket names, with the ticket that
    the downstream list carries for it (check_downstream passed). A 1.0 sender's node id,
    address and range in the list are ignored."""
    return t.DownstreamHop(body.downstream_node_id, body.downstream_address, None, downstream[0].ticket)


class SessionTable:
    def __init__(self, options: Options, clock: Callable[[], float] = time.monotonic,
                 wall_ms: Callable[[], int] = tickets.now_ms) -> None:
        self.options = options
        self._clock, self._wall_ms = clock, wall_ms
        self._lock = threading.Lock()
        self._sessions: dict[Key, Session] = {}
        self._fences: dict[str, _Fence] = {}
        self._fenced: dict[Key, Hashable] = {}  # fenced sessions -> their stream (STALE_EPOCH)
        self._work: dict[Key, list[int]] = {}  # (prefill, decode) tokens not yet taken

    def admit(self, route: t.RouteSession, ticket: Optional[t.RouteTicket], stream: Hashable,
              opens: bool, downstream: tuple[t.DownstreamHop, ...] = (),
              make_state: Callable[[], object] = lambda: None) -> Admission:
        """ADR 0003 steps 2-5 for a frame of `route` on `stream` naming `downstream`; `opens`
        for PREFILL/DECODE (RELEASE/CANCEL of an unknown session creates no session, but its
        valid ticket still raises the epoch fence, as in the worker). A session created here gets
        `make_state()` as its state."""
        key = (route.session_id, route.epoch)
        options = self.options
        with self._lock:
            session = self._sessions.get(key)
            if session is not None and session.stream is stream:
                status = check_downstream(session.ticket, downstream, options.last_hop, options.insecure)
                if opens and status.ok:
                    session.last_active = self._clock()
                return Admission(status, session if status.ok else None)
            if self._fenced.get(key) is stream:
                return Admission(_error(StatusCode.STALE_EPOCH, f"epoch {route.epoch} was fenced by a newer epoch"))
        try:
            body = tickets.admitting_body(ticket, options.tracker_key, route, options.node_id, options.layers,
                                          now=self._wall_ms())
        except tickets.TicketError as err:
            return Admission(err.status)
        if opens:
            status = check_downstream(body, downstream, options.last_hop, options.insecure)
            if not status.ok:
                return Admission(status, verified=True)
        with self._lock:
            return dataclasses.replace(self._admit_verified(key, body, stream, opens, make_state), verified=True)

    def _admit_verified(self, key: Key, body: t.TicketBody, stream: Hashable, opens: bool,
                        make_state: Callable[[], object]) -> Admission:
        sid, epoch = key
        fence = self._fences.get(sid)
        if fence is not None and epoch < fence.epoch:
            return Admission(_error(StatusCode.STALE_EPOCH, f"epoch {epoch} is fenced by {fence.epoch}"))
        session = self._sessions.get(key)
        if session is not None:
            if session.stream is not stream:
                return Admission(_error(StatusCode.PERMISSION_DENIED, "the session is bound to another stream"))
            return Admission(OK, session)
        older = [k for k in self._sessions if k[0] == sid and k[1] < epoch]
        if opens and len(self._sessions) - len(older) >= self.options.max_sessions:
            return Admission(_error(StatusCode.RESOURCE_EXHAUSTED,
                                    f"all {self.options.max_sessions} session slots are in use", True))
        if fence is None and len(self._fences) >= self.options.max_fences:
            self._prune_fences()
            if len(self._fences) >= self.options.max_fences:
                return Admission(_error(StatusCode.RESOURCE_EXHAUSTED,
                                        f"all {self.options.max_fences} epoch fences are in use", True))
        if fence is None:
            self._fences[sid] = _Fence(epoch, body.expires_unix_ms)
        else:
            fence.epoch, fence.expires_unix_ms = epoch, max(fence.expires_unix_ms, body.expires_unix_ms)
        fenced = tuple(self._sessions.pop(k) for k in older)
        for old in fenced:
            self._remember_fenced(old)
        if not opens:  # a RELEASE/CANCEL of a newer epoch fences too, and creates no session
            return Admission(OK, fenced=fenced)
        session = Session(key, stream, body, self._clock(), state=make_state())
        self._sessions[key] = session
        return Admission(OK, session, created=True, fenced=fenced)

    def _remember_fenced(self, session: Session) -> None:
        self._fenced[session.key] = session.stream
        while len(self._fenced) > self.options.max_fences:
            del self._fenced[next(iter(self._fenced))]  # the oldest tombstone

    def _prune_fences(self) -> None:
        now = self._wall_ms()
        live = {sid for sid, _ in self._sessions}
        for sid in [s for s, f in self._fences.items() if f.expires_unix_ms < now and s not in live]:
            del self._fences[sid]

    def prune(self) -> None:
        """Drops fences whose every ticket has expired (the reaper calls this)."""
        with self._lock:
            self._prune_fences()

    def replay(self, session: Session, step: int) -> tuple[Optional[t.SeamReply], Status]:
        """For step <= last_step: the recorded reply (replayed) or INVALID_ARGUMENT (older);
        (None, OK) for a new step."""
        with self._lock:
            if step > session.last_step:
                return None, OK
            if step == session.last_step and session.last_reply is not None:
                return dataclasses.replace(session.last_reply, replayed=True), OK
            return None, _error(StatusCode.INVALID_ARGUMENT, f"step {step} is older than {session.last_step}")

    def record_step(self, session: Session, step: int, reply: t.SeamReply, phase: t.Phase, tokens: int) -> None:
        with self._lock:
            session.last_step, session.last_reply = step, reply
            counts = self._work.setdefault(session.key, [0, 0])
            counts[1 if phase == t.Phase.DECODE else 0] += tokens

    def take_work(self) -> dict[Key, tuple[int, int]]:
        """(prefill, decode) tokens per session since the last call."""
        with self._lock:
            taken, self._work = self._work, {}
        return {k: (v[0], v[1]) for k, v in taken.items()}

    def remove(self, key: Key, session: Optional[Session] = None) -> Optional[Session]:
        """Removes the session (only if it is `session`, when given); None when absent."""
        with self._lock:
            current = self._sessions.get(key)
            if current is None or (session is not None and current is not session):
                return None
            return self._sessions.pop(key)

    def drop_stream(self, stream: Hashable) -> list[Session]:
        """Removes and returns every session bound to `stream` (it was lost or closed)."""
        with self._lock:
            for key in [k for k, s in self._fenced.items() if s is stream]:
                del self._fenced[key]
            keys = [k for k, s in self._sessions.items() if s.stream is stream]
            return [self._sessions.pop(k) for k in keys]

    def idle(self) -> list[Key]:
        """Sessions with no frame for longer than the idle timeout (not removed)."""
        now = self._clock()
        with self._lock:
            return [k for k, s in self._sessions.items() if now - s.last_active > self.options.idle_seconds]

    def count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def fence_count(self) -> int:
        with self._lock:
            return len(self._fences)


class Refusal(enum.Enum):
    """Why a Results reader got no queue (the server maps these to gRPC codes)."""

    HAS_READER = "the session's results already have a reader"
    FULL = "every result queue is in use"


@dataclasses.dataclass
class _Results:
    items: queue.Queue
    reader: bool = False
    closed_at: Optional[float] = None


class ResultsTable:
    """The last hop's result queues, one per session, at most one reader each."""

    def __init__(self, max_queues: int, grace_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._max, self._grace, self._clock = max_queues, grace_seconds, clock
        self._lock = threading.Lock()
        self._queues: dict[Key, _Results] = {}

    def attach(self, key: Key) -> tuple[Optional[queue.Queue], Optional[Refusal]]:
        """The queue for the session's only reader, or why there is none."""
        with self._lock:
            entry = self._queues.get(key)
            if entry is not None and entry.reader:
                return None, Refusal.HAS_READER
            if entry is None:
                entry = self._new(key, evict=False)
                if entry is None:
                    return None, Refusal.FULL
            entry.reader = True
            return entry.items, None

    def detach(self, key: Key, items: queue.Queue) -> None:
        """The reader left: its queue goes (only if it is still `items`)."""
        with self._lock:
            entry = self._queues.get(key)
            if entry is not None and entry.items is items:
                del self._queues[key]

    def push(self, key: Key, items: tuple, close: bool = False) -> bool:
        """Appends to the session's queue (made if absent); False when no queue could be had."""
        with self._lock:
            entry = self._queues.get(key) or self._new(key, evict=True)
            if entry is None:
                return False
            for item in items:
                entry.items.put(item)
            if close:
                entry.closed_at = self._clock()
            return True

    def _new(self, key: Key, evict: bool) -> Optional[_Results]:
        if len(self._queues) >= self._max:
            self._reap()
        if len(self._queues) >= self._max and evict:
            closed = [k for k, e in self._queues.items() if not e.reader and e.closed_at is not None]
            if closed:
                del self._queues[min(closed, key=lambda k: self._queues[k].closed_at)]
        if len(self._queues) >= self._max:
            return None
        entry = self._queues[key] = _Results(queue.Queue())
        return entry

    def _reap(self) -> None:
        now = self._clock()
        for key in [k for k, e in self._queues.items()
                    if not e.reader and e.closed_at is not None and now - e.closed_at > self._grace]:
            del self._queues[key]

    def reap(self) -> None:
        """Drops closed queues nobody read within the grace (the reaper calls this)."""
        with self._lock:
            self._reap()

    def readers(self) -> int:
        with self._lock:
            return sum(e.reader for e in self._queues.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._queues)
