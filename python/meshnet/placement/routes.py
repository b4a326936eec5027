"""The routes a placement can serve, and their predicted times: one evaluator for the planner,
the baselines and the simulator, so that every placement is judged by the same rule.

A route takes one holder per stage, each entered at the layer where the previous one ended
(GGUF nodes run their whole range, tracker/routing.py); with `suffix_entry` a holder may also
be entered anywhere inside its range and run to its end (Petals' servers; Meshnet's reference
shard). Routes are taken greedily: the route with the least single-stream time per token over
the holders not yet used, then the next, until no chain is left; each node serves at most one
route. Where a model's ranges tile its layers (the planner's and memory-proportional
placements), that is the fastest holder of each range, then the next fastest, and so on.

A stage's time is its compute (measured seconds per weight byte times its layers' bytes, plus
the head on the last stage) plus its hop to the next stage: the pairwise link figure where the
node has one, its default otherwise; the last stage's hop is back to the client.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

from meshnet.placement.fleet import ModelShape, NodeId, NodeOffer
from meshnet.placement.plans import Assignment, Hop, Route


def device_of(node: NodeOffer, backend: str):
    """The node's first device with `backend` (the one an assignment runs on)."""
    for device in node.devices:
        if device.backend == backend:
            return device
    raise ValueError(f"node {node.node_id} has no {backend} device")


def compute_seconds(model: ModelShape, node: NodeOffer, backend: str, start: int, end: int) -> float:
    """Decode seconds per token of layers [start, end) (and the head, if last) on that device."""
    weights = sum(model.layer_bytes[start:end]) + (model.output_bytes if end == model.n_layer else 0)
    return device_of(node, backend).seconds_per_byte(model) * weights


def timed_route(model: ModelShape, nodes: Mapping[NodeId, NodeOffer], stages: Sequence[tuple[Assignment, int]],
                sessions: int) -> Route:
    """The route through `stages` ((assignment, entry layer), in order), timed with pairwise hops."""
    hops = []
    for i, (assignment, entry) in enumerate(stages):
        node = nodes[assignment.node_id]
        following = stages[i + 1][0].node_id if i + 1 < len(stages) else None
        seconds = (compute_seconds(model, node, assignment.backend, entry, assignment.end)
                   + node.hop_seconds(model.activation_bytes, following))
        hops.append(Hop(assignment.node_id, entry, assignment.end, seconds))
    decode = sum(h.stage_seconds for h in hops)
    bottleneck = max(h.stage_seconds for h in hops)
    return Route(model.name, tuple(hops), decode, bottleneck, sessions / max(decode, sessions * bottleneck))


def model_routes(model: ModelShape, nodes: Mapping[NodeId, NodeOffer], assignments: Sequence[Assignment],
                 sessions: int, suffix_entry: bool = False) -> list[Route]:
    """Every route the holders of `model` in `assignments` form, greedily (module docstring)."""
    mine = sorted((a for a in assignments if a.model == model.name), key=lambda a: a.node_id)
    if not mine:
        return []
    ranges = sorted({(a.start, a.end) for a in mine})
    if all(b[0] == a[1] for a, b in zip(ranges, ranges[1:])) and ranges[0][0] == 0 and ranges[-1][1] == model.n_layer:
        return _tiled_routes(model, nodes, mine, ranges, sessions)
    return _greedy_routes(model, nodes, mine, sessions, suffix_entry)


def _stage_cost(model: ModelShape, node: NodeOffer, assignment: Assignment, entry: int) -> float:
    return (compute_seconds(model, node, assignment.backend, entry, assignment.end)
            + node.hop_seconds(model.activation_bytes))


def _tiled_routes(model: ModelShape, nodes: Mapping[NodeId, NodeOffer], mine: list[Assignment],
                  ranges: list[tuple[int, int]], sessions: int) -> list[Route]:
    holders = {r: [] for r in ranges}
    for a in mine:
        holders[(a.start, a.end)].append((_stage_cost(model, nodes[a.node_id], a, a.start), a.node_id, a))
    for entries in holders.values():
        entries.sort(key=lambda e: (e[0], e[1]))
    count = min(len(entries) for entries in holders.values())
    return [timed_route(model, nodes, [(holders[r][k][2], r[0]) for r in ranges], sessions) for k in range(count)]


def _greedy_routes(model: ModelShape, nodes: Mapping[NodeId, NodeOffer], mine: list[Assignment],
                   sessions: int, suffix_entry: bool) -> list[Route]:
    entering: list[list[tuple[int, float]]] = [[] for _ in range(model.n_layer)]  # per layer: (holder, cost)
    for index, a in enumerate(mine):
        for entry in (range(a.start, a.end) if suffix_entry else (a.start,)):
            entering[entry].append((index, _stage_cost(model, nodes[a.node_id], a, entry)))
    used = [False] * len(mine)
    routes = []
    while True:
        path = _cheapest_path(model.n_layer, entering, mine, used)
        if path is None:
            return routes
        for index, _ in path:
            used[index] = True
        routes.append(timed_route(model, nodes, [(mine[i], entry) for i, entry in path], sessions))


def _cheapest_path(n_layer: int, entering: list[list[tuple[int, float]]], mine: list[Assignment],
                   used: list[bool]) -> Optional[list[tuple[int, int]]]:
    """(holder, entry layer) along the least-cost chain from layer 0 to n_layer, or None.
    Ties break on the lower holder index (holders are sorted by node id)."""
    best = [math.inf] * (n_layer + 1)
    back: list[Optional[tuple[int, int, int]]] = [None] * (n_layer + 1)  # (holder, entry, previous layer)
    best[0] = 0.0
    for layer in range(n_layer):
        if math.isinf(best[layer]):
            continue
        for index, cost in entering[layer]:
            if used[index]:
                continue
            end = mine[index].end
            if best[layer] + cost < best[end]:
                best[end] = best[layer] + cost
                back[end] = (index, layer, layer)
    if math.isinf(best[n_layer]):
        return None
    path, layer = [], n_layer
    while layer:
        index, entry, previous = back[layer]
        path.append((index, entry))
        layer = previous
    return path[::-1]
