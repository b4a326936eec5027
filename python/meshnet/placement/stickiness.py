"""Re-placement that moves only what must move: repair a plan when nodes leave, and adopt a
fresh plan only when its gain repays the cost of moving weights.

Called by the tracker with the plan it runs, the nodes it has now and the time (`now` and
`last_applied` are arguments: no clock here). Pure; equal inputs give equal decisions.

Two steps:
1. Repair (always, coverage first): a node that left (its id is not among `nodes`) leaves its
   range; if no other holder, nor a chain of other holders meeting at exact boundaries, still
   covers it, it is reassigned to the cheapest of: one free node (its whole range), a replica
   whose own range stays covered without it, a neighbour widening its range over it (memory
   allowing), or several free nodes splitting it. Cheapest = least seconds to serve: the bytes
   it lacks on disk at its measured fetch rate, plus the drain if it was serving. Nothing else
   moves, so a leave costs one range's bytes, not a re-tile.
2. Re-plan (only outside the cooldown): the planner's fresh plan for the same nodes, with each
   node's current range counted as on its disk, is adopted when it covers a model the repaired
   plan cannot, or when (a) its aggregate tokens/s exceed the repaired plan's by more than
   `min_relative_gain` (hysteresis: measurement noise does not move nodes) and (b) the tokens
   gained over `horizon_seconds` after the moves complete exceed the tokens lost while they
   happen (each moving node stops its route for its move's seconds).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional, Sequence

from meshnet.placement.fleet import ModelShape, NodeOffer, Part, Targets, check_fleet
from meshnet.placement.planner import plan
from meshnet.placement.plans import Plan
from meshnet.placement.repair import Move, move_between, repair


@dataclasses.dataclass(frozen=True)
class Policy:
    horizon_seconds: float = 3600.0  # a re-plan's gain must repay its cost within this
    min_relative_gain: float = 0.10  # hysteresis: the fresh plan must beat the current by this fraction
    cooldown_seconds: float = 300.0  # no re-plan is adopted within this of the last one adopted
    drain_seconds: float = 30.0  # a serving node's drain before it moves (sessions finish or fail over)

    def __post_init__(self) -> None:
        for name in ("horizon_seconds", "min_relative_gain", "cooldown_seconds", "drain_seconds"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
                raise ValueError(f"policy {name} must be a finite number >= 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Decision:
    plan: Plan  # the plan to run now (the fresh one if adopted, else the repaired current one)
    moves: tuple[Move, ...]  # what nodes must do to get there: repairs, and the re-plan's moves if adopted
    adopted: bool  # whether the fresh plan was adopted
    reason: str  # why or why not, in words
    gain_tokens_per_second: float  # fresh aggregate tokens/s minus the repaired plan's
    cost_tokens: float  # tokens the re-plan's moves would cost (routes stopped while nodes move)


def replan(current: Plan, models: Iterable[ModelShape], nodes: Iterable[NodeOffer], targets: Targets,
           policy: Policy, now: float, last_adopted: Optional[float]) -> Decision:
    """Repair `current` for the nodes present, then adopt a fresh plan only if it pays (module
    docstring). `last_adopted`: when the last re-plan was adopted (None: never)."""
    models, nodes = tuple(models), tuple(sorted(nodes, key=lambda n: n.node_id))
    check_fleet(models, nodes)
    nodes = with_current_parts(current, nodes)
    repaired, repairs = repair(current, models, nodes, targets, policy.drain_seconds)
    if last_adopted is not None and now - last_adopted < policy.cooldown_seconds:
        wait = policy.cooldown_seconds - (now - last_adopted)
        reason = f"cooldown: {wait:.0f} s until a re-plan may be adopted"
        return Decision(repaired, tuple(repairs), False, reason, 0.0, 0.0)
    fresh = plan(models, nodes, targets)
    by_id = {n.node_id: n for n in nodes}
    by_name = {m.name: m for m in models}
    moves = [m for m in (move_between(repaired, fresh, node_id, by_id[node_id], by_name, policy.drain_seconds)
                         for node_id in sorted(by_id)) if m is not None]
    gain = fresh.tokens_per_second() - repaired.tokens_per_second()
    cost = _cost_tokens(repaired, moves)
    newly_covered = sorted({s.model for s in repaired.shortfalls} - {s.model for s in fresh.shortfalls})
    adopt, reason = _verdict(repaired, gain, cost, moves, newly_covered, policy)
    if adopt:
        return Decision(fresh, tuple(repairs) + tuple(moves), True, reason, gain, cost)
    return Decision(repaired, tuple(repairs), False, reason, gain, cost)


def _verdict(repaired: Plan, gain: float, cost: float, moves: Sequence[Move], newly_covered: Sequence[str],
             policy: Policy) -> tuple[bool, str]:
    if newly_covered:
        return True, f"the fresh plan covers {', '.join(newly_covered)}, which the current one cannot"
    if not moves:
        return False, "the fresh plan moves nothing"
    base = repaired.tokens_per_second()
    if gain <= policy.min_relative_gain * base or gain <= 0:
        return False, (f"gain {gain:.3f} tokens/s is within the hysteresis ({policy.min_relative_gain:.0%} of "
                       f"{base:.3f} tokens/s)")
    busy = max(m.seconds for m in moves)
    repaid = gain * max(0.0, policy.horizon_seconds - busy)
    if repaid <= cost:
        return False, (f"gain {gain:.3f} tokens/s over the {policy.horizon_seconds:.0f} s horizon ({repaid:.0f} tokens "
                       f"after {busy:.0f} s of moves) does not repay the {cost:.0f} tokens the moves cost")
    return True, (f"gain {gain:.3f} tokens/s repays the moves' {cost:.0f} tokens within the horizon "
                  f"({repaid:.0f} tokens)")


def _cost_tokens(current: Plan, moves: Sequence[Move]) -> float:
    """Tokens not served while nodes move: each moving node stops its route for its move's time."""
    seconds = {m.node_id: m.seconds for m in moves}
    cost = 0.0
    for route in current.routes:
        stopped = max((seconds.get(h.node_id, 0.0) for h in route.hops), default=0.0)
        cost += stopped * route.tokens_per_second
    return cost


def with_current_parts(current: Plan, nodes: Sequence[NodeOffer]) -> tuple[NodeOffer, ...]:
    """`nodes` with each one's current range counted among its parts on disk."""
    held = current.by_node()
    result = []
    for node in nodes:
        a = held.get(node.node_id)
        part = None if a is None else Part(a.model, a.start, a.end)
        if part is not None and part not in node.parts:
            node = dataclasses.replace(node, parts=node.parts + (part,))
        result.append(node)
    return tuple(result)


def bytes_moved(moves: Iterable[Move]) -> int:
    return sum(m.fetch_bytes for m in moves)


def retile_bytes(before: Plan, after: Plan, models: Iterable[ModelShape], nodes: Iterable[NodeOffer]) -> int:
    """Bytes nodes must fetch to go from `before` to `after` when nothing is kept but what they
    held (a re-tile: the baselines' answer to churn)."""
    by_name = {m.name: m for m in models}
    by_id = {n.node_id: n for n in with_current_parts(before, tuple(nodes))}
    total = 0
    for node_id, node in by_id.items():
        move = move_between(before, after, node_id, node, by_name, 0.0)
        total += 0 if move is None else move.fetch_bytes
    return total

