"""A read-only, bounded copy of the registry for the status page and the metrics (tracker/web/web.py).

Built by `Registry.snapshot()` under the registry's lock from its live state; pure otherwise.
It holds no secrets: no keys, certificates, tickets or full route session ids (a route shows an
8-character tag). What it does show, node ids, addresses, model names, load and client ids, is
what nodes and clients told the tracker, so renderers must escape it. Invariant: its size is
bounded whatever the swarm's: at most `max_nodes` nodes and `max_routes` routes are listed (the
counts and per-model totals still cover all of them), one coverage row per certified model.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Optional

from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId

MAX_NODES = 256  # nodes listed in one snapshot
MAX_ROUTES = 128  # live routes listed in one snapshot
STATES = ("routable", "draining", "banned", "dark", "quarantined")
UNCERTIFIED = "(uncertified)"  # the one model label of nodes whose model is not certified here


@dataclasses.dataclass(frozen=True)
class NodeView:
    node_id: NodeId
    address: str
    model: str
    backend: str  # "gguf" | "reference"
    layers: tuple[int, int]  # registered [start, end)
    state: str  # one of STATES
    load: tt.Load  # from its last heartbeat
    heartbeat_age_s: float  # since its last register or heartbeat
    routes: int  # live route sessions through it


@dataclasses.dataclass(frozen=True)
class RouteView:
    tag: str  # the first 8 hex digits of the route session id
    model: str
    epoch: int
    client_id: str
    hops: tuple[tuple[NodeId, int, int], ...]  # (node id, effective start, end)
    age_s: float  # since it was opened
    lease_left_s: float


@dataclasses.dataclass(frozen=True)
class ModelView:
    model: str
    n_layer: int
    replicas: tuple[int, ...]  # routable nodes serving each layer; 0 is a gap
    gaps: tuple[tuple[int, int], ...]  # uncovered [start, end) ranges

    @property
    def covered_ratio(self) -> float:
        return sum(1 for r in self.replicas if r) / self.n_layer if self.n_layer else 0.0


@dataclasses.dataclass(frozen=True)
class RegistrySnapshot:
    models: tuple[ModelView, ...]  # certified models, by name
    nodes: tuple[NodeView, ...]  # dark ones last, then by model, start, node id; at most max_nodes
    routes: tuple[RouteView, ...]  # newest first; at most max_routes
    node_count: int  # all live nodes
    route_count: int  # all live routes
    node_states: Mapping[tuple[str, str], int]  # (model, state) -> live nodes; uncertified models as one label
    live_routes: Mapping[str, int]  # model -> live routes


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What the registry hands the builder per live node."""
    info: tt.NodeInfo
    state: str
    load: tt.Load
    last_heartbeat: float


@dataclasses.dataclass(frozen=True)
class RouteFacts:
    """What the registry hands the builder per live route session."""
    session_id: str
    model: str
    epoch: int
    client_id: str
    hops: tuple[tt.Hop, ...]
    opened_at: float
    lease_until: float


def state_of(admission: tt.Admission, draining: bool, banned: bool, quarantined: bool = False) -> str:
    if quarantined:  # failed an audit (ADR 0008)
        return "quarantined"
    if admission != tt.Admission.ROUTABLE:
        return "dark"
    return "draining" if draining else "banned" if banned else "routable"


def replicas_per_layer(ranges: Iterable[tuple[int, int]], n_layer: int) -> tuple[int, ...]:
    """How many of `ranges` ([start, end), clipped to the model) serve each layer: O(ranges + n_layer)."""
    delta = [0] * (n_layer + 1)
    for start, end in ranges:
        start, end = max(0, start), min(n_layer, end)
        if start < end:
            delta[start] += 1
            delta[end] -= 1
    out, running = [], 0
    for layer in range(n_layer):
        running += delta[layer]
        out.append(running)
    return tuple(out)


def gaps_of(replicas: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    gaps, start = [], None
    for layer, count in enumerate(replicas + (1,)):
        if count == 0 and start is None:
            start = layer
        elif count and start is not None:
            gaps.append((start, layer))
            start = None
    return tuple(gaps)


def build(certified: Mapping[str, int], nodes: Iterable[NodeFacts], routes: Iterable[RouteFacts], now: float, *,
          max_nodes: int = MAX_NODES, max_routes: int = MAX_ROUTES) -> RegistrySnapshot:
    """`certified`: model name -> n_layer; `now` on the registry's clock."""
    nodes, routes = list(nodes), list(routes)
    through: dict[NodeId, int] = {}
    live_routes: dict[str, int] = {}
    for r in routes:
        live_routes[r.model] = live_routes.get(r.model, 0) + 1
        for hop in r.hops:
            through[hop.node.node_id] = through.get(hop.node.node_id, 0) + 1
    states: dict[tuple[str, str], int] = {}
    for n in nodes:
        key = (n.info.model if n.info.model in certified else UNCERTIFIED, n.state)
        states[key] = states.get(key, 0) + 1
    models = []
    for name in sorted(certified):
        ranges = [(n.info.layers.start, n.info.layers.end) for n in nodes
                  if n.info.model == name and n.state == "routable"]
        replicas = replicas_per_layer(ranges, certified[name])
        models.append(ModelView(name, certified[name], replicas, gaps_of(replicas)))
    # Certified models' nodes first, dark ones last: registrations that cost nothing (a fresh key
    # each) cannot crowd serving nodes out of the list (issue 35, finding 12).
    listed = sorted(nodes, key=lambda n: (n.state == "dark", n.info.model, n.info.layers.start,
                                          n.info.node_id))[:max_nodes]
    node_views = tuple(NodeView(n.info.node_id, n.info.address, n.info.model, _backend(n.info.backend),
                                (n.info.layers.start, n.info.layers.end), n.state, n.load,
                                max(0.0, now - n.last_heartbeat), through.get(n.info.node_id, 0)) for n in listed)
    newest = sorted(routes, key=lambda r: (-r.opened_at, r.session_id))[:max_routes]
    route_views = tuple(RouteView(_tag(r.session_id), r.model, r.epoch, r.client_id,
                                  tuple((h.node.node_id, h.layers.start, h.layers.end) for h in r.hops),
                                  max(0.0, now - r.opened_at), max(0.0, r.lease_until - now)) for r in newest)
    return RegistrySnapshot(tuple(models), node_views, route_views, len(nodes), len(routes), states, live_routes)


def _backend(kind: tt.BackendKind) -> str:
    return {tt.BackendKind.GGUF: "gguf", tt.BackendKind.REFERENCE: "reference"}.get(kind, "unspecified")


def _tag(session_id: str) -> str:
    return session_id.removeprefix("rs-")[:8]


def as_json(snapshot: RegistrySnapshot, extra: Optional[dict] = None) -> dict:
    """A JSON-ready dict of `snapshot` (and `extra` keys), for /status.json."""
    return {
        "models": [{"model": m.model, "n_layer": m.n_layer, "replicas": list(m.replicas),
                    "gaps": [list(g) for g in m.gaps], "covered_ratio": m.covered_ratio} for m in snapshot.models],
        "nodes": [{**dataclasses.asdict(n), "layers": list(n.layers)} for n in snapshot.nodes],
        "routes": [{**dataclasses.asdict(r), "hops": [list(h) for h in r.hops]} for r in snapshot.routes],
        "node_count": snapshot.node_count,
        "route_count": snapshot.route_count,
        **(extra or {}),
    }
