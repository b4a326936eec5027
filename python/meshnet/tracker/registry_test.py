"""Registry: admission, validation, leases, drain, coverage, routes, epochs, bans, capacity."""

from __future__ import annotations

import dataclasses

import pytest

from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.types import tracker as tt
from meshnet.types.ids import NodeId
from meshnet.types.seam import Fingerprints, RouteSession
from meshnet.types.status import StatusCode

MODEL = CertifiedModel("smol", "llama", 30, "sha256:art", "sha256:rec")
GOOD_FP = Fingerprints("sha256:art", "sha256:rec")


class FakeClock:
    """A settable monotonic clock (test fake)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node(name, start, end, **kw) -> tt.NodeInfo:
    base = tt.NodeInfo(NodeId(name), f"127.0.0.1:{7000 + start}", tt.BackendKind.GGUF, "smol", "llama", GOOD_FP,
                       "sha256:range", tt.LayerRange(start, end), tt.Capacity(4, 4096, 1 << 30), 30)
    return dataclasses.replace(base, **kw)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def registry(clock):
    return Registry([MODEL], lease_seconds=10, ban_seconds=5, clock=clock)


def route_ids(reply):
    return [(h.node.node_id, h.layers.start, h.layers.end) for h in reply.hops]


def test_admission(registry):
    assert registry.register(node("a", 0, 30)).admission == tt.Admission.ROUTABLE
    dark = registry.register(node("q", 0, 30, architecture="qwen3"))
    assert dark.admission == tt.Admission.DARK and dark.status.ok and "no certified adapter" in dark.reason
    bad_recipe = registry.register(node("r", 0, 30, fingerprints=Fingerprints("sha256:art", "sha256:other")))
    assert bad_recipe.admission == tt.Admission.REFUSED
    assert bad_recipe.status.code == StatusCode.FINGERPRINT_MISMATCH and "recipe fingerprint" in bad_recipe.reason
    bad_artifact = registry.register(node("s", 0, 30, fingerprints=Fingerprints("sha256:x", "sha256:rec")))
    assert "artifact fingerprint" in bad_artifact.reason
    unknown = registry.register(node("u", 0, 30, model="mystery"))
    assert unknown.admission == tt.Admission.REFUSED and "no certified recipe" in unknown.reason
    cover = registry.coverage("smol")
    assert cover.dark_node_ids == ("q",)
    assert [n.node_id for n in cover.nodes] == ["a", "q"]
    assert all(layer.node_ids == ("a",) for layer in cover.layers)


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
])
def test_malformed_registrations_are_invalid_argument(registry, changes, needle):
    reply = registry.register(node("a", 0, 30, **changes))
    assert reply.status.code == StatusCode.INVALID_ARGUMENT and needle in reply.status.message
    assert registry.register(None).status.code == StatusCode.INVALID_ARGUMENT


def test_dark_nodes_are_never_routed(registry):
    registry.register(node("q", 0, 30, architecture="qwen3"))
    reply = registry.open_route(tt.OpenRouteRequest("smol"))
    assert reply.status.code == StatusCode.UNAVAILABLE and reply.uncovered == (tt.LayerRange(0, 30),)
    registry.register(node("a", 0, 30))
    assert route_ids(registry.open_route(tt.OpenRouteRequest("smol"))) == [("a", 0, 30)]


def test_lease_expiry_removes_the_node(registry, clock):
    registry.register(node("a", 0, 15))
    registry.register(node("b", 15, 30))
    registry.register(node("b2", 10, 30))
    clock.now += 6
    assert registry.heartbeat(NodeId("a"), None).status.ok
    assert registry.heartbeat(NodeId("b2"), None).status.ok
    clock.now += 6  # b's lease (10 s) has run out; a and b2 renewed theirs
    assert registry.heartbeat(NodeId("b"), None).status.code == StatusCode.NOT_FOUND
    assert route_ids(registry.open_route(tt.OpenRouteRequest("smol"))) == [("a", 0, 15), ("b2", 15, 30)]
    assert "b" not in [n.node_id for n in registry.coverage("smol").nodes]


def test_drain_excludes_from_new_routes(registry):
    registry.register(node("a", 0, 30))
    registry.register(node("b", 0, 30, capacity=tt.Capacity(4, 4096, 1)))
    first = registry.open_route(tt.OpenRouteRequest("smol"))
    assert registry.drain(first.hops[0].node.node_id).ok
    second = registry.open_route(tt.OpenRouteRequest("smol"))
    assert second.hops[0].node.node_id != first.hops[0].node.node_id
    assert registry.drain(NodeId("nobody")).code == StatusCode.NOT_FOUND


def test_failure_fences_the_epoch_and_bans_the_node(registry, clock):
    registry.register(node("a", 0, 30))
    registry.register(node("b", 0, 30, capacity=tt.Capacity(4, 4096, 1)))
    first = registry.open_route(tt.OpenRouteRequest("smol"))
    failed = first.hops[0].node.node_id
    again = registry.report_failure(tt.ReportFailureRequest(first.session, failed))
    assert again.status.ok and again.session.epoch == 2 and failed not in [h.node.node_id for h in again.hops]
    stale = registry.report_failure(tt.ReportFailureRequest(first.session, failed))
    assert stale.status.code == StatusCode.STALE_EPOCH and stale.session.epoch == 2
    assert registry.close_route(first.session).code == StatusCode.STALE_EPOCH
    # The ban keeps the failed node out of other sessions' routes until it runs out.
    other = registry.open_route(tt.OpenRouteRequest("smol"))
    assert failed not in [h.node.node_id for h in other.hops]
    clock.now += 6
    registry.heartbeat(NodeId("a"), None)
    registry.heartbeat(NodeId("b"), None)
    assert registry.close_route(again.session).ok
    assert registry.close_route(other.session).ok


def test_failure_with_no_alternative_reports_the_gap(registry):
    registry.register(node("a", 0, 10))
    registry.register(node("b", 10, 30))
    first = registry.open_route(tt.OpenRouteRequest("smol"))
    reply = registry.report_failure(tt.ReportFailureRequest(first.session, NodeId("b")))
    assert reply.status.code == StatusCode.UNAVAILABLE and reply.status.retryable
    assert reply.uncovered == (tt.LayerRange(10, 30),) and reply.session.epoch == 2


def test_capacity_limits_routes(registry):
    registry.register(node("a", 0, 30, capacity=tt.Capacity(2, 1000, 1)))
    ok = [registry.open_route(tt.OpenRouteRequest("smol", expected_tokens=100)) for _ in range(2)]
    assert all(r.status.ok for r in ok)
    full = registry.open_route(tt.OpenRouteRequest("smol", expected_tokens=100))
    assert full.status.code == StatusCode.RESOURCE_EXHAUSTED and "at capacity" in full.status.message
    registry.close_route(ok[0].session)
    assert registry.open_route(tt.OpenRouteRequest("smol", expected_tokens=100)).status.ok
    too_big = registry.open_route(tt.OpenRouteRequest("smol", expected_tokens=5000))
    assert too_big.status.code == StatusCode.RESOURCE_EXHAUSTED


def test_bad_route_requests(registry):
    assert registry.open_route(tt.OpenRouteRequest("mystery")).status.code == StatusCode.NOT_FOUND
    assert registry.open_route(tt.OpenRouteRequest("smol", expected_tokens=1 << 30)).status.code == StatusCode.INVALID_ARGUMENT
    assert registry.coverage("mystery").status.code == StatusCode.NOT_FOUND
    unknown = RouteSession("rs-nope", 1)
    assert registry.report_failure(tt.ReportFailureRequest(unknown, NodeId("a"))).status.code == StatusCode.NOT_FOUND
    assert registry.close_route(None).code == StatusCode.INVALID_ARGUMENT


def test_coverage_reports_gaps_and_replicas(registry):
    registry.register(node("a", 0, 10))
    registry.register(node("a2", 0, 12))
    registry.register(node("c", 20, 30))
    cover = registry.coverage("smol")
    assert cover.n_layer == 30 and cover.gaps == (tt.LayerRange(12, 20),)
    assert cover.layers[5].node_ids == ("a", "a2") and cover.layers[11].node_ids == ("a2",)
    assert cover.layers[15].node_ids == ()
