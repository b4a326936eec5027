"""The tracker's HTTP endpoints over a real in-process tracker (gRPC on loopback, plaintext):
/metrics moves with registrations, routes, failovers, refusals and ledger work; /status and
/status.json show the swarm; the endpoints only read (other methods and paths are refused); two
trackers in one process keep separate metrics."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from email.message import Message

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from meshnet.identity.keys import Identity
from meshnet.identity.roles import new_role_tokens
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.ledger.ledger_store import LedgerUnavailable
from meshnet.tracker.metrics import TrackerMetrics
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.tracker.service import serve
from meshnet.tracker.web import web
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Fingerprints, ProtocolVersion

MODEL = CertifiedModel("smol", "llama", 30, "sha256:art", "sha256:rec")


class Tracker:
    """A tracker in this process with its HTTP endpoints on loopback port 0."""

    def __init__(self, tmp_path, ledger_class=Ledger) -> None:
        self.ledger = ledger_class(tmp_path / "ledger.db")
        self.registry = Registry([MODEL], lease_seconds=30)
        self.metrics = TrackerMetrics(self.registry, self.ledger, ledger_ttl=0.0)
        self.tokens = new_role_tokens()
        self.server, port = serve(self.registry, self.ledger, "127.0.0.1:0", self.tokens, Identity.generate(),
                                  metrics=self.metrics)
        self.address = f"127.0.0.1:{port}"
        self.http = web.serve(self.metrics, "127.0.0.1:0")

    def client(self, role: str, identity: Identity) -> TrackerClient:
        return TrackerClient(self.address, self.tokens[role], identity)

    def get(self, path: str) -> tuple[int, Message, str]:
        with urllib.request.urlopen(self.http.url + path, timeout=10) as reply:
            return reply.status, reply.headers, reply.read().decode()

    def scrape(self) -> dict[tuple[str, tuple], float]:
        _, _, text = self.get("/metrics")
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def stop(self) -> None:
        self.http.stop()
        self.server.stop(grace=1).wait()
        self.ledger.close()


@pytest.fixture
def tracker(tmp_path):
    t = Tracker(tmp_path)
    yield t
    t.stop()


def register(tracker: Tracker, key: Identity, start: int, end: int, address: str = "127.0.0.1:9") -> None:
    info = tt.NodeInfo(key.node_id, address, tt.BackendKind.GGUF, "smol", "llama", Fingerprints("sha256:art",
                       "sha256:rec"), "", tt.LayerRange(start, end), tt.Capacity(4, 4096, 0), 30, key.public_key, "")
    with tracker.client("node", key) as node:
        assert node.register(tt.RegisterRequest(ProtocolVersion(1, 0), info)).admission == tt.Admission.ROUTABLE


def at(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_follow_routes_failovers_refusals_and_ledger_work(tracker):
    a, b, c = Identity.generate(), Identity.generate(), Identity.generate()
    before = tracker.scrape()
    assert at(before, "meshnet_tracker_nodes", model="smol", state="routable") == 0
    assert at(before, "meshnet_tracker_layer_coverage_ratio", model="smol") == 0
    register(tracker, a, 0, 15)
    register(tracker, b, 15, 30)
    register(tracker, c, 15, 30)
    gateway = Identity.generate()
    with tracker.client("gateway", gateway) as client:
        route = client.open_route(tt.OpenRouteRequest("smol", "key:alice", 100))
        assert route.status.ok
        assert client.open_route(tt.OpenRouteRequest("nonesuch", "key:alice", 100)).status.code.name == "NOT_FOUND"
        second = client.report_failure(route.session, route.hops[1].node.node_id)
        assert second.status.ok and second.session.epoch == 2
    middle = next(k for k in (b, c) if k.node_id == second.hops[1].node.node_id)
    with tracker.client("node", a) as node:
        assert node.report_work(tt.WorkReport(a.node_id, (tt.WorkEntry(route.session, 40, 10),), 1)).status.ok
    with tracker.client("node", middle) as node:
        assert node.report_work(tt.WorkReport(middle.node_id, (tt.WorkEntry(second.session, 40, 5),), 1)).status.ok
    with pytest.raises(grpc.RpcError):  # a node token may not open routes
        with tracker.client("node", a) as node:
            node.open_route(tt.OpenRouteRequest("smol"))
    after = tracker.scrape()
    assert at(after, "meshnet_tracker_nodes", model="smol", state="routable") == 2  # the failed node is banned
    assert at(after, "meshnet_tracker_nodes", model="smol", state="banned") == 1
    assert at(after, "meshnet_tracker_live_routes", model="smol") == 1
    assert at(after, "meshnet_tracker_layer_coverage_ratio", model="smol") == 1.0
    assert at(after, "meshnet_tracker_min_layer_replicas", model="smol") == 1
    assert at(after, "meshnet_tracker_route_opens_total", model="smol", code="OK") == 1
    assert at(after, "meshnet_tracker_route_opens_total", model="(uncertified)", code="NOT_FOUND") == 1
    assert at(after, "meshnet_tracker_failovers_total", code="OK") == 1
    assert at(after, "meshnet_tracker_refusals_total", method="OpenRoute", code="NOT_FOUND") == 1
    assert at(after, "meshnet_tracker_refusals_total", method="OpenRoute", code="PERMISSION_DENIED") == 1
    assert at(after, "meshnet_tracker_rpc_duration_seconds_count", method="Register") == 3
    assert at(after, "meshnet_ledger_tokens_total", phase="prefill") == 80
    assert at(after, "meshnet_ledger_tokens_total", phase="decode") == 15
    assert at(after, "meshnet_ledger_sessions_total") == 1
    assert at(after, "meshnet_ledger_node_tokens_total", node_id=a.node_id, phase="decode") == 10
    assert at(after, "meshnet_ledger_client_tokens_total", client_id="key:alice", phase="prefill") == 80
    assert at(after, "meshnet_ledger_client_sessions_total", client_id="key:alice") == 1


def test_status_page_and_json_show_the_swarm(tracker):
    a, b = Identity.generate(), Identity.generate()
    register(tracker, a, 0, 15, address="<b>127.0.0.1:1</b>")
    code, headers, page = tracker.get("/status")
    assert code == 200 and headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert a.node_id in page and "&lt;b&gt;127.0.0.1:1&lt;/b&gt;" in page and "<b>127.0.0.1" not in page
    assert page.count('class="cell gap"') == 15  # [15, 30) has no node yet
    register(tracker, b, 15, 30)
    with tracker.client("gateway", Identity.generate()) as client:  # only the gateway bills to key:*
        route = client.open_route(tt.OpenRouteRequest("smol", "key:bob", 64))
    _, _, page = tracker.get("/status")
    assert 'class="cell gap"' not in page and "key:bob" in page
    _, _, text = tracker.get("/status.json")
    status = json.loads(text)
    assert {n["node_id"] for n in status["nodes"]} == {a.node_id, b.node_id}
    assert status["routes"][0]["client_id"] == "key:bob" and status["routes"][0]["epoch"] == 1
    assert route.session.session_id not in text  # only an 8-character tag of it
    assert status["models"][0]["gaps"] == [] and status["ledger"]["by_client"] == []


def test_the_endpoints_only_read(tracker):
    for method, path, code in (("POST", "/metrics", 405), ("DELETE", "/status", 405), ("GET", "/admin", 404)):
        request = urllib.request.Request(tracker.http.url + path, method=method, data=b"" if method == "POST" else None)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10)
        assert err.value.code == code


def test_two_trackers_in_one_process_keep_their_own_metrics(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    first, second = Tracker(tmp_path / "1"), Tracker(tmp_path / "2")
    try:
        register(first, Identity.generate(), 0, 30)
        assert at(first.scrape(), "meshnet_tracker_nodes", model="smol", state="routable") == 1
        assert at(second.scrape(), "meshnet_tracker_nodes", model="smol", state="routable") == 0
    finally:
        first.stop()
        second.stop()


def test_an_empty_tracker_lists_every_state_of_every_certified_model_at_zero(tracker):
    samples = tracker.scrape()
    for state in ("routable", "draining", "banned", "dark"):
        assert samples[("meshnet_tracker_nodes", (("model", "smol"), ("state", state)))] == 0
    assert at(samples, "meshnet_tracker_uncovered_layers", model="smol") == 30


class UnreachableLedgerFake(Ledger):
    """A test fake: a real ledger whose database becomes unreachable when `down` is set."""

    down = False

    def overall(self):
        if self.down:
            raise LedgerUnavailable("cannot reach the ledger database postgresql://ledger@db.example/meshnet: "
                                    "connection refused")
        return super().overall()


def test_an_unreachable_ledger_is_reported_and_the_endpoints_still_answer(tmp_path):
    tracker = Tracker(tmp_path, UnreachableLedgerFake)
    try:
        register(tracker, Identity.generate(), 0, 30)
        assert at(tracker.scrape(), "meshnet_ledger_up") == 1
        tracker.ledger.down = True
        samples = tracker.scrape()  # 200, with the registry's series intact
        assert at(samples, "meshnet_ledger_up") == 0
        assert at(samples, "meshnet_tracker_nodes", model="smol", state="routable") == 1
        code, _, text = tracker.get("/status.json")
        assert code == 200 and "connection refused" in json.loads(text)["ledger"]["unavailable"]
        code, _, page = tracker.get("/status")
        assert code == 200 and 'id="ledger-unavailable"' in page and "connection refused" in page
        tracker.ledger.down = False  # back: the next read clears it
        assert at(tracker.scrape(), "meshnet_ledger_up") == 1
        assert json.loads(tracker.get("/status.json")[2])["ledger"]["unavailable"] is None
    finally:
        tracker.stop()
