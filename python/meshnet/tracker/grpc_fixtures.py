"""What the tracker's gRPC tests share (grpc_server_test.py, connection_front_test.py): a tracker on
loopback as a pytest fixture, calls that never send their message, and the honest calls that must
be answered beside an attack. Test-only (a testonly library of its own)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from meshnet.identity.keys import Identity
from meshnet.identity.requests import TOKEN_METADATA
from meshnet.identity.roles import new_role_tokens
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.tracker.grpc_server import SERVICE, ServerLimits
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.metrics import TrackerMetrics
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.tracker.service import serve
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Fingerprints, ProtocolVersion

MODEL = CertifiedModel("smol", "llama", 30, "sha256:art", "sha256:rec")
ANSWERED_WITHIN_S = 5.0  # an honest call during an attack (the old server: never, until the attack ended)


class Attack:
    """`n` calls to `method` that send their metadata (the role token, if any) and never their
    message; `outcomes` gets each call's status code as it ends."""

    def __init__(self, address: str, method: str, n: int, token: str = "") -> None:
        self.release = threading.Event()
        # A connection of its own (gRPC would otherwise share one with the honest clients' channels).
        self.channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        call = self.channel.stream_unary(f"/{SERVICE}/{method}")
        metadata = ((TOKEN_METADATA, f"Bearer {token}"),) if token else ()
        self.futures = [call.future(self._never(), metadata=metadata) for _ in range(n)]

    def _never(self):
        self.release.wait()
        return
        yield  # a generator that yields nothing, after the release

    def outcomes(self, timeout: float) -> list[grpc.StatusCode]:
        codes = []
        for future in self.futures:
            try:
                future.result(timeout=timeout)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as err:
                codes.append(err.code())
        return codes

    def stop(self) -> None:
        self.release.set()
        for future in self.futures:
            future.cancel()
        self.channel.close()


@pytest.fixture
def tracker(tmp_path, request):
    """(address, role tokens, metrics) of a tracker on loopback."""
    limits = getattr(request, "param", ServerLimits())
    ledger = Ledger(tmp_path / "ledger.db")
    registry = Registry([MODEL], lease_seconds=30)
    metrics = TrackerMetrics(registry, ledger)
    tokens = new_role_tokens()
    server, port = serve(registry, ledger, "127.0.0.1:0", tokens, Identity.generate(), metrics=metrics, limits=limits)
    yield f"127.0.0.1:{port}", tokens, metrics
    server.stop(grace=0).wait()
    ledger.close()


def refusals(metrics: TrackerMetrics, method: str, code: str) -> int:
    value = metrics.prometheus.get_sample_value("meshnet_tracker_refusals_total", {"method": method, "code": code})
    return int(value or 0)


def honest_calls(address: str, tokens: dict) -> float:
    """A node registers and heartbeats, a client asks for Coverage; the seconds it took."""
    started = time.monotonic()
    key = Identity.generate()
    info = tt.NodeInfo(key.node_id, "127.0.0.1:9", tt.BackendKind.GGUF, "smol", "llama",
                       Fingerprints("sha256:art", "sha256:rec"), "", tt.LayerRange(0, 30), tt.Capacity(4, 4096, 0),
                       30, key.public_key, "")
    with TrackerClient(address, tokens["node"], key, timeout=ANSWERED_WITHIN_S) as node:
        assert node.register(tt.RegisterRequest(ProtocolVersion(1, 0), info)).admission == tt.Admission.ROUTABLE
        assert node.heartbeat(key.node_id).status.ok
    with TrackerClient(address, tokens["client"], Identity.generate(), timeout=ANSWERED_WITHIN_S) as client:
        assert client.coverage("smol").routable_count >= 1
    return time.monotonic() - started
