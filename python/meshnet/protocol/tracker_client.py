"""A typed client of the tracker (used by nodes, clients and tests): native types in and out.

Every call is signed with the caller's identity and carries its role token (ADR 0003); TLS
verifies the tracker against `tracker_ca` (plaintext only when it is None: --insecure). gRPC
failures (unreachable, UNAUTHENTICATED, PERMISSION_DENIED) raise grpc.RpcError; structured
errors come back in the replies' `status`.
"""

from __future__ import annotations

import secrets
from typing import Optional

import grpc

from meshnet.identity.keys import Identity
from meshnet.identity.requests import sign_request
from meshnet.protocol import tracker as codec
from meshnet.tracker.v1 import tracker_pb2_grpc
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.seam import RouteSession


class TrackerClient:
    def __init__(self, address: str, token: str, identity: Identity, *, tracker_ca: Optional[bytes] = None,
                 timeout: float = 10.0) -> None:
        if tracker_ca is None:
            self._channel = grpc.insecure_channel(address)
        else:
            self._channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=tracker_ca))
        self._stub = tracker_pb2_grpc.TrackerStub(self._channel)
        self._token = token
        self.identity = identity
        self._timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "TrackerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, request):
        message = codec.to_proto(request)
        metadata = sign_request(self.identity, self._token, method, message.SerializeToString(deterministic=True))
        reply = getattr(self._stub, method)(message, timeout=self._timeout, metadata=metadata)
        return codec.from_proto(reply)

    def register(self, request: tt.RegisterRequest) -> tt.RegisterReply:
        return self._call("Register", request)

    def heartbeat(self, node_id: NodeId, load: Optional[tt.Load] = None) -> tt.HeartbeatReply:
        return self._call("Heartbeat", tt.HeartbeatRequest(node_id, load))

    def drain(self, node_id: NodeId) -> tt.DrainReply:
        return self._call("Drain", tt.DrainRequest(node_id))

    def deregister(self, node_id: NodeId) -> tt.DeregisterReply:
        return self._call("Deregister", tt.DeregisterRequest(node_id))

    def coverage(self, model: str) -> tt.CoverageReply:
        return self._call("Coverage", tt.CoverageRequest(model))

    def open_route(self, request: tt.OpenRouteRequest) -> tt.RouteReply:
        return self._call("OpenRoute", request)

    def report_failure(self, session: RouteSession, failed_node_id: NodeId, failure=None) -> tt.RouteReply:
        return self._call("ReportFailure", tt.ReportFailureRequest(session, failed_node_id, failure))

    def report_work(self, report: tt.WorkReport) -> tt.WorkReply:
        if not report.report_id:  # a fresh id per report; pass one explicitly to retry a report
            report = tt.WorkReport(report.node_id, report.entries, secrets.randbits(62) + 1)
        return self._call("ReportWork", report)

    def close_route(self, session: RouteSession) -> tt.CloseRouteReply:
        return self._call("CloseRoute", tt.CloseRouteRequest(session))

    def renew_route(self, session: RouteSession) -> tt.RenewRouteReply:
        return self._call("RenewRoute", tt.RenewRouteRequest(session))

    def take_audit(self) -> tt.TakeAuditReply:
        return self._call("TakeAudit", tt.TakeAuditRequest())

    def report_audit(self, report: tt.ReportAuditRequest) -> tt.ReportAuditReply:
        return self._call("ReportAudit", report)

    def tracker_key(self) -> bytes:
        """The tracker's ticket key (trust it only over TLS)."""
        reply = self._stub.TrackerKey(codec.to_proto(tt.TrackerKeyRequest()), timeout=self._timeout)
        return codec.from_proto(reply).ticket_public_key
