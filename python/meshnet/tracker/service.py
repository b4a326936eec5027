"""The tracker's gRPC service (meshnet.tracker.v1.Tracker) over a Registry and a Ledger.

`serve()` builds the servicer and starts the server (grpc_server.py: grpc.aio, bounded per
peer, calls refused on their metadata before their message is read; optional TLS). Every call
but TrackerKey is authenticated before it is handled (ADR 0003): the bearer token must grant a
role allowed for the method (PERMISSION_DENIED otherwise, UNAUTHENTICATED for no known token),
and the request must be signed by the caller's Ed25519 key (UNAUTHENTICATED otherwise); the
verified key is the principal the registry acts for, and for a role the operator enrolls by key
it must be enrolled (PERMISSION_DENIED otherwise; ledger/principals.py, ADR 0017), whose quotas it
spends. Route replies carry a ticket per hop, signed with the tracker's ticket key, and every
issued (session, epoch, node) triple is recorded in the ledger, with the route's client_id,
before the reply leaves, so work is accepted only for it. The registry learns from the ledger
whether a route carried a prefill (OpenRoute, ReportFailure: issue 55, finding 12) or traffic
lately (RenewRoute: issue 35, finding 4). Every answer is counted in the tracker's metrics
(tracker/metrics.py). Protobuf stops here; bad input becomes a Status.
"""

from __future__ import annotations

import dataclasses
import hmac
import socket
import time
from typing import Any, Callable, Mapping, Optional

import grpc

from meshnet.identity import keys, requests
from meshnet.identity import tickets as route_tickets
from meshnet.identity.keys import Identity
from meshnet.identity.roles import ROLES
from meshnet.process import log
from meshnet.protocol import tracker as codec
from meshnet.protocol.errors import ProtocolError
from meshnet.tracker.assignment import Assignments, served_by
from meshnet.tracker.audits import Audits
from meshnet.tracker.grpc_server import Refused, ServerLimits, TrackerServer
from meshnet.tracker.ledger.invites import InviteRefused
from meshnet.tracker.ledger.ledger import Ledger, WorkRefused
from meshnet.tracker.ledger.principals import Principals
from meshnet.tracker.metrics import TrackerMetrics
from meshnet.tracker.registry import MAX_EXPECTED_TOKENS, Registry
from meshnet.tracker.store.state_store import StoreError
from meshnet.weights.piece_service import PublishedModels
from meshnet.wire import seam as st
from meshnet.wire import tracker as tt
from meshnet.wire.seam import RouteSession
from meshnet.wire.status import Status, StatusCode

_NODE, _ROUTES, _ANY = frozenset({"node"}), frozenset({"client", "gateway"}), frozenset(ROLES)
METHOD_ROLES: Mapping[str, frozenset[str]] = {
    "Register": _NODE, "Heartbeat": _NODE, "Drain": _NODE, "Deregister": _NODE, "ReportWork": _NODE, "Assign": _NODE,
    "OpenRoute": _ROUTES, "ReportFailure": _ROUTES, "CloseRoute": _ROUTES, "RenewRoute": _ROUTES, "Coverage": _ANY,
    "TakeAudit": frozenset({"verifier"}), "ReportAudit": frozenset({"verifier"}),
}
TICKET_SECONDS = 600.0
MAX_PIECE_SOURCES = 16  # peers named to a joining node as sources of its part
GATEWAY_CLIENT_PREFIX = "key:"  # client_ids the gateway bills its API keys' work to; no other role may
REACHABILITY_TIMEOUT_S = 2.0


class TrackerService:
    """The Tracker methods, synchronous: grpc_server.py calls them on its worker threads, many
    at once; the registry and ledger do their own locking. A refused call raises Refused."""

    def __init__(self, registry: Registry, ledger: Ledger, role_tokens: Mapping[str, str], ticket_key: Identity,
                 ticket_seconds: float = TICKET_SECONDS, metrics: Optional[TrackerMetrics] = None,
                 check_reachability: bool = False, audits: Optional[Audits] = None,
                 principals: Optional[Principals] = None, published: Optional[PublishedModels] = None) -> None:
        tokens = {role: token for role, token in role_tokens.items() if token}
        if not tokens:
            raise ValueError("the tracker needs at least one role token")
        if len(set(tokens.values())) != len(tokens):
            raise ValueError("role tokens must be distinct")
        unknown = set(tokens) - set(ROLES)
        if unknown:
            raise ValueError(f"unknown roles {sorted(unknown)}; roles are {ROLES}")
        self._registry = registry
        self._ledger = ledger
        self._tokens = tokens
        self._ticket_key = ticket_key
        self._ticket_ms = int(ticket_seconds * 1000)
        self._metrics = metrics or TrackerMetrics(registry, ledger)
        self._check_reachability = check_reachability
        self._audits = audits
        self._principals = principals or Principals()
        self._published = published
        self._assignments = Assignments()

    # ---- authentication ---------------------------------------------------------------------

    def role(self, token: str) -> Optional[str]:
        """The role `token` grants, or None; every token compared in constant time."""
        found = None
        for role, expected in self._tokens.items():
            if hmac.compare_digest(token.encode(), expected.encode()):
                found = role
        return found

    def _authenticate(self, method: str, request, context) -> bytes:
        metadata = tuple(context.invocation_metadata() or ())
        role = self.role(requests.bearer_token(metadata))
        if role is None:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, "missing or unknown role token")
        if role not in METHOD_ROLES[method]:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"role {role!r} may not call {method}")
        try:
            caller = requests.verify_request(metadata, method, request.SerializeToString(deterministic=True))
        except requests.RequestAuthError as err:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, str(err)) from None
        refusal = self._principals.refusal(role, caller)  # an enrolled role: the token alone is not enough
        if refusal is not None:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, refusal)
        return caller

    def _handle(self, method: str, request, context, reply_cls: type, work: Callable[[Any, bytes], Any]):
        started = time.perf_counter()
        try:
            caller = self._authenticate(method, request, context)
        except Refused as refused:
            self.refused(method, refused, started)
            raise
        return self._respond(method, request, caller, reply_cls, work, started)

    def _respond(self, method: str, request, caller: bytes, reply_cls: type, work: Callable[[Any, bytes], Any],
                 started: float):
        """The reply of `work` to an authenticated request, every failure a Status."""
        try:
            native = codec.from_proto(request)
            reply = work(native, caller)
        except ProtocolError as err:
            reply = reply_cls(err.status)
        except StoreError as err:  # etcd out of reach (UNAVAILABLE: another tracker may answer), a record too large
            log("store_error", method=method, error=str(err))
            reply = reply_cls(Status(err.code, str(err), err.retryable))
        except Exception as err:  # a bug must not take the tracker down; log it, tell nothing of it
            log("internal_error", method=method, error=repr(err))
            reply = reply_cls(Status(StatusCode.INTERNAL, "tracker error (in the tracker's log)"))
        self._metrics.answered(method, reply.status.code.name, time.perf_counter() - started)
        return codec.to_proto(reply)

    def refused(self, method: str, refused: Refused, started: float) -> None:
        """Logs and counts a refusal (here, or by the server on the call's metadata alone)."""
        log("refused", method=method, code=refused.code.name, reason=refused.message)
        self._metrics.answered(method, refused.code.name, time.perf_counter() - started)

    # ---- nodes ------------------------------------------------------------------------------

    def Register(self, request, context):  # noqa: N802
        def work(req: tt.RegisterRequest, caller: bytes) -> tt.RegisterReply:
            if req.version is None or req.version.major != 1:
                got = f"{req.version.major}.{req.version.minor}" if req.version else "none"
                return tt.RegisterReply(Status(StatusCode.VERSION_MISMATCH, f"protocol {got}; tracker speaks 1.x"))
            if self._check_reachability and req.node is not None and not req.node.relay:
                problem = unreachable(req.node.address)
                if problem:  # ADR 0007: the node should come back through a relay
                    reason = (f"the tracker cannot reach {req.node.address} ({problem}); a node that takes no "
                              "inbound connections registers through a relay (--relay-via)")
                    log("register", node=req.node.node_id, status="UNAVAILABLE", reason=reason)
                    return tt.RegisterReply(Status(StatusCode.UNAVAILABLE, reason, retryable=True),
                                            tt.Admission.REFUSED, reason)
            reply = self._registry.register(req.node, caller)
            if reply.status.ok:
                self._assignments.release(keys.node_id(caller))  # it serves now: coverage counts it
            log("register", node=req.node.node_id if req.node else None, admission=reply.admission.name,
                reason=reply.reason, status=reply.status.code.name)
            return reply
        return self._handle("Register", request, context, tt.RegisterReply, work)

    def Heartbeat(self, request, context):  # noqa: N802
        return self._handle("Heartbeat", request, context, tt.HeartbeatReply,
                            lambda r, caller: self._registry.heartbeat(r.node_id, r.load, caller))

    def Drain(self, request, context):  # noqa: N802
        def work(req: tt.DrainRequest, caller: bytes) -> tt.DrainReply:
            log("drain", node=req.node_id)
            return tt.DrainReply(self._registry.drain(req.node_id, caller))
        return self._handle("Drain", request, context, tt.DrainReply, work)

    def Deregister(self, request, context):  # noqa: N802
        def work(req: tt.DeregisterRequest, caller: bytes) -> tt.DeregisterReply:
            log("deregister", node=req.node_id)
            return tt.DeregisterReply(self._registry.deregister(req.node_id, caller))
        return self._handle("Deregister", request, context, tt.DeregisterReply, work)

    def ReportWork(self, request, context):  # noqa: N802
        def work(req: tt.WorkReport, caller: bytes) -> tt.WorkReply:
            if req.node_id != keys.node_id(caller):
                return tt.WorkReply(Status(StatusCode.PERMISSION_DENIED, "a node reports only its own work"))
            try:
                count = self._ledger.record(req.node_id, req.report_id, req.entries)
            except WorkRefused as err:
                log("work_refused", node=req.node_id, reason=str(err))
                return tt.WorkReply(Status(err.code, str(err)))
            log("work", node=req.node_id, entries=count, report=req.report_id)
            return tt.WorkReply(Status(StatusCode.OK))
        return self._handle("ReportWork", request, context, tt.WorkReply, work)

    def Assign(self, request, context):  # noqa: N802
        def work(req: tt.AssignRequest, caller: bytes) -> tt.AssignReply:
            models = {name: p.manifest for name, p in (self._published.models if self._published else {}).items()
                      if name in self._registry.models}
            reply = self._assignments.assign(keys.node_id(caller), req, models,
                                             served_by(lambda model: self._registry.coverage(model)))
            if reply.status.ok:  # the nodes that serve this very part's pieces: fetched from too
                peers = tuple(n for n in self._registry.coverage(reply.model).nodes
                              if n.pieces_address and n.layers == reply.layers and n.node_id != keys.node_id(caller))
                reply = dataclasses.replace(reply, sources=peers[:MAX_PIECE_SOURCES])
            log("assign", node=keys.node_id(caller), model=reply.model, part=reply.part_file,
                status=reply.status.code.name if reply.status else None, reason=reply.reason or reply.status.message)
            return reply
        return self._handle("Assign", request, context, tt.AssignReply, work)

    def joining(self) -> list[dict]:
        """Each joining node's last assignment or refusal, for /status.json and the doctor."""
        return [dataclasses.asdict(d) for d in self._assignments.decisions()]

    # ---- routes -----------------------------------------------------------------------------

    def Coverage(self, request, context):  # noqa: N802
        return self._handle("Coverage", request, context, tt.CoverageReply,
                            lambda r, caller: self._registry.coverage(r.model, r.max_nodes))

    def OpenRoute(self, request, context):  # noqa: N802
        def work(req: tt.OpenRouteRequest, caller: bytes) -> tt.RouteReply:
            role = self.role(requests.bearer_token(tuple(context.invocation_metadata() or ())))
            if req.client_id.startswith(GATEWAY_CLIENT_PREFIX) and role != "gateway":
                return tt.RouteReply(Status(StatusCode.PERMISSION_DENIED, f"only the gateway names its API keys' "
                                            f"ledger accounts ({GATEWAY_CLIENT_PREFIX}...)"))
            opened = self._registry.open_route(req, caller, self._carried_prefill)
            reply = self._issued(opened, caller, req.expected_tokens, req.client_id)
            self._metrics.route_opens.labels(self._metrics.model_label(req.model), reply.status.code.name).inc()
            log("open_route", model=req.model, client=keys.principal(caller), client_id=req.client_id,
                status=reply.status.code.name, session=reply.session.session_id if reply.session else None,
                hops=[(h.node.node_id, h.layers.start, h.layers.end) for h in reply.hops])
            return reply
        return self._handle("OpenRoute", request, context, tt.RouteReply, work)

    def ReportFailure(self, request, context):  # noqa: N802
        def work(req: tt.ReportFailureRequest, caller: bytes) -> tt.RouteReply:
            over = self._principals.take_failure_report(caller, self._registry.routes_held(caller))
            reply, stored = ((tt.RouteReply(Status(StatusCode.RESOURCE_EXHAUSTED, over, retryable=True)), None)
                             if over is not None
                             else self._registry.report_failure_with_record(req, caller, self._carried_prefill))
            if reply.status.ok:  # ticketed from the record the store wrote, not read back
                assert stored is not None
                reply = self._issued(reply, caller, stored.expected_tokens, stored.client_id)
            self._metrics.failovers.labels(reply.status.code.name).inc()
            log("report_failure", session=req.session, failed=req.failed_node_id, status=reply.status.code.name,
                epoch=reply.session.epoch if reply.session else None)
            return reply
        return self._handle("ReportFailure", request, context, tt.RouteReply, work)

    def CloseRoute(self, request, context):  # noqa: N802
        def work(req: tt.CloseRouteRequest, caller: bytes) -> tt.CloseRouteReply:
            if req.delivery is not None:  # recorded first: a close the ledger missed would pay the budget
                problem = self._registry.opener_problem(req.session, caller, "close")
                if problem is not None:
                    return tt.CloseRouteReply(problem)
                assert req.session is not None
                if req.delivery.prompt_tokens + req.delivery.tokens > MAX_EXPECTED_TOKENS:
                    return tt.CloseRouteReply(Status(StatusCode.INVALID_ARGUMENT, f"a delivery of more than "
                                                     f"{MAX_EXPECTED_TOKENS} tokens was never routed"))
                self._ledger.record_delivery(req.session.session_id, req.delivery.prompt_tokens, req.delivery.tokens)
            return tt.CloseRouteReply(self._registry.close_route(req.session, caller))
        return self._handle("CloseRoute", request, context, tt.CloseRouteReply, work)

    def RenewRoute(self, request, context):  # noqa: N802
        def work(req: tt.RenewRouteRequest, caller: bytes) -> tt.RenewRouteReply:
            return self._registry.renew_route(req.session, caller, lambda: self._carried_traffic(req.session))
        return self._handle("RenewRoute", request, context, tt.RenewRouteReply, work)

    def _carried_traffic(self, route: RouteSession) -> bool:
        """Whether the ledger recorded work for any hop of `route` (at its epoch) within the last
        route lease. Nodes report work with every heartbeat, so a route in use shows some; one
        opened and never sent a frame (capacity squatting, issue 35 finding 4) shows none. With
        replicated trackers this reads the ledger this tracker writes: they share one PostgreSQL
        ledger (ADR 0011), or a renewal sent to another tracker than the work is refused."""
        last = self._ledger.last_work_at(route.session_id, route.epoch)
        return last is not None and last >= time.time() - self._registry.route_lease_ms / 1000

    def _carried_prefill(self, route: RouteSession) -> bool:
        """Whether the ledger holds work by any hop of `route` at its epoch: the first step a hop
        reports for an epoch is its prefill (tracker/prefill_grace.py; issue 55, finding 12). A
        ledger that cannot be read says yes: no route is closed without the evidence."""
        try:
            return self._ledger.last_work_at(route.session_id, route.epoch) is not None
        except StoreError as err:
            log("ledger_unreadable", call="last_work_at", error=str(err))
            return True

    def TakeAudit(self, request, context):  # noqa: N802
        def work(r: tt.TakeAuditRequest, caller: bytes) -> tt.TakeAuditReply:
            if self._audits is None:
                return tt.TakeAuditReply(Status(StatusCode.NOT_FOUND, "this tracker runs no audits"))
            return self._audits.take(r.model_artifact, caller, r.compute_backends)
        return self._handle("TakeAudit", request, context, tt.TakeAuditReply, work)

    def ReportAudit(self, request, context):  # noqa: N802
        def work(report: tt.ReportAuditRequest, caller: bytes) -> tt.ReportAuditReply:
            if self._audits is None:
                return tt.ReportAuditReply(Status(StatusCode.NOT_FOUND, "this tracker runs no audits"))
            return self._audits.report(report, caller)
        return self._handle("ReportAudit", request, context, tt.ReportAuditReply, work)

    def TrackerKey(self, request, context):  # noqa: N802
        return codec.to_proto(tt.TrackerKeyReply(Status(StatusCode.OK), self._ticket_key.public_key))

    def RedeemInvite(self, request, context):  # noqa: N802
        """No role token: the invite is the credential. The request must still be signed, by the
        key the invite's role is bound to (ledger/invites.py)."""
        started = time.perf_counter()
        try:
            caller = requests.verify_request(tuple(context.invocation_metadata() or ()), "RedeemInvite",
                                             request.SerializeToString(deterministic=True))
        except requests.RequestAuthError as err:
            self.refused("RedeemInvite", Refused(grpc.StatusCode.UNAUTHENTICATED, str(err)), started)
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, str(err)) from None

        def work(req: tt.RedeemInviteRequest, caller: bytes) -> tt.RedeemInviteReply:
            try:
                role = self._ledger.redeem_invite(req.invite_id, req.secret, caller)
            except InviteRefused as refused:
                log("invite_refused", invite=req.invite_id[:16], key=keys.principal(caller), reason=str(refused))
                return tt.RedeemInviteReply(Status(StatusCode.PERMISSION_DENIED, str(refused)))
            token = self._tokens.get(role)
            if token is None:
                return tt.RedeemInviteReply(Status(StatusCode.NOT_FOUND, f"this tracker serves no {role} role"))
            self._principals.sync(self._ledger.enrolments())  # an enrolment it made counts from this call on
            log("invite_redeemed", invite=req.invite_id, role=role, key=keys.principal(caller))
            return tt.RedeemInviteReply(Status(StatusCode.OK), role, token)
        return self._respond("RedeemInvite", request, caller, tt.RedeemInviteReply, work, started)

    def _issued(self, reply: tt.RouteReply, client_key: bytes, expected_tokens: int, client_id: str) -> tt.RouteReply:
        """`reply` ticketed (below); when the ledger cannot record it, the route is withdrawn (its
        capacity returns at once, not at its lease's end) and the caller told to retry."""
        try:
            return self._ticketed(reply, client_key, expected_tokens, client_id)
        except Exception as err:
            log("route_withdrawn", session=reply.session.session_id if reply.session else None, error=repr(err))
            if reply.session is not None:
                self._registry.close_route(reply.session, client_key, audit=False)
            return tt.RouteReply(Status(StatusCode.UNAVAILABLE, "the ledger could not record this route; retry",
                                        retryable=True))

    def _ticketed(self, reply: tt.RouteReply, client_key: bytes, expected_tokens: int, client_id: str) -> tt.RouteReply:
        """The reply with a signed ticket on every hop; its triples are in the ledger first."""
        if not reply.status.ok or reply.session is None or not reply.hops:
            return reply
        session = reply.session
        self._ledger.issue([(session.session_id, session.epoch, h.node.node_id) for h in reply.hops], expected_tokens,
                           client_id)
        expires = route_tickets.now_ms() + self._ticket_ms
        hops = []
        # The last hop's downstream is the first hop when the route can ring (ADR 0005).
        ring = reply.hops[0].node if tt.ring_decode_capable([h.node for h in reply.hops]) else None
        for i, hop in enumerate(reply.hops):
            nxt = reply.hops[i + 1].node if i + 1 < len(reply.hops) else ring
            body = st.TicketBody(
                session.session_id, session.epoch, hop.node.node_id,
                st.ShardRange(hop.node.layers.start, hop.node.layers.end, hop.layers.start),
                nxt.node_id if nxt else "", nxt.address if nxt else "", nxt.public_key if nxt else b"",
                nxt.tls_certificate if nxt else "", client_key, keys.principal(client_key), expires)
            hops.append(dataclasses.replace(hop, ticket=route_tickets.issue(self._ticket_key, body)))
        return dataclasses.replace(reply, hops=tuple(hops), ring=ring is not None)


def unreachable(address: str, timeout: float = REACHABILITY_TIMEOUT_S) -> str:
    """'' when a TCP connection to host:port opens within `timeout`, else why not."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return ""  # malformed: the registry refuses it with the reason
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        return str(err) or type(err).__name__
    return ""


def serve(registry: Registry, ledger: Ledger, listen: str, role_tokens: Mapping[str, str], ticket_key: Identity, *,
          tls: Optional[tuple[bytes, bytes]] = None, ticket_seconds: float = TICKET_SECONDS,
          metrics: Optional[TrackerMetrics] = None, check_reachability: bool = False,
          audits: Optional[Audits] = None, limits: Optional[ServerLimits] = None,
          principals: Optional[Principals] = None,
          published: Optional[PublishedModels] = None) -> tuple[TrackerServer, int]:
    # tls: (certificate chain PEM, private key PEM), or None for plaintext (--insecure).
    # metrics: where the service counts its answers (a fresh TrackerMetrics if None).
    """Starts the tracker; returns the server and the bound port (listen may use port 0)."""
    # check_reachability: a node registering a direct address must accept a TCP connection from
    # the tracker there (else UNAVAILABLE: it should come back through a relay).
    # audits: the sampled audits the verifier role takes and reports (ADR 0008); None: off.
    # limits: the server's bounds (grpc_server.py).
    # principals: enrolled keys and per-principal quotas (ledger/principals.py); None: none enrolled, default quotas.
    service = TrackerService(registry, ledger, role_tokens, ticket_key, ticket_seconds, metrics, check_reachability,
                             audits, principals, published)
    server = TrackerServer(service, METHOD_ROLES, listen, tls, limits or ServerLimits(), published)
    return server, server.port
