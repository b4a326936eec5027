"""The planner (planner.py) over generated fleets: coverage or a reason, memory budgets, one
place per node, determinism, and how it compares with memory-proportional placement."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshnet.placement.baselines import memory_proportional
from meshnet.placement.fixtures import brute_force, chain_fits, model, node, small_fleets
from meshnet.placement.fleet import DeviceOffer, NodeId, NodeOffer, Part, Targets
from meshnet.placement.planner import plan
from meshnet.placement.plans import PRIMARY, Assignment
from meshnet.placement.routes import timed_route
from meshnet.placement.shapes import SYNTHETIC_1_07B

SETTINGS = settings(max_examples=250, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck))


@st.composite
def fleets(draw):
    """One or two models on the same small fleet (the second one timed by seconds per GiB)."""
    shape, nodes, targets = draw(small_fleets(max_nodes=6, max_layers=6))
    models = [shape]
    if draw(st.booleans()):
        models.append(model(draw(st.integers(1, 4)), layer_mib=draw(st.sampled_from([60, 120])), name="other"))
    return models, nodes, targets


def check_plan(models, nodes, targets, result):
    ids = [a.node_id for a in result.assignments] + [o.node_id for o in result.left_out]
    assert sorted(ids) == sorted(n.node_id for n in nodes)  # every node once, assigned or told why
    assert all(o.reason for o in result.left_out)
    stages = [(a.node_id, a.backend, a.start, a.end) for a in result.assignments]
    for shape in models:
        mine = [s for s, a in zip(stages, result.assignments) if a.model == shape.name]
        assert chain_fits(shape, nodes, targets.kv_tokens, mine)  # every memory budget holds
        routes = [r for r in result.routes if r.model == shape.name]
        short = [s for s in result.shortfalls if s.model == shape.name]
        assert bool(routes) != bool(short)  # covered, or told why not
        for route in routes:
            assert route.hops[0].start == 0 and route.hops[-1].end == shape.n_layer
            assert all(a.end == b.start for a, b in zip(route.hops, route.hops[1:]))
    used = [h.node_id for r in result.routes for h in r.hops]
    assert len(used) == len(set(used))  # a node serves one route


@SETTINGS
@given(fleets())
def test_every_plan_covers_every_layer_or_says_why_and_fits_memory(fleet):
    models, nodes, targets = fleet
    result = plan(models, nodes, targets)
    check_plan(models, nodes, targets, result)
    if len(models) == 1:  # coverage is exact: a chain exists iff the plan covers the model
        exists = brute_force(models[0], nodes, targets.kv_tokens, len(nodes)) is not None
        assert exists == (not result.shortfalls)


@SETTINGS
@given(fleets())
def test_the_plan_is_deterministic_whatever_the_order_of_the_nodes(fleet):
    models, nodes, targets = fleet
    first = plan(models, nodes, targets)
    assert plan(models, list(reversed(nodes)), targets) == first
    assert plan(list(reversed(models)), nodes, targets) == first


@SETTINGS
@given(small_fleets(max_nodes=6, max_layers=8))
def test_a_full_pipeline_is_never_slower_than_memory_proportional(fleet):
    """Guaranteed: with one route and at least as many streams as layers, every chain's per-token
    time is sessions x its slowest stage, so the planner's route has the least bottleneck of all
    chains (exact), memory-proportional placement's included."""
    shape, nodes, targets = fleet
    targets = dataclasses.replace(targets, sessions=shape.n_layer, replicas=0)
    ours, theirs = plan([shape], nodes, targets), memory_proportional([shape], nodes, targets)
    if theirs.routes:
        assert ours.routes[0].bottleneck_seconds <= theirs.routes[0].bottleneck_seconds + 1e-12


@SETTINGS
@given(small_fleets(max_nodes=6, max_layers=8))
def test_one_route_is_never_slower_per_token_than_memory_proportional(fleet):
    """Tested, not proven: with one route per model and any number of streams, the planner's
    per-stream time per token max(D, sessions x T) is no worse than memory-proportional's."""
    shape, nodes, targets = fleet
    targets = dataclasses.replace(targets, replicas=0)
    ours, theirs = plan([shape], nodes, targets), memory_proportional([shape], nodes, targets)
    if theirs.routes:
        per_token = lambda r: max(r.decode_seconds, targets.sessions * r.bottleneck_seconds)  # noqa: E731
        assert per_token(ours.routes[0]) <= per_token(theirs.routes[0]) + 1e-12
        assert ours.tokens_per_second() >= theirs.tokens_per_second() - 1e-9


def live_fleet(sessions: int, cap_fraction: float = 0.6):
    """The issue's live check: the synthetic 1.07B on nodes at 100%, 50% and 25% of one core
    (seconds per GiB: an assumed 0.2 at one core), each with memory for `cap_fraction` of it."""
    cap = int(cap_fraction * SYNTHETIC_1_07B.total_bytes())
    nodes = [NodeOffer(NodeId(name), (DeviceOffer("cpu", cap, seconds),), 0.0002, 1e9, 1e8)
             for name, seconds in (("core-100", 0.2), ("core-050", 0.4), ("core-025", 0.8))]
    return [SYNTHETIC_1_07B], nodes, Targets(kv_tokens_per_session=2048, sessions=sessions, replicas=0)


def equal_split_seconds(models, nodes, targets) -> float:
    """The live check's baseline: the three nodes split equally by memory (8, 7, 7 layers), in
    the order most favourable to it; its single-stream seconds per token."""
    shape, by_id = models[0], {n.node_id: n for n in nodes}
    best = float("inf")
    for order in itertools.permutations(nodes):
        stages = [(Assignment(n.node_id, shape.name, a, b, "cpu", PRIMARY, ""), a)
                  for n, (a, b) in zip(order, ((0, 8), (8, 15), (15, 22)))]
        if chain_fits(shape, nodes, targets.kv_tokens, [(a.node_id, "cpu", a.start, a.end) for a, _ in stages]):
            best = min(best, timed_route(shape, by_id, stages, targets.sessions).decode_seconds)
    return best


@pytest.mark.parametrize("sessions, cap_fraction", [(1, 0.6), (4, 0.8)])
def test_the_live_fleet_decodes_at_least_1_25x_faster_than_an_equal_memory_split(sessions, cap_fraction):
    """Planned for one stream, or for four where memory allows the speed split. (Four streams'
    KV in 60% caps leaves the fastest node too little room: 1.20x predicted, see the README.)"""
    models, nodes, targets = live_fleet(sessions, cap_fraction)
    ours = plan(models, nodes, targets)
    assert equal_split_seconds(models, nodes, targets) / ours.routes[0].decode_seconds >= 1.25


def test_the_live_fleet_with_a_full_pipeline_splits_work_by_speed():
    """Four streams in flight and memory for 80% of the model each: work goes 4:2:1, within one
    and a half layers, where the last stage's work counts the head (82.6 MB of tied Q6_K
    embeddings: 3.3 layers' worth of reads)."""
    models, nodes, targets = live_fleet(4, cap_fraction=0.8)
    shape = models[0]
    result = plan(models, nodes, targets)
    head = shape.output_bytes / shape.layer_bytes[0]
    work = {a.node_id: a.end - a.start + (head if a.end == shape.n_layer else 0) for a in result.assignments}
    total = shape.n_layer + head
    for name, share in (("core-100", 4 / 7), ("core-050", 2 / 7), ("core-025", 1 / 7)):
        assert abs(work[name] - total * share) <= 1.5


def test_a_model_that_does_not_fit_says_which_layers_and_how_much_memory():
    shape = model(10, layer_mib=100)
    nodes = [node("a", 0.1, 350), node("b", 0.1, 250)]
    result = plan([shape], nodes, Targets(kv_tokens_per_session=0))
    (short,) = result.shortfalls
    assert short.uncovered == (5, 10) and short.memory_short_bytes == 5 * 100 * (1 << 20)
    assert "at most 5 of its 10 layers" in short.reason
    assert not result.assignments and len(result.left_out) == 2


def test_a_node_too_small_for_any_range_is_told_why():
    shape = model(4, layer_mib=100)
    nodes = [node("big", 0.1, 1000), node("tiny", 0.1, 50)]
    result = plan([shape], nodes, Targets(kv_tokens_per_session=0))
    (left,) = result.left_out
    assert left.node_id == "tiny" and "no planned range fits" in left.reason


def test_replicas_stop_at_the_target_and_the_rest_are_spare():
    shape = model(4, layer_mib=100)
    nodes = [node(f"n{i}", 0.1, 1000) for i in range(5)]
    result = plan([shape], nodes, Targets(kv_tokens_per_session=0, replicas=1))
    assert len(result.assignments) == 2 and len(result.routes) == 2
    assert all("spare" in o.reason for o in result.left_out) and len(result.left_out) == 3


def test_a_replica_prefers_the_range_it_holds_on_disk():
    shape = model(4, layer_mib=100)
    nodes = [node("a", 0.1, 250), node("b", 0.1, 250), node("c", 0.1, 250, parts=[Part("m", 2, 4)]),
             node("d", 0.1, 250)]
    result = plan([shape], nodes, Targets(kv_tokens_per_session=0, sessions=4, replicas=1))
    held = result.assignment_of(NodeId("c"))
    assert (held.start, held.end) == (2, 4)


def test_ten_thousand_nodes_and_fifty_models_plan_without_error():
    """Size only (the timing is the simulator's to report, not a test's): every node placed or
    told why, every model covered."""
    import numpy as np

    from meshnet.placement.simulate import consumer_fleet, scale_models
    models = scale_models()
    nodes = consumer_fleet(10_000, np.random.default_rng(0))
    result = plan(models, nodes, Targets(kv_tokens_per_session=2048, sessions=4))
    assert len(result.assignments) + len(result.left_out) == 10_000
    assert not result.shortfalls and {r.model for r in result.routes} == {m.name for m in models}
