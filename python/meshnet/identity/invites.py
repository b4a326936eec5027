"""The invite a newcomer is given (issue 50, item 2): one string that carries the trackers'
addresses, the SHA-256 pin of their TLS certificate, a role, and a one-time enrolment secret,
the way kubeadm's join token carries its CA's hash.

    meshnet-invite-1.<base64url of a JSON object: trackers, pin, id, secret, role>

The redeemer trusts the tracker only if the certificate it presents has the pinned SHA-256
(`pinned_certificate`), and sends the secret only then; the tracker keeps only the secret's
hash (tracker/ledger/invites.py). Pure functions but for `pinned_certificate`, which opens one
TLS connection.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import json
import re
import secrets
import socket
import ssl

from meshnet.identity.roles import ROLES

PREFIX = "meshnet-invite-1."
MAX_INVITE_CHARS = 4096  # a longer string is refused before it is decoded
MAX_TRACKERS = 8
SECRET_BYTES = 32
ID_HEX_DIGITS = 12
_PIN = re.compile(r"sha256:[0-9a-f]{64}")
_ID = re.compile(f"[0-9a-f]{{{ID_HEX_DIGITS}}}")
_ADDRESS = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}")


class InviteError(ValueError):
    """An invite string that is not one, or a tracker that does not match its pin."""


@dataclasses.dataclass(frozen=True)
class Invite:
    trackers: tuple[str, ...]  # HOST:PORT of each tracker (replicated trackers share invites)
    pin: str  # 'sha256:HEX' of the trackers' TLS certificate (DER)
    invite_id: str  # the public half: how the tracker finds the invite
    secret: bytes  # the secret half: sent once, to a tracker that matched the pin
    role: str  # node, client, gateway or verifier

    def __post_init__(self) -> None:
        if not 1 <= len(self.trackers) <= MAX_TRACKERS or not all(_ADDRESS.fullmatch(t) for t in self.trackers):
            raise InviteError(f"an invite names 1 to {MAX_TRACKERS} trackers as HOST:PORT, not {self.trackers!r}")
        if not _PIN.fullmatch(self.pin):
            raise InviteError("an invite's pin is 'sha256:' and 64 lowercase hex digits")
        if not _ID.fullmatch(self.invite_id):
            raise InviteError(f"an invite's id is {ID_HEX_DIGITS} lowercase hex digits")
        if len(self.secret) != SECRET_BYTES:
            raise InviteError(f"an invite's secret is {SECRET_BYTES} bytes")
        if self.role not in ROLES:
            raise InviteError(f"an invite's role is one of {ROLES}, not {self.role!r}")

    def encode(self) -> str:
        body = {"trackers": list(self.trackers), "pin": self.pin, "id": self.invite_id,
                "secret": base64.urlsafe_b64encode(self.secret).decode().rstrip("="), "role": self.role}
        return PREFIX + base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode().rstrip("=")


def new_invite(trackers: tuple[str, ...], pin: str, role: str) -> Invite:
    """An invite with a fresh id and secret."""
    return Invite(trackers, pin, secrets.token_hex(ID_HEX_DIGITS // 2), secrets.token_bytes(SECRET_BYTES), role)


def _unpadded_b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def decode(text: str) -> Invite:
    """The invite `text` carries; InviteError saying what is wrong with it."""
    text = text.strip()
    if len(text) > MAX_INVITE_CHARS:
        raise InviteError(f"an invite is at most {MAX_INVITE_CHARS} characters")
    if not text.startswith(PREFIX):
        raise InviteError(f"not a Meshnet invite (it starts with {PREFIX!r})")
    try:
        body = json.loads(_unpadded_b64(text[len(PREFIX):]))
        secret = _unpadded_b64(body["secret"])
        return Invite(tuple(body["trackers"]), body["pin"], body["id"], secret, body["role"])
    except InviteError:
        raise
    except (binascii.Error, ValueError, KeyError, TypeError) as err:
        raise InviteError(f"the invite is damaged (copy it whole): {type(err).__name__}") from None


def certificate_pin(der: bytes) -> str:
    return "sha256:" + hashlib.sha256(der).hexdigest()


def pinned_certificate(address: str, pin: str, timeout: float = 10.0) -> bytes:
    """The PEM certificate the tracker at HOST:PORT presents, once its SHA-256 matches `pin`;
    InviteError (nothing else sent) when it does not, OSError when it cannot be reached."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # trust comes from the pin, checked below
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw:
        with context.wrap_socket(raw, server_hostname=None) as tls:
            der = tls.getpeercert(binary_form=True)
    presented = certificate_pin(der or b"")
    if not hmac.compare_digest(presented, pin):
        raise InviteError(f"the tracker at {address} presents a certificate with {presented}, not the invite's "
                          f"{pin}: not the tracker that made the invite (nothing was sent to it)")
    return ssl.DER_cert_to_PEM_cert(der).encode()
