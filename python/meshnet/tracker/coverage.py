"""The coverage map a tracker answers Coverage with: per layer, how many routable nodes serve it
and the first of their ids; the gaps; the live nodes, dark and quarantined ids of one model.

Called by the registry (registry.py, `Registry.coverage`) with what it read from its store; a pure
function of its arguments. Invariant: counts are exact, lists are cut (at most MAX_COVERAGE_NODES
entries, MAX_LAYER_NODE_IDS ids per layer, dark nodes last so that they cannot crowd the others
out), so a reply stays bounded whatever the swarm's size.
"""

from __future__ import annotations

from typing import Optional

from meshnet.tracker import routing
from meshnet.tracker.certified import CertifiedModel
from meshnet.tracker.store.state_store import NodeRecord
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.status import OK, Status, StatusCode

# Coverage lists (nodes, dark and quarantined ids) hold at most this many entries, and each layer
# names at most MAX_LAYER_NODE_IDS of its nodes: with MAX_CERTIFICATE_CHARS and MAX_LAYERS
# (admission.py), a reply stays under ~2 MiB, half gRPC's default message limit, whatever the
# swarm's size.
MAX_COVERAGE_NODES = 128
MAX_LAYER_NODE_IDS = 8


def coverage_reply(model: str, live: list[NodeRecord], quarantined_ids: frozenset[NodeId],
                   banned_ids: frozenset[NodeId], certified: Optional[CertifiedModel],
                   max_nodes: int = 0) -> tt.CoverageReply:
    """The coverage map of `model` over its `live` node records: exact counts, and lists cut to
    the first `max_nodes` nodes, dark ones last, by node id (0 or more than MAX_COVERAGE_NODES:
    that), at most MAX_LAYER_NODE_IDS ids per layer. `certified`: the model's entry (None for a
    name only dark nodes registered with)."""
    limit = min(max_nodes, MAX_COVERAGE_NODES) if max_nodes > 0 else MAX_COVERAGE_NODES
    # Dark nodes last, so that they cannot crowd the others out of the cut lists (finding 12).
    nodes = sorted(live, key=lambda n: (n.admission == tt.Admission.DARK, n.info.node_id))
    if certified is None and not nodes:
        return tt.CoverageReply(Status(StatusCode.NOT_FOUND, f"unknown model {model!r}", False))
    n_layer = certified.n_layer if certified else max(n.info.n_layer for n in nodes)
    routable = [n for n in nodes if n.admission == tt.Admission.ROUTABLE and not n.draining
                and n.info.node_id not in quarantined_ids and n.info.node_id not in banned_ids]
    replicas, listed = [0] * n_layer, [[] for _ in range(n_layer)]
    for n in routable:  # by node id, so each layer lists its first ones
        for layer in range(n.info.layers.start, min(n.info.layers.end, n_layer)):
            replicas[layer] += 1
            if len(listed[layer]) < MAX_LAYER_NODE_IDS:
                listed[layer].append(n.info.node_id)
    layers = tuple(tt.LayerCoverage(layer, tuple(listed[layer]), replicas[layer]) for layer in range(n_layer))
    gaps = tuple(tt.LayerRange(s, e) for s, e in routing.gaps([count > 0 for count in replicas]))
    dark = tuple(n.info.node_id for n in nodes if n.admission == tt.Admission.DARK)[:limit]
    quarantined = tuple(n.info.node_id for n in nodes if n.info.node_id in quarantined_ids)[:limit]
    infos = tuple(n.info for n in nodes[:limit])
    return tt.CoverageReply(OK, n_layer, layers, gaps, infos, dark, quarantined, len(nodes), len(routable),
                            certified.artifact_fingerprint if certified else "")
