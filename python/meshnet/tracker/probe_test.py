"""Issue 35, finding 3: a client could ban any node by opening a route through it and reporting
it failed. Now the tracker probes the reported node's Health itself: a node that answers is not
banned (only the reporter's route moves away from it) and keeps serving everyone else; one that
does not answer is banned as before. A real tracker on loopback whose node's shard service is a
test fake answering Health (FakeShardHealth)."""

from __future__ import annotations

import os
import resource
import socket
import time
from concurrent import futures

import grpc

from meshnet.identity.keys import Identity
from meshnet.identity.roles import new_role_tokens
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.shard.v1 import shard_pb2, shard_pb2_grpc
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.probe import FD_HEADROOM, PROBE_TIMEOUT_S, health_fails, out_of_files
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.tracker.service import serve
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Fingerprints, ProtocolVersion

MODEL = CertifiedModel("smol", "llama", 30, "sha256:art", "sha256:rec")


class FakeShardHealth(shard_pb2_grpc.ShardServicer):
    """Test fake of a node's shard service: answers Health, nothing else."""

    def Health(self, request, context):  # noqa: N802
        return shard_pb2.HealthReply()


def start_shard() -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    shard_pb2_grpc.add_ShardServicer_to_server(FakeShardHealth(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def node_info(key: Identity, address: str) -> tt.NodeInfo:
    return tt.NodeInfo(key.node_id, address, tt.BackendKind.GGUF, "smol", "llama",
                       Fingerprints("sha256:art", "sha256:rec"), "", tt.LayerRange(0, 30), tt.Capacity(4, 4096, 0),
                       30, key.public_key, "")


def test_the_probe_tells_a_serving_node_from_a_dead_or_hung_one():
    shard, address = start_shard()
    try:
        assert not health_fails(node_info(Identity.generate(), address))
    finally:
        shard.stop(grace=0).wait()
    assert health_fails(node_info(Identity.generate(), address))  # nothing listens there now
    silent = socket.socket()  # accepts connections, never speaks: a hung node
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        started = time.monotonic()
        assert health_fails(node_info(Identity.generate(), f"127.0.0.1:{silent.getsockname()[1]}"))
        assert time.monotonic() - started < PROBE_TIMEOUT_S + 2.0
    finally:
        silent.close()


def test_a_probe_that_fails_for_want_of_file_descriptors_is_not_evidence():
    """Issue 55, finding 4: with the tracker's descriptors taken (by idle connections), its probe
    of a node failed to open a socket and a healthy node was banned (and gRPC may abort the whole
    process when a channel gets no descriptor: this test did so before the probe stopped dialling
    out of files). Out of files, the probe does not dial and counts nothing; with descriptors
    back, a dead node fails it again."""
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{dead.getsockname()[1]}"
    dead.close()  # nothing listens there
    node = node_info(Identity.generate(), address)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + FD_HEADROOM // 2, hard))
        try:
            while True:
                held.append(open(os.devnull))
        except OSError:
            pass  # every descriptor taken
        assert out_of_files()
        assert not health_fails(node)
    finally:
        for f in held:
            f.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not out_of_files()
    assert health_fails(node)


def test_a_client_cannot_ban_a_node_that_answers_the_trackers_probe(tmp_path):
    shard, address = start_shard()
    ledger = Ledger(tmp_path / "ledger.db")
    registry = Registry([MODEL], lease_seconds=30, ban_seconds=30, corroborate=health_fails)
    tokens = new_role_tokens()
    server, port = serve(registry, ledger, "127.0.0.1:0", tokens, Identity.generate())
    tracker = f"127.0.0.1:{port}"
    key = Identity.generate()
    try:
        with TrackerClient(tracker, tokens["node"], key) as node:
            assert node.register(tt.RegisterRequest(ProtocolVersion(1, 0), node_info(key, address))).admission \
                == tt.Admission.ROUTABLE
        with TrackerClient(tracker, tokens["client"], Identity.generate()) as attacker, \
                TrackerClient(tracker, tokens["client"], Identity.generate()) as honest:
            route = attacker.open_route(tt.OpenRouteRequest("smol", "attacker", 16))
            assert route.status.ok and route.hops[0].node.node_id == key.node_id
            moved = attacker.report_failure(route.session, key.node_id)
            assert moved.session.epoch == 2 and not moved.hops  # the reporter's route avoids it: no other node
            assert registry.contradicted_reports == 1
            assert honest.coverage("smol").routable_count == 1  # not banned
            served = honest.open_route(tt.OpenRouteRequest("smol", "honest", 16))
            assert served.status.ok and served.hops[0].node.node_id == key.node_id
            assert honest.close_route(served.session).status.ok
            # A node that really fails is banned as before.
            shard.stop(grace=0).wait()
            route = honest.open_route(tt.OpenRouteRequest("smol", "honest", 16))
            assert route.status.ok
            honest.report_failure(route.session, key.node_id)
            assert honest.coverage("smol").routable_count == 0 and registry.contradicted_reports == 1
    finally:
        shard.stop(grace=0)
        server.stop(grace=0).wait()
        ledger.close()
