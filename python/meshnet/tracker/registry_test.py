"""Registry: admission, validation, leases, drain, coverage, routes, epochs, bans, capacity,
and who may do what (a node acts only for itself; a route's client alone reports and closes)."""

from __future__ import annotations

import dataclasses

import pytest

from meshnet.identity.keys import Identity
from meshnet.recipe import fingerprint
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.seam import Fingerprints, RouteSession
from meshnet.wire.status import StatusCode

MODEL = CertifiedModel("smol", "llama", 30, "sha256:art", "sha256:rec")
GOOD_FP = Fingerprints("sha256:art", "sha256:rec")
KEYS: dict[str, Identity] = {}  # node name -> its identity (made on first use)
CLIENT, OTHER_CLIENT = Identity.generate(), Identity.generate()


def key(name: str) -> Identity:
    return KEYS.setdefault(name, Identity.generate())


def nid(name: str) -> NodeId:
    return key(name).node_id


def name_of(node_id: str) -> str:
    return next(n for n, k in KEYS.items() if k.node_id == node_id)


class FakeClock:
    """A settable monotonic clock (test fake)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node(name, start, end, **kw) -> tt.NodeInfo:
    base = tt.NodeInfo(nid(name), f"127.0.0.1:{7000 + start}", tt.BackendKind.GGUF, "smol", "llama", GOOD_FP,
                       "sha256:range", tt.LayerRange(start, end), tt.Capacity(4, 4096, 1 << 30), 30,
                       key(name).public_key, "")
    return dataclasses.replace(base, **kw)


def register(registry, name, start, end, **kw) -> tt.RegisterReply:
    return registry.register(node(name, start, end, **kw), key(name).public_key)


def open_route(registry, request=tt.OpenRouteRequest("smol"), client=CLIENT) -> tt.RouteReply:
    return registry.open_route(request, client.public_key)


def fail(registry, session, failed, client=CLIENT) -> tt.RouteReply:
    return registry.report_failure(tt.ReportFailureRequest(session, failed), client.public_key)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def registry(clock):
    return Registry([MODEL], lease_seconds=10, ban_seconds=5, clock=clock)


def route_names(reply):
    return [(name_of(h.node.node_id), h.layers.start, h.layers.end) for h in reply.hops]


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


def test_a_relayed_node_is_routed_only_where_no_direct_one_is_cheaper(registry):
    register(registry, "relayed", 0, 30, relay="10.0.0.1:7700", relay_rtt_ms=0.5, address="10.0.0.1:41000")
    register(registry, "direct", 0, 30)
    # equal compute and load: the relay's round trip decides
    assert route_names(open_route(registry)) == [("direct", 0, 30)]
    assert registry.drain(nid("direct"), key("direct").public_key).ok
    route = open_route(registry)
    assert route_names(route) == [("relayed", 0, 30)]
    assert route.hops[0].node.address == "10.0.0.1:41000" and route.hops[0].node.relay == "10.0.0.1:7700"


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


def test_failure_fences_the_epoch_and_bans_the_node(registry, clock):
    register(registry, "a", 0, 30)
    register(registry, "b", 0, 30, capacity=tt.Capacity(4, 4096, 1))
    first = open_route(registry)
    failed = first.hops[0].node.node_id
    again = fail(registry, first.session, failed)
    assert again.status.ok and again.session.epoch == 2 and failed not in [h.node.node_id for h in again.hops]
    stale = fail(registry, first.session, failed)
    assert stale.status.code == StatusCode.STALE_EPOCH and stale.session.epoch == 2
    assert registry.close_route(first.session, CLIENT.public_key).code == StatusCode.STALE_EPOCH
    # The ban keeps the failed node out of other sessions' routes until it runs out, and out of
    # Coverage's routable counts (issue 35, finding 16: a banned node was counted routable).
    other = open_route(registry)
    assert failed not in [h.node.node_id for h in other.hops]
    cover = registry.coverage("smol")
    assert cover.routable_count == 1 and all(failed not in layer.node_ids for layer in cover.layers)
    clock.now += 6
    registry.heartbeat(nid("a"), None, key("a").public_key)
    registry.heartbeat(nid("b"), None, key("b").public_key)
    assert registry.close_route(again.session, CLIENT.public_key).ok
    assert registry.close_route(other.session, CLIENT.public_key).ok


def test_only_the_routes_client_reports_on_it_and_only_about_its_hops(registry):
    register(registry, "a", 0, 30)
    register(registry, "b", 0, 30)
    route = open_route(registry)
    hop = route.hops[0].node.node_id
    bystander = nid("b") if hop == nid("a") else nid("a")
    foreign = fail(registry, route.session, hop, client=OTHER_CLIENT)
    assert foreign.status.code == StatusCode.PERMISSION_DENIED
    off_route = fail(registry, route.session, bystander)
    assert off_route.status.code == StatusCode.INVALID_ARGUMENT and "not a hop" in off_route.status.message
    assert registry.close_route(route.session, OTHER_CLIENT.public_key).code == StatusCode.PERMISSION_DENIED
    # Neither report banned anyone: each node still serves a new route that avoids the other.
    for serving, avoided in ((hop, bystander), (bystander, hop)):
        reply = open_route(registry, tt.OpenRouteRequest("smol", avoid_node_ids=(avoided,)))
        assert [h.node.node_id for h in reply.hops] == [serving]
    assert registry.close_route(route.session, CLIENT.public_key).ok


def test_failure_with_no_alternative_reports_the_gap(registry):
    register(registry, "a", 0, 10)
    register(registry, "b", 10, 30)
    first = open_route(registry)
    reply = fail(registry, first.session, nid("b"))
    assert reply.status.code == StatusCode.UNAVAILABLE and reply.status.retryable
    assert reply.uncovered == (tt.LayerRange(10, 30),) and reply.session.epoch == 2


def test_capacity_limits_routes(registry):
    register(registry, "a", 0, 30, capacity=tt.Capacity(2, 1000, 1))
    request = tt.OpenRouteRequest("smol", expected_tokens=100)
    ok = [open_route(registry, request) for _ in range(2)]
    assert all(r.status.ok for r in ok)
    full = open_route(registry, request)
    assert full.status.code == StatusCode.RESOURCE_EXHAUSTED and "at capacity" in full.status.message
    registry.close_route(ok[0].session, CLIENT.public_key)
    assert open_route(registry, request).status.ok
    too_big = open_route(registry, tt.OpenRouteRequest("smol", expected_tokens=5000))
    assert too_big.status.code == StatusCode.RESOURCE_EXHAUSTED


def test_bad_route_requests(registry):
    assert open_route(registry, tt.OpenRouteRequest("mystery")).status.code == StatusCode.NOT_FOUND
    assert open_route(registry, tt.OpenRouteRequest("smol", expected_tokens=1 << 30)).status.code == \
        StatusCode.INVALID_ARGUMENT
    assert registry.coverage("mystery").status.code == StatusCode.NOT_FOUND
    unknown = RouteSession("rs-nope", 1)
    assert fail(registry, unknown, nid("a")).status.code == StatusCode.NOT_FOUND
    assert registry.close_route(None, CLIENT.public_key).code == StatusCode.INVALID_ARGUMENT


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
    from meshnet.tracker.registry import MAX_COVERAGE_NODES, MAX_LAYER_NODE_IDS

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


def test_an_abandoned_route_expires_and_its_capacity_returns(clock):
    registry = Registry([MODEL], lease_seconds=1000, route_lease_seconds=30, clock=clock)
    register(registry, "a", 0, 30, capacity=tt.Capacity(1, 4096, 1))
    abandoned = open_route(registry)
    assert abandoned.status.ok and abandoned.lease_ms == 30_000
    assert open_route(registry).status.code == StatusCode.RESOURCE_EXHAUSTED
    clock.now += 31  # the client never renewed nor closed it
    assert fail(registry, abandoned.session, nid("a")).status.code == StatusCode.NOT_FOUND
    kept = open_route(registry)
    assert kept.status.ok
    for _ in range(3):  # renewals keep a route alive past its first lease
        clock.now += 20
        renewed = registry.renew_route(kept.session, CLIENT.public_key)
        assert renewed.status.ok and renewed.lease_ms == 30_000
    assert registry.renew_route(kept.session, OTHER_CLIENT.public_key).status.code == StatusCode.PERMISSION_DENIED
    assert open_route(registry).status.code == StatusCode.RESOURCE_EXHAUSTED
    assert registry.renew_route(abandoned.session, CLIENT.public_key).status.code == StatusCode.NOT_FOUND
    assert registry.close_route(kept.session, CLIENT.public_key).ok


def test_expected_tokens_beyond_every_routes_session_limit_is_refused_up_front(registry):
    register(registry, "a", 0, 10, capacity=tt.Capacity(4, 1 << 20, 1, 2048))
    register(registry, "b", 10, 30, capacity=tt.Capacity(4, 1 << 20, 1, 8192))
    too_long = open_route(registry, tt.OpenRouteRequest("smol", expected_tokens=4096))
    assert too_long.status.code == StatusCode.INVALID_ARGUMENT and not too_long.status.retryable
    assert "at most 2048 tokens" in too_long.status.message and too_long.hops == ()
    register(registry, "a-long", 0, 10, capacity=tt.Capacity(4, 1 << 20, 1, 4096))
    assert route_names(open_route(registry, tt.OpenRouteRequest("smol", expected_tokens=4096))) == \
        [("a-long", 0, 10), ("b", 10, 30)]
    assert open_route(registry, tt.OpenRouteRequest("smol", expected_tokens=2048)).status.ok


def test_overlapping_gguf_ranges_meet_only_at_exact_boundaries(registry):
    register(registry, "a", 0, 12)
    register(registry, "b", 10, 30)
    reply = open_route(registry)
    assert reply.status.code == StatusCode.UNAVAILABLE and "past layer 12" in reply.status.message
    register(registry, "r", 10, 30, backend=tt.BackendKind.REFERENCE)
    assert route_names(open_route(registry)) == [("a", 0, 12), ("r", 12, 30)]


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


def test_a_route_keeps_its_client_id_across_epochs(registry):
    register(registry, "a", 0, 30)
    register(registry, "b", 0, 30)
    first = open_route(registry, tt.OpenRouteRequest("smol", client_id="key:alice"))
    assert registry.client_id(first.session) == "key:alice"
    second = fail(registry, first.session, first.hops[0].node.node_id)
    assert second.status.ok and second.session.epoch == 2
    assert registry.client_id(second.session) == "key:alice"
    assert registry.client_id(RouteSession("rs-unknown", 1)) == ""
    too_long = open_route(registry, tt.OpenRouteRequest("smol", client_id="k" * 129))
    assert too_long.status.code == StatusCode.INVALID_ARGUMENT


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


def test_a_route_just_closed_is_not_load_but_a_newer_heartbeat_is(registry, clock):
    """A node's heartbeat during a route counts that route's session; once this tracker closed
    the route, that heartbeat is stale and does not make the node look busier than a relayed
    replica (which pays its relay round trip): the next route stays on the direct node. A
    heartbeat after the close is believed again."""
    register(registry, "direct", 0, 30)
    register(registry, "relayed", 0, 30, relay="127.0.0.1:9999", relay_rtt_ms=0.8)
    measured = tt.Load(decode_tokens_per_second=10.0)  # 3.3 ms a layer: a session's share of it outweighs 0.8 ms
    for name in ("direct", "relayed"):
        assert registry.heartbeat(nid(name), measured, key(name).public_key).status.ok
    first = open_route(registry)
    assert route_names(first) == [("direct", 0, 30)]
    clock.now += 0.5
    busy = dataclasses.replace(measured, active_sessions=1)
    assert registry.heartbeat(nid("direct"), busy, key("direct").public_key).status.ok  # during the route
    clock.now += 0.1
    assert registry.close_route(first.session, CLIENT.public_key).ok
    again = open_route(registry)
    assert route_names(again) == [("direct", 0, 30)]  # the stale heartbeat's session is gone
    assert registry.close_route(again.session, CLIENT.public_key).ok
    clock.now += 0.5
    assert registry.heartbeat(nid("direct"), busy, key("direct").public_key).status.ok  # a session the tracker did not open
    assert route_names(open_route(registry)) == [("relayed", 0, 30)]


def test_a_principal_holds_at_most_its_route_quota(clock):
    """ADR 0017: one key squatted every node's sessions (issue 35, finding 4); now it holds at
    most its quota of open routes, and another principal beside it is still routed."""
    registry = Registry([MODEL], clock=clock, route_quota=lambda caller: 2 if caller == CLIENT.public_key else 8)
    register(registry, "a", 0, 30)  # four sessions
    held = [open_route(registry) for _ in range(2)]
    assert all(r.status.ok for r in held)
    over = open_route(registry)
    assert over.status.code == StatusCode.RESOURCE_EXHAUSTED and over.status.retryable and not over.hops
    assert "its quota" in over.status.message
    assert open_route(registry, client=OTHER_CLIENT).status.ok  # the node still has room for others
    assert registry.close_route(held[0].session, CLIENT.public_key).ok
    assert open_route(registry).status.ok  # a closed route frees a place in the quota
