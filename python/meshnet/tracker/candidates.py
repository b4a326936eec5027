"""Route candidates: a live node as routing.py weighs it (`node_candidate`: cost per layer, hop
overhead, pressure, compute backend), and whether candidates make a route at all (`routable`) or
how long a session the longest route could hold (`longest_route`).

Called by the registry (registry.py) under its lock while it chooses a route; pure functions of
their arguments, deterministic.
"""

from __future__ import annotations

from typing import Optional

from meshnet.tracker import routing
from meshnet.tracker.store.state_store import NodeRecord
from meshnet.wire import tracker as tt


def routable(candidates: list[routing.Candidate], n_layer: int, combinations: list[frozenset[str]]) -> bool:
    try:
        routing.find_route(candidates, n_layer, combinations)
        return True
    except routing.NoRouteError:
        return False


def longest_route(usable: list[routing.Candidate], limited: list[tuple[routing.Candidate, int]],
                  n_layer: int, combinations: list[frozenset[str]]) -> Optional[int]:
    """The longest session any route over `usable` plus the per-session `limited` nodes could
    hold (a route holds the smallest limit on it), or None when even all of them leave a gap."""
    for limit in sorted({limit for _, limit in limited}, reverse=True):
        if routable(usable + [c for c, own in limited if own >= limit], n_layer, combinations):
            return limit
    return None


def node_candidate(node: NodeRecord, sessions: int, backends: dict[str, str], stale: bool = False) -> routing.Candidate:
    """`backends`: the model's recipe fingerprints -> their compute backends (the node's was
    admitted against one of them). `sessions`: this tracker's live routes through the node;
    `stale`: its last heartbeat predates a route this tracker closed there, so the sessions it
    reported are not taken over `sessions` (a route just closed is not load)."""
    info, load = node.info, node.load
    served = info.layers.end - info.layers.start
    per_layer = routing.DEFAULT_SECONDS_PER_LAYER
    if load.decode_tokens_per_second > 0:
        per_layer = 1.0 / (load.decode_tokens_per_second * served)
    cap = max(1, (info.capacity.max_sessions if info.capacity else 0) or 1)
    reported = 0 if stale else load.active_sessions
    pressure = max(reported, sessions) / cap + load.queue_depth / cap
    # A relayed node (ADR 0007) costs its measured round trip to its relay on top of a direct hop.
    rtt = routing.HOP_OVERHEAD_SECONDS + (info.relay_rtt_ms / 1000.0 if info.relay else 0.0)
    return routing.Candidate(info.node_id, info.layers.start, info.layers.end, per_layer, rtt, pressure,
                             runs_suffix=info.backend == tt.BackendKind.REFERENCE,
                             backend=backends.get(info.fingerprints.runtime_recipe if info.fingerprints else "", "cpu"),
                             measured=load.decode_tokens_per_second > 0)
