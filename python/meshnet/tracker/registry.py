"""The tracker's state: nodes and leases, admission, coverage, route sessions, epochs, bans.

Called by service.py (gRPC threads) and by tests directly; every public method takes the one
lock, so the registry is safe to share. Time comes from an injected monotonic clock. Callers are
named by their verified Ed25519 public key (`caller`, see meshnet.identity). Invariants: only
ROUTABLE nodes with a live lease, not draining and not banned appear in routes; a node id is
registered, renewed, drained and removed only by the key it derives from; a route session is
reported on and closed only by the principal that opened it; a route session's epoch only
grows, and every issued route covers [0, n_layer) exactly once. A route session is leased: unless
its client renews it (or reports on it) within `route_lease_seconds`, it expires and its hops'
capacity returns. A route only enters a GGUF node at its registered start (the worker cannot run
from an effective start); reference nodes may be entered at any layer they serve. A route keeps
the client_id it was opened with across epochs (the ledger attributes its work to it).
`snapshot()` is a bounded, read-only copy for the status page and metrics (tracker/web.py).
Size: over 400 lines, because every method mutates state under the one lock and its invariants
span nodes, leases and routes together; route choice itself is in routing.py.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from typing import Callable, Iterable, Optional

from meshnet.identity import keys
from meshnet.recipe import fingerprint
from meshnet.recipe.adapters import has_adapter
from meshnet.tracker import routing
from meshnet.tracker import snapshot as snap
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId, SessionId
from meshnet.wire.seam import RouteSession
from meshnet.wire.status import Status, StatusCode

MAX_LAYERS = 4096
MAX_SESSIONS = 1 << 16
MAX_KV_TOKENS = 1 << 40
MAX_EXPECTED_TOKENS = 1 << 24  # one session: prompt + new tokens
MAX_ID_CHARS = 128
MAX_CERTIFICATE_CHARS = 8192
MAX_RELAY_RTT_MS = 60_000.0
OK = Status(StatusCode.OK)


@dataclasses.dataclass(frozen=True)
class CertifiedModel:
    model: str  # name clients ask for
    architecture: str  # GGUF general.architecture
    n_layer: int
    artifact_fingerprint: str  # "sha256:<hex>" of the certified GGUF
    recipe_fingerprint: str  # "sha256:<hex>" of the certified runtime recipe
    # tensor name -> digest (meshnet.recipe.fingerprint): any range's expected fingerprint; an
    # empty map (an entry certified before range checks) skips the range check
    tensor_digests: dict = dataclasses.field(default_factory=dict)
    # what //python:certify measured when it wrote the entry ({"suite", "passed", "checks", ...});
    # empty for an entry made without the suite (the local test harness: --allow-uncertified)
    certification: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Node:
    info: tt.NodeInfo
    admission: tt.Admission
    reason: str
    lease_until: float
    draining: bool = False
    load: tt.Load = dataclasses.field(default_factory=tt.Load)
    last_heartbeat: float = 0.0  # registry clock: the last register or heartbeat


@dataclasses.dataclass
class _Session:
    model: str
    epoch: int
    hops: tuple[tt.Hop, ...]
    expected_tokens: int
    avoid: frozenset[NodeId]
    client_key: bytes = b""  # the verified key of the principal that opened the route
    lease_until: float = 0.0  # registry clock; the session expires after this unless renewed
    client_id: str = ""  # as the opener named it (OpenRouteRequest.client_id); kept across epochs
    opened_at: float = 0.0  # registry clock


@dataclasses.dataclass
class _Ban:
    until: float
    strikes: int


def _error(code: StatusCode, message: str, retryable: bool = False) -> Status:
    return Status(code, message, retryable)


class Registry:
    def __init__(self, models: list[CertifiedModel], *, lease_seconds: float = 10.0,
                 route_lease_seconds: float = 60.0, ban_seconds: float = 5.0, max_ban_seconds: float = 300.0,
                 clock: Callable[[], float] = time.monotonic, quarantined: Iterable[NodeId] = (),
                 on_close: Callable[[RouteSession, str, tuple[tt.Hop, ...]], None] = lambda route, model, hops: None
                 ) -> None:
        """`quarantined`: nodes that failed an audit (ADR 0008; the ledger keeps them), never
        routed. `on_close(route, model, hops)` is called after a client closes a route, outside
        the lock (the tracker samples audits there)."""
        self._models = {m.model: m for m in models}
        self._quarantined: set[NodeId] = set(quarantined)
        self._on_close = on_close
        self._lease = lease_seconds
        self._route_lease = route_lease_seconds
        self._ban_base, self._ban_max = ban_seconds, max_ban_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[NodeId, _Node] = {}
        self._sessions: dict[SessionId, _Session] = {}
        self._bans: dict[NodeId, _Ban] = {}

    @property
    def models(self) -> frozenset[str]:
        """The names of the certified models (fixed at construction)."""
        return frozenset(self._models)

    @property
    def lease_ms(self) -> int:
        return int(self._lease * 1000)

    @property
    def route_lease_ms(self) -> int:
        return int(self._route_lease * 1000)

    # ---- nodes ------------------------------------------------------------------------------

    def register(self, info: Optional[tt.NodeInfo], caller: bytes) -> tt.RegisterReply:
        problem = _validate_node(info)
        if problem:
            return tt.RegisterReply(_error(StatusCode.INVALID_ARGUMENT, problem), tt.Admission.REFUSED, problem)
        assert info is not None and info.layers is not None
        if info.public_key != caller or info.node_id != keys.node_id(caller):
            problem = (f"node {info.node_id!r} is not the id of the key that signed the request "
                       f"({keys.node_id(caller)}); a node registers only itself")
            return tt.RegisterReply(_error(StatusCode.PERMISSION_DENIED, problem), tt.Admission.REFUSED, problem)
        admission, reason = self._admit(info)
        if admission == tt.Admission.REFUSED:
            return tt.RegisterReply(_error(StatusCode.FINGERPRINT_MISMATCH, reason), admission, reason)
        with self._lock:
            now = self._clock()
            self._nodes[info.node_id] = _Node(info, admission, reason, now + self._lease, last_heartbeat=now)
        return tt.RegisterReply(OK, admission, reason, self.lease_ms)

    def _admit(self, info: tt.NodeInfo) -> tuple[tt.Admission, str]:
        if not has_adapter(info.architecture):
            return tt.Admission.DARK, f"architecture {info.architecture!r} has no layer-range adapter; registered dark"
        model = self._models.get(info.model)
        if model is None:
            return tt.Admission.REFUSED, f"model {info.model!r} has no certified recipe on this tracker"
        fp = info.fingerprints
        if info.architecture != model.architecture or info.n_layer != model.n_layer:
            return tt.Admission.REFUSED, (f"model {info.model!r} is certified as {model.architecture} with "
                                          f"{model.n_layer} layers; node says {info.architecture} with {info.n_layer}")
        if fp is None or fp.model_artifact != model.artifact_fingerprint:
            got = fp.model_artifact if fp else "none"
            return tt.Admission.REFUSED, f"artifact fingerprint {got} != certified {model.artifact_fingerprint}"
        if fp.runtime_recipe != model.recipe_fingerprint:
            return tt.Admission.REFUSED, f"recipe fingerprint {fp.runtime_recipe} != certified {model.recipe_fingerprint}"
        if model.tensor_digests:
            start, end = info.layers.start, info.layers.end
            try:
                expected = fingerprint.certified_range_fingerprint(model.tensor_digests, model.n_layer, start, end)
            except ValueError as err:
                return tt.Admission.REFUSED, f"layers [{start}, {end}) cannot be served from the certified model: {err}"
            if info.range_fingerprint != expected:
                return tt.Admission.REFUSED, (f"range fingerprint {info.range_fingerprint or 'none'} for layers "
                                              f"[{start}, {end}) != certified {expected}")
        return tt.Admission.ROUTABLE, ""

    def heartbeat(self, node_id: NodeId, load: Optional[tt.Load], caller: bytes) -> tt.HeartbeatReply:
        refused = _not_self(node_id, caller)
        if refused is not None:
            return tt.HeartbeatReply(refused)
        with self._lock:
            node = self._live_node(node_id)
            if node is None:
                return tt.HeartbeatReply(_error(StatusCode.NOT_FOUND, f"node {node_id!r} has no live lease; register again", True))
            node.last_heartbeat = self._clock()
            node.lease_until = node.last_heartbeat + self._lease
            if load is not None:
                node.load = load
        return tt.HeartbeatReply(OK, self.lease_ms)

    def drain(self, node_id: NodeId, caller: bytes) -> Status:
        refused = _not_self(node_id, caller)
        if refused is not None:
            return refused
        with self._lock:
            node = self._live_node(node_id)
            if node is None:
                return _error(StatusCode.NOT_FOUND, f"node {node_id!r} is not registered")
            node.draining = True
        return OK

    def deregister(self, node_id: NodeId, caller: bytes) -> Status:
        refused = _not_self(node_id, caller)
        if refused is not None:
            return refused
        with self._lock:
            if self._nodes.pop(node_id, None) is None:
                return _error(StatusCode.NOT_FOUND, f"node {node_id!r} is not registered")
        return OK

    def _live_node(self, node_id: NodeId) -> Optional[_Node]:
        node = self._nodes.get(node_id)
        if node is not None and node.lease_until < self._clock():
            del self._nodes[node_id]  # the lease expired: the node leaves the coverage map
            return None
        return node

    def _live_nodes(self, model: str) -> list[_Node]:
        return [n for n in (self._live_node(i) for i in list(self._nodes)) if n is not None and n.info.model == model]

    # ---- coverage ---------------------------------------------------------------------------

    def coverage(self, model: str) -> tt.CoverageReply:
        with self._lock:
            nodes = self._live_nodes(model)
            certified = self._models.get(model)
            if certified is None and not nodes:
                return tt.CoverageReply(_error(StatusCode.NOT_FOUND, f"unknown model {model!r}"))
            n_layer = certified.n_layer if certified else max(n.info.n_layer for n in nodes)
            routable = [n for n in nodes if n.admission == tt.Admission.ROUTABLE and not n.draining
                        and n.info.node_id not in self._quarantined]
            layers = tuple(
                tt.LayerCoverage(layer, tuple(sorted(n.info.node_id for n in routable
                                                     if n.info.layers.start <= layer < n.info.layers.end)))
                for layer in range(n_layer))
            candidates = [routing.Candidate(n.info.node_id, n.info.layers.start, n.info.layers.end) for n in routable]
            gaps = tuple(tt.LayerRange(s, e) for s, e in routing.uncovered_ranges(candidates, n_layer))
            dark = tuple(sorted(n.info.node_id for n in nodes if n.admission == tt.Admission.DARK))
            infos = tuple(n.info for n in sorted(nodes, key=lambda n: n.info.node_id))
            quarantined = tuple(sorted(n.info.node_id for n in nodes if n.info.node_id in self._quarantined))
        return tt.CoverageReply(OK, n_layer, layers, gaps, infos, dark, quarantined)

    def snapshot(self, max_nodes: int = snap.MAX_NODES, max_routes: int = snap.MAX_ROUTES) -> snap.RegistrySnapshot:
        """A bounded read-only copy of the live nodes, routes and coverage (see snapshot.py).
        Forgets expired leases on the way, as every other reader does."""
        with self._lock:
            now = self._clock()
            self._expire_sessions()
            nodes = [snap.NodeFacts(n.info, snap.state_of(n.admission, n.draining, self._banned(n, now),
                                                        n.info.node_id in self._quarantined), n.load,
                                    n.last_heartbeat)
                     for n in (self._live_node(i) for i in list(self._nodes)) if n is not None]
            routes = [snap.RouteFacts(sid, s.model, s.epoch, s.client_id, s.hops, s.opened_at, s.lease_until)
                      for sid, s in self._sessions.items()]
            certified = {m.model: m.n_layer for m in self._models.values()}
        return snap.build(certified, nodes, routes, now, max_nodes=max_nodes, max_routes=max_routes)

    def _banned(self, node: _Node, now: float) -> bool:
        ban = self._bans.get(node.info.node_id)
        return ban is not None and ban.until > now

    # ---- route sessions ---------------------------------------------------------------------

    def open_route(self, request: tt.OpenRouteRequest, caller: bytes) -> tt.RouteReply:
        if request.expected_tokens > MAX_EXPECTED_TOKENS:
            return tt.RouteReply(_error(StatusCode.INVALID_ARGUMENT, f"expected_tokens {request.expected_tokens} is too large"))
        if len(request.client_id) > MAX_ID_CHARS:
            return tt.RouteReply(_error(StatusCode.INVALID_ARGUMENT, f"client_id must be at most {MAX_ID_CHARS} characters"))
        with self._lock:
            model = self._models.get(request.model)
            if model is None:
                return tt.RouteReply(_error(StatusCode.NOT_FOUND, f"unknown model {request.model!r}"))
            session = _Session(request.model, 1, (), request.expected_tokens, frozenset(request.avoid_node_ids), caller,
                               client_id=request.client_id, opened_at=self._clock())
            reply = self._route(SessionId(f"rs-{uuid.uuid4().hex}"), session, model)
        return reply

    def report_failure(self, request: tt.ReportFailureRequest, caller: bytes) -> tt.RouteReply:
        if request.session is None:
            return tt.RouteReply(_error(StatusCode.INVALID_ARGUMENT, "failure report without a session"))
        with self._lock:
            session = self._live_session(request.session.session_id)
            if session is None:
                return tt.RouteReply(_error(StatusCode.NOT_FOUND, f"unknown route session {request.session.session_id!r} "
                                                                 "(closed, or its lease expired)"))
            if session.client_key != caller:
                return tt.RouteReply(_error(StatusCode.PERMISSION_DENIED,
                                            "only the client that opened a route may report a failure on it"))
            current = RouteSession(request.session.session_id, session.epoch)
            if request.session.epoch != session.epoch:
                return tt.RouteReply(_error(StatusCode.STALE_EPOCH, f"epoch {request.session.epoch} is fenced; "
                                                                   f"the session is at epoch {session.epoch}"),
                                     current, session.hops)
            on_route = {h.node.node_id for h in session.hops}
            if request.failed_node_id and request.failed_node_id not in on_route:
                return tt.RouteReply(_error(StatusCode.INVALID_ARGUMENT,
                                            f"node {request.failed_node_id!r} is not a hop of epoch {session.epoch}; "
                                            "the report is ignored"), current, session.hops)
            if request.failed_node_id:
                ban = self._bans.get(request.failed_node_id, _Ban(0.0, 0))
                ban.strikes += 1
                ban.until = self._clock() + min(self._ban_max, self._ban_base * 2 ** (ban.strikes - 1))
                self._bans[request.failed_node_id] = ban
            session.epoch += 1
            return self._route(request.session.session_id, session, self._models[session.model])

    def close_route(self, route: Optional[RouteSession], caller: bytes) -> Status:
        with self._lock:
            problem = self._check_session(route)
            if problem is not None:
                return problem
            assert route is not None
            if self._sessions[route.session_id].client_key != caller:
                return _error(StatusCode.PERMISSION_DENIED, "only the client that opened a route may close it")
            closed = self._sessions.pop(route.session_id)
        if closed.hops:
            self._on_close(RouteSession(route.session_id, closed.epoch), closed.model, closed.hops)
        return OK

    def quarantine(self, node_id: NodeId) -> None:
        """Never routes `node_id` again (it failed an audit); it stays visible as quarantined."""
        with self._lock:
            self._quarantined.add(node_id)

    @property
    def quarantined(self) -> frozenset[NodeId]:
        with self._lock:
            return frozenset(self._quarantined)

    def renew_route(self, route: Optional[RouteSession], caller: bytes) -> tt.RenewRouteReply:
        """Extends the lease of a live route session (its opener only, at its current epoch)."""
        with self._lock:
            problem = self._check_session(route)
            if problem is not None:
                return tt.RenewRouteReply(problem)
            assert route is not None
            session = self._sessions[route.session_id]
            if session.client_key != caller:
                return tt.RenewRouteReply(_error(StatusCode.PERMISSION_DENIED,
                                                 "only the client that opened a route may renew it"))
            session.lease_until = self._clock() + self._route_lease
        return tt.RenewRouteReply(OK, self.route_lease_ms)

    def expected_tokens(self, route: Optional[RouteSession]) -> int:
        """The token budget a live route session was opened with (0 if unknown)."""
        with self._lock:
            session = self._live_session(route.session_id) if route else None
            return session.expected_tokens if session else 0

    def client_id(self, route: Optional[RouteSession]) -> str:
        """The client_id a live route session was opened with ('' if unknown)."""
        with self._lock:
            session = self._live_session(route.session_id) if route else None
            return session.client_id if session else ""

    def _check_session(self, route: Optional[RouteSession]) -> Optional[Status]:
        if route is None:
            return _error(StatusCode.INVALID_ARGUMENT, "no route session given")
        session = self._live_session(route.session_id)
        if session is None:
            return _error(StatusCode.NOT_FOUND, f"unknown route session {route.session_id!r} (closed, or its lease expired)")
        if route.epoch != session.epoch:
            return _error(StatusCode.STALE_EPOCH, f"epoch {route.epoch} is fenced; the session is at epoch {session.epoch}")
        return None

    def _live_session(self, session_id: SessionId) -> Optional[_Session]:
        """Lock held. The session, unless its lease expired (then it is forgotten)."""
        session = self._sessions.get(session_id)
        if session is not None and session.lease_until < self._clock():
            del self._sessions[session_id]
            return None
        return session

    def _expire_sessions(self) -> None:
        """Lock held. Forgets every route session whose lease expired: its capacity returns."""
        now = self._clock()
        for sid in [sid for sid, s in self._sessions.items() if s.lease_until < now]:
            del self._sessions[sid]

    def _route(self, session_id: SessionId, session: _Session, model: CertifiedModel) -> tt.RouteReply:
        """Lock held. Picks hops for `session` at its current epoch and records them (with a
        fresh lease)."""
        now = self._clock()
        self._expire_sessions()
        session.lease_until = now + self._route_lease
        in_use: dict[NodeId, tuple[int, int]] = {}
        for sid, other in self._sessions.items():
            if sid == session_id:
                continue
            for hop in other.hops:
                sessions, tokens = in_use.get(hop.node.node_id, (0, 0))
                in_use[hop.node.node_id] = (sessions + 1, tokens + other.expected_tokens)
        nodes, candidates, full, too_short = {}, [], [], []
        for node in self._live_nodes(session.model):
            info, cap = node.info, node.info.capacity or tt.Capacity()
            ban = self._bans.get(info.node_id)
            sessions, tokens = in_use.get(info.node_id, (0, 0))
            if (node.admission != tt.Admission.ROUTABLE or node.draining or info.node_id in session.avoid
                    or (ban is not None and ban.until > now) or info.node_id in self._quarantined):
                continue
            if cap.max_session_tokens and session.expected_tokens > cap.max_session_tokens:
                too_short.append((_candidate(node, sessions), cap.max_session_tokens))
                continue
            if ((cap.max_sessions and sessions >= cap.max_sessions)
                    or (cap.kv_tokens and tokens + session.expected_tokens > cap.kv_tokens)):
                full.append(_candidate(node, sessions))
                continue
            nodes[info.node_id] = info
            candidates.append(_candidate(node, sessions))
        route = RouteSession(session_id, session.epoch)
        try:
            hops = routing.find_route(candidates, model.n_layer)
        except routing.NoRouteError as err:
            if session.epoch > 1:  # keep the session (its old epoch stays fenced) with no route
                session.hops = ()
                self._sessions[session_id] = session
            gaps = tuple(tt.LayerRange(s, e) for s, e in err.uncovered)
            longest = _longest_route(candidates + full, too_short, model.n_layer)
            if longest is not None and longest < session.expected_tokens:
                status = _error(StatusCode.INVALID_ARGUMENT, f"expected_tokens {session.expected_tokens} (prompt + new "
                                f"tokens) exceeds what any route can hold for one session: at most {longest} tokens")
                return tt.RouteReply(status, route, (), gaps)
            if full and _routable(candidates + full, model.n_layer):
                status = _error(StatusCode.RESOURCE_EXHAUSTED, f"the nodes serving layers "
                                f"{routing.describe_layers(err.uncovered)} are all at capacity", True)
                return tt.RouteReply(status, route, (), gaps)
            return tt.RouteReply(_error(StatusCode.UNAVAILABLE, str(err), True), route, (), gaps)
        session.hops = tuple(tt.Hop(nodes[h.node_id], tt.LayerRange(h.start, h.end)) for h in hops)
        self._sessions[session_id] = session
        return tt.RouteReply(OK, route, session.hops, (), self.route_lease_ms)


def _routable(candidates: list[routing.Candidate], n_layer: int) -> bool:
    try:
        routing.find_route(candidates, n_layer)
        return True
    except routing.NoRouteError:
        return False


def _longest_route(usable: list[routing.Candidate], limited: list[tuple[routing.Candidate, int]],
                   n_layer: int) -> Optional[int]:
    """The longest session any route over `usable` plus the per-session `limited` nodes could
    hold (a route holds the smallest limit on it), or None when even all of them leave a gap."""
    for limit in sorted({limit for _, limit in limited}, reverse=True):
        if _routable(usable + [c for c, own in limited if own >= limit], n_layer):
            return limit
    return None


def _candidate(node: _Node, sessions: int) -> routing.Candidate:
    info, load = node.info, node.load
    served = info.layers.end - info.layers.start
    per_layer = routing.DEFAULT_SECONDS_PER_LAYER
    if load.decode_tokens_per_second > 0:
        per_layer = 1.0 / (load.decode_tokens_per_second * served)
    cap = max(1, (info.capacity.max_sessions if info.capacity else 0) or 1)
    pressure = max(load.active_sessions, sessions) / cap + load.queue_depth / cap
    # A relayed node (ADR 0007) costs its measured round trip to its relay on top of a direct hop.
    rtt = routing.HOP_OVERHEAD_SECONDS + (info.relay_rtt_ms / 1000.0 if info.relay else 0.0)
    return routing.Candidate(info.node_id, info.layers.start, info.layers.end, per_layer, rtt, pressure,
                             runs_suffix=info.backend == tt.BackendKind.REFERENCE)


def _not_self(node_id: NodeId, caller: bytes) -> Optional[Status]:
    """PERMISSION_DENIED unless `node_id` is the id of the caller's key."""
    if node_id != keys.node_id(caller):
        return _error(StatusCode.PERMISSION_DENIED, f"a node acts only for itself; the caller is {keys.node_id(caller)}, "
                                                    f"not {node_id!r}")
    return None


def _validate_node(info: Optional[tt.NodeInfo]) -> str:
    """'' if `info` is well formed, else what is wrong with it."""
    if info is None:
        return "registration without node info"
    for what, value in (("node_id", info.node_id), ("address", info.address), ("model", info.model),
                        ("architecture", info.architecture)):
        if not value or len(value) > MAX_ID_CHARS:
            return f"{what} must be 1..{MAX_ID_CHARS} characters"
    if not 0 < info.n_layer <= MAX_LAYERS:
        return f"n_layer {info.n_layer} outside 1..{MAX_LAYERS}"
    if info.layers is None:
        return "registration without a layer range"
    start, end = info.layers.start, info.layers.end
    if end <= start:
        return f"layer range [{start}, {end}) ends before it starts"
    if end > info.n_layer:
        return f"layer range [{start}, {end}) exceeds the model's {info.n_layer} layers"
    cap = info.capacity or tt.Capacity()
    if cap.max_sessions > MAX_SESSIONS or cap.kv_tokens > MAX_KV_TOKENS:
        return f"capacity {cap} exceeds the tracker's limits ({MAX_SESSIONS} sessions, {MAX_KV_TOKENS} KV tokens)"
    if info.backend not in (tt.BackendKind.REFERENCE, tt.BackendKind.GGUF):
        return f"unknown backend {int(info.backend)}"
    if len(info.public_key) != keys.PUBLIC_KEY_BYTES:
        return f"public_key must be a {keys.PUBLIC_KEY_BYTES}-byte Ed25519 key"
    if len(info.tls_certificate) > MAX_CERTIFICATE_CHARS:
        return f"tls_certificate exceeds {MAX_CERTIFICATE_CHARS} characters"
    if len(info.relay) > MAX_ID_CHARS:
        return f"relay must be at most {MAX_ID_CHARS} characters"
    if not 0.0 <= info.relay_rtt_ms <= MAX_RELAY_RTT_MS:  # also refuses NaN
        return f"relay_rtt_ms {info.relay_rtt_ms} outside 0..{MAX_RELAY_RTT_MS:g}"
    return ""
