"""The placement planner (issue 51): which node serves which layers of which model, and when a
new plan is worth moving weights for. Pure functions, no I/O; the tracker calls them.

`plan` places models on nodes (planner.py); `replan` repairs a plan when nodes leave and adopts a
fresh one only when it pays (stickiness.py); `memory_proportional` and `petals_least_served` are
the placements it is compared with (baselines.py); `simulate` compares them over generated fleets
and, like `fixtures` (tests only), is deliberately not imported here.
"""

from meshnet.placement.baselines import memory_proportional, petals_least_served
from meshnet.placement.fleet import DeviceOffer, LinkOffer, ModelShape, NodeId, NodeOffer, Part, Targets
from meshnet.placement.planner import plan
from meshnet.placement.plans import Assignment, Hop, LeftOut, Plan, Route, Shortfall
from meshnet.placement.repair import Move
from meshnet.placement.stickiness import Decision, Policy, replan

__all__ = [
    "Assignment",
    "Decision",
    "DeviceOffer",
    "Hop",
    "LeftOut",
    "LinkOffer",
    "ModelShape",
    "Move",
    "NodeId",
    "NodeOffer",
    "Part",
    "Plan",
    "Policy",
    "Route",
    "Shortfall",
    "Targets",
    "memory_proportional",
    "petals_least_served",
    "plan",
    "replan",
]
