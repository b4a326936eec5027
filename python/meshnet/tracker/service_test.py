"""Issue 35, finding 13: a route the ledger cannot record is withdrawn (its capacity back at once,
not at the end of its lease) and the client is told to retry, without any internal text; a
client_id that is not printable text (a NUL) is refused before anything is written. A real
tracker on loopback over a test fake ledger whose writes can be made to fail."""

from __future__ import annotations

from meshnet.identity.keys import Identity
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.tracker.ledger import Ledger
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.tracker.service import new_role_tokens, serve
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Fingerprints, ProtocolVersion
from meshnet.wire.status import StatusCode

MODEL = CertifiedModel("smol", "llama", 30, "sha256:art", "sha256:rec")


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
        info = tt.NodeInfo(key.node_id, "127.0.0.1:9", tt.BackendKind.GGUF, "smol", "llama",
                           Fingerprints("sha256:art", "sha256:rec"), "", tt.LayerRange(0, 30),
                           tt.Capacity(1, 4096, 0), 30, key.public_key, "")  # one session at a time
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
