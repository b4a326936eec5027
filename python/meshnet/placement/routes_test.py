"""Routes from placements (routes.py), the baselines (baselines.py) and the simulator's output
(simulate.py)."""

from __future__ import annotations

import json

import pytest

from meshnet.placement.baselines import memory_proportional, petals_least_served
from meshnet.placement.fixtures import model, node
from meshnet.placement.fleet import LinkOffer, NodeId, Targets
from meshnet.placement.plans import REPLICA, Assignment
from meshnet.placement.routes import model_routes
from meshnet.placement.simulate import main
from meshnet.placement.stickiness import retile_bytes


def held(node_id, start, end):
    return Assignment(NodeId(node_id), "m", start, end, "cpu", REPLICA, "")


def test_tiled_ranges_pair_the_fastest_holders_first():
    shape = model(4)
    nodes = {n.node_id: n for n in (node("a", 1.0, 1000), node("b", 2.0, 1000), node("c", 3.0, 1000),
                                    node("d", 1.0, 1000))}
    routes = model_routes(shape, nodes, [held("a", 0, 2), held("b", 0, 2), held("c", 2, 4), held("d", 2, 4)], 1)
    assert [[h.node_id for h in r.hops] for r in routes] == [["a", "d"], ["b", "c"]]
    assert routes[0].decode_seconds == pytest.approx(4.0) and routes[1].bottleneck_seconds == pytest.approx(6.0)


def test_ranges_meet_only_at_exact_boundaries_unless_a_suffix_may_be_entered():
    shape = model(4)
    nodes = {n.node_id: n for n in (node("a", 1.0, 1000), node("b", 1.0, 1000))}
    overlapping = [held("a", 0, 3), held("b", 1, 4)]
    assert model_routes(shape, nodes, overlapping, 1) == []
    (route,) = model_routes(shape, nodes, overlapping, 1, suffix_entry=True)
    assert [(h.node_id, h.start, h.end) for h in route.hops] == [("a", 0, 3), ("b", 3, 4)]


def test_a_route_is_timed_with_pairwise_links_and_its_streams():
    shape = model(2, activation_bytes=0)
    a = node("a", 1.0, 1000, rtt=5.0)
    a = type(a)(a.node_id, a.devices, a.rtt_seconds, a.bytes_per_second, a.fetch_bytes_per_second,
                links=(LinkOffer(NodeId("b"), 0.5, 1e9),))
    nodes = {"a": a, "b": node("b", 1.0, 1000, rtt=2.0)}
    (route,) = model_routes(shape, nodes, [held("a", 0, 1), held("b", 1, 2)], sessions=3)
    assert [h.stage_seconds for h in route.hops] == pytest.approx([1.5, 3.0])
    assert route.tokens_per_second == pytest.approx(3 / max(4.5, 3 * 3.0))


def test_memory_proportional_splits_by_memory_in_id_order():
    shape = model(9, layer_mib=100)
    nodes = [node("a", 1.0, 200), node("b", 0.1, 400), node("c", 0.5, 300), node("d", 0.1, 10_000)]
    result = memory_proportional([shape], nodes, Targets(kv_tokens_per_session=0, replicas=0))
    assert [(a.node_id, a.start, a.end) for a in result.assignments] == [("a", 0, 2), ("b", 2, 6), ("c", 6, 9)]
    assert [o.node_id for o in result.left_out] == ["d"]  # speed plays no part


def test_petals_takes_the_least_served_window():
    shape = model(6, layer_mib=100)
    nodes = [node("a", 0.1, 300), node("b", 0.1, 300), node("c", 0.1, 300)]
    result = petals_least_served([shape], nodes, Targets(kv_tokens_per_session=0))
    assert [(a.node_id, a.start, a.end) for a in result.assignments] == [("a", 0, 3), ("b", 3, 6), ("c", 0, 3)]


def test_re_tiling_after_a_leave_moves_far_more_than_the_leaver_held():
    """Memory-proportional groups form in id order: when n1 leaves, every later group shifts and
    three nodes fetch a half each, for the one half that left."""
    shape = model(8, layer_mib=100)
    nodes = [node(f"n{i}", 0.1, 450) for i in range(6)]
    targets = Targets(kv_tokens_per_session=0)
    before = memory_proportional([shape], nodes, targets)
    remaining = [n for n in nodes if n.node_id != "n1"]
    after = memory_proportional([shape], remaining, targets)
    assert retile_bytes(before, after, [shape], remaining) == 3 * shape.weight_bytes(0, 4)


def test_the_simulator_writes_its_table_and_figures(tmp_path):
    assert main(["--out", str(tmp_path), "--only", "live3", "--only", "five"]) == 0
    figures = json.loads((tmp_path / "placement.json").read_text())
    assert [f["fleet"] for f in figures["fleets"]] == ["live3", "five"]
    for fleet in figures["fleets"]:
        for placement in ("planner", "memory_proportional", "petals"):
            assert fleet[placement]["routes"] >= 0 and "churn_bytes_moved" in fleet[placement]
    assert (tmp_path / "placement.md").read_text().count("| live3") == 3
