"""Fair share: while other principals wait for a range's sessions, one principal cannot take
more than its share of them (issue 55, finding 12).

A range is a registered layer range [start, end) of a model; its nodes are replicas. Its
capacity is the sum of the `max_sessions` of its nodes that can be routed now (routable, live,
not draining, banned or quarantined); a range with a node that sets no session limit has no
share. A principal (a verified key, ADR 0017) holds a place in a range for each of its open
routes with a hop there, and for each of its routes that the registry reclaimed for carrying no
prefill within the last grace (prefill_grace.py), so that a squatter cannot take back at once
the places it was made to give up. A principal waits for a range from a refusal of its route
because every node of that range it could use was at capacity or at its share, until it is
granted a route of that model or `wait_seconds` (the route lease) after its last such refusal.

The rule. While a principal other than P waits for range R, P's new route takes no place in R
if P holds share(R) places there already, where share(R) = ceil(capacity(R) x w(P) / W) and W
is the sum of the weights of the principals holding a place in R, P included, plus one if some
waiting principal holds none there. The waiting principals who hold nothing count as one of
weight 1, so that keys minted only to ask cannot shrink everyone's share; rounded up, the shares
cover the capacity, and whoever is under its share may still take a free place. A principal's
weight is its route quota over the tracker's default (`weight`; 1 for every key the operator did
not enrol with a larger quota): a gateway, which carries many users under one key, is enrolled
with the quota of the routes it may hold, and holds that much more of a range than a single key
while others wait; a key minted by a token holder has the default quota and weight 1. The route goes around R when it can; else it is
refused RESOURCE_EXHAUSTED (retryable), as a principal over its route quota is. Places already
held are not taken back (a share is reached as routes end), and a failover is not held to it
(its route held its place already).

Called by the registry (registry.py) under its lock, which guards `Contention`. `shares` is the
rule, a pure function; `over_share` gathers what it needs. Bounded: waiting principals expire,
at most MAX_WAITING per range, and reclaimed routes after one grace.
"""

from __future__ import annotations

import collections
import math
from typing import Callable, Iterable, Mapping, NamedTuple, Optional

from meshnet.tracker.store.state_store import NodeRecord, SessionRecord
from meshnet.wire import tracker as tt

Range = tuple[int, int]  # a registered layer range [start, end)
Weight = Callable[[bytes], float]  # a principal's weight in the shares (1 unless enrolled with more)
MAX_WAITING = 1024  # waiting principals remembered per (model, range); the oldest go first
MAX_RECLAIMED = 1 << 16  # reclaimed routes remembered (each for one grace)


class Contention:
    """Who waits for which range of which model, and the places of reclaimed routes; the
    registry's lock guards it."""

    def __init__(self, wait_seconds: float) -> None:
        self._wait = wait_seconds
        self._waiting: dict[tuple[str, Range], dict[bytes, float]] = {}  # -> principal -> last refusal
        self._reclaimed: collections.deque[tuple[float, str, bytes, tuple[Range, ...]]] = collections.deque()

    def refused(self, model: str, ranges: Iterable[Range], principal: bytes, now: float) -> None:
        """`principal` was refused a route of `model` for want of a place in `ranges`."""
        for at in ranges:
            waiting = self._waiting.setdefault((model, at), {})
            waiting.pop(principal, None)  # re-inserted last: the dict keeps refusal order
            waiting[principal] = now
            while len(waiting) > MAX_WAITING:
                del waiting[next(iter(waiting))]

    def served(self, model: str, principal: bytes) -> None:
        """`principal` was granted a route of `model`: it waits for none of its ranges."""
        for (waited, _), waiting in self._waiting.items():
            if waited == model:
                waiting.pop(principal, None)

    def reclaimed(self, model: str, principal: bytes, ranges: Iterable[Range], until: float) -> None:
        """A route of `principal` through `ranges` was reclaimed unused: its places count until `until`."""
        self._reclaimed.append((until, model, principal, tuple(ranges)))
        while len(self._reclaimed) > MAX_RECLAIMED:
            self._reclaimed.popleft()

    def waiting(self, model: str, now: float) -> dict[Range, frozenset[bytes]]:
        """The principals waiting for each range of `model` (forgets those whose wait expired)."""
        found = {}
        for key in [key for key in self._waiting if key[0] == model]:
            live = {p: at for p, at in self._waiting[key].items() if now - at < self._wait}
            if live:
                self._waiting[key] = live
                found[key[1]] = frozenset(live)
            else:
                del self._waiting[key]
        return found

    def reclaimed_places(self, model: str, now: float) -> list[tuple[bytes, tuple[Range, ...]]]:
        """(principal, ranges) of each route of `model` reclaimed within the last grace."""
        while self._reclaimed and self._reclaimed[0][0] <= now:
            self._reclaimed.popleft()  # in order of expiry: every grace is the same length
        return [(principal, ranges) for until, m, principal, ranges in self._reclaimed if m == model]


class Share(NamedTuple):
    """A principal at its share of one range."""

    held: int  # its places there
    share: int
    sessions: int  # the range's capacity


def over_share(principal: bytes, model: str, sessions: Iterable[SessionRecord], nodes: Iterable[NodeRecord],
               contention: Contention, now: float, weight: Weight = lambda key: 1.0) -> dict[Range, Share]:
    """The ranges of `model` where `principal` may take no more places now. `sessions`: the open
    routes but the one being routed; `nodes`: those a route may use (routable, live, not
    draining, banned or quarantined); `weight`: each principal's (module docstring)."""
    waiting = contention.waiting(model, now)
    if not any(principals - {principal} for principals in waiting.values()):
        return {}  # nobody else waits: the common case costs no more than this
    capacity: dict[Range, Optional[int]] = {}
    for node in nodes:
        at = (node.info.layers.start, node.info.layers.end)
        limit = node.info.capacity.max_sessions if node.info.capacity else 0
        counted = capacity.get(at, 0)
        capacity[at] = None if counted is None or not limit else counted + limit  # 0: no limit
    places: dict[Range, collections.Counter[bytes]] = collections.defaultdict(collections.Counter)
    for session in sessions:
        if session.model == model:
            for at in ranges_of(session.hops):
                places[at][session.client_key] += 1
    for holder, ranges in contention.reclaimed_places(model, now):
        for at in ranges:
            places[at][holder] += 1
    return shares(principal, capacity, places, waiting, weight)


def shares(principal: bytes, capacity: Mapping[Range, Optional[int]], places: Mapping[Range, Mapping[bytes, int]],
           waiting: Mapping[Range, frozenset[bytes]], weight: Weight = lambda key: 1.0) -> dict[Range, Share]:
    """The rule itself: the ranges where `principal` holds its share while others wait.
    `capacity`: sessions per range (None: no limit); `places`: the places each principal holds
    per range; `waiting`: who waits for each range; `weight`: each principal's (at least 1)."""
    over = {}
    for at, sessions in capacity.items():
        others = waiting.get(at, frozenset()) - {principal}
        if sessions is None or not others:
            continue
        holders = places.get(at, {})
        counted = {p for p, held in holders.items() if held > 0} | {principal}
        total = sum(max(1.0, weight(p)) for p in counted) + (1.0 if others - counted else 0.0)
        share = max(1, math.ceil(sessions * max(1.0, weight(principal)) / total))  # at least 1
        held = holders.get(principal, 0)
        if held >= share:
            over[at] = Share(held, share, sessions)
    return over


def ranges_of(hops: Iterable[tt.Hop]) -> list[Range]:
    """The registered ranges of the nodes a route's hops are on."""
    return [(h.node.layers.start, h.node.layers.end) for h in hops if h.node.layers is not None]
