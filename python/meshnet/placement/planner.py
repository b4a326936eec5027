"""The placement planner: a pure function from models, node offers and targets to a Plan.

Called by the tracker (when a node joins, leaves, fails probation, or measured stage times
drift; through stickiness.replan) and by the simulator. No I/O, no clock; equal inputs give
equal plans whatever their order (nodes are taken in id order and every tie breaks on it).

Objective, in order (issue 51):
1. Cover every layer of every model: each model gets a primary route (chain.best_chain) from the
   nodes still free, models with the most weight bytes first (then by name). A model that no
   chain of the free nodes can hold gets a Shortfall naming the layers left and the memory short.
2. Balance: for each stage count the primary route's slowest stage is as fast as it can be
   (exact), and the stage count is chosen for the most estimated tokens/s: the route's
   sessions / max(D, sessions x T) times the routes the free nodes could fill with its ranges
   (with one route wanted, simply the least per-token time). A node that would make that worse,
   and is not needed for memory, is left out of the primary route (its note says why) and may
   still serve as a replica.
3. Replicas (replicas.water_fill): the remaining nodes hold the planned ranges, evenly, as many
   as complete routes; nodes that complete none form the next round's routes with ranges of
   their own (at most _MAX_ROUNDS rounds, only while targets.replicas is None); what is left
   becomes failover spares, up to 1 + targets.replicas holders per range.
4. Stickiness: among equally served ranges a replica takes one it holds on disk; moving nodes
   between plans is weighed by stickiness.replan.

Exact: one model's primary route for each stage count over the nodes it is searched among
(chain.py says under what conditions). Heuristic: the choice of stage count when several routes
are wanted (an estimate that takes every replica route to be as fast as the primary), the order
in which models take nodes (largest first, each with a fair share of the free nodes in that
estimate), the candidate pruning for a large fleet (a model's route is searched among the
fastest, the largest and the most efficient n_layer + 2 free nodes of each kind, when more than
three times that are free), replicas and rounds, nodes with several devices (a stage runs on one
device; a node never splits its range over two) and pairwise link figures (used to time routes,
not to choose them). `Plan.notes` records where pruning or a conservative count applied.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from meshnet.placement.capacity import FleetTable, Pool, build_pool, fleet_table
from meshnet.placement.chain import FleetShare, best_chain, most_layers
from meshnet.placement.fleet import GIB, ModelShape, NodeOffer, Targets, check_fleet
from meshnet.placement.plans import PRIMARY, REPLICA, Assignment, LeftOut, Plan, Shortfall
from meshnet.placement.replicas import Placed, Slot, fillable_routes, slots_of, water_fill
from meshnet.placement.routes import model_routes

_PRUNE_FACTOR = 3  # search a model's route among all free nodes while they are at most this many times n_layer + 2
_MAX_ROUNDS = 4  # rounds of routes (each followed by replicas) while targets.replicas is None
_NO_ROUTE = "no route of the remaining free nodes holds any model, and no planned range fits it"


def plan(models: Iterable[ModelShape], nodes: Iterable[NodeOffer], targets: Targets) -> Plan:
    """The plan for serving `models` on `nodes` toward `targets` (module docstring)."""
    models, nodes = tuple(models), tuple(sorted(nodes, key=lambda n: n.node_id))
    check_fleet(models, nodes)
    table = fleet_table(nodes)
    state = _State(table, targets, {m.name: table.seconds_per_byte(m) for m in models})
    order = sorted(models, key=lambda m: (-m.total_bytes(), m.name))
    wanted = np.inf if targets.replicas is None else 1 + targets.replicas
    for round_ in range(_MAX_ROUNDS if targets.replicas is None else 1):
        slots = [slot for i, model in enumerate(order) for slot in state.route(model, round_, len(order) - i)]
        if not slots:
            break
        state.fill(slots, np.asarray([min(wanted, 1 + _fillable(state, slots, s.model)) for s in slots]))
    state.fill(state.slots, np.full(len(state.slots), wanted))  # failover spares for whatever is left
    left_out = [LeftOut(table.nodes[n].node_id, state.reasons.get(n, _NO_ROUTE)) for n in np.flatnonzero(state.free)]
    return _assemble(models, nodes, state.assignments, left_out, state.shortfalls, targets.sessions, state.notes)


class _State:
    """What the plan has so far (plan() only)."""

    def __init__(self, table: FleetTable, targets: Targets, per_byte: dict[str, np.ndarray]) -> None:
        self.table, self.targets, self.per_byte = table, targets, per_byte
        self.free = np.ones(len(table.nodes), dtype=bool)
        self.memory = table.node_memory()
        self.assignments: list[Assignment] = []
        self.shortfalls: list[Shortfall] = []
        self.notes: list[str] = []
        self.reasons: dict[int, str] = {}
        self.slots: list[Slot] = []  # every planned route's stage ranges, in the order planned
        self.holders = np.zeros(0, dtype=np.int64)  # per slot, its holders
        self.bottlenecks: dict[str, float] = {}

    def route(self, model: ModelShape, round_: int, models_left: int) -> list[Slot]:
        """A route for `model` from the free nodes (its primary in round 0); its stage ranges."""
        free = np.flatnonzero(self.free)
        kv_tokens = self.targets.kv_tokens
        candidates, pruned = _candidates(self.table, model, free, kv_tokens, self.per_byte[model.name])
        pool = build_pool(self.table, model, candidates, kv_tokens)
        most = float("inf") if self.targets.replicas is None else 1 + self.targets.replicas
        share = FleetShare(np.sort(self.memory[free]), max(1, len(free) // models_left), most)
        chain = best_chain(pool, self.targets.sessions, share) if len(candidates) else None
        if chain is None:
            if round_ == 0:
                self.shortfalls.append(_shortfall(pool, len(free)))
            return []
        if round_ == 0 and pruned:
            self.notes.append(f"{model.name}: primary route searched among {len(candidates)} of {len(free)} free "
                              "nodes (the fastest, largest and most efficient); exact within them only")
        if round_ == 0 and not chain.exact:
            self.notes.append(f"{model.name}: unlike layers, counted as the largest; the primary route fits but may "
                              "not have the least bottleneck")
        role = PRIMARY if round_ == 0 else REPLICA
        for stage, (row, (start, end)) in enumerate(zip(chain.rows, chain.ranges())):
            index = int(pool.row_node[row])
            self.free[candidates[index]] = False
            node = pool.nodes[index]
            what = f"primary route of {model.name}" if round_ == 0 else f"route {round_ + 1} of {model.name} " \
                "(nodes no range of an earlier route fits)"
            note = (f"{what}, stage {stage + 1} of {len(chain.rows)}: predicted {chain.decode_seconds * 1e3:.3f} ms "
                    f"per token, slowest stage {chain.bottleneck_seconds * 1e3:.3f} ms")
            backend = node.devices[int(pool.row_device[row])].backend
            self.assignments.append(Assignment(node.node_id, model.name, start, end, backend, role, note))
        self.bottlenecks.setdefault(model.name, chain.bottleneck_seconds)
        slots = slots_of(model, chain.ranges(), kv_tokens)
        self.slots.extend(slots)
        self.holders = np.concatenate((self.holders, np.ones(len(slots), dtype=np.int64)))
        return slots

    def fill(self, slots: list[Slot], caps: np.ndarray) -> None:
        """Water-fill the free nodes into `slots` (some of self.slots) up to `caps` holders each."""
        index = {id(s): i for i, s in enumerate(self.slots)}
        where = np.asarray([index[id(s)] for s in slots], dtype=np.int64)
        holders = self.holders[where]
        placed, self.reasons = water_fill(self.table, slots, holders, caps, list(np.flatnonzero(self.free)),
                                          self.per_byte)
        self.holders[where] = holders
        for p in placed:
            self.replica(slots[p.slot], p)

    def replica(self, slot: Slot, placed: Placed) -> None:
        node = self.table.nodes[placed.node]
        self.free[placed.node] = False
        backend = node.devices[int(self.table.row_device[placed.row])].backend
        note = _replica_note(self.table, placed.row, slot, self.per_byte[slot.model.name],
                             self.bottlenecks[slot.model.name])
        self.assignments.append(Assignment(node.node_id, slot.model.name, slot.start, slot.end, backend, REPLICA, note))


def _fillable(state: "_State", slots: list[Slot], model: ModelShape) -> int:
    """Routes of `model`'s new ranges the free nodes could complete."""
    needs = [s.need_bytes for s in slots if s.model is model]
    return fillable_routes(np.sort(state.memory[state.free]), needs)


def _assemble(models: Sequence[ModelShape], nodes: Sequence[NodeOffer], assignments: list[Assignment],
              left_out: list[LeftOut], shortfalls: list[Shortfall], sessions: int, notes: list[str]) -> Plan:
    by_id = {n.node_id: n for n in nodes}
    by_model: dict[str, list[Assignment]] = {}
    for a in assignments:
        by_model.setdefault(a.model, []).append(a)
    routes = []
    for model in sorted(models, key=lambda m: m.name):
        routes.extend(model_routes(model, by_id, by_model.get(model.name, []), sessions))
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
        chosen.update(int(n) for n in table.row_node[rows[_smallest(key, keep)]])
    return np.asarray(sorted(chosen), dtype=np.int64), True


def _smallest(key: np.ndarray, keep: int) -> np.ndarray:
    """Indices of the `keep` smallest keys; ties at the cut go to the lower index (lower node id)."""
    if len(key) <= keep:
        return np.arange(len(key))
    cut = np.partition(key, keep - 1)[keep - 1]
    below = np.flatnonzero(key < cut)
    return np.r_[below, np.flatnonzero(key == cut)[: keep - len(below)]]


def _shortfall(pool: Pool, free_count: int) -> Shortfall:
    """Why no chain of the pool holds the model: the most layers one chain of it could hold."""
    model = pool.model
    holds = min(model.n_layer - 1, most_layers(pool)) if len(pool.nodes) else 0
    can_be_last = bool(len(pool.nodes)) and int(pool.last_memory_layers.max()) >= 1
    short = (model.n_layer - holds) * pool.layer_memory + (0 if can_be_last else model.output_bytes)
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
