"""The tracker as a real process over real gRPC and TLS on loopback: registration with
admission, overlapping ranges, 100 concurrent routes with signed tickets, lease loss, fencing,
bad input, and the trust boundary (ADR 0003): role tokens, signed requests, a node acting only
for itself, off-route and foreign failure reports, and work accepted only for issued triples."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from meshnet.identity import tickets
from meshnet.identity.keys import Identity
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.seam import Fingerprints, ProtocolVersion, RouteSession
from meshnet.wire.status import StatusCode
from tracker_process import TrackerProcess

MODEL = {"model": "smol", "architecture": "llama", "n_layer": 30,
         "artifact_fingerprint": "sha256:art", "recipe_fingerprint": "sha256:rec"}
V1 = ProtocolVersion(1, 0)
LEASE = 1.5
NAMES = ["n0", "n1", "n2", "n3", "qwen", "bad", "ok", "v2", "x", "impostor"]


@pytest.fixture(scope="module")
def keys():
    return {name: Identity.generate() for name in NAMES}


def info(keys, name, start, end, *, architecture="llama", recipe="sha256:rec", sessions=64):
    # Reference nodes: they may run from an effective start, so overlapping ranges chain
    # (GGUF nodes meet only at exact boundaries: tracker/routing_test.py, overlap_route_test.py).
    key = keys[name]
    return tt.NodeInfo(key.node_id, f"127.0.0.1:{9000 + start}", tt.BackendKind.REFERENCE, "smol", architecture,
                       Fingerprints("sha256:art", recipe), "sha256:r", tt.LayerRange(start, end),
                       tt.Capacity(sessions, 1 << 20, 1 << 30), 30, key.public_key, "")


@pytest.fixture
def tracker(tmp_path):
    # one client key opens 100 routes at once below: more than a principal's default quota (ADR 0017)
    proc = TrackerProcess(tmp_path, [MODEL], lease_seconds=LEASE,
                          extra_args=["--max-routes-per-principal", "128"]).start()
    yield proc
    assert proc.stop() == 0


@pytest.fixture
def nodes(tracker, keys):
    """A node-role tracker client per node name, each signing with that node's key."""
    clients = {name: tracker.client("node", keys[name]) for name in NAMES}
    yield clients
    for c in clients.values():
        c.close()


@contextlib.contextmanager
def heartbeating(nodes, keys, names):
    """Keeps `names` alive (a heartbeat every LEASE/4) while the block runs: on a loaded machine
    the block can outlast a 1.5 s lease, and what it checks is not about leases."""
    stop = threading.Event()

    def beat():
        while not stop.wait(LEASE / 4):
            for name in names:
                try:
                    nodes[name].heartbeat(keys[name].node_id)
                except grpc.RpcError:
                    pass  # the next beat tries again; the block's own checks see any real failure

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@pytest.fixture
def client(tracker):
    with tracker.client() as c:
        yield c


def test_routes_leases_and_fencing(client, nodes, keys, tracker):
    def register(name, start, end, **kw):
        return nodes[name].register(tt.RegisterRequest(V1, info(keys, name, start, end, **kw)))

    for name, start, end, sessions in (("n0", 0, 12, 64), ("n1", 8, 22, 64), ("n2", 18, 30, 64), ("n3", 0, 30, 1000)):
        reply = register(name, start, end, sessions=sessions)
        assert reply.status.ok and reply.admission == tt.Admission.ROUTABLE, reply
    wrong = register("bad", 0, 30, recipe="sha256:tampered")
    assert wrong.admission == tt.Admission.REFUSED and "recipe fingerprint" in wrong.reason
    dark = register("qwen", 0, 30, architecture="bloom")
    assert dark.admission == tt.Admission.DARK and dark.status.ok

    ticket_key = client.tracker_key()
    with heartbeating(nodes, keys, ["n0", "n1", "n2", "n3", "qwen"]), ThreadPoolExecutor(max_workers=16) as pool:
        replies = list(pool.map(lambda i: client.open_route(tt.OpenRouteRequest("smol", f"c{i}", 64)), range(100)))
    assert all(r.status.ok for r in replies)
    assert len({r.session.session_id for r in replies}) == 100
    for r in replies:
        layers = [layer for h in r.hops for layer in range(h.layers.start, h.layers.end)]
        assert layers == list(range(30))
        assert keys["qwen"].node_id not in [h.node.node_id for h in r.hops]
        assert all(h.node.layers.start <= h.layers.start for h in r.hops)  # effective starts inside ranges
        for i, hop in enumerate(r.hops):  # every hop's ticket: signed, for it, chained to the next hop
            body = tickets.open_ticket(hop.ticket, ticket_key)
            tickets.admit(body, r.session, hop.node.node_id, (hop.node.layers.start, hop.node.layers.end))
            assert body.range.effective_start == hop.layers.start
            assert body.client_public_key == client.identity.public_key
            assert body.downstream_node_id == (r.hops[i + 1].node.node_id if i + 1 < len(r.hops) else "")

    # n3 stops heartbeating: once its lease runs out, new routes avoid it.
    survivors = ["n0", "n1", "n2", "qwen"]
    deadline = time.monotonic() + LEASE * 3
    while time.monotonic() < deadline:
        for name in survivors:
            assert nodes[name].heartbeat(keys[name].node_id).status.ok
        time.sleep(LEASE / 4)
    assert nodes["n3"].heartbeat(keys["n3"].node_id).status.code == StatusCode.NOT_FOUND
    fresh = client.open_route(tt.OpenRouteRequest("smol", "late", 64))
    assert fresh.status.ok and [h.node.node_id for h in fresh.hops] == [keys[n].node_id for n in ("n0", "n1", "n2")]
    assert [(h.layers.start, h.layers.end) for h in fresh.hops] == [(0, 12), (12, 22), (22, 30)]
    cover = client.coverage("smol")
    assert keys["n3"].node_id not in [n.node_id for n in cover.nodes]
    assert cover.dark_node_ids == (keys["qwen"].node_id,)

    # A failure report fences the old epoch; the old epoch can no longer be used.
    old = fresh.session
    new = client.report_failure(old, keys["n1"].node_id)
    assert new.session.epoch == old.epoch + 1
    assert new.status.code == StatusCode.UNAVAILABLE and new.uncovered  # n1 banned, n3 gone: layers uncovered
    assert client.close_route(old).status.code == StatusCode.STALE_EPOCH
    assert client.report_failure(old, keys["n1"].node_id).status.code == StatusCode.STALE_EPOCH
    assert client.close_route(RouteSession(old.session_id, new.session.epoch)).status.ok


def test_roles_and_signatures_scope_every_call(tracker, nodes, keys, client):
    assert nodes["n0"].register(tt.RegisterRequest(V1, info(keys, "n0", 0, 30))).status.ok
    victim = keys["n0"].node_id

    def code_of(call):
        with pytest.raises(grpc.RpcError) as err:
            call()
        return err.value.code()

    with heartbeating(nodes, keys, ["n0"]):  # the victim stays routable throughout
        # Clients cannot act as nodes, nodes cannot open routes, and an unknown token is nobody.
        assert code_of(lambda: client.heartbeat(victim)) == grpc.StatusCode.PERMISSION_DENIED
        assert code_of(lambda: nodes["n1"].open_route(tt.OpenRouteRequest("smol"))) == grpc.StatusCode.PERMISSION_DENIED
        with TrackerClient(tracker.address, "wrong-token", Identity.generate(), tracker_ca=tracker.ca) as intruder:
            assert code_of(lambda: intruder.coverage("smol")) == grpc.StatusCode.UNAUTHENTICATED
        # A valid token without a valid signature: the request is refused whole.
        channel = grpc.secure_channel(tracker.address, grpc.ssl_channel_credentials(root_certificates=tracker.ca))
        method = channel.unary_unary("/meshnet.tracker.v1.Tracker/Coverage")
        with pytest.raises(grpc.RpcError) as err:
            method(b"", timeout=5, metadata=(("authorization", f"Bearer {tracker.roles['client']}"),))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        channel.close()

        # A node with the node token acts only for itself: the old take-over, drain and deregister
        # attacks all fail, and the victim keeps its lease, address and routes.
        impostor = nodes["impostor"]
        hijack = tt.RegisterRequest(V1, tt.NodeInfo(victim, "10.6.6.6:1", tt.BackendKind.GGUF, "smol", "llama",
                                                    Fingerprints("sha256:art", "sha256:rec"), "sha256:r",
                                                    tt.LayerRange(0, 30), tt.Capacity(64, 1 << 20, 1), 30,
                                                    keys["impostor"].public_key, ""))
        assert impostor.register(hijack).status.code == StatusCode.PERMISSION_DENIED
        assert impostor.heartbeat(victim).status.code == StatusCode.PERMISSION_DENIED
        assert impostor.drain(victim).status.code == StatusCode.PERMISSION_DENIED
        assert impostor.deregister(victim).status.code == StatusCode.PERMISSION_DENIED
        route = client.open_route(tt.OpenRouteRequest("smol", expected_tokens=100))
        assert [(h.node.node_id, h.node.address) for h in route.hops] == [(victim, "127.0.0.1:9000")]

        # Failure reports: only the route's own client, and only naming a hop of the route.
        with tracker.client() as stranger:
            assert stranger.report_failure(route.session, victim).status.code == StatusCode.PERMISSION_DENIED
            assert stranger.close_route(route.session).status.code == StatusCode.PERMISSION_DENIED
            assert stranger.renew_route(route.session).status.code == StatusCode.PERMISSION_DENIED
        assert code_of(lambda: nodes["n1"].renew_route(route.session)) == grpc.StatusCode.PERMISSION_DENIED  # role
        # A route no hop has worked for is not renewed (capacity squatting: issue 35, finding 4);
        # once its hop reports work, its own client renews it, beside the refusals.
        idle = client.renew_route(route.session)
        assert idle.status.code == StatusCode.RESOURCE_EXHAUSTED and idle.status.retryable
        assert nodes["n0"].report_work(tt.WorkReport(victim, (tt.WorkEntry(route.session, 60, 30),), 11)).status.ok
        renewed = client.renew_route(route.session)
        assert renewed.status.ok and renewed.lease_ms == route.lease_ms > 0
        off_route = client.report_failure(route.session, keys["n1"].node_id)
        assert off_route.status.code == StatusCode.INVALID_ARGUMENT
        assert client.open_route(tt.OpenRouteRequest("smol")).hops[0].node.node_id == victim  # nobody was banned

    # Work: only for the issued triple, once per report id, within the route's expected tokens.
    session = route.session
    entry = tt.WorkEntry(session, 60, 30)  # reported above (report 11), before the renewal
    assert nodes["n0"].report_work(tt.WorkReport(victim, (entry,), 11)).status.ok  # a repeat: acknowledged
    over = nodes["n0"].report_work(tt.WorkReport(victim, (tt.WorkEntry(session, 10, 1),), 12))
    assert over.status.code == StatusCode.INVALID_ARGUMENT  # 90 + 11 > 100 expected tokens
    unknown = nodes["n0"].report_work(tt.WorkReport(victim, (tt.WorkEntry(RouteSession("rs-made-up", 1), 1, 1),), 13))
    assert unknown.status.code == StatusCode.PERMISSION_DENIED
    for_other = impostor.report_work(tt.WorkReport(keys["impostor"].node_id, (entry,), 14))
    assert for_other.status.code == StatusCode.PERMISSION_DENIED  # the impostor was not on the route
    as_other = impostor.report_work(tt.WorkReport(victim, (entry,), 15))
    assert as_other.status.code == StatusCode.PERMISSION_DENIED
    maximum = nodes["n0"].report_work(tt.WorkReport(victim, (tt.WorkEntry(session, (1 << 64) - 1, (1 << 64) - 1),), 16))
    assert maximum.status.code == StatusCode.INVALID_ARGUMENT
    ledger = Ledger(tracker.db)
    totals = ledger.totals()
    ledger.close()
    assert [(t.node_id, t.sessions, t.prefill_tokens, t.decode_tokens) for t in totals] == [(victim, 1, 60, 30)]


def test_bad_input_gets_structured_errors_and_the_tracker_keeps_serving(client, nodes, keys):
    assert client.open_route(tt.OpenRouteRequest("unknown-model")).status.code == StatusCode.NOT_FOUND
    x = keys["x"]
    bad = [
        info(keys, "x", 20, 10),
        info(keys, "x", 0, 31),
        tt.NodeInfo(x.node_id, "a:1", tt.BackendKind.GGUF, "smol", "llama", None, "", tt.LayerRange(0, 1 << 31),
                    tt.Capacity(1 << 31, 1 << 62, 1 << 62), 1 << 31, x.public_key),
        tt.NodeInfo(NodeId(""), "", tt.BackendKind.UNSPECIFIED, "", "", None, "", None, None, 0),
    ]
    for node in bad:
        reply = nodes["x"].register(tt.RegisterRequest(V1, node))
        assert reply.status.code == StatusCode.INVALID_ARGUMENT and reply.status.message
    assert nodes["v2"].register(tt.RegisterRequest(ProtocolVersion(2, 0), info(keys, "v2", 0, 30))).status.code == \
        StatusCode.VERSION_MISMATCH
    assert client.open_route(tt.OpenRouteRequest("smol", expected_tokens=(1 << 32) - 1)).status.code == \
        StatusCode.INVALID_ARGUMENT
    assert nodes["x"].report_work(tt.WorkReport(x.node_id, (tt.WorkEntry(None, 1, 1),))).status.code == \
        StatusCode.INVALID_ARGUMENT

    # Still serving.
    assert nodes["ok"].register(tt.RegisterRequest(V1, info(keys, "ok", 0, 30))).status.ok
    assert client.open_route(tt.OpenRouteRequest("smol")).status.ok


def test_plaintext_is_refused_by_a_tls_tracker(tracker, keys):
    with TrackerClient(tracker.address, tracker.roles["node"], keys["n0"], timeout=3) as plaintext:
        with pytest.raises(grpc.RpcError) as err:
            plaintext.coverage("smol")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_reachability_check_sends_an_unreachable_node_to_a_relay(tmp_path, keys):
    """--check-reachability (ADR 0007): a direct address that takes no connection is refused
    UNAVAILABLE with the reason; a reachable one and a relayed one are admitted."""
    proc = TrackerProcess(tmp_path, [MODEL], lease_seconds=LEASE)
    proc.check_reachability = True
    proc.start()
    listening = socket.create_server(("127.0.0.1", 0))
    closed = socket.create_server(("127.0.0.1", 0))
    closed_address = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()  # nothing listens there now
    try:
        with proc.client("node", keys["n0"]) as n0, proc.client("node", keys["n1"]) as n1, \
                proc.client("node", keys["n2"]) as n2:
            unreachable = dataclasses.replace(info(keys, "n0", 0, 10), address=closed_address)
            reply = n0.register(tt.RegisterRequest(V1, unreachable))
            assert reply.status.code == StatusCode.UNAVAILABLE and reply.status.retryable
            assert reply.admission == tt.Admission.REFUSED and "--relay-via" in reply.reason
            reachable = dataclasses.replace(info(keys, "n1", 10, 20),
                                            address=f"127.0.0.1:{listening.getsockname()[1]}")
            assert n1.register(tt.RegisterRequest(V1, reachable)).status.ok
            relayed = dataclasses.replace(info(keys, "n2", 20, 30), address=closed_address, relay="127.0.0.1:1",
                                          relay_rtt_ms=0.4)
            assert n2.register(tt.RegisterRequest(V1, relayed)).status.ok
            registered = {n.node_id: n for n in n2.coverage("smol").nodes}
            assert keys["n0"].node_id not in registered
            assert registered[keys["n2"].node_id].relay == "127.0.0.1:1"
    finally:
        listening.close()
        assert proc.stop() == 0


def test_only_the_verifier_role_takes_and_reports_audits(tracker, keys):
    with tracker.client("client") as client, tracker.client("node", keys["n0"]) as node, \
            tracker.client("verifier") as verifier:
        for caller in (client, node):
            for call in (caller.take_audit, lambda: caller.report_audit(tt.ReportAuditRequest(1, False, "n"))):
                with pytest.raises(grpc.RpcError) as caught:
                    call()
                assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert verifier.take_audit().status.code == StatusCode.NOT_FOUND  # nothing closed yet
        assert verifier.report_audit(tt.ReportAuditRequest(1, True)).status.code == StatusCode.NOT_FOUND
