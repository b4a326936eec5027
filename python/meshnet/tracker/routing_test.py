"""Route selection: cheapest chain, effective starts, gaps, bans (by exclusion), determinism."""

import random

import pytest

from meshnet.tracker.routing import Candidate, NoRouteError, RouteHop, find_route, hop_cost, uncovered_ranges
from meshnet.wire.ids import NodeId


def c(node, start, end, **kw):
    return Candidate(NodeId(node), start, end, **kw)


def test_single_node_covers_everything():
    assert find_route([c("a", 0, 30)], 30) == [RouteHop(NodeId("a"), 0, 30)]


def test_replicas_pick_the_cheapest_chain():
    nodes = [
        c("slow-0", 0, 10, seconds_per_layer=0.010), c("fast-0", 0, 10, seconds_per_layer=0.002),
        c("busy-1", 10, 20, load=3.0), c("idle-1", 10, 20),
        c("far-2", 20, 30, rtt_seconds=0.080), c("near-2", 20, 30, rtt_seconds=0.001),
    ]
    route = find_route(nodes, 30)
    assert [h.node_id for h in route] == ["fast-0", "idle-1", "near-2"]
    assert [(h.start, h.end) for h in route] == [(0, 10), (10, 20), (20, 30)]


def test_fewer_hops_win_when_compute_is_equal():
    nodes = [c("a", 0, 10), c("b", 10, 20), c("c", 20, 30), c("whole", 0, 30)]
    assert [h.node_id for h in find_route(nodes, 30)] == ["whole"]


def test_overlapping_ranges_use_effective_starts():
    nodes = [c("a", 0, 12, runs_suffix=True), c("b", 8, 22, runs_suffix=True), c("c", 18, 30, runs_suffix=True)]
    route = find_route(nodes, 30)
    assert route == [RouteHop(NodeId("a"), 0, 12), RouteHop(NodeId("b"), 12, 22), RouteHop(NodeId("c"), 22, 30)]
    covered = [layer for h in route for layer in range(h.start, h.end)]
    assert covered == list(range(30))


def test_whole_range_nodes_join_only_at_their_registered_start():
    # GGUF workers run their whole range: [0,12) then [10,30) would run layers 10 and 11 twice.
    with pytest.raises(NoRouteError) as err:
        find_route([c("a", 0, 12), c("b", 10, 30)], 30)
    assert err.value.uncovered == [] and "past layer 12" in str(err.value)
    route = find_route([c("a", 0, 12), c("b", 10, 30), c("c", 0, 10)], 30)
    assert route == [RouteHop(NodeId("c"), 0, 10), RouteHop(NodeId("b"), 10, 30)]
    mixed = find_route([c("a", 0, 12), c("r", 10, 30, runs_suffix=True)], 30)
    assert mixed == [RouteHop(NodeId("a"), 0, 12), RouteHop(NodeId("r"), 12, 30)]


def test_gap_names_the_missing_layers():
    with pytest.raises(NoRouteError) as err:
        find_route([c("a", 0, 10), c("c", 20, 30), c("d", 25, 28)], 30)
    assert err.value.uncovered == [(10, 20)]
    assert "10..19" in str(err.value)
    assert uncovered_ranges([c("a", 1, 2)], 4) == [(0, 1), (2, 4)]


def test_banned_node_is_avoided_by_exclusion():
    nodes = [c("a", 0, 10), c("b", 10, 30), c("b2", 10, 30, seconds_per_layer=0.005)]
    assert [h.node_id for h in find_route(nodes, 30)] == ["a", "b"]
    without_b = [n for n in nodes if n.node_id != "b"]
    assert [h.node_id for h in find_route(without_b, 30)] == ["a", "b2"]


def test_equal_inputs_give_equal_routes_whatever_the_order():
    nodes = [c(f"n{i}", s, e) for i, (s, e) in enumerate([(0, 10), (0, 10), (10, 20), (10, 20), (20, 30), (20, 30), (5, 25)])]
    expected = find_route(nodes, 30)
    rng = random.Random(7)
    for _ in range(50):
        shuffled = nodes[:]
        rng.shuffle(shuffled)
        assert find_route(shuffled, 30) == expected


def test_out_of_range_candidates_are_ignored():
    assert find_route([c("bad", 5, 40), c("ok", 0, 30)], 30) == [RouteHop(NodeId("ok"), 0, 30)]
    with pytest.raises(ValueError):
        find_route([], 0)


def _every_chain(candidates, n_layer, boundary=0):
    """Every chain of hops from `boundary` to n_layer, by brute force (small inputs only)."""
    if boundary == n_layer:
        yield ()
        return
    for cand in candidates:
        if cand.start <= boundary < cand.end <= n_layer and (cand.start == boundary or cand.runs_suffix):
            for rest in _every_chain(candidates, n_layer, cand.end):
                yield ((cand, boundary),) + rest


def test_the_route_is_the_cheapest_of_every_chain():
    # find_route reduces same-hop candidates before searching; an exhaustive search says what
    # the answer must be: the least total cost, then the fewest hops, then the node ids in order.
    rng = random.Random(11)
    for trial in range(300):
        n_layer = rng.randint(1, 8)
        nodes = []
        for i in range(rng.randint(1, 7)):
            start = rng.randrange(n_layer)
            nodes.append(c(f"n{rng.randrange(100):02d}-{i}", start, rng.randint(start + 1, n_layer),
                           seconds_per_layer=rng.choice([0.001, 0.002, 0.004]), load=rng.choice([0.0, 0.5, 1.0]),
                           rtt_seconds=rng.choice([0.001, 0.002, 0.003]), runs_suffix=rng.random() < 0.4))
        chains = list(_every_chain(nodes, n_layer))
        if not chains:
            with pytest.raises(NoRouteError):
                find_route(nodes, n_layer)
            continue

        def key(chain):
            total = 0.0
            for cand, entry in chain:  # summed in path order, as the search does
                total += hop_cost(cand, entry)
            return total, len(chain), tuple(cand.node_id for cand, _ in chain)

        cheapest = min(chains, key=key)
        expected = [RouteHop(cand.node_id, entry, cand.end) for cand, entry in cheapest]
        assert find_route(nodes, n_layer) == expected, (trial, nodes)


def test_an_unmeasured_node_is_costed_at_its_peers_median_speed():
    """A node without telemetry yet is estimated at the median measured speed, not a fixed
    guess: on a loaded swarm the fixed 1 ms per layer beat a measured direct node, and routes
    went over a relayed hop (its relay round trip on top) where the direct one was as fast."""
    slow = 0.0015  # measured: 1.5 ms a layer, slower than the fixed guess
    direct = [c("d0", 0, 10, seconds_per_layer=slow, load=1 / 16, measured=True),
              c("d1", 10, 20, seconds_per_layer=slow, measured=True), c("d2", 20, 30, seconds_per_layer=slow, measured=True)]
    relayed = c("r2", 20, 30, rtt_seconds=0.002 + 0.0008)  # no telemetry: the default estimate
    assert [h.node_id for h in find_route(direct + [relayed], 30)] == ["d0", "d1", "d2"]
    fast = c("d2", 20, 30, seconds_per_layer=0.0001, measured=True)
    assert find_route([fast, relayed, *direct[:2]], 30)[-1].node_id == "d2"
    unmeasured = [c("a", 0, 30), c("b", 0, 30, seconds_per_layer=0.0005)]  # nobody measured: as given
    assert find_route(unmeasured, 30)[0].node_id == "b"
