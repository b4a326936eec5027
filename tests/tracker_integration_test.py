"""The tracker as a real process over real gRPC on loopback: registration with admission,
overlapping ranges, 100 concurrent routes, lease loss, fencing, bad input, authentication."""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from meshnet.protocol.tracker_client import TrackerClient
from meshnet.types import tracker as tt
from meshnet.types.ids import NodeId
from meshnet.types.seam import Fingerprints, ProtocolVersion, RouteSession
from meshnet.types.status import StatusCode
from tracker_process import SECRET, TrackerProcess

MODEL = {"model": "smol", "architecture": "llama", "n_layer": 30,
         "artifact_fingerprint": "sha256:art", "recipe_fingerprint": "sha256:rec"}
V1 = ProtocolVersion(1, 0)
LEASE = 1.5


def info(name, start, end, *, architecture="llama", recipe="sha256:rec", sessions=64):
    return tt.NodeInfo(NodeId(name), f"127.0.0.1:{9000 + start}", tt.BackendKind.GGUF, "smol", architecture,
                       Fingerprints("sha256:art", recipe), "sha256:r", tt.LayerRange(start, end),
                       tt.Capacity(sessions, 1 << 20, 1 << 30), 30)


@pytest.fixture
def tracker(tmp_path):
    proc = TrackerProcess(tmp_path, [MODEL], lease_seconds=LEASE).start()
    yield proc
    assert proc.stop() == 0


@pytest.fixture
def client(tracker):
    with TrackerClient(tracker.address, SECRET) as c:
        yield c


NODES = [info("n0", 0, 12), info("n1", 8, 22), info("n2", 18, 30), info("n3", 0, 30, sessions=1000)]


def _heartbeat_all(client, names):
    for name in names:
        assert client.heartbeat(NodeId(name)).status.ok


def test_routes_leases_and_fencing(client):
    for node in NODES:
        reply = client.register(tt.RegisterRequest(V1, node))
        assert reply.status.ok and reply.admission == tt.Admission.ROUTABLE, reply
    wrong = client.register(tt.RegisterRequest(V1, info("bad", 0, 30, recipe="sha256:tampered")))
    assert wrong.admission == tt.Admission.REFUSED and "recipe fingerprint" in wrong.reason
    dark = client.register(tt.RegisterRequest(V1, info("qwen", 0, 30, architecture="qwen3")))
    assert dark.admission == tt.Admission.DARK and dark.status.ok

    with ThreadPoolExecutor(max_workers=16) as pool:
        replies = list(pool.map(lambda i: client.open_route(tt.OpenRouteRequest("smol", f"c{i}", 64)), range(100)))
    assert all(r.status.ok for r in replies)
    assert len({r.session.session_id for r in replies}) == 100
    for r in replies:
        layers = [layer for h in r.hops for layer in range(h.layers.start, h.layers.end)]
        assert layers == list(range(30))
        assert "qwen" not in [h.node.node_id for h in r.hops]
        assert all(h.node.layers.start <= h.layers.start for h in r.hops)  # effective starts inside ranges

    # n3 stops heartbeating: once its lease runs out, new routes avoid it.
    survivors = ["n0", "n1", "n2", "qwen"]
    deadline = time.monotonic() + LEASE * 3
    while time.monotonic() < deadline:
        _heartbeat_all(client, survivors)
        time.sleep(LEASE / 4)
    assert client.heartbeat(NodeId("n3")).status.code == StatusCode.NOT_FOUND
    fresh = client.open_route(tt.OpenRouteRequest("smol", "late", 64))
    assert fresh.status.ok and [h.node.node_id for h in fresh.hops] == ["n0", "n1", "n2"]
    assert [(h.layers.start, h.layers.end) for h in fresh.hops] == [(0, 12), (12, 22), (22, 30)]
    cover = client.coverage("smol")
    assert "n3" not in [n.node_id for n in cover.nodes] and cover.dark_node_ids == ("qwen",)

    # A failure report fences the old epoch; the old epoch can no longer be used.
    old = fresh.session
    new = client.report_failure(old, NodeId("n1"))
    assert new.session.epoch == old.epoch + 1
    assert new.status.code == StatusCode.UNAVAILABLE and new.uncovered  # n1 banned, n3 gone: layers uncovered
    assert client.close_route(old).status.code == StatusCode.STALE_EPOCH
    assert client.report_failure(old, NodeId("n1")).status.code == StatusCode.STALE_EPOCH
    assert client.close_route(RouteSession(old.session_id, new.session.epoch)).status.ok


def test_bad_input_gets_structured_errors_and_the_tracker_keeps_serving(client, tracker):
    assert client.open_route(tt.OpenRouteRequest("unknown-model")).status.code == StatusCode.NOT_FOUND
    bad = [
        info("x", 20, 10),
        info("x", 0, 31),
        tt.NodeInfo(NodeId("x"), "a:1", tt.BackendKind.GGUF, "smol", "llama", None, "", tt.LayerRange(0, 1 << 31),
                    tt.Capacity(1 << 31, 1 << 62, 1 << 62), 1 << 31),
        tt.NodeInfo(NodeId(""), "", tt.BackendKind.UNSPECIFIED, "", "", None, "", None, None, 0),
    ]
    for node in bad:
        reply = client.register(tt.RegisterRequest(V1, node))
        assert reply.status.code == StatusCode.INVALID_ARGUMENT and reply.status.message
    assert client.register(tt.RegisterRequest(ProtocolVersion(2, 0), info("v2", 0, 30))).status.code == \
        StatusCode.VERSION_MISMATCH
    assert client.open_route(tt.OpenRouteRequest("smol", expected_tokens=(1 << 32) - 1)).status.code == \
        StatusCode.INVALID_ARGUMENT
    assert client.report_work(tt.WorkReport(NodeId("n0"), (tt.WorkEntry(None, 1, 1),))).status.code == \
        StatusCode.INVALID_ARGUMENT

    with TrackerClient(tracker.address, "wrong-secret") as intruder:
        with pytest.raises(grpc.RpcError) as err:
            intruder.coverage("smol")
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel = grpc.insecure_channel(tracker.address)
    with pytest.raises(grpc.RpcError) as err:
        channel.unary_unary("/meshnet.tracker.v1.Tracker/Coverage")(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel.close()

    # Still serving.
    assert client.register(tt.RegisterRequest(V1, info("ok", 0, 30))).status.ok
    assert client.open_route(tt.OpenRouteRequest("smol")).status.ok


def test_tls(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    tracker = TrackerProcess(tmp_path, [MODEL], tls=(cert, key)).start()
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with TrackerClient(tracker.address, SECRET, credentials=creds) as secure:
            assert secure.register(tt.RegisterRequest(V1, info("tls-node", 0, 30))).status.ok
        with TrackerClient(tracker.address, SECRET, timeout=3) as plaintext:
            with pytest.raises(grpc.RpcError):
                plaintext.coverage("smol")
    finally:
        assert tracker.stop() == 0
