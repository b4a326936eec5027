"""Issue 50, item 2: invites, end to end. A real tracker over TLS (its certificate made as
`tracker --init` makes it); the operator's `invite make` prints the string; the newcomer's
`redeem` trusts the tracker by the invite's pin and gets the role's token for its own key. Every
bad invite is refused with its reason beside an honest node and client that are served."""

from __future__ import annotations

import json
import secrets
import time

import pytest

from meshnet.identity import certificates
from meshnet.identity.invites import InviteError, decode
from meshnet.identity.keys import Identity
from meshnet.identity.roles import new_role_tokens
from meshnet.protocol.invite_redemption import InviteRefusedByTracker, redeem
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.tracker.grpc_fixtures import MODEL
from meshnet.tracker.invite_command import main as invite
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.ledger.principals import Principals
from meshnet.tracker.metrics import TrackerMetrics
from meshnet.tracker.registry import Registry
from meshnet.tracker.service import serve


@pytest.fixture
def tracker(tmp_path):
    """(address, tokens, certificate PEM, metrics, make-invite) of a TLS tracker serving enrolled clients."""
    cert, key = certificates.self_signed("meshnet-tracker", ["localhost"], ["127.0.0.1"])
    (tmp_path / "cert.pem").write_bytes(cert)
    ledger = Ledger(tmp_path / "tracker.db")
    registry = Registry([MODEL], lease_seconds=30)
    metrics = TrackerMetrics(registry, ledger)
    tokens = new_role_tokens()
    principals = Principals(enrolled_roles=("client",))
    server, port = serve(registry, ledger, "127.0.0.1:0", tokens, Identity.generate(), tls=(cert, key),
                         metrics=metrics, principals=principals)
    address = f"127.0.0.1:{port}"

    def make(role: str, *flags: str, tracker: str = address) -> str:
        return invite_string(["make", "--db", str(tmp_path / "tracker.db"), "--tls-cert", str(tmp_path / "cert.pem"),
                              "--role", role, "--tracker", tracker, *flags])

    yield address, tokens, cert, metrics, make
    server.stop(grace=0).wait()
    ledger.close()


def invite_string(argv: list[str]) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert invite(argv) == 0
    return out.getvalue().strip()


def honest_served(address: str, tokens: dict, cert: bytes) -> None:
    key = Identity.generate()
    with TrackerClient(address, tokens["node"], key, tracker_ca=cert, tls_name="localhost", timeout=5) as node:
        assert not node.heartbeat(key.node_id).status.ok  # answered: this node never registered


def refused_redemptions(metrics: TrackerMetrics, code: str) -> int:
    value = metrics.prometheus.get_sample_value("meshnet_tracker_refusals_total",
                                                {"method": "RedeemInvite", "code": code})
    return int(value or 0)


def redemption_calls(metrics: TrackerMetrics) -> int:
    value = metrics.prometheus.get_sample_value("meshnet_tracker_rpc_duration_seconds_count",
                                                {"method": "RedeemInvite"})
    return int(value or 0)


def test_a_node_invite_gives_the_node_token_to_the_redeemers_key_once(tracker):
    address, tokens, cert, _, make = tracker
    text = make("node")
    redeemed = redeem(decode(text), Identity.generate())
    assert (redeemed.role, redeemed.role_token, redeemed.trackers) == ("node", tokens["node"], (address,))
    assert redeemed.tracker_certificate.strip() == cert.strip()
    key = Identity.generate()  # the token it got works for a node's calls over the pinned certificate
    with TrackerClient(redeemed.trackers, redeemed.role_token, key, tracker_ca=redeemed.tracker_certificate,
                       tls_name=redeemed.tls_name) as node:
        assert not node.heartbeat(key.node_id).status.ok
    with pytest.raises(InviteRefusedByTracker, match="is used up \\(1 of 1 uses\\)"):
        redeem(decode(text), Identity.generate())
    honest_served(address, tokens, cert)


def test_a_client_invite_enrols_the_redeemers_key(tracker):
    address, tokens, cert, _, make = tracker
    joined = Identity.generate()
    redeemed = redeem(decode(make("client", "--uses", "2")), joined)
    with TrackerClient(address, redeemed.role_token, joined, tracker_ca=cert, tls_name="localhost") as client:
        assert client.coverage(MODEL.model).routable_count == 0  # served: the key is enrolled
    import grpc

    with pytest.raises(grpc.RpcError) as refused:  # the token alone, with a key nobody enrolled
        with TrackerClient(address, tokens["client"], Identity.generate(), tracker_ca=cert,
                           tls_name="localhost") as stranger:
            stranger.coverage(MODEL.model)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "is not enrolled as a client" in refused.value.details()


def test_forged_expired_and_revoked_invites_are_refused_with_their_reason(tracker, tmp_path):
    address, tokens, cert, metrics, make = tracker
    forged = decode(make("node"))
    forged = type(forged)(forged.trackers, forged.pin, forged.invite_id, secrets.token_bytes(32), "node")
    with pytest.raises(InviteRefusedByTracker, match="unknown invite, or not its secret"):
        redeem(forged, Identity.generate())
    expired = decode(make("node", "--expires", "1s"))
    time.sleep(1.2)
    with pytest.raises(InviteRefusedByTracker, match=f"invite {expired.invite_id} is expired"):
        redeem(expired, Identity.generate())
    revoked = decode(make("node"))
    assert invite_string(["revoke", "--db", str(tmp_path / "tracker.db"), revoked.invite_id]) == \
        json.dumps({"id": revoked.invite_id, "revoked": True})
    with pytest.raises(InviteRefusedByTracker, match=f"invite {revoked.invite_id} was revoked"):
        redeem(revoked, Identity.generate())
    assert refused_redemptions(metrics, "PERMISSION_DENIED") == 3
    listed = json.loads(invite_string(["list", "--db", str(tmp_path / "tracker.db")]))
    assert {i["id"]: i["state"] for i in listed}[revoked.invite_id] == "revoked"
    honest_served(address, tokens, cert)


def test_an_invite_whose_pin_does_not_match_sends_nothing(tracker, tmp_path):
    """A tracker presenting another certificate (here: a second tracker, made apart) is not
    trusted: the secret is never sent to it, and the real tracker's invite stays unspent."""
    address, tokens, cert, metrics, make = tracker
    other_cert, other_key = certificates.self_signed("meshnet-tracker", ["localhost"], ["127.0.0.1"])
    other_ledger = Ledger(tmp_path / "other.db")
    other, other_port = serve(Registry([MODEL]), other_ledger, "127.0.0.1:0", new_role_tokens(), Identity.generate(),
                              tls=(other_cert, other_key))
    try:
        text = make("node", tracker=f"127.0.0.1:{other_port}")  # the invite names the impostor's address
        with pytest.raises(InviteError, match="not the tracker that made the invite \\(nothing was sent to it\\)"):
            redeem(decode(text), Identity.generate())
    finally:
        other.stop(grace=0).wait()
        other_ledger.close()
    assert redemption_calls(metrics) == 0
    real = decode(text)
    redeemed = redeem(type(real)((address,), real.pin, real.invite_id, real.secret, real.role), Identity.generate())
    assert redeemed.role_token == tokens["node"]  # unspent: the real tracker still honours it
    honest_served(address, tokens, cert)


def test_a_redemption_must_be_signed(tracker):
    import grpc

    from meshnet.protocol import tracker as codec
    from meshnet.tracker.v1 import tracker_pb2_grpc
    from meshnet.wire import tracker as tt

    address, tokens, cert, _, make = tracker
    invite = decode(make("node"))
    channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=cert),
                                  options=[("grpc.ssl_target_name_override", "localhost")])
    with pytest.raises(grpc.RpcError) as refused:
        tracker_pb2_grpc.TrackerStub(channel).RedeemInvite(
            codec.to_proto(tt.RedeemInviteRequest(invite.invite_id, invite.secret)), timeout=5)
    channel.close()
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert redeem(invite, Identity.generate()).role == "node"  # unspent by the unsigned call
