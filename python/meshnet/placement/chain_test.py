"""One model's route (chain.py): the bottleneck search against brute force over every subset,
order, device and cut of small fleets, and the stage-count choice."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from meshnet.placement.capacity import build_pool, fleet_table
from meshnet.placement.chain import best_chain, chain_at, min_bottleneck
from meshnet.placement.fixtures import brute_force, chain_fits, model, node, small_fleets
from meshnet.placement.fleet import ModelShape

SETTINGS = settings(max_examples=300, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck))


def pool_of(shape, nodes, kv_tokens=0):
    nodes = sorted(nodes, key=lambda n: n.node_id)
    return build_pool(fleet_table(nodes), shape, range(len(nodes)), kv_tokens)


def stages_of(pool, chain):
    out = []
    for row, (start, end) in zip(chain.rows, chain.ranges()):
        n = pool.nodes[int(pool.row_node[row])]
        out.append((n.node_id, n.devices[int(pool.row_device[row])].backend, start, end))
    return out


def check_valid(shape, pool, chain, kv_tokens, max_stages):
    assert sum(chain.layers) == shape.n_layer and min(chain.layers) >= 1
    assert len(chain.rows) <= max_stages
    assert len({int(pool.row_node[r]) for r in chain.rows}) == len(chain.rows)  # a node serves one stage
    assert chain_fits(shape, pool.nodes, kv_tokens, stages_of(pool, chain))


@SETTINGS
@given(small_fleets())
def test_the_least_bottleneck_is_exact_against_brute_force(fleet):
    shape, nodes, targets = fleet
    pool = pool_of(shape, nodes, targets.kv_tokens)
    for stages in range(1, len(nodes) + 1):
        truth = brute_force(shape, pool.nodes, targets.kv_tokens, stages)
        found = min_bottleneck(pool, stages)
        chain = None if found is None else chain_at(pool, found, stages)
        if truth is None:
            assert found is None and chain is None
            continue
        assert found == pytest.approx(truth, rel=1e-9, abs=1e-12)
        assert chain is not None and chain.exact
        check_valid(shape, pool, chain, targets.kv_tokens, stages)
        assert chain.bottleneck_seconds == pytest.approx(truth, rel=1e-9, abs=1e-12)


@SETTINGS
@given(small_fleets(max_layers=5))
def test_unlike_layers_give_a_valid_conservative_chain(fleet):
    shape, nodes, targets = fleet
    grown = tuple(b * (1 + i % 3) for i, b in enumerate(shape.layer_bytes))
    shape = ModelShape(shape.name, grown, shape.kv_bytes_per_token, shape.activation_bytes, shape.embedding_bytes,
                       shape.output_bytes)
    pool = pool_of(shape, nodes, targets.kv_tokens)
    chain = best_chain(pool, targets.sessions)
    truth = brute_force(shape, pool.nodes, targets.kv_tokens, len(nodes))
    if chain is None:
        return
    check_valid(shape, pool, chain, targets.kv_tokens, len(nodes))
    assert truth is not None and chain.bottleneck_seconds >= truth - 1e-12
    assert not chain.exact or len(set(grown)) == 1


def test_layers_follow_speed_when_the_route_is_kept_full():
    """The issue's live fleet: one, half and a quarter of a core. With four streams in flight the
    slowest stage paces everything: layers go 4:2:1 (13, 6, 3 of 22), the bottleneck 13 layer-times
    against 15 for the best two-node chain and 22 for one node."""
    shape = model(22)
    nodes = [node("full", 1.0, 10_000), node("half", 2.0, 10_000), node("quarter", 4.0, 10_000)]
    pool = pool_of(shape, nodes)
    chain = best_chain(pool, sessions=4)
    layers = {pool.nodes[int(pool.row_node[r])].node_id: count for r, count in zip(chain.rows, chain.layers)}
    assert layers == {"full": 13, "half": 6, "quarter": 3}
    assert chain.bottleneck_seconds == pytest.approx(13.0)
    assert [min_bottleneck(pool, s) for s in (1, 2, 3)] == pytest.approx([22.0, 15.0, 13.0])


def test_one_stream_prefers_fewer_faster_stages():
    """One stream waits for every stage in turn: the fastest node alone (22) beats 4:2:1 (37)."""
    shape = model(22)
    nodes = [node("full", 1.0, 10_000), node("half", 2.0, 10_000), node("quarter", 4.0, 10_000)]
    pool = pool_of(shape, nodes)
    chain = best_chain(pool, sessions=1)
    assert chain.layers == (22,) and chain.decode_seconds == pytest.approx(22.0)


def test_a_slow_far_node_is_left_out_of_the_route():
    """A node whose hop alone exceeds what it would save is not used: with it the bottleneck
    drops from 6 to 5 layer-times but every token pays its 50-second hop."""
    shape = model(12)
    nodes = [node("a", 1.0, 10_000), node("b", 1.0, 10_000), node("far", 1.0, 10_000, rtt=50.0)]
    pool = pool_of(shape, nodes)
    chain = best_chain(pool, sessions=2)
    used = {pool.nodes[int(pool.row_node[r])].node_id for r in chain.rows}
    assert used == {"a", "b"} and chain.bottleneck_seconds == pytest.approx(6.0)


def test_memory_forces_slow_nodes_in():
    """The fast node holds only 4 of 10 layers: the slow one must take the rest."""
    shape = model(10, layer_mib=100)
    nodes = [node("fast", 0.1, 450), node("slow", 1.0, 10_000)]
    pool = pool_of(shape, nodes)
    chain = best_chain(pool, sessions=1)
    assert sorted(chain.layers) == [4, 6]
    assert chain.decode_seconds == pytest.approx(0.4 + 6.0)


def test_no_chain_when_memory_is_short():
    shape = model(10, layer_mib=100)
    pool = pool_of(shape, [node("a", 1.0, 450), node("b", 1.0, 450)])
    assert best_chain(pool, sessions=1) is None
    assert min_bottleneck(pool, 2) is None


def test_a_node_cannot_be_both_ends_of_a_chain():
    """One node holds every layer and the head but not the embeddings too; the other holds
    nothing: there is no chain (the first node cannot also be the first stage)."""
    shape = model(4, layer_mib=200, embedding_mib=150, output_mib=50)
    pool = pool_of(shape, [node("big", 1.0, 900), node("tiny", 1.0, 180)])
    assert best_chain(pool, sessions=1) is None
    assert brute_force(shape, pool.nodes, 0, 2) is None


@SETTINGS
@given(small_fleets(max_nodes=4, max_layers=6))
def test_a_chain_is_found_whenever_one_exists(fleet):
    """Coverage first: whatever the embeddings and head cost, a chain comes back iff brute force
    finds one, and it fits."""
    shape, nodes, targets = fleet
    pool = pool_of(shape, nodes, targets.kv_tokens)
    chain = best_chain(pool, targets.sessions)
    truth = brute_force(shape, pool.nodes, targets.kv_tokens, len(nodes))
    assert (chain is None) == (truth is None)
    if chain is not None:
        check_valid(shape, pool, chain, targets.kv_tokens, len(nodes))
        assert chain.bottleneck_seconds >= truth - 1e-12


def test_the_first_stage_may_rank_below_the_largest():
    """A case where the best first stage (room for the 200 MiB embeddings) ranks below the node
    that ends up last among the middle counts: found by a search for it."""
    shape = model(8, layer_mib=100, embedding_mib=200, output_mib=50)
    nodes = [node("n0", 0.2, 400), node("n1", 0.1, 300), node("n2", 1.0, 700), node("n3", 1.0, 500)]
    pool = pool_of(shape, nodes)
    assert brute_force(shape, pool.nodes, 0, 2) == pytest.approx(4.5)
    assert min_bottleneck(pool, 2) == pytest.approx(4.5)
    assert chain_at(pool, 4.5, 2).bottleneck_seconds == pytest.approx(4.5)
