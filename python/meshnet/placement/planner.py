"""The placement planner: a pure function from models, node offers and targets to a Plan.

Called by the tracker (when a node joins, leaves, fails probation, or measured stage times
drift; through stickiness.replan) and by the simulator. No I/O, no clock; equal inputs give
equal plans (nodes are taken in id order and every tie breaks on it).

Objective, in order (issue 51):
1. Cover every layer of every model: each model gets a primary route (chain.best_chain) from the
   nodes still free, models with the most weight bytes first (then by name); a model no chain
   of the free nodes can hold gets a Shortfall naming the layers left and the memory short.
2. Balance: the primary route's slowest stage is as fast as it can be for its stage count, and
   the stage count gives the least per-stream time per token max(D, sessions x T); a node that
   would make that worse, and is not needed for memory, is left out of the primary route (its
   note says why) and may still serve as a replica.
3. Replicas (replicas.water_fill): the remaining nodes hold the primary routes' ranges, evenly,
   up to 1 + targets.replicas holders per range.
4. Stickiness: among equally served ranges a replica takes one it holds on disk; moving nodes
   between plans is weighed by stickiness.replan.

Exact: one model's primary route over the nodes it is searched among (chain.py says under what
conditions). Heuristic: the order in which models take nodes (largest first), the candidate
pruning for a large fleet (a model's route is searched among the fastest, the largest and the
most efficient n_layer + 2 free nodes of each kind, when more are free than three times that),
replicas (water-filling over fixed ranges), nodes with several devices (each stage runs on one
device; a node never splits its range over two), and pairwise link figures (used to time routes,
not to choose them). `Plan.notes` records where pruning or a conservative count applied.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from meshnet.placement.capacity import FleetTable, Pool, build_pool, fleet_table, row_layers
from meshnet.placement.chain import best_chain
from meshnet.placement.fleet import GIB, ModelShape, NodeOffer, Targets, check_fleet
from meshnet.placement.plans import PRIMARY, REPLICA, Assignment, LeftOut, Plan, Shortfall
from meshnet.placement.replicas import Slot, slots_of, water_fill
from meshnet.placement.routes import model_routes

_PRUNE_FACTOR = 3  # search a model's route among all free nodes while they are at most this many times n_layer + 2


def plan(models: Iterable[ModelShape], nodes: Iterable[NodeOffer], targets: Targets) -> Plan:
    """The plan for serving `models` on `nodes` toward `targets` (module docstring)."""
    models, nodes = tuple(models), tuple(sorted(nodes, key=lambda n: n.node_id))
    check_fleet(models, nodes)
    table = fleet_table(nodes)
    per_byte = {m.name: table.seconds_per_byte(m) for m in models}
    free = np.ones(len(nodes), dtype=bool)
    assignments: list[Assignment] = []
    shortfalls: list[Shortfall] = []
    notes: list[str] = []
    slots: list[Slot] = []
    bottlenecks: dict[str, float] = {}
    for model in sorted(models, key=lambda m: (-m.total_bytes(), m.name)):
        candidates, pruned = _candidates(table, model, np.flatnonzero(free), targets.kv_tokens, per_byte[model.name])
        pool = build_pool(table, model, candidates, targets.kv_tokens)
        chain = best_chain(pool, targets.sessions) if len(candidates) else None
        if chain is None:
            shortfalls.append(_shortfall(pool, int(free.sum())))
            continue
        if pruned:
            notes.append(f"{model.name}: primary route searched among {len(candidates)} of {int(free.sum())} free "
                         "nodes (the fastest, largest and most efficient); exact within them only")
        if not chain.exact:
            notes.append(f"{model.name}: layers counted conservatively (unlike layers, or no stage with room for "
                         "the embeddings beside its layers); the primary route may not be the least bottleneck")
        for stage, (row, (start, end)) in enumerate(zip(chain.rows, chain.ranges())):
            node = pool.nodes[int(pool.row_node[row])]
            free[candidates[int(pool.row_node[row])]] = False
            backend = node.devices[int(pool.row_device[row])].backend
            note = (f"primary route of {model.name}, stage {stage + 1} of {len(chain.rows)}: predicted "
                    f"{chain.decode_seconds * 1e3:.3f} ms per token, slowest stage {chain.bottleneck_seconds * 1e3:.3f} ms")
            assignments.append(Assignment(node.node_id, model.name, start, end, backend, PRIMARY, note))
        slots.extend(slots_of(model, chain.ranges(), targets.kv_tokens))
        bottlenecks[model.name] = chain.bottleneck_seconds
    placed, reasons = water_fill(table, slots, list(np.flatnonzero(free)), targets.replicas, per_byte)
    for p in placed:
        slot = slots[p.slot]
        node = table.nodes[p.node]
        backend = node.devices[int(table.row_device[p.row])].backend
        note = _replica_note(table, p.row, slot, per_byte[slot.model.name], bottlenecks[slot.model.name])
        assignments.append(Assignment(node.node_id, slot.model.name, slot.start, slot.end, backend, REPLICA, note))
    left_out = [LeftOut(table.nodes[n].node_id, reason) for n, reason in reasons.items()]
    return _assemble(models, nodes, assignments, left_out, shortfalls, targets.sessions, notes)


def _assemble(models: Sequence[ModelShape], nodes: Sequence[NodeOffer], assignments: list[Assignment],
              left_out: list[LeftOut], shortfalls: list[Shortfall], sessions: int, notes: list[str]) -> Plan:
    by_id = {n.node_id: n for n in nodes}
    routes = []
    for model in sorted(models, key=lambda m: m.name):
        routes.extend(model_routes(model, by_id, assignments, sessions))
    return Plan(tuple(sorted(assignments, key=lambda a: a.node_id)), tuple(sorted(left_out, key=lambda o: o.node_id)),
                tuple(routes), tuple(sorted(shortfalls, key=lambda s: s.model)), sessions, tuple(notes))


def _candidates(table: FleetTable, model: ModelShape, free: np.ndarray, kv_tokens: int,
                per_byte: np.ndarray) -> tuple[np.ndarray, bool]:
    """The free nodes a model's primary route is searched among, and whether that is a pruned
    subset: when many are free, the n_layer + 2 fastest, largest and most efficient (least
    seconds per layer at their memory's full load, hop included) of each kind."""
    keep = model.n_layer + 2
    if len(free) <= _PRUNE_FACTOR * keep:
        return free, False
    rows = np.flatnonzero(np.isin(table.row_node, free))
    layer_memory = max(model.layer_bytes) + kv_tokens * max(model.kv_bytes_per_token)
    held = np.clip(np.floor(table.memory[rows] / layer_memory), 0, model.n_layer)
    seconds = per_byte[rows] * max(model.layer_bytes)
    hop = table.rtt[rows] + model.activation_bytes / table.bandwidth[rows]
    useful = held >= 1
    rows, held, seconds, hop = rows[useful], held[useful], seconds[useful], hop[useful]
    chosen: set[int] = set()
    for key in (seconds, -held, seconds + hop / np.maximum(held, 1)):
        top = rows[np.argsort(key, kind="stable")[:keep]]
        chosen.update(int(n) for n in table.row_node[top])
    return np.asarray(sorted(chosen), dtype=np.int64), True


def _shortfall(pool: Pool, free_count: int) -> Shortfall:
    """Why no chain of the pool holds the model: the most layers one chain of it could hold."""
    model = pool.model
    holds, can_be_last = 0, False
    if len(pool.nodes):
        mid_rows, last_rows, only_rows = row_layers(pool, float("inf"))
        mid, last = np.zeros(len(pool.nodes), dtype=np.int64), np.zeros(len(pool.nodes), dtype=np.int64)
        np.maximum.at(mid, pool.row_node, mid_rows)
        np.maximum.at(last, pool.row_node, last_rows)
        can_be_last = bool((last >= 1).any())
        through = np.where(last >= 1, last + mid.sum() - mid, 0)
        holds = min(model.n_layer - 1, max(int(only_rows.max()), int(through.max())))
    missing = model.n_layer - holds
    short = missing * pool.layer_memory + (0 if can_be_last else model.output_bytes)
    reason = (f"the {free_count} free nodes hold at most {holds} of its {model.n_layer} layers in one chain "
              f"(a layer needs {pool.layer_memory / GIB:.3f} GiB with KV for {pool.kv_tokens} tokens"
              f"{'' if can_be_last else '; no node has room for the head'}); "
              f"about {short / GIB:.2f} GiB more memory is needed")
    return Shortfall(model.name, (holds, model.n_layer), int(short), reason)


def _replica_note(table: FleetTable, row: int, slot: Slot, per_byte: np.ndarray, bottleneck: float) -> str:
    model = slot.model
    one_layer = float(per_byte[row]) * max(model.layer_bytes) + float(table.rtt[row]) + \
        model.activation_bytes / float(table.bandwidth[row])
    why = (f"one layer on it takes {one_layer * 1e3:.3f} ms with its hop, more than the primary route's slowest "
           f"stage ({bottleneck * 1e3:.3f} ms)" if one_layer > bottleneck else
           "the primary route is as fast or faster per token without it")
    return f"replica of {model.name} [{slot.start}, {slot.end}); not in the primary route: {why}"
