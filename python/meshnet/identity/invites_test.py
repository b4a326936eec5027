"""The invite string (issue 50): it round-trips, a damaged or foreign one is refused with the
reason, and a tracker is trusted only when its certificate has the invite's pin."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import socket
import ssl
import threading

import pytest

from meshnet.identity import certificates
from meshnet.identity.invites import (MAX_INVITE_CHARS, PREFIX, InviteError, decode, new_invite,
                                      pinned_certificate)

PIN = "sha256:" + "ab" * 32


def test_an_invite_round_trips_and_each_is_new():
    invite = new_invite(("tracker.example:7700", "[2001:db8::1]:7700"), PIN, "node")
    assert decode(invite.encode()) == invite
    assert decode("  " + invite.encode() + "\n") == invite  # as pasted
    other = new_invite(invite.trackers, PIN, "node")
    assert (other.invite_id, other.secret) != (invite.invite_id, invite.secret)


def body(**change) -> str:
    fields = {"trackers": ["t:1"], "pin": PIN, "id": "0" * 12, "secret": base64.urlsafe_b64encode(bytes(32)).decode(),
              "role": "node", **change}
    return PREFIX + base64.urlsafe_b64encode(json.dumps(fields).encode()).decode()


@pytest.mark.parametrize("text, message", [
    ("hello", "not a Meshnet invite"),
    (PREFIX + "!!!", "damaged"),
    (PREFIX + base64.urlsafe_b64encode(b"[1]").decode(), "damaged"),
    (PREFIX + "A" * MAX_INVITE_CHARS, "at most"),
    (body(role="admin"), "role is one of"),
    (body(pin="sha256:xyz"), "pin is"),
    (body(pin="md5:" + "0" * 32), "pin is"),
    (body(id="../../etc"), "id is"),
    (body(secret="AAAA"), "secret is 32 bytes"),
    (body(trackers=[]), "1 to 8 trackers"),
    (body(trackers=["no-port"]), "1 to 8 trackers"),
    (body(trackers=["t:1"] * 9), "1 to 8 trackers"),
])
def test_a_damaged_or_foreign_invite_is_refused_with_the_reason(text, message):
    with pytest.raises(InviteError, match=message):
        decode(text)


def test_an_invite_cannot_be_made_with_a_bad_field():
    good = new_invite(("t:1",), PIN, "client")
    with pytest.raises(InviteError):
        dataclasses.replace(good, secret=b"short")


class TlsServer:
    """A TLS listener on loopback presenting `cert`; it completes handshakes and reads nothing."""

    def __init__(self, cert: bytes, key: bytes, tmp_path) -> None:
        (tmp_path / "c.pem").write_bytes(cert)
        (tmp_path / "k.pem").write_bytes(key)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.received = b""
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            try:
                with self.context.wrap_socket(raw, server_side=True) as tls:
                    tls.settimeout(1)
                    self.received += tls.recv(100)
            except OSError:
                pass


def test_a_tracker_is_trusted_only_with_the_pinned_certificate(tmp_path):
    cert, key = certificates.self_signed("meshnet-tracker", ["localhost"], ["127.0.0.1"])
    server = TlsServer(cert, key, tmp_path)
    pin = "sha256:" + hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert.decode())).hexdigest()
    assert ssl.PEM_cert_to_DER_cert(pinned_certificate(server.address, pin).decode()) == \
        ssl.PEM_cert_to_DER_cert(cert.decode())
    with pytest.raises(InviteError, match="not the tracker that made the invite"):
        pinned_certificate(server.address, PIN)
    assert server.received == b""  # nothing but the handshake was sent either time
    server.listener.close()
