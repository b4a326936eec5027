"""The prefill grace: a route that carries no prefill within a few seconds gives its hops'
sessions back (issue 55, finding 12).

What the tracker sees of a route's traffic is its hops' work in the ledger: a node reports each
session's prefill and decode tokens with every heartbeat (every 2 s by default), and the first
step any hop completes for a route epoch is that epoch's prefill. So "the route carried a
prefill" means: the ledger holds work reported by a hop of the route at its current epoch (any
hop: the first one reports first). An epoch is watched from when this tracker routed it (an open
or a failover), or first saw it when another tracker sharing the store routed it, until such work
is seen; when `grace_seconds` pass without it, the registry closes the route (its sessions count
no more, at once rather than at the end of the 60 s lease) and its principal's places stay
counted for fair share one more grace (fair_share.py). An epoch without hops holds nothing and is
not watched. The grace must exceed the longest first-hop prefill the swarm serves plus a
heartbeat: a route closed mid-prefill still runs on its tickets, but the tracker no longer
counts its sessions.

Called by the registry (registry.py) under its lock, which guards `PrefillWatch`; the registry
asks the ledger outside it. Bounded: it remembers only sessions that are live in the store.
"""

from __future__ import annotations

import math
from typing import Iterable

from meshnet.tracker.store.state_store import SessionRecord
from meshnet.wire.ids import SessionId

DEFAULT_GRACE_SECONDS = 10.0


def check_grace(seconds: float) -> None:
    """Raises ValueError unless `seconds` is a usable grace (finite and positive)."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"the prefill grace must be a positive number of seconds, not {seconds}")


class PrefillWatch:
    """Which route epochs are still to show a prefill, and since when (registry clock)."""

    def __init__(self, grace_seconds: float) -> None:
        check_grace(grace_seconds)
        self.grace_seconds = grace_seconds
        self._routed: dict[SessionId, tuple[int, float]] = {}  # session -> (epoch, when it was routed)
        self._proven: set[tuple[SessionId, int]] = set()  # (session, epoch) whose work was seen

    def routed(self, session_id: SessionId, epoch: int, now: float) -> None:
        """This tracker routed `epoch` of the session at `now`: its grace starts."""
        self._routed[session_id] = (epoch, now)

    def proven(self, session_id: SessionId, epoch: int) -> None:
        """A hop reported work for `epoch` of the session: it is not watched any more."""
        self._proven.add((session_id, epoch))

    def due(self, sessions: Iterable[tuple[SessionId, SessionRecord]],
            now: float) -> list[tuple[SessionId, SessionRecord]]:
        """Of `sessions` (every live one), those with hops whose epoch has not shown work a grace
        after it was routed; forgets the sessions not among them."""
        routed: dict[SessionId, tuple[int, float]] = {}
        proven: set[tuple[SessionId, int]] = set()
        due = []
        for session_id, session in sessions:
            if not session.hops:
                continue
            seen = self._routed.get(session_id)
            if seen is None or seen[0] != session.epoch:
                seen = (session.epoch, now)
            routed[session_id] = seen
            if (session_id, session.epoch) in self._proven:
                proven.add((session_id, session.epoch))
            elif now - seen[1] >= self.grace_seconds:
                due.append((session_id, session))
        self._routed, self._proven = routed, proven
        return due
