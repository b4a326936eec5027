"""Route selection: the cheapest chain of hops over layer boundaries (Dijkstra).

Pure functions over `Candidate`s; the registry builds the candidates (routable, alive, not
draining, not banned, with capacity) and calls `find_route`. A node serving [s, e) whose backend
can run a suffix (`runs_suffix`: the reference shard) may be entered at any b with s <= b < e (its
effective start b), so overlapping ranges chain; a GGUF node (the worker runs its whole range) is
entered only at s, so overlapping GGUF ranges chain only at exact boundaries. Each candidate
names the compute backend it was admitted under (`backend`, ADR 0014); `find_route` may be told
which sets of backends one route may combine (`combinations`: every backend alone, and a mix only
where the model's entry certifies its cross-backend agreement). Invariants: a returned route
covers [0, n_layer) exactly once, in order, and its backends lie within one allowed combination;
equal inputs give the same route (ties break on hop count, then the node ids along the path).
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Optional, Sequence

from meshnet.wire.ids import NodeId

DEFAULT_SECONDS_PER_LAYER = 0.001  # compute estimate before any candidate reports telemetry
HOP_OVERHEAD_SECONDS = 0.002  # serialisation + one network latency on loopback/LAN


@dataclasses.dataclass(frozen=True)
class Candidate:
    node_id: NodeId
    start: int  # registered range [start, end)
    end: int
    seconds_per_layer: float = DEFAULT_SECONDS_PER_LAYER  # from telemetry (decode tok/s)
    rtt_seconds: float = HOP_OVERHEAD_SECONDS  # measured or hinted round trip to the node
    load: float = 0.0  # 0 = idle; active sessions / max sessions, queue pressure
    runs_suffix: bool = False  # the backend can start at any layer of its range (effective start)
    backend: str = "cpu"  # the compute backend of the recipe the node was admitted under (ADR 0014)
    measured: bool = False  # seconds_per_layer is the node's telemetry, not an estimate


@dataclasses.dataclass(frozen=True)
class RouteHop:
    node_id: NodeId
    start: int  # effective start
    end: int


class NoRouteError(Exception):
    """No chain covers [0, n_layer); `uncovered` lists the missing [start, end) ranges."""

    def __init__(self, uncovered: list[tuple[int, int]], reached: int = 0, unmixed: bool = False) -> None:
        self.uncovered = uncovered
        if unmixed:
            message = ("no route: every layer is served, but not by nodes of one compute backend (or of a mix the "
                       "model's entry certifies): a route does not mix backends without a certified agreement")
        elif uncovered:
            message = f"no route: layers {describe_layers(uncovered)} are not covered by any available node"
        else:
            message = (f"no route: every layer is served, but no chain of nodes gets past layer {reached} "
                       "(GGUF nodes run only from their registered start, so their ranges must meet exactly)")
        super().__init__(message)


def describe_layers(ranges: Sequence[tuple[int, int]]) -> str:
    """[(10, 20), (25, 26)] -> "10..19, 25"."""
    return ", ".join(f"{s}..{e - 1}" if e - s > 1 else str(s) for s, e in ranges)


def hop_cost(c: Candidate, start: int) -> float:
    return (c.end - start) * c.seconds_per_layer * (1.0 + c.load) + c.rtt_seconds


def uncovered_ranges(candidates: Sequence[Candidate], n_layer: int) -> list[tuple[int, int]]:
    covered = [False] * n_layer
    for c in candidates:
        for layer in range(max(0, c.start), min(n_layer, c.end)):
            covered[layer] = True
    return gaps(covered)


def gaps(covered: Sequence[bool]) -> list[tuple[int, int]]:
    """The [start, end) runs of layers whose `covered` is False."""
    found, start = [], None
    for layer, ok in enumerate([*covered, True]):
        if not ok and start is None:
            start = layer
        elif ok and start is not None:
            found.append((start, layer))
            start = None
    return found


def find_route(candidates: Sequence[Candidate], n_layer: int,
               combinations: Optional[Sequence[frozenset[str]]] = None) -> list[RouteHop]:
    """The cheapest chain from boundary 0 to boundary n_layer; raises NoRouteError.

    `combinations`: the sets of backends one route may combine (None: any). Each is searched on
    its own and the cheapest route wins (ties: fewer hops, then the node ids along the path)."""
    if n_layer <= 0:
        raise ValueError(f"n_layer must be positive, got {n_layer}")
    candidates = estimated(candidates)
    if combinations is None:
        found, reached = _cheapest(candidates, n_layer)
        if found is None:
            raise NoRouteError(uncovered_ranges(_usable(candidates, n_layer), n_layer), reached)
        return found[-1]
    routes = [found for allowed in combinations
              if (found := _cheapest([c for c in candidates if c.backend in allowed], n_layer)[0]) is not None]
    if routes:
        return min(routes, key=lambda found: found[:3])[-1]
    found, reached = _cheapest(candidates, n_layer)
    if found is not None:
        raise NoRouteError([], unmixed=True)
    raise NoRouteError(uncovered_ranges(_usable(candidates, n_layer), n_layer), reached)


def estimated(candidates: Sequence[Candidate]) -> list[Candidate]:
    """`candidates`, each unmeasured one (no telemetry yet) costed at the median measured speed
    of the nodes serving the same range (the layers a range holds, the output head of the last
    one, make ranges unlike), else of all measured ones: a fixed guess for a new node beat every
    measured node of a loaded swarm, and sent routes over relayed hops a direct one would have
    served as fast."""
    measured = [c for c in candidates if c.measured]
    if not measured:
        return list(candidates)

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    overall = median([c.seconds_per_layer for c in measured])
    out = []
    for c in candidates:
        if not c.measured:
            peers = [m.seconds_per_layer for m in measured if (m.start, m.end) == (c.start, c.end)]
            c = dataclasses.replace(c, seconds_per_layer=median(peers) if peers else overall)
        out.append(c)
    return out


def _usable(candidates: Sequence[Candidate], n_layer: int) -> list[Candidate]:
    return [c for c in candidates if 0 <= c.start < c.end <= n_layer]


def _cheapest(candidates: Sequence[Candidate], n_layer: int
              ) -> tuple[Optional[tuple[float, int, tuple[NodeId, ...], list[RouteHop]]], int]:
    """((cost, hop count, node ids, hops) of the cheapest chain over `candidates`, or None; the
    farthest boundary a chain reaches).

    Of the candidates that could make the same hop (entered at one boundary, leaving at one),
    only the cheapest (then the smallest node id) can be on the answer: they are reduced to it
    first, so the search costs O(candidates + hops log hops) rather than a heap entry per
    candidate and a list entry per candidate and layer."""
    usable = _usable(candidates, n_layer)
    best: dict[tuple[int, int], tuple[float, NodeId]] = {}  # (entry, exit) -> (cost, node id)
    for c in usable:
        for entry in (range(c.start, c.end) if c.runs_suffix else (c.start,)):
            key, offer = (entry, c.end), (hop_cost(c, entry), c.node_id)
            held = best.get(key)
            if held is None or offer < held:
                best[key] = offer
    edges: list[list[tuple[int, float, NodeId]]] = [[] for _ in range(n_layer)]
    for (entry, end), (cost, node_id) in best.items():
        edges[entry].append((end, cost, node_id))
    # Priority: (cost, hop count, node ids so far); the path itself rides along for the answer.
    queue: list[tuple[float, int, tuple[NodeId, ...], int, tuple[RouteHop, ...]]] = [(0.0, 0, (), 0, ())]
    settled: set[int] = set()
    while queue:
        cost, hops, ids, boundary, path = heapq.heappop(queue)
        if boundary == n_layer:
            return (cost, hops, ids, list(path)), n_layer
        if boundary in settled:
            continue
        settled.add(boundary)
        for end, step, node_id in edges[boundary]:
            if end not in settled:
                hop = RouteHop(node_id, boundary, end)
                heapq.heappush(queue, (cost + step, hops + 1, ids + (node_id,), end, path + (hop,)))
    return None, max(settled, default=0)
