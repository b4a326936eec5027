"""TrackerClient across a list of trackers (issue 20, ADR 0011), against real tracker services in
this process (gRPC on loopback, plaintext, one swarm ticket key and role tokens): a call that
finds a tracker UNAVAILABLE goes to the next and the client stays there; a refusal is raised
where it happened, without trying the others; with every tracker down the call fails
UNAVAILABLE; malformed address lists are refused before any channel is made."""

from __future__ import annotations

import socket
import time

import grpc
import pytest

from meshnet.identity.keys import Identity
from meshnet.identity.roles import new_role_tokens
from meshnet.protocol.tracker_client import MAX_TRACKERS, TrackerClient, tracker_addresses
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.registry import CertifiedModel, Registry
from meshnet.tracker.service import serve
from meshnet.wire import tracker as tt
from meshnet.wire.seam import Fingerprints, ProtocolVersion

MODEL = CertifiedModel("smol", "llama", 30, "sha256:art", "sha256:rec")


class Tracker:
    def __init__(self, tmp_path, name: str, tokens, ticket_key: Identity) -> None:
        self.registry = Registry([MODEL], lease_seconds=30)
        self.ledger = Ledger(tmp_path / f"{name}.db")
        self.server, port = serve(self.registry, self.ledger, "127.0.0.1:0", tokens, ticket_key)
        self.address = f"127.0.0.1:{port}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=0).wait()
            self.server = None
            self.ledger.close()


def closed_port() -> str:
    """A loopback address nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def trackers(tmp_path):
    tokens, ticket_key = new_role_tokens(), Identity.generate()
    started = [Tracker(tmp_path, name, tokens, ticket_key) for name in ("a", "b")]
    yield tokens, ticket_key, started
    for t in started:
        t.stop()


def register(client: TrackerClient, key: Identity) -> tt.RegisterReply:
    info = tt.NodeInfo(key.node_id, "127.0.0.1:9", tt.BackendKind.GGUF, "smol", "llama",
                       Fingerprints("sha256:art", "sha256:rec"), "", tt.LayerRange(0, 30), tt.Capacity(4, 4096, 0),
                       30, key.public_key, "")
    return client.register(tt.RegisterRequest(ProtocolVersion(1, 0), info))


def test_calls_skip_unavailable_trackers_and_stay_where_answered(trackers):
    tokens, ticket_key, (a, b) = trackers
    dead = closed_port()
    node_key = Identity.generate()
    with TrackerClient(f"{dead},{a.address},{b.address}", tokens["node"], node_key) as client:
        assert client.addresses == [dead, a.address, b.address]
        assert client.tracker_key() == ticket_key.public_key  # unsigned calls fail over too
        assert client.address == a.address
        assert register(client, node_key).status.ok
        assert client.address == a.address
        a.stop()
        started = time.monotonic()
        reply = register(client, node_key)  # b has its own registry here: it admits the node anew
        took = time.monotonic() - started
        assert reply.status.ok and client.address == b.address
        assert took < 2.0, f"failover took {took:.2f} s"
        assert client.heartbeat(node_key.node_id).status.ok and client.address == b.address
        b.stop()
        with pytest.raises(grpc.RpcError) as err:
            client.heartbeat(node_key.node_id)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_refusal_is_raised_where_it_happened(trackers):
    tokens, _, (a, b) = trackers
    with TrackerClient(f"{a.address},{b.address}", "not-a-role-token", Identity.generate()) as stranger, \
            TrackerClient(f"{a.address},{b.address}", tokens["client"], Identity.generate()) as honest:
        with pytest.raises(grpc.RpcError) as err:
            stranger.coverage("smol")
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert stranger.address == a.address  # not retried on b
        reply = honest.coverage("smol")  # an honest client beside it is served as before
        assert reply.status.ok and honest.address == a.address


@pytest.mark.parametrize("bad", ["", "127.0.0.1", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536", ":80",
                                 "127.0.0.1:80,", ",".join(["127.0.0.1:80"] * (MAX_TRACKERS + 1))])
def test_malformed_address_lists_are_refused(bad):
    with pytest.raises(ValueError):
        tracker_addresses(bad)


def test_address_lists_parse():
    assert tracker_addresses("h:1") == ["h:1"]
    assert tracker_addresses(" h:1, [::1]:2 ") == ["h:1", "[::1]:2"]
