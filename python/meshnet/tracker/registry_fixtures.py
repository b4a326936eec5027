"""What the registry's tests share (registry_test.py, registry_routes_test.py): a certified model,
node identities by name, a settable clock, registration and route helpers, and the `clock` and
`registry` pytest fixtures. Test-only (a testonly library of its own)."""

from __future__ import annotations

import dataclasses

import pytest

from meshnet.identity.keys import Identity
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.seam import Fingerprints

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
