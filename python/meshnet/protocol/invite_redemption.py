"""Redeeming an invite (issue 50, item 2): the newcomer's side. The tracker is trusted only when
the certificate it presents has the invite's pin (identity/invites.py); only then is the secret
sent, in a RedeemInvite call signed by the newcomer's own key, which the tracker binds to the
invite's role. What comes back is all a node, client, gateway or verifier needs to call the
tracker from then on: its addresses, its certificate, and the role's token.
"""

from __future__ import annotations

import dataclasses

from meshnet.identity.invites import Invite, InviteError, pinned_certificate
from meshnet.identity.keys import Identity
from meshnet.protocol.tracker_client import TrackerClient


class InviteRefusedByTracker(PermissionError):
    """The tracker matched the pin and refused the invite (unknown, revoked, expired, used up)."""


@dataclasses.dataclass(frozen=True)
class Redeemed:
    trackers: tuple[str, ...]  # HOST:PORT of each tracker
    tracker_certificate: bytes  # PEM, the one whose SHA-256 the invite pinned
    tls_name: str  # a name in that certificate, checked instead of the host dialed
    role: str
    role_token: str  # the role's bearer token, for every later call


def certificate_name(cert_pem: bytes) -> str:
    """A DNS name the certificate holds (its first), to check it by; '' if it holds none."""
    from cryptography import x509  # only here: a newcomer's one check, not every process's import

    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ""
    dns = names.get_values_for_type(x509.DNSName)
    return dns[0] if dns else ""


def redeem(invite: Invite, identity: Identity, timeout: float = 10.0) -> Redeemed:
    """Redeems `invite` for `identity` at the first of its trackers that answers. InviteError
    when a tracker presents another certificate (the secret is not sent, and no other tracker is
    tried: the invite is not for whoever answers there); InviteRefusedByTracker when the tracker
    refuses it; OSError when none can be reached."""
    unreachable = []
    for address in invite.trackers:
        try:
            cert = pinned_certificate(address, invite.pin, timeout)
        except OSError as err:
            unreachable.append(f"{address}: {err}")
            continue
        name = certificate_name(cert)
        with TrackerClient([address], "", identity, tracker_ca=cert, tls_name=name or None, timeout=timeout) as client:
            reply = client.redeem_invite(invite.invite_id, invite.secret)
        if not reply.status.ok:
            raise InviteRefusedByTracker(f"the tracker at {address} refused the invite: {reply.status.message}")
        if reply.role != invite.role:
            raise InviteError(f"the tracker bound the role {reply.role!r}, the invite says {invite.role!r}")
        return Redeemed(invite.trackers, cert, name, reply.role, reply.role_token)
    raise OSError(f"no tracker of the invite answered: {'; '.join(unreachable)}")
