"""The planner's inputs (fleet.py): every bad figure refused with the field named, and the
arithmetic the planner relies on."""

from __future__ import annotations

import dataclasses

import pytest

from meshnet.placement.fixtures import MIB, model, node
from meshnet.placement.fleet import GIB, DeviceOffer, LinkOffer, ModelShape, NodeId, NodeOffer, Part, Targets
from meshnet.placement.planner import plan

NAN, INF = float("nan"), float("inf")
SHAPE = dict(name="m", layer_bytes=(10, 10), kv_bytes_per_token=(1, 1), activation_bytes=4)
DEVICE = dict(backend="cpu", memory_bytes=100, seconds_per_gib=1.0)
NODE = dict(node_id=NodeId("a"), devices=(DeviceOffer(**DEVICE),), rtt_seconds=0.001, bytes_per_second=1e8,
            fetch_bytes_per_second=1e8)

REFUSALS = [
    (ModelShape, SHAPE, dict(name=""), "name"),
    (ModelShape, SHAPE, dict(layer_bytes=(), kv_bytes_per_token=()), "at least one layer"),
    (ModelShape, SHAPE, dict(kv_bytes_per_token=(1,)), "kv_bytes_per_token has 1 entries for 2 layers"),
    (ModelShape, SHAPE, dict(layer_bytes=(10, -1)), r"layer_bytes\[1\]"),
    (ModelShape, SHAPE, dict(layer_bytes=(10, 0)), r"layer_bytes\[1\]"),
    (ModelShape, SHAPE, dict(layer_bytes=(10, 1.5)), r"layer_bytes\[1\]"),
    (ModelShape, SHAPE, dict(kv_bytes_per_token=(1, -1)), r"kv_bytes_per_token\[1\]"),
    (ModelShape, SHAPE, dict(activation_bytes=-1), "activation_bytes"),
    (ModelShape, SHAPE, dict(embedding_bytes=-1), "embedding_bytes"),
    (ModelShape, SHAPE, dict(output_bytes=True), "output_bytes"),
    (DeviceOffer, DEVICE, dict(backend=""), "backend"),
    (DeviceOffer, DEVICE, dict(memory_bytes=-1), "memory_bytes"),
    (DeviceOffer, DEVICE, dict(seconds_per_gib=NAN), "seconds_per_gib"),
    (DeviceOffer, DEVICE, dict(seconds_per_gib=INF), "seconds_per_gib"),
    (DeviceOffer, DEVICE, dict(seconds_per_gib=0.0), "seconds_per_gib"),
    (DeviceOffer, DEVICE, dict(seconds_per_layer=(("m", -0.1),)), "seconds_per_layer"),
    (DeviceOffer, DEVICE, dict(seconds_per_layer=(("m", 0.1), ("m", 0.2))), "names a model twice"),
    (NodeOffer, NODE, dict(node_id=NodeId("")), "node_id"),
    (NodeOffer, NODE, dict(devices=()), "offers no device"),
    (NodeOffer, NODE, dict(devices=(DeviceOffer(**DEVICE), DeviceOffer(**DEVICE))), "share a backend"),
    (NodeOffer, NODE, dict(rtt_seconds=NAN), "rtt_seconds"),
    (NodeOffer, NODE, dict(rtt_seconds=-0.001), "rtt_seconds"),
    (NodeOffer, NODE, dict(bytes_per_second=0.0), "bytes_per_second"),
    (NodeOffer, NODE, dict(fetch_bytes_per_second=INF), "fetch_bytes_per_second"),
    (NodeOffer, NODE, dict(links=(LinkOffer(NodeId("b"), 0.1, 1e6), LinkOffer(NodeId("b"), 0.2, 1e6))),
     "links name a peer twice"),
    (Targets, dict(kv_tokens_per_session=0), dict(sessions=0), "sessions"),
    (Targets, dict(kv_tokens_per_session=0), dict(kv_tokens_per_session=-1), "kv_tokens_per_session"),
    (Targets, dict(kv_tokens_per_session=0), dict(replicas=-1), "replicas"),
]


@pytest.mark.parametrize("kind, good, change, message", REFUSALS,
                         ids=[f"{k.__name__}-{next(iter(c))}-{i}" for i, (k, _, c, _) in enumerate(REFUSALS)])
def test_bad_input_is_refused_naming_the_field(kind, good, change, message):
    kind(**good)  # the unchanged figures are fine
    with pytest.raises(ValueError, match=message):
        kind(**{**good, **change})


@pytest.mark.parametrize("link", [dict(rtt_seconds=NAN), dict(rtt_seconds=-1.0), dict(bytes_per_second=0.0)])
def test_a_bad_link_is_refused(link):
    with pytest.raises(ValueError, match="link to b"):
        LinkOffer(**{"peer": NodeId("b"), "rtt_seconds": 0.1, "bytes_per_second": 1e6, **link})


@pytest.mark.parametrize("start, end", [(-1, 2), (3, 3), (4, 2)])
def test_a_bad_part_is_refused(start, end):
    with pytest.raises(ValueError, match="part of m"):
        Part("m", start, end)


def test_duplicate_models_or_nodes_are_refused_by_the_planner():
    shape = model(2)
    with pytest.raises(ValueError, match="two models share a name"):
        plan([shape, shape], [node("a", 0.1, 1000)], Targets(0))
    with pytest.raises(ValueError, match="two nodes share an id"):
        plan([shape], [node("a", 0.1, 1000), node("a", 0.2, 1000)], Targets(0))


def test_a_stage_holds_its_layers_and_the_ends_their_extras():
    shape = model(4, layer_mib=100, kv_bytes=1000, embedding_mib=30, output_mib=50)
    assert shape.weight_bytes(0, 1) == 130 * MIB
    assert shape.weight_bytes(1, 3) == 200 * MIB
    assert shape.weight_bytes(3, 4) == 150 * MIB
    assert shape.memory_bytes(1, 3, kv_tokens=10) == 200 * MIB + 2 * 10 * 1000


def test_bytes_on_disk_count_only_the_layers_held():
    shape = model(6, layer_mib=100, embedding_mib=30, output_mib=50)
    holder = node("a", 0.1, 1000, parts=[Part("m", 0, 2), Part("m", 5, 6), Part("other", 0, 6)])
    assert holder.bytes_on_disk(shape, 0, 6) == (3 * 100 + 30 + 50) * MIB
    assert holder.bytes_on_disk(shape, 1, 4) == 100 * MIB  # layer 1 only; no embeddings (not the first stage)


def test_a_pairwise_link_overrides_the_default_hop():
    a = dataclasses.replace(node("a", 0.1, 1000, rtt=0.010, bandwidth=1e6),
                            links=(LinkOffer(NodeId("b"), 0.001, 1e9),))
    assert a.hop_seconds(1000, NodeId("b")) == pytest.approx(0.001 + 1e-6)
    assert a.hop_seconds(1000, NodeId("c")) == pytest.approx(0.010 + 1e-3)
    assert a.hop_seconds(1000) == pytest.approx(0.010 + 1e-3)


def test_a_measured_figure_for_the_model_beats_the_per_gib_figure():
    shape = model(2, layer_mib=512)
    measured = DeviceOffer("cpu", GIB, 4.0, (("m", 0.25),))
    assert measured.seconds_per_byte(shape) * 512 * MIB == pytest.approx(0.25)
    assert DeviceOffer("cpu", GIB, 4.0).seconds_per_byte(shape) * 512 * MIB == pytest.approx(2.0)
