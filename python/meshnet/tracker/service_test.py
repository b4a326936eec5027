"""The tracker service on loopback, over a real SQLite ledger (or a test fake of it).

Issue 35, finding 13: a route the ledger cannot record is withdrawn (its capacity back at once,
not at the end of its lease) and the client is told to retry, without any internal text; a
client_id that is not printable text (a NUL) is refused before anything is written. A real
tracker on loopback over a test fake ledger whose writes can be made to fail. Issue 34: a
failover is ticketed from the session record the store wrote, never read back (on etcd each read
is a round trip); the route reply says whether the route rings, as its tickets do (ADR 0021).
Issue 55, finding 12: routes that show no work in the ledger within the prefill grace are
closed, and a squatter re-opening them is held to its fair share while an honest client waits."""

from __future__ import annotations

import time

import grpc
import pytest

from meshnet.identity import tickets
from meshnet.identity.keys import Identity
from meshnet.identity.roles import new_role_tokens
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.ledger.principals import Enrolment, Principals
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.tracker.service import serve
from meshnet.tracker.store.state_store import EmbeddedStore
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Fingerprints, ProtocolVersion
from meshnet.wire.status import StatusCode

MODEL = CertifiedModel("smol", "llama", 30, "sha256:art", "sha256:rec")


def node_info(key: Identity, sessions: int, backend: tt.BackendKind = tt.BackendKind.GGUF) -> tt.NodeInfo:
    """A whole-model node of MODEL (GGUF unless `backend`) that takes `sessions` sessions at a time."""
    return tt.NodeInfo(key.node_id, "127.0.0.1:9", backend, "smol", "llama",
                       Fingerprints("sha256:art", "sha256:rec"), "", tt.LayerRange(0, 30),
                       tt.Capacity(sessions, 4096, 0), 30, key.public_key, "")


class FailingLedgerFake(Ledger):
    """Test fake: a real SQLite ledger whose `issue` raises while `failing` is set, as a
    PostgreSQL ledger does when the database refuses a write."""

    failing = False

    def issue(self, triples, max_tokens, client_id=""):
        if self.failing:
            raise RuntimeError("psycopg.errors.DataError: PostgreSQL text fields cannot contain NUL (0x00) bytes")
        return super().issue(triples, max_tokens, client_id)


def test_a_route_the_ledger_cannot_record_is_withdrawn_and_its_capacity_returns(tmp_path):
    ledger = FailingLedgerFake(tmp_path / "ledger.db")
    registry = Registry([MODEL], lease_seconds=30, route_lease_seconds=600)
    tokens = new_role_tokens()
    server, port = serve(registry, ledger, "127.0.0.1:0", tokens, Identity.generate())
    address = f"127.0.0.1:{port}"
    try:
        key = Identity.generate()
        info = node_info(key, 1)  # one session at a time
        with TrackerClient(address, tokens["node"], key) as node:
            assert node.register(tt.RegisterRequest(ProtocolVersion(1, 0), info)).admission == tt.Admission.ROUTABLE
        with TrackerClient(address, tokens["gateway"], Identity.generate()) as client:
            refused = client.open_route(tt.OpenRouteRequest("smol", "key:a\x00b", 64))
            assert refused.status.code == StatusCode.INVALID_ARGUMENT and "printable" in refused.status.message
            ledger.failing = True
            failed = client.open_route(tt.OpenRouteRequest("smol", "key:alice", 64))
            assert failed.status.code == StatusCode.UNAVAILABLE and failed.status.retryable
            assert "psycopg" not in failed.status.message and "Error" not in failed.status.message
            assert not failed.hops
            ledger.failing = False
            route = client.open_route(tt.OpenRouteRequest("smol", "key:alice", 64))  # the one session is free
            assert route.status.ok and route.hops[0].node.node_id == key.node_id
            assert client.close_route(route.session).status.ok
    finally:
        server.stop(grace=0).wait()
        ledger.close()


def test_only_the_gateway_bills_to_api_key_accounts(tmp_path):
    """Issue 35, finding 7 (its first half): any client could bill work to a gateway key's ledger
    account by naming it as its client_id."""
    ledger = Ledger(tmp_path / "ledger.db")
    tokens = new_role_tokens()
    server, port = serve(Registry([MODEL], lease_seconds=30), ledger, "127.0.0.1:0", tokens, Identity.generate())
    address = f"127.0.0.1:{port}"
    try:
        with TrackerClient(address, tokens["client"], Identity.generate()) as client:
            refused = client.open_route(tt.OpenRouteRequest("smol", "key:alice", 64))
            assert refused.status.code == StatusCode.PERMISSION_DENIED and not refused.hops
            honest = client.open_route(tt.OpenRouteRequest("smol", "my-app", 64))
            assert honest.status.code == StatusCode.UNAVAILABLE  # served as usual (no node here: no route)
        with TrackerClient(address, tokens["gateway"], Identity.generate()) as gateway:
            assert gateway.open_route(tt.OpenRouteRequest("smol", "key:alice", 64)).status.code \
                == StatusCode.UNAVAILABLE
    finally:
        server.stop(grace=0).wait()
        ledger.close()


def test_a_route_that_carries_no_traffic_is_not_renewed_and_its_capacity_returns(tmp_path):
    """Issue 35, finding 4: a client opened routes up to a node's max_sessions, renewed them
    before each lease ended and never sent a frame, so every other request got 429 for as long
    as it cared to. Renewal now needs work by a hop of the route (in the ledger) within the last
    lease: the squatter's route lapses, while an honest route beside it, whose hop reports its
    work as nodes do with every heartbeat, is renewed."""
    lease = 1.5
    ledger = Ledger(tmp_path / "ledger.db")
    tokens = new_role_tokens()
    server, port = serve(Registry([MODEL], lease_seconds=30, route_lease_seconds=lease), ledger, "127.0.0.1:0",
                         tokens, Identity.generate())
    address = f"127.0.0.1:{port}"
    try:
        key = Identity.generate()
        info = node_info(key, 2)  # two sessions at a time
        with TrackerClient(address, tokens["node"], key) as node, \
                TrackerClient(address, tokens["client"], Identity.generate()) as squatter, \
                TrackerClient(address, tokens["client"], Identity.generate()) as honest:
            assert node.register(tt.RegisterRequest(ProtocolVersion(1, 0), info)).admission == tt.Admission.ROUTABLE
            squatted = squatter.open_route(tt.OpenRouteRequest("smol", expected_tokens=64))
            served = honest.open_route(tt.OpenRouteRequest("smol", expected_tokens=64))
            assert squatted.status.ok and served.status.ok
            assert squatter.open_route(tt.OpenRouteRequest("smol")).status.code == StatusCode.RESOURCE_EXHAUSTED

            refused = squatter.renew_route(squatted.session)
            assert refused.status.code == StatusCode.RESOURCE_EXHAUSTED and refused.status.retryable
            assert "carries traffic" in refused.status.message
            report = 1
            deadline = time.monotonic() + 2 * lease
            while time.monotonic() < deadline:  # the honest hop works and reports; its client renews
                assert node.report_work(tt.WorkReport(key.node_id, (tt.WorkEntry(served.session, 0, 1),),
                                                      report)).status.ok
                report += 1
                assert honest.renew_route(served.session).status.ok
                time.sleep(lease / 4)
            assert squatter.renew_route(squatted.session).status.code == StatusCode.NOT_FOUND  # lapsed
            again = honest.open_route(tt.OpenRouteRequest("smol", expected_tokens=64))  # its capacity is back
            assert again.status.ok
            assert honest.renew_route(served.session).status.ok  # the honest route still lives
    finally:
        server.stop(grace=0).wait()
        ledger.close()


def test_a_squatter_reopening_as_its_routes_lapse_is_held_to_its_share_on_the_wire(tmp_path):
    """Issue 55, finding 12, over a real SQLite ledger: routes that show no work in the ledger a
    grace after they were opened are closed, and while the honest client waits the squatter's
    new routes are refused (RESOURCE_EXHAUSTED, retryable, as over its quota); the honest
    client is served, and its route, whose hop reports its prefill, keeps its session."""
    grace = 1.0
    ledger = Ledger(tmp_path / "ledger.db")
    tokens = new_role_tokens()
    registry = Registry([MODEL], lease_seconds=30, route_lease_seconds=60, prefill_grace_seconds=grace)
    server, port = serve(registry, ledger, "127.0.0.1:0", tokens, Identity.generate())
    address = f"127.0.0.1:{port}"
    try:
        key = Identity.generate()
        with TrackerClient(address, tokens["node"], key) as node, \
                TrackerClient(address, tokens["client"], Identity.generate()) as squatter, \
                TrackerClient(address, tokens["client"], Identity.generate()) as honest:
            assert node.register(tt.RegisterRequest(ProtocolVersion(1, 0), node_info(key, 2))).admission == \
                tt.Admission.ROUTABLE
            assert all(squatter.open_route(tt.OpenRouteRequest("smol", expected_tokens=64)).status.ok for _ in "ab")
            waits = honest.open_route(tt.OpenRouteRequest("smol", expected_tokens=64))
            assert waits.status.code == StatusCode.RESOURCE_EXHAUSTED and "at capacity" in waits.status.message
            time.sleep(grace + 0.1)  # no hop reported work for the squatter's routes
            again = squatter.open_route(tt.OpenRouteRequest("smol", expected_tokens=64))
            assert again.status.code == StatusCode.RESOURCE_EXHAUSTED and again.status.retryable and not again.hops
            assert "fair share" in again.status.message and registry.reclaimed_routes == 2
            served = honest.open_route(tt.OpenRouteRequest("smol", expected_tokens=64))
            assert served.status.ok
            assert node.report_work(tt.WorkReport(key.node_id, (tt.WorkEntry(served.session, 8, 0),), 1)).status.ok
            time.sleep(grace + 0.1)  # the closed routes' places are forgotten; the honest route has carried a prefill
            assert squatter.open_route(tt.OpenRouteRequest("smol", expected_tokens=64)).status.ok
            full = squatter.open_route(tt.OpenRouteRequest("smol", expected_tokens=64))
            assert full.status.code == StatusCode.RESOURCE_EXHAUSTED and "at capacity" in full.status.message
            assert registry.reclaimed_routes == 2 and honest.renew_route(served.session).status.ok
    finally:
        server.stop(grace=0).wait()
        ledger.close()


def test_close_route_reports_the_delivery_that_caps_the_hops_credit(tmp_path):
    """Issue 35, finding 7 (its second half): a node was credited up to the route's budget
    whatever it computed (a session cancelled after 5 tokens was credited 205). The client now
    reports what it received at CloseRoute; only the route's opener may, with sane counts, and
    the hop's credit is capped by it. A stranger's report (which would zero the hop's credit) is
    refused and changes nothing."""
    ledger = Ledger(tmp_path / "ledger.db")
    tokens = new_role_tokens()
    server, port = serve(Registry([MODEL], lease_seconds=30), ledger, "127.0.0.1:0", tokens, Identity.generate())
    address = f"127.0.0.1:{port}"
    try:
        key = Identity.generate()
        info = node_info(key, 4)
        with TrackerClient(address, tokens["node"], key) as node, \
                TrackerClient(address, tokens["client"], Identity.generate()) as client, \
                TrackerClient(address, tokens["client"], Identity.generate()) as stranger:
            assert node.register(tt.RegisterRequest(ProtocolVersion(1, 0), info)).admission == tt.Admission.ROUTABLE
            route = client.open_route(tt.OpenRouteRequest("smol", expected_tokens=205))
            other = client.open_route(tt.OpenRouteRequest("smol", expected_tokens=205))
            assert route.status.ok and other.status.ok
            claimed = tt.WorkReport(key.node_id, (tt.WorkEntry(route.session, 10, 195),
                                                  tt.WorkEntry(other.session, 10, 20)), 1)
            assert node.report_work(claimed).status.ok  # the whole budget of `route`, though 5 tokens went out
            forged = stranger.close_route(route.session, tt.Delivery(0, 0))
            assert forged.status.code == StatusCode.PERMISSION_DENIED
            huge = client.close_route(route.session, tt.Delivery(1 << 24, 1))
            assert huge.status.code == StatusCode.INVALID_ARGUMENT
            assert ledger.totals()[0].decode_tokens == 215  # nothing of either refusal was recorded
            assert client.close_route(route.session, tt.Delivery(10, 5)).status.ok
            assert client.close_route(other.session, tt.Delivery(10, 21)).status.ok  # beside it: all its work counts
            (totals,) = ledger.totals()
            assert (totals.node_id, totals.prefill_tokens, totals.decode_tokens) == (key.node_id, 20, 5 + 20)
    finally:
        server.stop(grace=0).wait()
        ledger.close()


def test_enrolled_roles_and_per_principal_quotas_on_the_wire(tmp_path):
    """ADR 0017: with the verifier role enrolled, the verifier token alone no longer serves a key
    (PERMISSION_DENIED; an enrolled verifier beside it is served), so one token holder cannot
    make up an audit quorum with minted keys; and a client past its failure-report quota is
    refused (RESOURCE_EXHAUSTED, retryable) while another client's report is acted on."""
    ledger = Ledger(tmp_path / "ledger.db")
    tokens = new_role_tokens()
    enrolled = Identity.generate()
    principals = Principals(["verifier"], failure_reports_per_minute=2,
                            enrolments=[Enrolment(enrolled.public_key, "verifier")])
    registry = Registry([MODEL], lease_seconds=30, route_quota=principals.route_quota)
    server, port = serve(registry, ledger, "127.0.0.1:0", tokens, Identity.generate(), principals=principals)
    address = f"127.0.0.1:{port}"
    try:
        with TrackerClient(address, tokens["verifier"], Identity.generate()) as minted, \
                TrackerClient(address, tokens["verifier"], enrolled) as verifier:
            with pytest.raises(grpc.RpcError) as refused:
                minted.take_audit()
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "not enrolled as a verifier" in refused.value.details()
            assert verifier.take_audit().status.code == StatusCode.NOT_FOUND  # served: this tracker runs no audits
        key = Identity.generate()
        with TrackerClient(address, tokens["node"], key) as node, \
                TrackerClient(address, tokens["client"], Identity.generate()) as reporter, \
                TrackerClient(address, tokens["client"], Identity.generate()) as honest:
            assert node.register(tt.RegisterRequest(ProtocolVersion(1, 0), node_info(key, 8))).admission == \
                tt.Admission.ROUTABLE
            route = reporter.open_route(tt.OpenRouteRequest("smol", expected_tokens=64))
            for epoch in (2, 3):  # its quota: each report is acted on (a new epoch; no node named, none banned)
                route = reporter.report_failure(route.session, "")
                assert route.status.ok and route.session.epoch == epoch, route.status
            over = reporter.report_failure(route.session, "")
            assert over.status.code == StatusCode.RESOURCE_EXHAUSTED and over.status.retryable and not over.hops
            other = honest.open_route(tt.OpenRouteRequest("smol", expected_tokens=64))
            moved = honest.report_failure(other.session, "")
            assert moved.status.ok and moved.session.epoch == 2
            assert reporter.close_route(route.session).status.ok  # epoch 3 still: the refused report moved nothing
    finally:
        server.stop(grace=0).wait()
        ledger.close()


class CountingStoreFake(EmbeddedStore):
    """Test fake: the embedded store, logging each session read and write in order."""

    def __init__(self) -> None:
        super().__init__(time.monotonic)
        self.calls: list[str] = []

    def session(self, session_id):
        self.calls.append("session")
        return super().session(session_id)

    def advance_session(self, session_id, seen_epoch, record, lease_seconds):
        self.calls.append("advance_session")
        return super().advance_session(session_id, seen_epoch, record, lease_seconds)


def test_a_failover_is_ticketed_from_the_record_written_without_reading_it_back(tmp_path):
    """Issue 34: ReportFailure re-read the session it had just advanced (its budget and client
    id, for the tickets and the ledger): two store reads, on etcd two round trips, per failover.
    The new epoch's triples still carry the route's budget and client."""
    ledger = Ledger(tmp_path / "ledger.db")
    store = CountingStoreFake()
    tokens = new_role_tokens()
    server, port = serve(Registry([MODEL], lease_seconds=30, store=store), ledger, "127.0.0.1:0", tokens,
                         Identity.generate())
    address = f"127.0.0.1:{port}"
    try:
        key = Identity.generate()
        with TrackerClient(address, tokens["node"], key) as node, \
                TrackerClient(address, tokens["gateway"], Identity.generate()) as client:
            assert node.register(tt.RegisterRequest(ProtocolVersion(1, 0), node_info(key, 4))).admission == \
                tt.Admission.ROUTABLE
            route = client.open_route(tt.OpenRouteRequest("smol", "key:alice", 64))
            assert route.status.ok
            store.calls.clear()
            moved = client.report_failure(route.session, "")
            assert moved.status.ok and moved.session.epoch == 2 and moved.hops[0].ticket
            assert store.calls[-1] == "advance_session", store.calls  # nothing read after the write
            assert store.calls.count("session") == 2  # the probe's read and the decision's, both before it
            assert node.report_work(tt.WorkReport(key.node_id, (tt.WorkEntry(moved.session, 4, 60),), 1)).status.ok
            over = node.report_work(tt.WorkReport(key.node_id, (tt.WorkEntry(moved.session, 0, 1),), 2))
            assert over.status.code == StatusCode.INVALID_ARGUMENT  # the budget of 64 came with the record
            assert [(t.client_id, t.decode_tokens) for t in ledger.totals_by_client()] == [("key:alice", 60)]
    finally:
        server.stop(grace=0).wait()
        ledger.close()


@pytest.mark.parametrize("backend, rings", [(tt.BackendKind.GGUF, True), (tt.BackendKind.REFERENCE, False)])
def test_the_route_reply_says_whether_it_rings_as_the_tickets_do(tmp_path, backend, rings):
    """Issue 34: the client no longer works out the ring from the hops' backends; the tracker
    says it once, beside the last hop's ticket that names the first hop (or no one)."""
    ledger = Ledger(tmp_path / "ledger.db")
    tracker_key = Identity.generate()
    tokens = new_role_tokens()
    server, port = serve(Registry([MODEL], lease_seconds=30), ledger, "127.0.0.1:0", tokens, tracker_key)
    address = f"127.0.0.1:{port}"
    try:
        key = Identity.generate()
        with TrackerClient(address, tokens["node"], key) as node, \
                TrackerClient(address, tokens["gateway"], Identity.generate()) as client:
            info = node_info(key, 1, backend)
            assert node.register(tt.RegisterRequest(ProtocolVersion(1, 0), info)).admission == tt.Admission.ROUTABLE
            route = client.open_route(tt.OpenRouteRequest("smol", "key:alice", 64))
            assert route.status.ok and len(route.hops) == 1 and route.ring is rings
            body = tickets.open_ticket(route.hops[-1].ticket, tracker_key.public_key)
            assert body.downstream_node_id == (key.node_id if rings else "")  # the one hop rings to itself
            assert client.close_route(route.session).status.ok
    finally:
        server.stop(grace=0).wait()
        ledger.close()
