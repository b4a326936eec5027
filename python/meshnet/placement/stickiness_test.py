"""Re-placement (stickiness.py, repair.py): a leave moves one range, not the swarm; a re-plan is
adopted only when it pays, outside the cooldown and beyond the hysteresis."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshnet.placement.baselines import memory_proportional
from meshnet.placement.fixtures import MIB, chain_fits, model, node, small_fleets
from meshnet.placement.fleet import DeviceOffer, NodeId, Part, Targets
from meshnet.placement.planner import plan
from meshnet.placement.repair import covered
from meshnet.placement.stickiness import Policy, bytes_moved, replan, retile_bytes

SETTINGS = settings(max_examples=150, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck))
ONE_ROUTE = Targets(kv_tokens_per_session=0, sessions=4, replicas=0)
EARLY = dict(now=0.0, last_adopted=0.0)  # inside the cooldown: repairs only
LATE = dict(now=1e9, last_adopted=None)


def swarm(count: int = 12, layers: int = 24):
    """`count` alike nodes 5 ms apart that each hold 4 of `layers` layers: a route takes 6 of
    them (more stages would only add hops), the rest are spare."""
    shape = model(layers, layer_mib=100)
    return shape, [node(f"n{i:02d}", 0.01, 450, rtt=0.005) for i in range(count)]


def test_a_node_that_leaves_is_replaced_by_one_range_not_a_retile():
    shape, nodes = swarm()
    before = plan([shape], nodes, ONE_ROUTE)
    leaving = before.routes[0].hops[2].node_id
    remaining = [n for n in nodes if n.node_id != leaving]
    decision = replan(before, [shape], remaining, ONE_ROUTE, Policy(), **EARLY)
    (move,) = decision.moves
    lost = before.assignment_of(leaving)
    assert move.to_range == (lost.start, lost.end) and move.from_range is None  # a spare took it
    assert move.fetch_bytes == shape.weight_bytes(lost.start, lost.end)
    assert decision.plan.routes and not decision.plan.shortfalls
    kept = {a.node_id: a for a in before.assignments if a.node_id != leaving}
    assert all(decision.plan.assignment_of(i) == a for i, a in kept.items())  # nobody else moved
    retile = retile_bytes(before, memory_proportional([shape], remaining, ONE_ROUTE), [shape], remaining)
    assert bytes_moved(decision.moves) * 4 <= retile


def test_the_replacement_is_the_node_with_the_part_on_disk():
    shape, nodes = swarm()
    before = plan([shape], nodes, ONE_ROUTE)
    lost = before.assignment_of(before.routes[0].hops[1].node_id)
    spare = before.left_out[-1].node_id
    nodes = [dataclasses.replace(n, parts=(Part("m", lost.start, lost.end),)) if n.node_id == spare else n
             for n in nodes if n.node_id != lost.node_id]
    decision = replan(before, [shape], nodes, ONE_ROUTE, Policy(), **EARLY)
    (move,) = decision.moves
    assert move.node_id == spare and move.fetch_bytes == 0 and move.seconds == 0.0


def test_without_spares_a_neighbour_widens_over_the_range():
    shape = model(8, layer_mib=100)
    nodes = [node("a", 0.01, 450), node("b", 0.01, 450), node("c", 0.01, 900)]
    targets = Targets(kv_tokens_per_session=0, sessions=4, replicas=0)
    before = plan([shape], nodes, targets)
    small = [a for a in before.assignments if a.node_id != "c" and a.end - a.start <= 4]
    lost = min(small, key=lambda a: (a.start, a.node_id))
    remaining = [n for n in nodes if n.node_id != lost.node_id]
    decision = replan(before, [shape], remaining, targets, Policy(), **EARLY)
    assert decision.plan.routes and not decision.plan.shortfalls
    (move,) = decision.moves
    assert move.from_range is not None and move.to_range[1] - move.to_range[0] > move.from_range[1] - move.from_range[0]
    assert move.fetch_bytes == shape.weight_bytes(lost.start, lost.end) - (
        shape.embedding_bytes if lost.start == 0 else 0)


def test_spares_too_small_alone_split_the_range():
    shape = model(8, layer_mib=100)
    nodes = [node("a", 0.01, 450, rtt=0.005), node("b", 0.01, 450, rtt=0.005), node("s1", 0.01, 250, rtt=0.005),
             node("s2", 0.01, 250, rtt=0.005)]
    targets = Targets(kv_tokens_per_session=0, sessions=1, replicas=0)  # one stream: two stages beat four
    before = plan([shape], nodes, targets)
    assert {a.node_id for a in before.assignments} == {"a", "b"}
    lost = before.assignment_of(NodeId("b"))
    remaining = [n for n in nodes if n.node_id != lost.node_id]
    decision = replan(before, [shape], remaining, targets, Policy(), **EARLY)
    assert {m.node_id for m in decision.moves} == {"s1", "s2"}
    assert covered(decision.plan.assignments, "m", 0, 8) and decision.plan.routes


def test_a_range_nobody_can_take_becomes_a_shortfall():
    shape = model(8, layer_mib=100)
    nodes = [node("a", 0.01, 450), node("b", 0.01, 450)]
    before = plan([shape], nodes, ONE_ROUTE)
    decision = replan(before, [shape], nodes[:1], ONE_ROUTE, Policy(), **EARLY)
    assert decision.plan.shortfalls and not decision.plan.routes and not decision.moves


def faster(nodes, node_id, factor):
    """`nodes` with one node's measured speed multiplied by `factor`."""
    out = []
    for n in nodes:
        if n.node_id == node_id:
            devices = tuple(dataclasses.replace(d, seconds_per_layer=tuple((m, s / factor)
                                                                           for m, s in d.seconds_per_layer))
                            for d in n.devices)
            n = dataclasses.replace(n, devices=devices)
        out.append(n)
    return out


def sped_up():
    """Two nodes splitting 10 layers; then one of them measures 4x faster: a re-plan shifts layers."""
    shape = model(10, layer_mib=100)
    nodes = [node("a", 0.1, 2000, fetch=1e9), node("b", 0.1, 2000, fetch=1e9)]
    targets = Targets(kv_tokens_per_session=0, sessions=4, replicas=0)
    before = plan([shape], nodes, targets)
    return shape, faster(nodes, "a", 4.0), targets, before


def test_a_re_plan_that_pays_is_adopted():
    shape, nodes, targets, before = sped_up()
    decision = replan(before, [shape], nodes, targets, Policy(), **LATE)
    assert decision.adopted and decision.moves and decision.gain_tokens_per_second > 0


def test_a_re_plan_whose_moves_cost_more_than_it_gains_is_not_adopted():
    shape, nodes, targets, before = sped_up()
    slow = [dataclasses.replace(n, fetch_bytes_per_second=1.0) for n in nodes]  # a byte a second
    decision = replan(before, [shape], slow, targets, Policy(), **LATE)
    assert not decision.adopted and not decision.moves and decision.plan.assignments == before.assignments
    assert "does not repay" in decision.reason


def test_no_re_plan_within_the_cooldown():
    shape, nodes, targets, before = sped_up()
    decision = replan(before, [shape], nodes, targets, Policy(cooldown_seconds=300), now=1000.0, last_adopted=800.0)
    assert not decision.adopted and decision.reason.startswith("cooldown")


def test_a_gain_within_the_hysteresis_moves_nothing():
    """One of two nodes measures 15% faster: the balanced split moves one layer for about 4.5%
    more tokens/s. Adopted with no hysteresis; not with 10%."""
    shape = model(20, layer_mib=100)
    nodes = [node("a", 0.1, 4000, fetch=1e9), node("b", 0.1, 4000, fetch=1e9)]
    targets = Targets(kv_tokens_per_session=0, sessions=4, replicas=0)
    before = plan([shape], nodes, targets)
    measured = faster(nodes, "a", 1.15)
    eager = replan(before, [shape], measured, targets, Policy(min_relative_gain=0.0), **LATE)
    assert eager.adopted and 0.0 < eager.gain_tokens_per_second < 0.1 * before.tokens_per_second()
    calm = replan(before, [shape], measured, targets, Policy(min_relative_gain=0.10), **LATE)
    assert not calm.adopted and not calm.moves and "hysteresis" in calm.reason


@SETTINGS
@given(small_fleets(max_nodes=5, max_layers=6), st.lists(st.sampled_from([0.6, 0.9, 1.0, 1.1, 2.0]), min_size=5,
                                                          max_size=5),
       st.sampled_from([0.0, 0.1, 0.5]), st.sampled_from([10.0, 3600.0]), st.sampled_from([1e3, 1e9]))
def test_nodes_move_only_when_the_gain_repays_the_cost(fleet, factors, margin, horizon, fetch):
    shape, nodes, targets = fleet
    before = plan([shape], nodes, targets)
    measured = [dataclasses.replace(n, fetch_bytes_per_second=fetch) for n in nodes]
    for n, factor in zip(nodes, factors):
        measured = faster(measured, n.node_id, factor)
    policy = Policy(horizon_seconds=horizon, min_relative_gain=margin)
    decision = replan(before, [shape], measured, targets, policy, **LATE)
    if not decision.adopted:
        assert not decision.moves and decision.plan.assignments == before.assignments  # nobody left: nothing moves
        return
    if before.shortfalls and not decision.plan.shortfalls:
        return  # coverage first
    base = before.tokens_per_second()
    assert decision.gain_tokens_per_second > margin * base
    busy = max(m.seconds for m in decision.moves)
    assert decision.gain_tokens_per_second * (horizon - busy) > decision.cost_tokens
    stages = [(a.node_id, a.backend, a.start, a.end) for a in decision.plan.assignments]
    assert chain_fits(shape, measured, targets.kv_tokens, stages)


@pytest.mark.parametrize("field", ["horizon_seconds", "min_relative_gain", "cooldown_seconds", "drain_seconds"])
@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_a_bad_policy_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        Policy(**{field: value})


def test_nodes_that_measured_nothing_for_a_model_use_their_speed_per_gib():
    shape = model(4, layer_mib=100)
    bare = dataclasses.replace(node("x", 0.1, 1000), devices=(DeviceOffer("cpu", 1000 * MIB, 2.0),))
    result = plan([shape], [bare], ONE_ROUTE)
    assert result.routes[0].decode_seconds == pytest.approx(2.0 * 400 * MIB / (1 << 30))
