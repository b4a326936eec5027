"""The planner's output: who serves what, who is left out and why, and the routes it expects.

Made by `planner.plan` (and, for comparison, by `baselines`); read by `stickiness.replan` and
the simulator. Invariant: a node appears at most once, either in `assignments` or in
`left_out`; `routes` use only assigned nodes, each at most once, and each route's hops cover
[0, n_layer) of its model in order, meeting at exact boundaries.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from meshnet.placement.fleet import NodeId

PRIMARY = "primary"  # in the route the planner balanced for its model
REPLICA = "replica"  # holds a range of that route, for throughput and failover


@dataclasses.dataclass(frozen=True)
class Assignment:
    node_id: NodeId  # the node told to serve
    model: str  # the model it serves
    start: int  # layers [start, end) of it
    end: int
    backend: str  # the device backend that runs them
    role: str  # PRIMARY or REPLICA
    note: str  # why it serves this (shown by /status and doctor)


@dataclasses.dataclass(frozen=True)
class LeftOut:
    node_id: NodeId  # a node the plan gives nothing
    reason: str  # why, in words the node's owner can act on


@dataclasses.dataclass(frozen=True)
class Hop:
    node_id: NodeId  # the stage's node
    start: int  # its layers [start, end)
    end: int
    stage_seconds: float  # predicted compute for one token plus the hop to the next stage


@dataclasses.dataclass(frozen=True)
class Route:
    model: str  # the model the route serves
    hops: tuple[Hop, ...]  # one per stage, in layer order
    decode_seconds: float  # one token through every stage: a single stream's time per token
    bottleneck_seconds: float  # the slowest stage: a full pipeline's time per token
    tokens_per_second: float  # with `sessions` streams in flight: sessions / max(decode, sessions x bottleneck)


@dataclasses.dataclass(frozen=True)
class Shortfall:
    model: str  # a model the plan cannot cover
    uncovered: tuple[int, int]  # layers [start, end) no chain of the free nodes reaches
    memory_short_bytes: int  # at least this much more memory (in one more node) would be needed
    reason: str  # in words


@dataclasses.dataclass(frozen=True)
class Plan:
    assignments: tuple[Assignment, ...]  # sorted by node id
    left_out: tuple[LeftOut, ...]  # sorted by node id
    routes: tuple[Route, ...]  # by model, fastest first
    shortfalls: tuple[Shortfall, ...]  # models not covered, by name
    sessions: int  # the streams each route was planned to carry
    notes: tuple[str, ...] = ()  # where the plan is heuristic rather than exact, and why

    def assignment_of(self, node_id: NodeId) -> Optional[Assignment]:
        for assignment in self.assignments:
            if assignment.node_id == node_id:
                return assignment
        return None

    def by_node(self) -> dict[NodeId, Assignment]:
        return {a.node_id: a for a in self.assignments}

    def tokens_per_second(self, model: Optional[str] = None) -> float:
        """Aggregate predicted tokens/s of the routes (of one model, or of all)."""
        return sum(r.tokens_per_second for r in self.routes if model is None or r.model == model)

    def best_route(self, model: str) -> Optional[Route]:
        """The route with the least single-stream time per token, or None."""
        routes = [r for r in self.routes if r.model == model]
        return min(routes, key=lambda r: (r.decode_seconds, r.bottleneck_seconds)) if routes else None
