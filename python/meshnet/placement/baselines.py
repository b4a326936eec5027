"""Two placements the planner is compared with, as their projects describe them.

- `memory_proportional` (exo's placement in code, llama.cpp RPC's tensor split, Mesh-LLM's
  default): nodes in id order form a group until their memory holds the model, and each takes
  layers in proportion to its memory, in that order; groups repeat, model after model, until
  the nodes run out. Speed plays no part (peers-2026-12b.md, section 3: exo's "feasibility, not
  speed").
- `petals_least_served` (Petals' block_selection.py): nodes join in id order; each takes as many
  consecutive layers as its memory holds, of the model whose least-served layer is served least,
  at the window whose throughputs, sorted, are lexicographically least (`_choose_best_start`).
  Its routes may enter a node inside its window (Petals' servers run any span).

Both reserve the same KV as the planner (targets) and run on each node's largest device. Both
are re-run from scratch when nodes leave (re-tiling), as their projects do.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from meshnet.placement.fleet import ModelShape, NodeOffer, Targets, check_fleet
from meshnet.placement.plans import PRIMARY, REPLICA, Assignment, LeftOut, Plan
from meshnet.placement.routes import compute_seconds, model_routes


def _largest_device(node: NodeOffer):
    return max(node.devices, key=lambda d: (d.memory_bytes, d.backend))


def _split(model: ModelShape, group: Sequence[NodeOffer], kv_tokens: int) -> list[tuple[int, int]] | None:
    """Layers in proportion to memory (largest remainders), in group order; None if a stage's
    range does not fit its node or a node would get no layer."""
    budgets = [float(_largest_device(n).memory_bytes) for n in group]
    shares = [model.n_layer * b / sum(budgets) for b in budgets]
    counts = [math.floor(s) for s in shares]
    for i in sorted(range(len(group)), key=lambda i: (counts[i] - shares[i], i))[: model.n_layer - sum(counts)]:
        counts[i] += 1
    if 0 in counts:
        return None
    bounds = np.cumsum([0] + counts)
    ranges = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    fits = all(model.memory_bytes(a, b, kv_tokens) <= budget for (a, b), budget in zip(ranges, budgets))
    return ranges if fits else None


def _group(model: ModelShape, queue: list[NodeOffer],
           kv_tokens: int) -> tuple[list[NodeOffer], list[tuple[int, int]]] | None:
    """The shortest prefix of `queue` whose memory-proportional split fits, or None."""
    need = model.memory_bytes(0, model.n_layer, kv_tokens)
    total = 0.0
    for size, node in enumerate(queue, start=1):
        total += _largest_device(node).memory_bytes
        if total >= need:
            ranges = _split(model, queue[:size], kv_tokens)
            if ranges is not None:
                return queue[:size], ranges
    return None


def memory_proportional(models: Iterable[ModelShape], nodes: Iterable[NodeOffer], targets: Targets) -> Plan:
    models, nodes = tuple(models), tuple(sorted(nodes, key=lambda n: n.node_id))
    check_fleet(models, nodes)
    queue = list(nodes)
    routes_left = {m.name: math.inf if targets.replicas is None else 1 + targets.replicas for m in models}
    assignments: list[Assignment] = []
    served: set[str] = set()
    active = sorted(models, key=lambda m: (-m.total_bytes(), m.name))
    while active and queue:
        still = []
        for model in active:
            found = _group(model, queue, targets.kv_tokens) if routes_left[model.name] > 0 else None
            if found is None:
                continue
            group, ranges = found
            role = REPLICA if model.name in served else PRIMARY
            served.add(model.name)
            for node, (a, b) in zip(group, ranges):
                assignments.append(Assignment(node.node_id, model.name, a, b, _largest_device(node).backend, role,
                                              "memory-proportional share of its group"))
            taken = {n.node_id for n in group}
            queue = [n for n in queue if n.node_id not in taken]
            routes_left[model.name] -= 1
            still.append(model)
        active = still
    left = [LeftOut(n.node_id, "memory-proportional: no group left to join") for n in queue]
    return _plan(models, nodes, assignments, left, targets.sessions, suffix_entry=False)


def petals_least_served(models: Iterable[ModelShape], nodes: Iterable[NodeOffer], targets: Targets) -> Plan:
    models, nodes = tuple(models), tuple(sorted(nodes, key=lambda n: n.node_id))
    check_fleet(models, nodes)
    throughput = {m.name: np.zeros(m.n_layer) for m in models}
    holders = {m.name: np.zeros(m.n_layer, dtype=np.int64) for m in models}
    cap = math.inf if targets.replicas is None else 1 + targets.replicas
    assignments, left = [], []
    for node in nodes:
        device = _largest_device(node)
        options = sorted((float(throughput[m.name].min()), m.name, m) for m in models
                         if holders[m.name].min() < cap and device.memory_bytes >= _layer_memory(m, targets.kv_tokens))
        window = None
        for _, _, model in options:
            window = _window(model, device.memory_bytes, targets.kv_tokens, throughput[model.name])
            if window is not None:
                break
        if window is None:
            left.append(LeftOut(node.node_id, "Petals' rule: no model's window fits or needs it"))
            continue
        a, b = window
        seconds = compute_seconds(model, node, device.backend, a, b) + node.hop_seconds(model.activation_bytes)
        throughput[model.name][a:b] += 1.0 / seconds
        holders[model.name][a:b] += 1
        assignments.append(Assignment(node.node_id, model.name, a, b, device.backend, REPLICA,
                                      "Petals' rule: the least-served window its memory holds"))
    return _plan(models, nodes, assignments, left, targets.sessions, suffix_entry=True)


def _layer_memory(model: ModelShape, kv_tokens: int) -> int:
    return max(model.layer_bytes) + kv_tokens * max(model.kv_bytes_per_token)


def _window(model: ModelShape, budget: int, kv_tokens: int, throughput: np.ndarray) -> tuple[int, int] | None:
    """Petals' window: as many layers as `budget` holds (fewer at the model's ends, where the
    embeddings or head share the memory), at the start whose throughputs, sorted, are
    lexicographically least (ties: the lower start)."""
    n = model.n_layer
    if model.memory_bytes(0, n, kv_tokens) <= budget:
        return 0, n
    cumulative = np.r_[0, np.cumsum(np.asarray(model.layer_bytes, dtype=np.float64)
                                    + kv_tokens * np.asarray(model.kv_bytes_per_token, dtype=np.float64))]
    first = min(n - 1, int(np.searchsorted(cumulative, budget - model.embedding_bytes, side="right")) - 1)
    last = n - int(np.searchsorted(cumulative, cumulative[n] + model.output_bytes - budget, side="left"))
    last = min(n - 1, last)
    size = min(n, budget // _layer_memory(model, kv_tokens))
    windows = [(a, a + size) for a in range(1, n - size)] if size >= 1 else []
    windows += [(0, first)] if first >= 1 else []
    windows += [(n - last, n)] if last >= 1 else []
    windows.sort()
    if not windows:
        return None
    width = max(b - a for a, b in windows)
    keys = np.full((len(windows), width), np.inf)
    for row, (a, b) in enumerate(windows):
        keys[row, : b - a] = np.sort(throughput[a:b])
    order = np.lexsort(tuple(keys[:, k] for k in range(width - 1, -1, -1)))  # stable: ties keep the lower start
    return windows[int(order[0])]


def _plan(models: Sequence[ModelShape], nodes: Sequence[NodeOffer], assignments: list[Assignment],
          left: list[LeftOut], sessions: int, suffix_entry: bool) -> Plan:
    by_id = {n.node_id: n for n in nodes}
    routes = []
    for model in sorted(models, key=lambda m: m.name):
        routes.extend(model_routes(model, by_id, assignments, sessions, suffix_entry=suffix_entry))
    return Plan(tuple(sorted(assignments, key=lambda a: a.node_id)), tuple(sorted(left, key=lambda o: o.node_id)),
                tuple(routes), (), sessions, ())
