"""The tracker's gRPC service (meshnet.tracker.v1.Tracker) over a Registry and a Ledger.

`serve()` builds the server: a swarm-secret interceptor in front of every call (bearer token
in the "authorization" metadata, compared in constant time), optional TLS, and the servicer.
Protobuf stops here: requests are converted to native types, handled by the registry, and
converted back. Bad input becomes a structured Status in the reply; the server keeps serving.
"""

from __future__ import annotations

import hmac
from concurrent import futures
from typing import Any, Callable, Optional

import grpc

from meshnet.process import log
from meshnet.protocol import tracker as codec
from meshnet.protocol.errors import ProtocolError
from meshnet.tracker.ledger import Ledger
from meshnet.tracker.registry import Registry
from meshnet.tracker.v1 import tracker_pb2_grpc
from meshnet.types import tracker as tt
from meshnet.types.status import Status, StatusCode

AUTH_METADATA = "authorization"


class _SwarmAuth(grpc.ServerInterceptor):
    def __init__(self, secret: str) -> None:
        self._expected = f"Bearer {secret}".encode()

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong swarm token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, handler_call_details):
        token = dict(handler_call_details.invocation_metadata or ()).get(AUTH_METADATA, "")
        if hmac.compare_digest(token.encode(), self._expected):
            return continuation(handler_call_details)
        log("unauthenticated", method=handler_call_details.method)
        return self._deny


class TrackerService(tracker_pb2_grpc.TrackerServicer):
    """gRPC threads call in concurrently; the registry and ledger do their own locking."""

    def __init__(self, registry: Registry, ledger: Ledger) -> None:
        self._registry = registry
        self._ledger = ledger

    def _handle(self, request, reply_cls: type, work: Callable[[Any], Any]):
        try:
            native = codec.from_proto(request)
            reply = work(native)
        except ProtocolError as err:
            reply = reply_cls(err.status)
        except Exception as err:  # a bug must not take the tracker down; report it
            log("internal_error", method=type(request).__name__, error=repr(err))
            reply = reply_cls(Status(StatusCode.INTERNAL, f"tracker error: {err!r}"))
        return codec.to_proto(reply)

    def Register(self, request, context):  # noqa: N802
        def work(req: tt.RegisterRequest) -> tt.RegisterReply:
            if req.version is None or req.version.major != 1:
                got = f"{req.version.major}.{req.version.minor}" if req.version else "none"
                return tt.RegisterReply(Status(StatusCode.VERSION_MISMATCH, f"protocol {got}; tracker speaks 1.x"))
            reply = self._registry.register(req.node)
            log("register", node=req.node.node_id if req.node else None, admission=reply.admission.name,
                reason=reply.reason, status=reply.status.code.name)
            return reply
        return self._handle(request, tt.RegisterReply, work)

    def Heartbeat(self, request, context):  # noqa: N802
        return self._handle(request, tt.HeartbeatReply, lambda r: self._registry.heartbeat(r.node_id, r.load))

    def Drain(self, request, context):  # noqa: N802
        def work(req: tt.DrainRequest) -> tt.DrainReply:
            log("drain", node=req.node_id)
            return tt.DrainReply(self._registry.drain(req.node_id))
        return self._handle(request, tt.DrainReply, work)

    def Deregister(self, request, context):  # noqa: N802
        def work(req: tt.DeregisterRequest) -> tt.DeregisterReply:
            log("deregister", node=req.node_id)
            return tt.DeregisterReply(self._registry.deregister(req.node_id))
        return self._handle(request, tt.DeregisterReply, work)

    def Coverage(self, request, context):  # noqa: N802
        return self._handle(request, tt.CoverageReply, lambda r: self._registry.coverage(r.model))

    def OpenRoute(self, request, context):  # noqa: N802
        def work(req: tt.OpenRouteRequest) -> tt.RouteReply:
            reply = self._registry.open_route(req)
            log("open_route", model=req.model, client=req.client_id, status=reply.status.code.name,
                session=reply.session.session_id if reply.session else None,
                hops=[(h.node.node_id, h.layers.start, h.layers.end) for h in reply.hops])
            return reply
        return self._handle(request, tt.RouteReply, work)

    def ReportFailure(self, request, context):  # noqa: N802
        def work(req: tt.ReportFailureRequest) -> tt.RouteReply:
            reply = self._registry.report_failure(req)
            log("report_failure", session=req.session, failed=req.failed_node_id, status=reply.status.code.name,
                epoch=reply.session.epoch if reply.session else None)
            return reply
        return self._handle(request, tt.RouteReply, work)

    def ReportWork(self, request, context):  # noqa: N802
        def work(req: tt.WorkReport) -> tt.WorkReply:
            if not req.node_id:
                return tt.WorkReply(Status(StatusCode.INVALID_ARGUMENT, "work report without a node id"))
            try:
                count = self._ledger.record(req.node_id, req.entries)
            except ValueError as err:
                return tt.WorkReply(Status(StatusCode.INVALID_ARGUMENT, str(err)))
            log("work", node=req.node_id, entries=count)
            return tt.WorkReply(Status(StatusCode.OK))
        return self._handle(request, tt.WorkReply, work)

    def CloseRoute(self, request, context):  # noqa: N802
        return self._handle(request, tt.CloseRouteReply, lambda r: tt.CloseRouteReply(self._registry.close_route(r.session)))


def serve(registry: Registry, ledger: Ledger, listen: str, secret: str, *,
          tls: Optional[tuple[bytes, bytes]] = None, max_workers: int = 16) -> tuple[grpc.Server, int]:
    # tls: (certificate chain PEM, private key PEM), or None for plaintext.
    """Starts the tracker; returns the server and the bound port (listen may use port 0)."""
    if not secret:
        raise ValueError("a swarm secret is required")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), interceptors=[_SwarmAuth(secret)])
    tracker_pb2_grpc.add_TrackerServicer_to_server(TrackerService(registry, ledger), server)
    if tls is not None:
        port = server.add_secure_port(listen, grpc.ssl_server_credentials([(tls[1], tls[0])]))
    else:
        port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    server.start()
    return server, port


