"""A typed client of the tracker (used by nodes, clients and tests): native types in and out.

Every call is signed with the caller's identity and carries its role token (ADR 0003); TLS
verifies the tracker against `tracker_ca` (plaintext only when it is None: --insecure). gRPC
failures (unreachable, UNAUTHENTICATED, PERMISSION_DENIED) raise grpc.RpcError; structured
errors come back in the replies' `status`.

Replicated trackers (ADR 0011): `address` may list several trackers of one swarm,
"HOST:PORT,HOST:PORT,...". Calls go to one of them; a call that finds it UNAVAILABLE (no
connection: the tracker is down or unreachable; nothing reached it) moves to the next and is sent
again there, until each has been tried once; the client then stays on the tracker that answered.
Any other failure (a deadline, a refusal) is raised as is: a call that may have reached a tracker
is not repeated behind the caller's back.
"""

from __future__ import annotations

import secrets
import threading
from typing import Optional, Sequence

import grpc

from meshnet.identity.keys import Identity
from meshnet.identity.requests import sign_request
from meshnet.protocol import tracker as codec
from meshnet.tracker.v1 import tracker_pb2_grpc
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.seam import RouteSession


MAX_TRACKERS = 16


def tracker_addresses(address: str) -> list[str]:
    """"HOST:PORT[,HOST:PORT...]" as a list; ValueError for an empty entry, a missing port or
    more than MAX_TRACKERS entries."""
    entries = [a.strip() for a in address.split(",")]
    if not 1 <= len(entries) <= MAX_TRACKERS:
        raise ValueError(f"between 1 and {MAX_TRACKERS} tracker addresses, got {len(entries)}")
    for entry in entries:
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"tracker address {entry!r} is not HOST:PORT")
    return entries


class TrackerClient:
    def __init__(self, address: str | Sequence[str], token: str, identity: Identity, *,
                 tracker_ca: Optional[bytes] = None, timeout: float = 10.0, tls_name: Optional[str] = None) -> None:
        # tls_name: the name the tracker's certificate is checked for instead of the address's host
        # (for a certificate trusted by its pin, issue 50); None checks the host dialed.
        self.addresses = tracker_addresses(address) if isinstance(address, str) else list(address)
        credentials = None if tracker_ca is None else grpc.ssl_channel_credentials(root_certificates=tracker_ca)
        options = [("grpc.ssl_target_name_override", tls_name)] if tls_name else []
        self._channels = [grpc.insecure_channel(a) if credentials is None
                          else grpc.secure_channel(a, credentials, options=options) for a in self.addresses]
        self._stubs = [tracker_pb2_grpc.TrackerStub(c) for c in self._channels]
        self._current = 0  # the tracker calls go to; moves on UNAVAILABLE
        self._lock = threading.Lock()
        self._token = token
        self.identity = identity
        self._timeout = timeout

    @property
    def address(self) -> str:
        """The tracker calls go to now."""
        return self.addresses[self._current]

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> "TrackerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _send(self, method: str, message, signed: bool):
        """The reply from the current tracker, or from the next ones while they are UNAVAILABLE."""
        with self._lock:
            first = self._current
        for step in range(len(self._stubs)):
            index = (first + step) % len(self._stubs)
            metadata = (sign_request(self.identity, self._token, method, message.SerializeToString(deterministic=True))
                        if signed else None)
            try:
                reply = getattr(self._stubs[index], method)(message, timeout=self._timeout, metadata=metadata)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or step == len(self._stubs) - 1:
                    raise
                continue
            with self._lock:
                self._current = index
            return reply
        raise AssertionError("unreachable")

    def _call(self, method: str, request):
        return codec.from_proto(self._send(method, codec.to_proto(request), signed=True))

    def register(self, request: tt.RegisterRequest) -> tt.RegisterReply:
        return self._call("Register", request)

    def heartbeat(self, node_id: NodeId, load: Optional[tt.Load] = None) -> tt.HeartbeatReply:
        return self._call("Heartbeat", tt.HeartbeatRequest(node_id, load))

    def drain(self, node_id: NodeId) -> tt.DrainReply:
        return self._call("Drain", tt.DrainRequest(node_id))

    def deregister(self, node_id: NodeId) -> tt.DeregisterReply:
        return self._call("Deregister", tt.DeregisterRequest(node_id))

    def coverage(self, model: str, max_nodes: int = 0) -> tt.CoverageReply:
        """A bounded summary (registry.coverage): exact counts, at most `max_nodes` nodes listed."""
        return self._call("Coverage", tt.CoverageRequest(model, max_nodes))

    def open_route(self, request: tt.OpenRouteRequest) -> tt.RouteReply:
        return self._call("OpenRoute", request)

    def report_failure(self, session: RouteSession, failed_node_id: NodeId, failure=None) -> tt.RouteReply:
        return self._call("ReportFailure", tt.ReportFailureRequest(session, failed_node_id, failure))

    def report_work(self, report: tt.WorkReport) -> tt.WorkReply:
        if not report.report_id:  # a fresh id per report; pass one explicitly to retry a report
            report = tt.WorkReport(report.node_id, report.entries, secrets.randbits(62) + 1)
        return self._call("ReportWork", report)

    def close_route(self, session: RouteSession, delivery: Optional[tt.Delivery] = None) -> tt.CloseRouteReply:
        return self._call("CloseRoute", tt.CloseRouteRequest(session, delivery))

    def renew_route(self, session: RouteSession) -> tt.RenewRouteReply:
        return self._call("RenewRoute", tt.RenewRouteRequest(session))

    def take_audit(self, model_artifact: str = "", compute_backends: tuple[str, ...] = ()) -> tt.TakeAuditReply:
        """The oldest pending audit of a model certified from `model_artifact` ("" any) whose
        every hop ran one of `compute_backends` (() = the CPU alone)."""
        return self._call("TakeAudit", tt.TakeAuditRequest(model_artifact, tuple(compute_backends)))

    def report_audit(self, report: tt.ReportAuditRequest) -> tt.ReportAuditReply:
        return self._call("ReportAudit", report)

    def assign(self, request: tt.AssignRequest) -> tt.AssignReply:
        """What this node should serve (node role; issue 50)."""
        return self._call("Assign", request)

    def redeem_invite(self, invite_id: str, secret: bytes) -> tt.RedeemInviteReply:
        """Binds an invite's role to this client's key (signed with it; no role token needed)."""
        return self._call("RedeemInvite", tt.RedeemInviteRequest(invite_id, secret))

    def tracker_key(self) -> bytes:
        """The tracker's ticket key (trust it only over TLS)."""
        return codec.from_proto(self._send("TrackerKey", codec.to_proto(tt.TrackerKeyRequest()),
                                           signed=False)).ticket_public_key
