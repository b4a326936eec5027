"""The tracker state that replicated trackers share, behind one interface, and its embedded default.

`Registry` (tracker/registry.py) keeps its decisions (admission, routing, who may do what) and reads and
writes through a `TrackerStore`: node records with leases, route-session records with epochs and
leases, bans and the quarantine. Two implementations: `EmbeddedStore` here (in memory, one
process: the default, today's behaviour exactly) and `EtcdStore` (etcd_store.py: several trackers
on one etcd cluster; ADR 0011). Times in records are on the registry's clock.

The contract both keep (state_store_test.py runs it against each):
- A node record lives while its lease does: `put_node` (re)starts it, `refresh_node` extends it;
  an expired record is gone for every reader. `remove_node` removes a record whatever its lease.
- A route session is created once (`create_session` is False when the id exists). Its epoch only
  grows, one step at a time, and only by `advance_session`, which succeeds for exactly one caller
  that saw the current epoch: every (session, epoch) is handed out at most once, also across
  trackers. A stale epoch renews, advances and closes nothing. A successful advance returns the
  record as stored (its lease included), so the caller never reads back what it just wrote.
- A route session lives while its lease does (`create_session`, `advance_session` and
  `renew_session` restart it).
- A strike bans a node for base * 2^(strikes - 1) seconds, at most max; strikes are never forgotten.
- Quarantine only grows.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Optional, Protocol

from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId, SessionId
from meshnet.wire.status import StatusCode


@dataclasses.dataclass(frozen=True)
class NodeRecord:
    info: tt.NodeInfo
    admission: tt.Admission
    reason: str  # why it is dark ("" when routable)
    draining: bool = False
    load: tt.Load = dataclasses.field(default_factory=tt.Load)  # from its last heartbeat
    last_heartbeat: float = 0.0  # registry clock: the last register or heartbeat


@dataclasses.dataclass(frozen=True)
class SessionRecord:
    model: str
    epoch: int
    hops: tuple[tt.Hop, ...]  # () while an epoch > 1 has no route (its older epochs stay fenced)
    expected_tokens: int
    avoid: frozenset[NodeId]
    client_key: bytes  # the verified key of the principal that opened the route
    client_id: str  # as the opener named it; kept across epochs
    opened_at: float  # registry clock
    lease_until: float = 0.0  # registry clock; set by the store (as of its last write, on etcd)


class StoreError(Exception):
    """The store could not do what was asked; `code` and `retryable` become the reply's status."""

    code = StatusCode.INTERNAL
    retryable = False


class StoreUnavailable(StoreError):
    """No store endpoint answered in time (every etcd member tried): another tracker may do better."""

    code = StatusCode.UNAVAILABLE
    retryable = True


class RecordTooLarge(StoreError):
    """A record is over the store's size bound (etcd_store.MAX_VALUE_BYTES)."""

    code = StatusCode.RESOURCE_EXHAUSTED


class TrackerStore(Protocol):
    """Thread-safe. Every method may raise StoreError."""

    # ---- nodes --------------------------------------------------------------------------------
    def put_node(self, record: NodeRecord, lease_seconds: float) -> None: ...
    def refresh_node(self, node_id: NodeId, lease_seconds: float, load: Optional[tt.Load]) -> bool:
        """Extends a live node's lease (and takes its load when given); False if it has none."""
    def drain_node(self, node_id: NodeId) -> bool: ...
    def remove_node(self, node_id: NodeId) -> bool: ...
    def nodes(self) -> list[NodeRecord]:
        """Every live node."""

    # ---- route sessions ----------------------------------------------------------------------
    def create_session(self, session_id: SessionId, record: SessionRecord, lease_seconds: float) -> bool: ...
    def session(self, session_id: SessionId) -> Optional[SessionRecord]:
        """The live session, read where its epoch is decided (never a stale copy)."""
    def advance_session(self, session_id: SessionId, seen_epoch: int, record: SessionRecord,
                        lease_seconds: float) -> Optional[SessionRecord]:
        """Replaces the session by `record` (epoch seen_epoch + 1) iff it is live at seen_epoch:
        the record as stored (with its new lease_until), else None."""
    def renew_session(self, session_id: SessionId, epoch: int, lease_seconds: float) -> bool: ...
    def close_session(self, session_id: SessionId, epoch: int, opener: bytes) -> Optional[SessionRecord]:
        """Removes the session iff it is live at `epoch` and was opened by the key `opener`; the
        removed record, else None (the caller reads again to say why)."""
    def sessions(self) -> list[tuple[SessionId, SessionRecord]]:
        """Every live session (a view that may trail other trackers' writes by a watch event)."""

    # ---- bans and quarantine -----------------------------------------------------------------
    def strike(self, node_id: NodeId, base_seconds: float, max_seconds: float) -> None: ...
    def banned(self) -> frozenset[NodeId]: ...
    def quarantine(self, node_id: NodeId) -> None: ...
    def release(self, node_id: NodeId) -> None: ...  # the operator ended its quarantine (ADR 0016)
    def quarantined(self) -> frozenset[NodeId]: ...
    def close(self) -> None: ...


@dataclasses.dataclass
class _Leased:
    record: object
    lease_until: float


@dataclasses.dataclass
class _Ban:
    until: float
    strikes: int


class EmbeddedStore:
    """In memory, for one tracker. Expiry is lazy: a reader that finds an expired lease forgets it
    (as the registry always did). Dicts keep insertion order, so `nodes()` lists nodes in the order
    they first registered."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._nodes: dict[NodeId, _Leased] = {}
        self._sessions: dict[SessionId, _Leased] = {}
        self._bans: dict[NodeId, _Ban] = {}
        self._quarantined: set[NodeId] = set()

    # ---- nodes --------------------------------------------------------------------------------

    def put_node(self, record: NodeRecord, lease_seconds: float) -> None:
        with self._lock:
            self._nodes[record.info.node_id] = _Leased(record, self._clock() + lease_seconds)

    def refresh_node(self, node_id: NodeId, lease_seconds: float, load: Optional[tt.Load]) -> bool:
        with self._lock:
            entry = self._live(self._nodes, node_id)
            if entry is None:
                return False
            now = self._clock()
            entry.record = dataclasses.replace(entry.record, last_heartbeat=now, load=entry.record.load
                                               if load is None else load)
            entry.lease_until = now + lease_seconds
            return True

    def drain_node(self, node_id: NodeId) -> bool:
        with self._lock:
            entry = self._live(self._nodes, node_id)
            if entry is None:
                return False
            entry.record = dataclasses.replace(entry.record, draining=True)
            return True

    def remove_node(self, node_id: NodeId) -> bool:
        with self._lock:
            return self._nodes.pop(node_id, None) is not None

    def nodes(self) -> list[NodeRecord]:
        with self._lock:
            now = self._clock()
            for node_id in [i for i, e in self._nodes.items() if e.lease_until < now]:
                del self._nodes[node_id]
            return [e.record for e in self._nodes.values()]

    # ---- route sessions ----------------------------------------------------------------------

    def create_session(self, session_id: SessionId, record: SessionRecord, lease_seconds: float) -> bool:
        with self._lock:
            if self._live(self._sessions, session_id) is not None:
                return False
            self._sessions[session_id] = self._leased_session(record, lease_seconds)
            return True

    def session(self, session_id: SessionId) -> Optional[SessionRecord]:
        with self._lock:
            entry = self._live(self._sessions, session_id)
            return entry.record if entry else None

    def advance_session(self, session_id: SessionId, seen_epoch: int, record: SessionRecord,
                        lease_seconds: float) -> Optional[SessionRecord]:
        check_advance(seen_epoch, record)
        with self._lock:
            entry = self._live(self._sessions, session_id)
            if entry is None or entry.record.epoch != seen_epoch:
                return None
            self._sessions[session_id] = self._leased_session(record, lease_seconds)
            return self._sessions[session_id].record

    def renew_session(self, session_id: SessionId, epoch: int, lease_seconds: float) -> bool:
        with self._lock:
            entry = self._live(self._sessions, session_id)
            if entry is None or entry.record.epoch != epoch:
                return False
            entry.lease_until = self._clock() + lease_seconds
            entry.record = dataclasses.replace(entry.record, lease_until=entry.lease_until)
            return True

    def close_session(self, session_id: SessionId, epoch: int, opener: bytes) -> Optional[SessionRecord]:
        with self._lock:
            entry = self._live(self._sessions, session_id)
            if entry is None or entry.record.epoch != epoch or entry.record.client_key != opener:
                return None
            del self._sessions[session_id]
            return entry.record

    def sessions(self) -> list[tuple[SessionId, SessionRecord]]:
        with self._lock:
            now = self._clock()
            for sid in [sid for sid, e in self._sessions.items() if e.lease_until < now]:
                del self._sessions[sid]
            return [(sid, e.record) for sid, e in self._sessions.items()]

    def _leased_session(self, record: SessionRecord, lease_seconds: float) -> _Leased:
        until = self._clock() + lease_seconds
        return _Leased(dataclasses.replace(record, lease_until=until), until)

    # ---- bans and quarantine -----------------------------------------------------------------

    def strike(self, node_id: NodeId, base_seconds: float, max_seconds: float) -> None:
        with self._lock:
            ban = self._bans.setdefault(node_id, _Ban(0.0, 0))
            ban.strikes += 1
            ban.until = self._clock() + ban_seconds(ban.strikes, base_seconds, max_seconds)

    def banned(self) -> frozenset[NodeId]:
        with self._lock:
            now = self._clock()
            return frozenset(i for i, ban in self._bans.items() if ban.until > now)

    def quarantine(self, node_id: NodeId) -> None:
        with self._lock:
            self._quarantined.add(node_id)

    def release(self, node_id: NodeId) -> None:
        with self._lock:
            self._quarantined.discard(node_id)

    def quarantined(self) -> frozenset[NodeId]:
        with self._lock:
            return frozenset(self._quarantined)

    def close(self) -> None:
        pass

    def _live(self, table: dict, key: str) -> Optional[_Leased]:
        """Lock held. The entry, unless its lease expired (then it is forgotten)."""
        entry = table.get(key)
        if entry is not None and entry.lease_until < self._clock():
            del table[key]
            return None
        return entry


def ban_seconds(strikes: int, base_seconds: float, max_seconds: float) -> float:
    """How long the `strikes`-th strike bans a node: doubling from base, capped at max."""
    return min(max_seconds, base_seconds * 2 ** (strikes - 1))


def check_advance(seen_epoch: int, record: SessionRecord) -> None:
    if record.epoch != seen_epoch + 1:
        raise ValueError(f"an advance from epoch {seen_epoch} must store epoch {seen_epoch + 1}, not {record.epoch}")
