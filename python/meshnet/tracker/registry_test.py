"""Registry, nodes: admission, validation, leases, drain, quarantine, dark nodes, coverage and the
snapshot, and that a node acts only for itself. Route sessions are in registry_routes_test.py."""

from __future__ import annotations

import dataclasses

import pytest

from meshnet.recipe import fingerprint
from meshnet.tracker.registry import Registry
from meshnet.tracker.registry_fixtures import (CLIENT, MODEL, fail, key, name_of, nid, node, open_route, register,
                                               route_names)
from meshnet.tracker.registry_fixtures import clock, registry  # noqa: F401 (pytest fixtures)
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.seam import Fingerprints
from meshnet.wire.status import StatusCode


def test_admission(registry):
    assert register(registry, "a", 0, 30).admission == tt.Admission.ROUTABLE
    dark = register(registry, "q", 0, 30, architecture="bloom")
    assert dark.admission == tt.Admission.DARK and dark.status.ok and "no layer-range adapter" in dark.reason
    bad_recipe = register(registry, "r", 0, 30, fingerprints=Fingerprints("sha256:art", "sha256:other"))
    assert bad_recipe.admission == tt.Admission.REFUSED
    assert bad_recipe.status.code == StatusCode.FINGERPRINT_MISMATCH and "recipe fingerprint" in bad_recipe.reason
    assert "matmul activations" not in bad_recipe.reason  # the entry names none
    bad_artifact = register(registry, "s", 0, 30, fingerprints=Fingerprints("sha256:x", "sha256:rec"))
    assert "artifact fingerprint" in bad_artifact.reason
    unknown = register(registry, "u", 0, 30, model="mystery")
    assert unknown.admission == tt.Admission.REFUSED and "no certified recipe" in unknown.reason
    cover = registry.coverage("smol")
    assert cover.dark_node_ids == (nid("q"),)
    assert sorted(name_of(n.node_id) for n in cover.nodes) == ["a", "q"]
    assert all(layer.node_ids == (nid("a"),) for layer in cover.layers)


def test_a_refused_recipe_is_told_the_certified_matmul_activations(clock):
    """An entry that records its recipe's matmul activations (ADR 0012) tells a node with another
    recipe which flag to run; the honest node beside it is admitted."""
    registry = Registry([dataclasses.replace(MODEL, matmul_activations="f32")], clock=clock)
    refused = register(registry, "r", 0, 30, fingerprints=Fingerprints("sha256:art", "sha256:other"))
    assert refused.admission == tt.Admission.REFUSED and refused.status.code == StatusCode.FINGERPRINT_MISMATCH
    assert refused.reason.endswith("(certified with f32 matmul activations: the node's --matmul-activations f32)")
    assert register(registry, "a", 0, 30).admission == tt.Admission.ROUTABLE


def test_a_node_registers_renews_drains_and_leaves_only_as_itself(registry):
    assert register(registry, "victim", 0, 30).status.ok
    impostor = key("impostor").public_key
    # Same id, another key (the old "take over an id by registering it again"): refused.
    taken = registry.register(node("victim", 0, 30, address="10.6.6.6:1", public_key=impostor), impostor)
    assert taken.status.code == StatusCode.PERMISSION_DENIED and taken.admission == tt.Admission.REFUSED
    # The victim's own key, but a claim to another id: refused too.
    forged = registry.register(node("victim", 0, 30), impostor)
    assert forged.status.code == StatusCode.PERMISSION_DENIED
    for action in (lambda: registry.heartbeat(nid("victim"), None, impostor).status,
                   lambda: registry.drain(nid("victim"), impostor),
                   lambda: registry.deregister(nid("victim"), impostor)):
        assert action().code == StatusCode.PERMISSION_DENIED
    # The victim is untouched: still routable at its own address.
    route = open_route(registry)
    assert route_names(route) == [("victim", 0, 30)] and route.hops[0].node.address == "127.0.0.1:7000"
    assert registry.heartbeat(nid("victim"), None, key("victim").public_key).status.ok


@pytest.mark.parametrize("changes,needle", [
    ({"layers": tt.LayerRange(10, 5)}, "ends before it starts"),
    ({"layers": tt.LayerRange(5, 5)}, "ends before it starts"),
    ({"layers": tt.LayerRange(0, 31)}, "exceeds the model"),
    ({"layers": None}, "layer range"),
    ({"n_layer": 1 << 40}, "n_layer"),
    ({"capacity": tt.Capacity(1 << 30, 1, 1)}, "capacity"),
    ({"node_id": NodeId("")}, "node_id"),
    ({"node_id": NodeId("x" * 500)}, "node_id"),
    ({"backend": tt.BackendKind.UNSPECIFIED}, "backend"),
    ({"public_key": b"short"}, "public_key"),
    ({"tls_certificate": "x" * 10000}, "tls_certificate"),
    ({"relay": "x" * 500}, "relay"),
    ({"relay": "10.0.0.1:7700", "relay_rtt_ms": -1.0}, "relay_rtt_ms"),
    ({"relay": "10.0.0.1:7700", "relay_rtt_ms": float("nan")}, "relay_rtt_ms"),
    ({"device": tt.Device("", "llvmpipe", 2, 1)}, "device name"),
    ({"device": tt.Device("vulkan0", "x" * 500, 2, 1)}, "device name"),
    ({"device": tt.Device("vulkan0", "llvmpipe", 1, 2)}, "bytes free of"),
])
def test_malformed_registrations_are_invalid_argument(registry, changes, needle):
    reply = register(registry, "a", 0, 30, **changes)
    assert reply.status.code == StatusCode.INVALID_ARGUMENT and needle in reply.status.message
    assert registry.register(None, key("a").public_key).status.code == StatusCode.INVALID_ARGUMENT
    assert register(registry, "honest", 0, 30).status.ok  # a well-formed node beside it is served
    assert route_names(open_route(registry)) == [("honest", 0, 30)]


def test_a_node_s_device_is_kept_and_shown_in_routes(registry):
    gpu = tt.Device("vulkan0", "Radeon 8060S", 96 << 30, 90 << 30)
    assert register(registry, "gpu", 0, 30, device=gpu).status.ok
    route = open_route(registry)
    assert route.hops[0].node.device == gpu


def test_a_quarantined_node_is_never_routed_and_shows_as_such(clock):
    closed = []
    registry = Registry([MODEL], lease_seconds=10, clock=clock, quarantined=[nid("old-cheat")],
                        on_close=lambda route, model, hops: closed.append((route, model, hops)))
    for name in ("old-cheat", "cheat", "honest"):
        register(registry, name, 0, 30)
    route = open_route(registry)
    assert route_names(route)[0][0] in ("cheat", "honest")
    assert registry.close_route(route.session, CLIENT.public_key).ok
    assert closed == [(route.session, "smol", route.hops)]  # the audit hook sees the closed route
    registry.quarantine(nid("cheat"))
    for _ in range(3):
        reply = open_route(registry)
        assert route_names(reply) == [("honest", 0, 30)]
        registry.close_route(reply.session, CLIENT.public_key)
    coverage = registry.coverage("smol")
    assert set(coverage.quarantined_node_ids) == {nid("old-cheat"), nid("cheat")}
    assert all(nid("cheat") not in layer.node_ids for layer in coverage.layers)
    states = {n.node_id: n.state for n in registry.snapshot().nodes}
    assert states[nid("cheat")] == "quarantined" and states[nid("honest")] == "routable"


def test_dark_nodes_are_never_routed(registry):
    register(registry, "q", 0, 30, architecture="bloom")
    reply = open_route(registry)
    assert reply.status.code == StatusCode.UNAVAILABLE and reply.uncovered == (tt.LayerRange(0, 30),)
    register(registry, "a", 0, 30)
    assert route_names(open_route(registry)) == [("a", 0, 30)]


def test_lease_expiry_removes_the_node(registry, clock):
    register(registry, "a", 0, 15)
    register(registry, "b", 15, 30)
    register(registry, "b2", 10, 30, backend=tt.BackendKind.REFERENCE)  # may start at 15
    clock.now += 6
    assert registry.heartbeat(nid("a"), None, key("a").public_key).status.ok
    assert registry.heartbeat(nid("b2"), None, key("b2").public_key).status.ok
    clock.now += 6  # b's lease (10 s) has run out; a and b2 renewed theirs
    assert registry.heartbeat(nid("b"), None, key("b").public_key).status.code == StatusCode.NOT_FOUND
    assert route_names(open_route(registry)) == [("a", 0, 15), ("b2", 15, 30)]
    assert nid("b") not in [n.node_id for n in registry.coverage("smol").nodes]


def test_drain_excludes_from_new_routes(registry):
    register(registry, "a", 0, 30)
    register(registry, "b", 0, 30, capacity=tt.Capacity(4, 4096, 1))
    first = open_route(registry)
    drained = first.hops[0].node.node_id
    assert registry.drain(drained, key(name_of(drained)).public_key).ok
    second = open_route(registry)
    assert second.hops[0].node.node_id != drained
    assert registry.drain(nid("nobody"), key("nobody").public_key).code == StatusCode.NOT_FOUND


def test_coverage_reports_gaps_and_replicas(registry):
    register(registry, "a", 0, 10)
    register(registry, "a2", 0, 12)
    register(registry, "c", 20, 30)
    cover = registry.coverage("smol")
    assert cover.n_layer == 30 and cover.gaps == (tt.LayerRange(12, 20),)
    assert set(cover.layers[5].node_ids) == {nid("a"), nid("a2")} and cover.layers[11].node_ids == (nid("a2"),)
    assert cover.layers[15].node_ids == ()
    assert [cover.layers[i].replicas for i in (5, 11, 15, 25)] == [2, 1, 0, 1]
    assert cover.node_count == 3 and cover.routable_count == 3


def test_coverage_is_a_bounded_summary_of_a_large_swarm():
    # 10,000 nodes (the scale figures found the full listing at 6 MB, over gRPC's 4 MiB limit):
    # counts stay exact, lists are the first nodes by node id, and the encoded reply is small.
    from meshnet.protocol import tracker as codec
    from meshnet.tracker.coverage import MAX_COVERAGE_NODES, MAX_LAYER_NODE_IDS

    registry = Registry([MODEL], lease_seconds=600)
    cert = "-----BEGIN CERTIFICATE-----\n" + "A" * 600 + "\n-----END CERTIFICATE-----\n"
    names = [f"big{i}" for i in range(10_000)]
    for i, name in enumerate(names):
        start = (i % 3) * 10
        assert register(registry, name, start, start + 10, tls_certificate=cert).status.ok
    register(registry, "dark", 0, 30, architecture="mystery-arch")
    by_id = sorted(nid(name) for name in names)
    cover = registry.coverage("smol")
    assert cover.node_count == 10_001 and cover.routable_count == 10_000 and cover.gaps == ()
    assert [n.node_id for n in cover.nodes] == sorted(by_id + [nid("dark")])[:MAX_COVERAGE_NODES]
    assert cover.dark_node_ids == (nid("dark"),)
    assert [layer.replicas for layer in cover.layers] == [3334] * 10 + [3333] * 20
    first_layer = sorted(nid(name) for i, name in enumerate(names) if i % 3 == 0)
    assert cover.layers[0].node_ids == tuple(first_layer[:MAX_LAYER_NODE_IDS])
    assert len(codec.to_proto(cover).SerializeToString()) < 512 * 1024
    assert len(registry.coverage("smol", max_nodes=5).nodes) == 5
    assert len(registry.coverage("smol", max_nodes=10 ** 6).nodes) == MAX_COVERAGE_NODES  # clamped


def test_the_range_fingerprint_must_be_the_certified_one_for_the_registered_layers(clock):
    names = ["token_embd.weight", "output_norm.weight"] + [f"blk.{i}.{t}.weight" for i in range(30)
                                                            for t in ("attn_q", "ffn_up")]
    digests = {n: f"{i:064x}" for i, n in enumerate(names)}
    certified = dataclasses.replace(MODEL, tensor_digests=digests)
    registry = Registry([certified], clock=clock)
    good = fingerprint.certified_range_fingerprint(digests, 30, 10, 20)
    assert register(registry, "a", 10, 20, range_fingerprint=good).admission == tt.Admission.ROUTABLE
    other = fingerprint.certified_range_fingerprint(digests, 30, 0, 10)  # a real fingerprint, of other layers
    refused = register(registry, "b", 10, 20, range_fingerprint=other)
    assert refused.admission == tt.Admission.REFUSED and refused.status.code == StatusCode.FINGERPRINT_MISMATCH
    assert "range fingerprint" in refused.reason
    assert nid("b") not in [n.node_id for n in registry.coverage("smol").nodes]


def test_the_snapshot_shows_states_coverage_routes_and_no_secrets(registry, clock):
    register(registry, "a", 0, 10)
    register(registry, "b", 10, 20)
    register(registry, "c", 20, 30)
    register(registry, "d", 0, 30)
    register(registry, "e", 0, 30, architecture="bloom", model="other")  # dark
    clock.now += 3
    registry.heartbeat(nid("a"), tt.Load(active_sessions=1, decode_tokens_per_second=42.5), key("a").public_key)
    route = open_route(registry, tt.OpenRouteRequest("smol", client_id="key:alice",
                                                     avoid_node_ids=(nid("d"),)))
    assert route.status.ok
    assert registry.drain(nid("b"), key("b").public_key).ok
    assert fail(registry, open_route(registry, tt.OpenRouteRequest("smol", avoid_node_ids=(nid("a"), nid("b"),
                                                                                           nid("c")))).session,
                nid("d")).status.code == StatusCode.UNAVAILABLE  # d is banned; that session keeps no route
    clock.now += 1
    snap = registry.snapshot()
    states = {n.node_id: n.state for n in snap.nodes}
    assert states == {nid("a"): "routable", nid("b"): "draining", nid("c"): "routable", nid("d"): "banned",
                      nid("e"): "dark"}
    assert snap.node_states == {("smol", "routable"): 2, ("smol", "draining"): 1, ("smol", "banned"): 1,
                                ("(uncertified)", "dark"): 1}
    (model,) = snap.models
    assert (model.model, model.n_layer) == ("smol", 30)
    assert model.replicas == (1,) * 10 + (0,) * 10 + (1,) * 10 and model.gaps == ((10, 20),)
    assert model.covered_ratio == pytest.approx(20 / 30)
    a = next(n for n in snap.nodes if n.node_id == nid("a"))
    assert a.heartbeat_age_s == pytest.approx(1.0) and a.load.decode_tokens_per_second == 42.5 and a.routes == 1
    assert next(n for n in snap.nodes if n.node_id == nid("c")).heartbeat_age_s == pytest.approx(4.0)
    assert snap.route_count == 2 and snap.live_routes == {"smol": 2}
    alice = next(r for r in snap.routes if r.client_id == "key:alice")
    assert alice.hops == ((nid("a"), 0, 10), (nid("b"), 10, 20), (nid("c"), 20, 30))
    assert alice.epoch == 1 and alice.age_s == pytest.approx(1.0) and len(alice.tag) == 8
    assert route.session.session_id.startswith("rs-" + alice.tag) and alice.tag != route.session.session_id[3:]
    assert "public_key" not in repr(snap) and "ticket" not in repr(snap) and route.session.session_id not in repr(snap)


def test_the_snapshot_is_bounded(registry):
    for i in range(6):
        register(registry, f"n{i}", 0, 30)
    for _ in range(5):
        assert open_route(registry).status.ok
    snap = registry.snapshot(max_nodes=4, max_routes=3)
    assert (len(snap.nodes), snap.node_count, len(snap.routes), snap.route_count) == (4, 6, 3, 5)
    assert snap.node_states == {("smol", "routable"): 6}


def test_dark_registrations_are_capped_and_listed_after_serving_nodes(registry):
    """Issue 35, finding 12: one node token registered thousands of fresh-key dark nodes in
    seconds, crowding honest nodes out of Coverage's and the status page's lists."""
    from meshnet.tracker.registry import MAX_DARK_NODES

    for i in range(MAX_DARK_NODES):
        assert register(registry, f"dark-{i}", 0, 30, architecture="nonesuch").admission == tt.Admission.DARK
    refused = register(registry, "dark-one-more", 0, 30, architecture="nonesuch")
    assert (refused.admission, refused.status.code) == (tt.Admission.REFUSED, StatusCode.RESOURCE_EXHAUSTED)
    assert register(registry, "dark-0", 0, 30, architecture="nonesuch").admission == tt.Admission.DARK  # again
    assert register(registry, "honest", 0, 30).admission == tt.Admission.ROUTABLE
    cover = registry.coverage("smol", max_nodes=8)
    assert cover.nodes[0].node_id == nid("honest") and cover.routable_count == 1
    assert cover.node_count == MAX_DARK_NODES + 1
    snapshot = registry.snapshot(max_nodes=8)
    assert snapshot.nodes[0].node_id == nid("honest")
