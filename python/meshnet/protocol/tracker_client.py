"""A typed client of the tracker (used by nodes, clients and tests): native types in and out.

Attaches the swarm secret to every call. gRPC failures (unreachable, UNAUTHENTICATED) raise
grpc.RpcError; structured errors come back in the replies' `status`.
"""

from __future__ import annotations

from typing import Optional

import grpc

from meshnet.protocol import tracker as codec
from meshnet.tracker.v1 import tracker_pb2_grpc
from meshnet.types import tracker as tt
from meshnet.types.ids import NodeId
from meshnet.types.seam import RouteSession


class TrackerClient:
    def __init__(self, address: str, secret: str, *, timeout: float = 10.0,
                 credentials: Optional[grpc.ChannelCredentials] = None) -> None:
        self._channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
        self._stub = tracker_pb2_grpc.TrackerStub(self._channel)
        self._metadata = (("authorization", f"Bearer {secret}"),)
        self._timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "TrackerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, request):
        reply = getattr(self._stub, method)(codec.to_proto(request), timeout=self._timeout, metadata=self._metadata)
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
        return self._call("ReportWork", report)

    def close_route(self, session: RouteSession) -> tt.CloseRouteReply:
        return self._call("CloseRoute", tt.CloseRouteRequest(session))
