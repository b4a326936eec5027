"""Moves, and the repair of a plan whose nodes left: their ranges go to whoever can take them
at the least cost, and nothing else moves (stickiness.replan calls this first, always).

A move's cost is the time before the node serves its new range: the bytes of that range it does
not hold on disk (its parts, and the range it serves now) at its measured fetch rate, plus a
drain if it is serving now. Invariant: the repaired plan keeps every remaining node's
assignment except those of the moves it returns.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Mapping, Optional, Sequence

from meshnet.placement.fleet import ModelShape, NodeId, NodeOffer, Targets
from meshnet.placement.plans import Assignment, LeftOut, Plan, Shortfall
from meshnet.placement.routes import model_routes


@dataclasses.dataclass(frozen=True)
class Move:
    node_id: NodeId  # the node that changes what it serves
    model: Optional[str]  # the model of its new range (None: it stops serving)
    from_range: Optional[tuple[int, int]]  # what it served before (None: nothing)
    to_range: Optional[tuple[int, int]]  # what it serves after (None: nothing)
    fetch_bytes: int  # weights it must fetch (what its disk lacks)
    seconds: float  # drain plus fetch at its measured rate: the time before it serves again
    reason: str  # why, in words


def fetch_bytes(model: ModelShape, node: NodeOffer, start: int, end: int) -> int:
    """Weights of [start, end) of `model` the node lacks on disk."""
    return model.weight_bytes(start, end) - node.bytes_on_disk(model, start, end)


def move_between(before: Plan, after: Plan, node_id: NodeId, node: NodeOffer, models: Mapping[str, ModelShape],
                 drain_seconds: float) -> Optional[Move]:
    """The move that takes `node_id` from its place in `before` to its place in `after`, or None."""
    old, new = before.assignment_of(node_id), after.assignment_of(node_id)
    key = lambda a: None if a is None else (a.model, a.start, a.end, a.backend)  # noqa: E731
    if key(old) == key(new):
        return None
    drain = drain_seconds if old is not None else 0.0
    from_range = None if old is None else (old.start, old.end)
    if new is None:
        return Move(node_id, None, from_range, None, 0, drain, "withdrawn: the new plan gives it nothing")
    model = models[new.model]
    fetch = fetch_bytes(model, node, new.start, new.end)
    seconds = drain + fetch / node.fetch_bytes_per_second
    return Move(node_id, new.model, from_range, (new.start, new.end), fetch, seconds,
                f"re-plan: {new.role} of {new.model} [{new.start}, {new.end})")


def covered(assignments: Sequence[Assignment], model: str, start: int, end: int) -> bool:
    """Whether holders of `model` chain from `start` to `end`, meeting at exact boundaries."""
    reached, frontier = {start}, [start]
    while frontier:
        at = frontier.pop()
        for a in assignments:
            if a.model == model and a.start == at and a.end <= end and a.end not in reached:
                reached.add(a.end)
                frontier.append(a.end)
    return end in reached


def repair(current: Plan, models: Sequence[ModelShape], nodes: Sequence[NodeOffer], targets: Targets,
           drain_seconds: float) -> tuple[Plan, list[Move]]:
    """`current` with the ranges of nodes that left reassigned at the least cost (module docstring)."""
    present = {n.node_id: n for n in nodes}
    by_name = {m.name: m for m in models}
    kept = [a for a in current.assignments if a.node_id in present and a.model in by_name]
    gone = [a for a in current.assignments if a.node_id not in present and a.model in by_name]
    moves: list[Move] = []
    shortfalls = [s for s in current.shortfalls if s.model in by_name]
    for lost in gone:
        model = by_name[lost.model]
        if covered(kept, lost.model, lost.start, lost.end):
            continue
        option = _cheapest(model, lost, kept, present, targets, drain_seconds)
        if option is None:
            shortfalls.append(Shortfall(lost.model, (lost.start, lost.end), model.memory_bytes(
                lost.start, lost.end, targets.kv_tokens), f"{lost.node_id} left and no node can take [{lost.start}, "
                f"{lost.end}) of {lost.model}"))
            continue
        changed, option_moves = option
        moved = {a.node_id for a in changed}
        kept = [a for a in kept if a.node_id not in moved] + changed
        moves.extend(option_moves)
    assigned = {a.node_id for a in kept}
    reasons = {o.node_id: o.reason for o in current.left_out}
    left_out = [LeftOut(i, reasons.get(i, "joined since the last plan: spare until a re-plan"))
                for i in sorted(present) if i not in assigned]
    routes = []
    for model in sorted(models, key=lambda m: m.name):
        routes.extend(model_routes(model, present, kept, targets.sessions))
    plan_ = Plan(tuple(sorted(kept, key=lambda a: a.node_id)), tuple(left_out), tuple(routes),
                 tuple(sorted(shortfalls, key=lambda s: s.model)), targets.sessions, current.notes)
    return plan_, moves


def _fits(model: ModelShape, node: NodeOffer, start: int, end: int, targets: Targets) -> Optional[str]:
    """The fastest backend of the node whose memory holds [start, end), or None."""
    need = model.memory_bytes(start, end, targets.kv_tokens)
    fitting = [d for d in node.devices if d.memory_bytes >= need]
    return min(fitting, key=lambda d: (d.seconds_per_byte(model), d.backend)).backend if fitting else None


def _take(model: ModelShape, node: NodeOffer, old: Optional[Assignment], start: int, end: int, backend: str,
          role: str, reason: str, drain_seconds: float) -> tuple[Assignment, Move]:
    fetch = fetch_bytes(model, node, start, end)
    drain = drain_seconds if old is not None else 0.0
    move = Move(node.node_id, model.name, None if old is None else (old.start, old.end), (start, end), fetch,
                drain + fetch / node.fetch_bytes_per_second, reason)
    return Assignment(node.node_id, model.name, start, end, backend, role, reason), move


def _cheapest(model: ModelShape, lost: Assignment, kept: list[Assignment], present: Mapping[NodeId, NodeOffer],
              targets: Targets, drain_seconds: float) -> Optional[tuple[list[Assignment], list[Move]]]:
    """The least-cost way to cover `lost`'s range again: (new assignments, moves), or None."""
    start, end = lost.start, lost.end
    need = model.memory_bytes(start, end, targets.kv_tokens)
    held = {a.node_id: a for a in kept}
    holders = collections.Counter((a.model, a.start, a.end) for a in kept)
    options = []
    for node_id in sorted(present):
        node, old = present[node_id], held.get(node_id)
        if old is not None and not _redundant(old, kept, holders):
            if old.model == lost.model and (old.end == start or old.start == end):
                options.append(_widen(model, node, old, lost, targets, drain_seconds))
            continue
        if max(d.memory_bytes for d in node.devices) < need:
            continue
        why = f"replaces {lost.node_id} (left) on [{start}, {end}) of {model.name}"
        backend = _fits(model, node, start, end, targets)
        options.append([_take(model, node, old, start, end, backend, lost.role, why, drain_seconds)])
    options = [o for o in options if o]
    if not options:
        split = _split(model, lost, kept, present, targets)
        return None if split is None else ([a for a, _ in split], [m for _, m in split])
    best = min(options, key=lambda o: (max(m.seconds for _, m in o), sum(m.fetch_bytes for _, m in o),
                                       [a.node_id for a, _ in o]))
    return [a for a, _ in best], [m for _, m in best]


def _redundant(a: Assignment, kept: list[Assignment], holders: collections.Counter) -> bool:
    """Whether `a`'s range stays covered without it (another holder, or a chain of others)."""
    if holders[(a.model, a.start, a.end)] >= 2:
        return True
    others = [b for b in kept if b.model == a.model and b.node_id != a.node_id]
    return covered(others, a.model, a.start, a.end)


def _widen(model: ModelShape, node: NodeOffer, old: Assignment, lost: Assignment, targets: Targets,
           drain_seconds: float) -> list[tuple[Assignment, Move]]:
    """The neighbour `old` widened over `lost`'s range, if its memory allows ([] if not)."""
    start, end = min(old.start, lost.start), max(old.end, lost.end)
    backend = _fits(model, node, start, end, targets)
    if backend is None:
        return []
    why = f"widens [{old.start}, {old.end}) over [{lost.start}, {lost.end}) of {model.name} ({lost.node_id} left)"
    return [_take(model, node, old, start, end, backend, old.role, why, drain_seconds)]


def _split(model: ModelShape, lost: Assignment, kept: list[Assignment], present: Mapping[NodeId, NodeOffer],
           targets: Targets) -> Optional[list[tuple[Assignment, Move]]]:
    """Free nodes splitting `lost`'s range from its start, each taking the most layers it holds
    (ties: the least fetch time, then id); None if they cannot cover it."""
    busy = {a.node_id for a in kept}
    spare = [present[i] for i in sorted(present) if i not in busy]
    taken, at = [], lost.start
    while at < lost.end:
        best = None
        for node in spare:
            reach = at
            while reach < lost.end and _fits(model, node, at, reach + 1, targets) is not None:
                reach += 1
            if reach > at:
                key = (-(reach - at), fetch_bytes(model, node, at, reach) / node.fetch_bytes_per_second, node.node_id)
                if best is None or key < best[0]:
                    best = (key, node, reach)
        if best is None:
            return None
        _, node, reach = best
        backend = _fits(model, node, at, reach, targets)
        why = f"takes [{at}, {reach}) of {model.name}, part of [{lost.start}, {lost.end}) ({lost.node_id} left)"
        taken.append(_take(model, node, None, at, reach, backend, lost.role, why, 0.0))
        spare.remove(node)
        at = reach
    return taken

