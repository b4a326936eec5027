"""A model certified on several compute backends (ADR 0015): nodes of each certified backend are
admitted, a route never mixes backends unless the entry certifies the mix, and then it may."""

from __future__ import annotations

import dataclasses
import json

import pytest

from meshnet.identity.keys import Identity
from meshnet.tracker import routing
from meshnet.tracker.main import load_models
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.tracker.routing import Candidate, NoRouteError, RouteHop, find_route
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.seam import Fingerprints
from meshnet.wire.status import StatusCode

CPU, VULKAN, CUDA = "sha256:cpu-recipe", "sha256:vulkan-recipe", "sha256:cuda-recipe"
PASSED = {"passed": True}
BOTH = CertifiedModel("smol", "llama", 30, "sha256:art", CPU, certification=PASSED, matmul_activations="quantized",
                      other_backends=[{"compute_backend": "vulkan", "recipe_fingerprint": VULKAN,
                                       "matmul_activations": "quantized", "certification": PASSED}])
MIXED = dataclasses.replace(BOTH, mixed_backends={"backends": ["cpu", "vulkan"], "certification": PASSED})
CLIENT = Identity.generate()
KEYS: dict[str, Identity] = {}


def key(name: str) -> Identity:
    return KEYS.setdefault(name, Identity.generate())


def register(registry: Registry, name: str, start: int, end: int, recipe: str) -> tt.RegisterReply:
    info = tt.NodeInfo(key(name).node_id, f"127.0.0.1:{7000 + start}", tt.BackendKind.GGUF, "smol", "llama",
                       Fingerprints("sha256:art", recipe), "sha256:range", tt.LayerRange(start, end),
                       tt.Capacity(4, 4096, 1 << 30), 30, key(name).public_key, "")
    return registry.register(info, key(name).public_key)


def hops(reply: tt.RouteReply) -> list[str]:
    names = {k.node_id: name for name, k in KEYS.items()}
    return [names[h.node.node_id] for h in reply.hops]


def test_nodes_of_every_certified_backend_are_admitted_and_others_refused():
    registry = Registry([BOTH])
    assert register(registry, "cpu", 0, 30, CPU).admission == tt.Admission.ROUTABLE
    assert register(registry, "gpu", 0, 30, VULKAN).admission == tt.Admission.ROUTABLE
    refused = register(registry, "cuda", 0, 30, CUDA)
    assert refused.admission == tt.Admission.REFUSED and refused.status.code == StatusCode.FINGERPRINT_MISMATCH
    assert "certified on cpu, vulkan" in refused.reason and f"{VULKAN} (vulkan)" in refused.reason
    route = registry.open_route(tt.OpenRouteRequest("smol"), CLIENT.public_key)  # the honest nodes still serve
    assert route.status.ok and hops(route) in (["cpu"], ["gpu"])


def test_a_route_does_not_mix_backends_without_a_certified_mix():
    """CPU covers [0, 10) and [20, 30), Vulkan [10, 20): every layer is served, but only a mix
    covers them all, and the entry certifies none: UNAVAILABLE, saying why."""
    registry = Registry([BOTH])
    for name, (start, end), recipe in (("c0", (0, 10), CPU), ("v1", (10, 20), VULKAN), ("c2", (20, 30), CPU)):
        assert register(registry, name, start, end, recipe).admission == tt.Admission.ROUTABLE
    reply = registry.open_route(tt.OpenRouteRequest("smol"), CLIENT.public_key)
    assert reply.status.code == StatusCode.UNAVAILABLE and not reply.hops
    assert "not by nodes of one compute backend" in reply.status.message
    # a Vulkan node for the missing ranges makes a route of Vulkan alone
    assert register(registry, "v0", 0, 10, VULKAN).status.ok and register(registry, "v2", 20, 30, VULKAN).status.ok
    reply = registry.open_route(tt.OpenRouteRequest("smol"), CLIENT.public_key)
    assert reply.status.ok and hops(reply) == ["v0", "v1", "v2"]


def test_a_certified_mix_is_routed():
    registry = Registry([MIXED])
    for name, (start, end), recipe in (("m0", (0, 10), CPU), ("m1", (10, 20), VULKAN), ("m2", (20, 30), CPU)):
        assert register(registry, name, start, end, recipe).status.ok
    reply = registry.open_route(tt.OpenRouteRequest("smol"), CLIENT.public_key)
    assert reply.status.ok and hops(reply) == ["m0", "m1", "m2"]


def c(name: str, start: int, end: int, backend: str, seconds_per_layer: float = 0.001) -> Candidate:
    return Candidate(NodeId(name), start, end, seconds_per_layer, backend=backend)


def test_the_cheapest_allowed_combination_wins():
    fast_mix = [c("cpu-a", 0, 15, "cpu"), c("gpu-b", 15, 30, "vulkan", 0.0001)]
    slow_cpu = [c("cpu-c", 15, 30, "cpu", 0.01)]
    one_each = [frozenset({"cpu"}), frozenset({"vulkan"})]
    assert [h.node_id for h in find_route(fast_mix + slow_cpu, 30, one_each)] == ["cpu-a", "cpu-c"]
    mixed = one_each + [frozenset({"cpu", "vulkan"})]
    assert find_route(fast_mix + slow_cpu, 30, mixed) == [RouteHop(NodeId("cpu-a"), 0, 15),
                                                          RouteHop(NodeId("gpu-b"), 15, 30)]
    assert find_route(fast_mix + slow_cpu, 30) == find_route(fast_mix + slow_cpu, 30, mixed)  # None: any mix


def test_a_gap_is_still_named_as_a_gap():
    with pytest.raises(NoRouteError) as err:
        find_route([c("a", 0, 10, "cpu"), c("b", 20, 30, "vulkan")], 30, [frozenset({"cpu"}), frozenset({"vulkan"})])
    assert err.value.uncovered == [(10, 20)]
    assert routing.describe_layers(err.value.uncovered) == "10..19"


def test_the_tracker_loads_only_entries_whose_every_certification_passed(tmp_path):
    path = tmp_path / "models.json"
    unpassed_mix = dataclasses.asdict(dataclasses.replace(MIXED, mixed_backends={"backends": ["cpu", "vulkan"]}))
    path.write_text(json.dumps([unpassed_mix]))
    with pytest.raises(SystemExit, match="no passed certification for \\['smol'\\]"):
        load_models(path)
    path.write_text(json.dumps([dataclasses.asdict(MIXED)]))
    assert load_models(path)[0].route_combinations() == [frozenset({"cpu"}), frozenset({"vulkan"}),
                                                         frozenset({"cpu", "vulkan"})]
