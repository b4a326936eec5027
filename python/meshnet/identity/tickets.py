"""Route tickets (ADR 0003): the tracker signs one per hop; hops and clients check them.

Called by the tracker (issue), the reference shard (open + admit), the client (results
signature) and the conformance tests. Invariant: a ticket's body is verified as the exact bytes
received and only then parsed; `admit` says yes only for this node, session, epoch and range,
before its expiry.
"""

from __future__ import annotations

import time
from typing import Optional

from meshnet.identity.keys import Identity, verify
from meshnet.protocol import seam
from meshnet.protocol.errors import ProtocolError
from meshnet.wire import seam as t
from meshnet.wire.status import Status, StatusCode

TICKET_DOMAIN = b"meshnet-ticket-v1\0"
AUDIT_DOMAIN = b"meshnet-audit-v1\0"
RESULTS_DOMAIN = b"meshnet-results-v1\0"
MAX_SESSION_ID_BYTES = 64


class TicketError(Exception):
    """A ticket that does not admit the request; `status` is UNAUTHENTICATED or PERMISSION_DENIED."""

    def __init__(self, status: Status) -> None:
        super().__init__(f"{status.code.name}: {status.message}")
        self.status = status


def _denied(message: str) -> TicketError:
    return TicketError(Status(StatusCode.PERMISSION_DENIED, message))


def now_ms() -> int:
    return int(time.time() * 1000)


def issue(tracker: Identity, body: t.TicketBody) -> t.RouteTicket:
    data = seam.encode_ticket_body(body)
    return t.RouteTicket(data, tracker.sign(TICKET_DOMAIN + data))


def issue_audit(tracker: Identity, session_id: str, epoch: int, node_id: str, seconds: float) -> t.AuditTicket:
    """The tracker's permission to read `node_id`'s commitments for (session, epoch) (ADR 0008)."""
    data = seam.encode_audit_body(session_id, epoch, node_id, now_ms() + int(seconds * 1000))
    return t.AuditTicket(data, tracker.sign(AUDIT_DOMAIN + data))


def open_ticket(ticket: Optional[t.RouteTicket], tracker_key: bytes) -> t.TicketBody:
    """The body of a ticket the tracker signed; TicketError(UNAUTHENTICATED) otherwise."""
    if ticket is None:
        raise TicketError(Status(StatusCode.UNAUTHENTICATED, "no route ticket"))
    if not verify(tracker_key, ticket.signature, TICKET_DOMAIN + ticket.body):
        raise TicketError(Status(StatusCode.UNAUTHENTICATED, "the route ticket's signature does not verify"))
    try:
        return seam.decode_ticket_body(ticket.body)
    except ProtocolError as err:
        raise TicketError(Status(StatusCode.UNAUTHENTICATED, err.status.message)) from None


def admit(body: t.TicketBody, session: t.RouteSession, node_id: str, layers: tuple[int, int],
          now: Optional[int] = None) -> None:
    """Raises TicketError(PERMISSION_DENIED) unless `body` admits `session` on this hop now."""
    if body.session_id != session.session_id or body.epoch != session.epoch:
        raise _denied(f"the ticket is for session {body.session_id!r} epoch {body.epoch}, "
                      f"not {session.session_id!r} epoch {session.epoch}")
    if body.node_id != node_id:
        raise _denied(f"the ticket is for node {body.node_id!r}, not {node_id!r}")
    got = (body.range.layer_start, body.range.layer_end) if body.range else None
    if got != tuple(layers):
        raise _denied(f"the ticket is for layers {got}, this hop serves {tuple(layers)}")
    if not layers[0] <= body.range.effective_start < layers[1]:
        raise _denied(f"the ticket's effective start {body.range.effective_start} is outside [{layers[0]}, {layers[1]})")
    if (now if now is not None else now_ms()) > body.expires_unix_ms:
        raise _denied("the ticket has expired")


def admitting_body(ticket: Optional[t.RouteTicket], tracker_key: bytes, session: t.RouteSession, node_id: str,
                   layers: tuple[int, int], now: Optional[int] = None) -> t.TicketBody:
    """What a hop does before anything else for an unbound session: open the ticket, then
    admit it for this session, node and range now (TicketError otherwise)."""
    body = open_ticket(ticket, tracker_key)
    admit(body, session, node_id, layers, now)
    return body


def session_id_too_long(session_id: str) -> bool:
    return len(session_id.encode()) > MAX_SESSION_ID_BYTES


def results_signature(client: Identity, ticket: t.RouteTicket) -> bytes:
    """What a client sends with its ResultsRequest to prove it opened the route."""
    return client.sign(RESULTS_DOMAIN + ticket.signature)


def check_results_signature(body: t.TicketBody, ticket: t.RouteTicket, signature: bytes) -> None:
    if not verify(body.client_public_key, signature, RESULTS_DOMAIN + ticket.signature):
        raise _denied("the results request is not signed by the route's client")
