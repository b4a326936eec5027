"""The tracker's decisions over its state: nodes and leases, admission, coverage, route sessions,
epochs, bans.

Called by service.py (gRPC threads) and by tests directly; it is safe to share. The state itself
is in a `TrackerStore` (store/state_store.py, thread-safe): in memory by default, or shared with other
trackers on etcd (store/etcd_store.py, ADR 0011), where a route session's epoch is advanced by
compare-and-swap, so that of two trackers advancing one session at once, one wins and the other
answers STALE_EPOCH. The registry's lock guards the decisions made over several reads: route
choice with capacity, and failure reports. OpenRoute plans under it and reserves the plan
(counted as in use by every route planned meanwhile) while the store writes it, so that capacity
stays exact within one tracker without the lock held over a store round trip; calls that are one
store operation (register, heartbeat, drain) or a read then a write conditional on the epoch
(close, renew) do not take it. Time comes from an injected monotonic clock. Callers are named by
their verified Ed25519 public key (`caller`, see meshnet.identity). Invariants: only ROUTABLE
nodes with a live lease, not draining and not banned appear in routes; a node id is
registered, renewed, drained and removed only by the key it derives from; a route session is
reported on and closed only by the principal that opened it; a route session's epoch only
grows, and every issued route covers [0, n_layer) exactly once. A route session is leased: unless
its client renews it (or reports on it) within `route_lease_seconds`, it expires and its hops'
capacity returns. Against capacity squatting (issue 55, finding 12), a route epoch that shows no
prefill in the ledger within `prefill_grace_seconds` is closed (prefill_grace.py), and while
other principals wait for a range's sessions a principal's new route takes no more than its fair
share of them (fair_share.py). A route only enters a GGUF node at its registered start (the
worker cannot run from an effective start); reference nodes may be entered at any layer they
serve. A route keeps the client_id it was opened with across epochs (the ledger attributes its
work to it).
`snapshot()` is a bounded, read-only copy for the status page and metrics (tracker/web/web.py).
Beside it, each a pure function of what the registry read: admission.py (what a registration
must carry, how it is admitted), coverage.py (the Coverage reply), candidates.py (a node as a route
candidate) and routing.py (route choice itself); certified.py holds the certified entries
(`CertifiedModel`, re-exported here), store/state_store.py the state; prefill_grace.py and
fair_share.py keep the registry's memory of unproven routes and of who waits.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from typing import Callable, Iterable, Optional

from meshnet.identity import keys
from meshnet.tracker import routing
from meshnet.tracker import snapshot as snap
from meshnet.tracker.admission import MAX_ID_CHARS, MAX_SESSIONS, admit, validate_node
from meshnet.tracker.candidates import longest_route, node_candidate, routable
from meshnet.tracker.certified import CertifiedModel  # re-exported: callers import it from here
from meshnet.tracker.coverage import coverage_reply
from meshnet.tracker.fair_share import Contention, Range, Share, over_share, ranges_of
from meshnet.tracker.prefill_grace import DEFAULT_GRACE_SECONDS, PrefillWatch
from meshnet.tracker.store.state_store import EmbeddedStore, NodeRecord, SessionRecord, TrackerStore
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId, SessionId
from meshnet.wire.seam import RouteSession
from meshnet.wire.status import Status, StatusCode

MAX_EXPECTED_TOKENS = 1 << 24  # one session: prompt + new tokens
MAX_CLOSES_KEPT = 1 << 16  # nodes whose last route close the registry remembers
MAX_DARK_NODES = 256  # live dark registrations in all (no certified model vouches for them)
OK = Status(StatusCode.OK)


def _error(code: StatusCode, message: str, retryable: bool = False) -> Status:
    return Status(code, message, retryable)


class Registry:
    def __init__(self, models: list[CertifiedModel], *, lease_seconds: float = 10.0,
                 route_lease_seconds: float = 60.0, ban_seconds: float = 5.0, max_ban_seconds: float = 300.0,
                 clock: Callable[[], float] = time.monotonic, quarantined: Iterable[NodeId] = (),
                 on_close: Callable[[RouteSession, str, tuple[tt.Hop, ...]], None] = lambda route, model, hops: None,
                 store: Optional[TrackerStore] = None,
                 corroborate: Callable[[tt.NodeInfo], bool] = lambda node: True,
                 route_quota: Callable[[bytes], int] = lambda caller: MAX_SESSIONS,
                 prefill_grace_seconds: float = DEFAULT_GRACE_SECONDS,
                 share_weight: Callable[[bytes], float] = lambda caller: 1.0) -> None:
        """`quarantined`: nodes that failed an audit (ADR 0008; the ledger keeps them), never
        routed. `on_close(route, model, hops)` is called after a client closes a route, outside
        the lock (the tracker samples audits there). `store`: where the state lives (an
        EmbeddedStore on `clock` when None). `corroborate(node)`: whether the tracker itself
        finds a reported node failing (its own Health probe, tracker/probe.py), called outside
        the lock; only then does a failure report ban the node (issue 35, finding 3). The
        default takes every report on trust. `route_quota(caller)`: how many routes one
        principal may hold open at once (tracker/ledger/principals.py, ADR 0017).
        `prefill_grace_seconds`: how long a route epoch may go without showing a prefill before
        it is closed (prefill_grace.py; ValueError unless finite and positive). `share_weight(caller)`:
        its weight in a range's fair share (fair_share.py; Principals.share_weight)."""
        self._models = {m.model: m for m in models}
        self._store: TrackerStore = store if store is not None else EmbeddedStore(clock)
        for node_id in set(quarantined) - self._store.quarantined():
            self._store.quarantine(node_id)
        self._on_close = on_close
        self._corroborate = corroborate
        self._route_quota = route_quota
        self._share_weight = share_weight
        self.contradicted_reports = 0  # failure reports the tracker's probe contradicted (no ban)
        self.reclaimed_routes = 0  # routes closed for carrying no prefill within the grace
        self._prefill = PrefillWatch(prefill_grace_seconds)
        self._contention = Contention(route_lease_seconds)  # a refusal is remembered for one route lease
        self._lease = lease_seconds
        self._route_lease = route_lease_seconds
        self._ban_base, self._ban_max = ban_seconds, max_ban_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._opening: dict[SessionId, SessionRecord] = {}  # planned under the lock, being written
        # Each live node's route candidate with no session of this tracker on it, by node id, and
        # the info and load it was made from (a heartbeat brings a new load): made again only
        # when those change. Replaced on every route choice, so it holds only live nodes.
        self._idle_candidates: dict[NodeId, tuple[tt.NodeInfo, tt.Load, bool, routing.Candidate]] = {}
        # When this tracker last closed a route through each node (registry clock): a heartbeat
        # older than that counts a session that is gone, so its load is not taken over the
        # tracker's own count. Bounded: cleared past MAX_CLOSES_KEPT nodes (loads count again).
        self._closed_at: dict[NodeId, float] = {}

    @property
    def models(self) -> frozenset[str]:
        """The names of the certified models (fixed at construction)."""
        return frozenset(self._models)

    def certified(self, model: str) -> Optional[CertifiedModel]:
        """`model`'s certified entry (None for a name not certified)."""
        return self._models.get(model)

    @property
    def lease_ms(self) -> int:
        return int(self._lease * 1000)

    @property
    def route_lease_ms(self) -> int:
        return int(self._route_lease * 1000)

    def close(self) -> None:
        """Releases the store (its connections and watch); the registry is unusable after."""
        self._store.close()

    # ---- nodes ------------------------------------------------------------------------------

    def register(self, info: Optional[tt.NodeInfo], caller: bytes) -> tt.RegisterReply:
        problem = validate_node(info)
        if problem:
            return tt.RegisterReply(_error(StatusCode.INVALID_ARGUMENT, problem), tt.Admission.REFUSED, problem)
        assert info is not None and info.layers is not None
        if info.public_key != caller or info.node_id != keys.node_id(caller):
            problem = (f"node {info.node_id!r} is not the id of the key that signed the request "
                       f"({keys.node_id(caller)}); a node registers only itself")
            return tt.RegisterReply(_error(StatusCode.PERMISSION_DENIED, problem), tt.Admission.REFUSED, problem)
        admission, reason = admit(info, self._models)
        if admission == tt.Admission.REFUSED:
            return tt.RegisterReply(_error(StatusCode.FINGERPRINT_MISMATCH, reason), admission, reason)
        if admission == tt.Admission.DARK:
            dark = {n.info.node_id for n in self._store.nodes() if n.admission == tt.Admission.DARK}
            if info.node_id not in dark and len(dark) >= MAX_DARK_NODES:
                problem = f"{MAX_DARK_NODES} dark nodes are registered, the most this tracker keeps; retry later"
                return tt.RegisterReply(_error(StatusCode.RESOURCE_EXHAUSTED, problem, True), tt.Admission.REFUSED,
                                        problem)
        self._store.put_node(NodeRecord(info, admission, reason, last_heartbeat=self._clock()), self._lease)
        return tt.RegisterReply(OK, admission, reason, self.lease_ms)

    def heartbeat(self, node_id: NodeId, load: Optional[tt.Load], caller: bytes) -> tt.HeartbeatReply:
        refused = _not_self(node_id, caller)
        if refused is not None:
            return tt.HeartbeatReply(refused)
        if not self._store.refresh_node(node_id, self._lease, load):
            return tt.HeartbeatReply(_error(StatusCode.NOT_FOUND, f"node {node_id!r} has no live lease; register again",
                                            True))
        return tt.HeartbeatReply(OK, self.lease_ms)

    def drain(self, node_id: NodeId, caller: bytes) -> Status:
        refused = _not_self(node_id, caller)
        if refused is not None:
            return refused
        if not self._store.drain_node(node_id):
            return _error(StatusCode.NOT_FOUND, f"node {node_id!r} is not registered")
        return OK

    def deregister(self, node_id: NodeId, caller: bytes) -> Status:
        refused = _not_self(node_id, caller)
        if refused is not None:
            return refused
        if not self._store.remove_node(node_id):
            return _error(StatusCode.NOT_FOUND, f"node {node_id!r} is not registered")
        return OK

    def _live_nodes(self, model: str) -> list[NodeRecord]:
        """Lock held. A node whose lease expired has left the coverage map."""
        return [n for n in self._store.nodes() if n.info.model == model]

    # ---- coverage ---------------------------------------------------------------------------

    def coverage(self, model: str, max_nodes: int = 0) -> tt.CoverageReply:
        """The coverage map of `model`, bounded however large the swarm (coverage.py). Reads the
        store only (no decision), so it does not take the lock."""
        return coverage_reply(model, self._live_nodes(model), self._store.quarantined(), self._store.banned(),
                              self._models.get(model), max_nodes)

    def snapshot(self, max_nodes: int = snap.MAX_NODES, max_routes: int = snap.MAX_ROUTES) -> snap.RegistrySnapshot:
        """A bounded read-only copy of the live nodes, routes and coverage (see snapshot.py).
        Forgets expired leases on the way, as every other reader does."""
        with self._lock:
            now = self._clock()
            sessions = self._store.sessions()
            banned, quarantined = self._store.banned(), self._store.quarantined()
            nodes = [snap.NodeFacts(n.info, snap.state_of(n.admission, n.draining, n.info.node_id in banned,
                                                        n.info.node_id in quarantined), n.load, n.last_heartbeat)
                     for n in self._store.nodes()]
            routes = [snap.RouteFacts(sid, s.model, s.epoch, s.client_id, s.hops, s.opened_at, s.lease_until)
                      for sid, s in sessions]
            certified = {m.model: m.n_layer for m in self._models.values()}
        return snap.build(certified, nodes, routes, now, max_nodes=max_nodes, max_routes=max_routes)

    # ---- route sessions ---------------------------------------------------------------------

    def open_route(self, request: tt.OpenRouteRequest, caller: bytes,
                   carried_work: Optional[Callable[[RouteSession], bool]] = None) -> tt.RouteReply:
        """A new route for `caller`, within its quota and its fair share of each range others wait
        for. `carried_work(route)`: whether the ledger holds work by a hop of `route` at its epoch
        (service.py asks it); with it, routes that carried no prefill within the grace are closed
        first (None: none is)."""
        if request.expected_tokens > MAX_EXPECTED_TOKENS:
            return tt.RouteReply(_error(StatusCode.INVALID_ARGUMENT, f"expected_tokens {request.expected_tokens} is too large"))
        if len(request.client_id) > MAX_ID_CHARS:
            return tt.RouteReply(_error(StatusCode.INVALID_ARGUMENT, f"client_id must be at most {MAX_ID_CHARS} characters"))
        if not request.client_id.isprintable():
            return tt.RouteReply(_error(StatusCode.INVALID_ARGUMENT, "client_id must be printable text"))
        self._reclaim_unused(carried_work)
        with self._lock:
            model = self._models.get(request.model)
            if model is None:
                return tt.RouteReply(_error(StatusCode.NOT_FOUND, f"unknown model {request.model!r}"))
            quota = self._route_quota(caller)
            held = self._routes_held(caller)
            if held >= quota:
                return tt.RouteReply(_error(StatusCode.RESOURCE_EXHAUSTED, f"principal {keys.principal(caller)} "
                                            f"holds {held} open routes, its quota; close one first", True))
            session_id = SessionId(f"rs-{uuid.uuid4().hex}")
            opened = SessionRecord(request.model, 1, (), request.expected_tokens, frozenset(request.avoid_node_ids),
                                   caller, request.client_id, self._clock())
            reply, planned = self._route(session_id, opened, model, fair=True)
            if not reply.status.ok:
                return reply
            self._opening[session_id] = planned
        created = False
        try:
            created = self._store.create_session(session_id, planned, self._route_lease)
        finally:
            with self._lock:
                del self._opening[session_id]
                if created:
                    self._prefill.routed(session_id, 1, opened.opened_at)
        if not created:
            return tt.RouteReply(_error(StatusCode.INTERNAL, f"route session id {session_id} is taken"))
        return reply

    def routes_held(self, caller: bytes) -> int:
        """How many routes `caller` holds open (a principal's quota is counted in these)."""
        with self._lock:
            return self._routes_held(caller)

    def _routes_held(self, caller: bytes) -> int:
        """Lock held: routes in the store and being opened whose opener is `caller`."""
        held = sum(1 for _, s in self._store.sessions() if s.client_key == caller)
        return held + sum(1 for s in self._opening.values() if s.client_key == caller)

    def report_failure(self, request: tt.ReportFailureRequest, caller: bytes) -> tt.RouteReply:
        """report_failure_with_record's reply alone."""
        return self.report_failure_with_record(request, caller)[0]

    def report_failure_with_record(self, request: tt.ReportFailureRequest, caller: bytes,
                                   carried_work: Optional[Callable[[RouteSession], bool]] = None
                                   ) -> tuple[tt.RouteReply, Optional[SessionRecord]]:
        """A new epoch for the reporter's route, avoiding the failed hop, and the session record
        as the store now holds it (None when nothing was written), so the caller needs no read
        to ticket the reply (expected_tokens, client_id). The hop is banned (from every route,
        for a doubling time) only when the tracker corroborates the failure; else only this
        route avoids it, so a client cannot ban an honest node by reporting it. `carried_work`: as
        in open_route. A failover is not held to the fair share (its route held its places already)."""
        if request.session is None:
            return tt.RouteReply(_error(StatusCode.INVALID_ARGUMENT, "failure report without a session")), None
        session_id = request.session.session_id
        self._reclaim_unused(carried_work, keep=session_id)  # a hop that never finished the prefill is reported
        confirmed = self._confirmed(session_id, request.failed_node_id, caller)  # a probe: outside the lock
        with self._lock:
            session = self._store.session(session_id)
            if session is None:
                return tt.RouteReply(_error(StatusCode.NOT_FOUND, f"unknown route session {session_id!r} "
                                                                 "(closed, or its lease expired)")), None
            if session.client_key != caller:
                return tt.RouteReply(_error(StatusCode.PERMISSION_DENIED,
                                            "only the client that opened a route may report a failure on it")), None
            current = RouteSession(session_id, session.epoch)
            if request.session.epoch != session.epoch:
                return _stale(request.session, session), None
            on_route = {h.node.node_id for h in session.hops}
            if request.failed_node_id and request.failed_node_id not in on_route:
                return tt.RouteReply(_error(StatusCode.INVALID_ARGUMENT,
                                            f"node {request.failed_node_id!r} is not a hop of epoch {session.epoch}; "
                                            "the report is ignored"), current, session.hops), None
            model = self._models.get(session.model)
            if model is None:  # opened through another tracker that certifies a model this one does not
                return tt.RouteReply(_error(StatusCode.NOT_FOUND, f"model {session.model!r} is not certified on "
                                                                 "this tracker"), current, session.hops), None
            avoid = session.avoid
            if request.failed_node_id and confirmed:  # a time-limited ban: the node may come back
                self._store.strike(request.failed_node_id, self._ban_base, self._ban_max)
            elif request.failed_node_id:  # the tracker found it serving: this route alone avoids it
                avoid = avoid | {request.failed_node_id}
                self.contradicted_reports += 1
            reply, planned = self._route(session_id, dataclasses.replace(session, epoch=session.epoch + 1,
                                                                         avoid=avoid), model)
            # The session is kept with no route when there is none (its old epoch stays fenced).
            stored = self._store.advance_session(session_id, session.epoch, planned, self._route_lease)
            if stored is None:
                now = self._store.session(session_id)  # another tracker advanced or closed it first
                if now is None:
                    return tt.RouteReply(_error(StatusCode.NOT_FOUND, f"route session {session_id!r} was closed")), None
                return _stale(request.session, now), None
            if stored.hops:
                self._prefill.routed(session_id, stored.epoch, self._clock())
            return reply, stored

    def _confirmed(self, session_id: SessionId, failed: NodeId, caller: bytes) -> bool:
        """Whether `corroborate` finds the reported hop failing (True when there is nothing to
        probe: the report is then refused or ignored under the lock)."""
        session = self._store.session(session_id)
        if not failed or session is None or session.client_key != caller:
            return True
        node = next((h.node for h in session.hops if h.node.node_id == failed), None)
        return node is None or self._corroborate(node)

    def close_route(self, route: Optional[RouteSession], caller: bytes, audit: bool = True) -> Status:
        """Ends a route (its opener only, at its current epoch); `audit`: offer it to the audits
        (False for a route withdrawn before it was used)."""
        if route is None:
            return _error(StatusCode.INVALID_ARGUMENT, "no route session given")
        # One store read on the way that succeeds: the store checks epoch and opener as it removes.
        closed = self._store.close_session(route.session_id, route.epoch, caller)
        if closed is None:  # why not: unknown, fenced, someone else's, or advanced meanwhile
            problem, session = self._check_session(route)
            if problem is not None:
                return problem
            assert session is not None
            if session.client_key != caller:
                return _error(StatusCode.PERMISSION_DENIED, "only the client that opened a route may close it")
            return _error(StatusCode.UNAVAILABLE, "close raced; retry", True)
        self._note_closed(closed)
        if closed.hops and audit:
            self._on_close(RouteSession(route.session_id, closed.epoch), closed.model, closed.hops)
        return OK

    def _note_closed(self, closed: SessionRecord) -> None:
        """This tracker ended a route through `closed.hops` now: a heartbeat of theirs from before
        counts a session that is gone."""
        now = self._clock()
        if len(self._closed_at) > MAX_CLOSES_KEPT:
            self._closed_at.clear()
        for hop in closed.hops:
            self._closed_at[hop.node.node_id] = now

    def _reclaim_unused(self, carried_work: Optional[Callable[[RouteSession], bool]],
                        keep: Optional[SessionId] = None) -> None:
        """Closes each route but `keep` whose epoch showed no prefill (`carried_work` false) a
        grace after it was routed (prefill_grace.py); its principal's places stay counted for
        fair share one more grace. The ledger is asked outside the lock; the close is at the
        epoch seen, so a route that failed over meanwhile is left alone."""
        if carried_work is None:
            return
        with self._lock:
            due = self._prefill.due(self._store.sessions(), self._clock())
        for session_id, session in due:
            if session_id == keep:
                continue
            if carried_work(RouteSession(session_id, session.epoch)):
                with self._lock:
                    self._prefill.proven(session_id, session.epoch)
                continue
            closed = self._store.close_session(session_id, session.epoch, session.client_key)
            if closed is None:
                continue
            self._note_closed(closed)
            with self._lock:
                until = self._clock() + self._prefill.grace_seconds
                self._contention.reclaimed(closed.model, closed.client_key, ranges_of(closed.hops), until)
                self.reclaimed_routes += 1

    def quarantine(self, node_id: NodeId) -> None:
        """Never routes `node_id` again (it failed an audit); it stays visible as quarantined."""
        with self._lock:
            self._store.quarantine(node_id)

    def registered_at(self, node_id: str, address: str) -> bool:
        """Whether `node_id` has a live registration with `address` (the relay's question about
        an allocation it holds for that node)."""
        return any(n.info.node_id == node_id and n.info.address == address for n in self._store.nodes())

    def sync_quarantine(self, quarantined: Iterable[NodeId]) -> None:
        """Makes the store's quarantine `quarantined` (the ledger's, which is the record: a node
        the operator released there is routed again; one quarantined by a tracker sharing the
        ledger is fenced here too)."""
        wanted = set(quarantined)
        with self._lock:
            held = self._store.quarantined()
            for node_id in held - wanted:
                self._store.release(node_id)
            for node_id in wanted - held:
                self._store.quarantine(node_id)

    @property
    def quarantined(self) -> frozenset[NodeId]:
        with self._lock:
            return self._store.quarantined()

    def renew_route(self, route: Optional[RouteSession], caller: bytes,
                    carried_traffic: Callable[[], bool] = lambda: True) -> tt.RenewRouteReply:
        """Extends the lease of a live route session (its opener only, at its current epoch), if
        `carried_traffic()` says its hops worked for it lately (service.py asks the ledger): a
        route nobody sends frames on lapses, and its hops' capacity returns (issue 35, finding 4)."""
        problem = self.opener_problem(route, caller, "renew")
        if problem is not None:
            return tt.RenewRouteReply(problem)
        assert route is not None
        if not carried_traffic():
            return tt.RenewRouteReply(_error(
                StatusCode.RESOURCE_EXHAUSTED, f"no hop of this route reported work in the last "
                f"{self._route_lease:g} s: only a route that carries traffic keeps the hops' capacity (an idle one lapses)",
                True))
        if not self._store.renew_session(route.session_id, route.epoch, self._route_lease):  # only at that epoch
            problem = self._check_session(route)[0] or _error(StatusCode.UNAVAILABLE, "renew raced; retry", True)
            return tt.RenewRouteReply(problem)
        return tt.RenewRouteReply(OK, self.route_lease_ms)

    def opener_problem(self, route: Optional[RouteSession], caller: bytes, verb: str) -> Optional[Status]:
        """None when `route` is live at its current epoch (as read now) and `caller` opened it;
        else why not (`verb`: what the caller wants to do, for the message)."""
        problem, session = self._check_session(route)
        if problem is not None:
            return problem
        assert session is not None
        if session.client_key != caller:
            return _error(StatusCode.PERMISSION_DENIED, f"only the client that opened a route may {verb} it")
        return None

    def client_id(self, route: Optional[RouteSession]) -> str:
        """The client_id a live route session was opened with ('' if unknown)."""
        session = self._store.session(route.session_id) if route else None
        return session.client_id if session else ""

    def _check_session(self, route: Optional[RouteSession]) -> tuple[Optional[Status], Optional[SessionRecord]]:
        """(None, the session) when `route` names a live session at its current epoch (as read now:
        the caller's write must still be conditional on that epoch)."""
        if route is None:
            return _error(StatusCode.INVALID_ARGUMENT, "no route session given"), None
        session = self._store.session(route.session_id)
        if session is None:
            return _error(StatusCode.NOT_FOUND, f"unknown route session {route.session_id!r} (closed, or its lease "
                                                "expired)"), None
        if route.epoch != session.epoch:
            return _error(StatusCode.STALE_EPOCH, f"epoch {route.epoch} is fenced; the session is at epoch "
                                                  f"{session.epoch}"), None
        return None, session

    def _route(self, session_id: SessionId, session: SessionRecord, model: CertifiedModel,
               fair: bool = False) -> tuple[tt.RouteReply, SessionRecord]:
        """Lock held. Picks hops for `session` at its epoch: the reply, and the record to store
        (with those hops, or none). Sessions other routes are being written for count as in use.
        `fair`: the route takes no place where its opener holds its fair share (fair_share.py)."""
        live = dict(self._store.sessions())
        live.update(self._opening)
        live.pop(session_id, None)
        now = self._clock()
        eligible = self._eligible(session.model)
        over = (over_share(session.client_key, session.model, live.values(), eligible, self._contention, now,
                           self._share_weight) if fair else {})
        choice = self._candidates(session, live, eligible, model.recipes(), over)
        combinations = model.route_combinations()
        route = RouteSession(session_id, session.epoch)
        unrouted = dataclasses.replace(session, hops=())
        try:
            hops = routing.find_route(choice.usable, model.n_layer, combinations)
        except routing.NoRouteError as err:
            return self._no_route(route, session, model.n_layer, combinations, choice, over, err, now), unrouted
        self._contention.served(session.model, session.client_key)
        routed = tuple(tt.Hop(choice.nodes[h.node_id], tt.LayerRange(h.start, h.end)) for h in hops)
        return tt.RouteReply(OK, route, routed, (), self.route_lease_ms), dataclasses.replace(session, hops=routed)

    def _eligible(self, model: str) -> list[NodeRecord]:
        """Lock held: the live nodes of `model` a route may use (routable, neither draining, banned
        nor quarantined)."""
        banned, quarantined = self._store.banned(), self._store.quarantined()
        return [n for n in self._live_nodes(model) if n.admission == tt.Admission.ROUTABLE and not n.draining
                and n.info.node_id not in banned and n.info.node_id not in quarantined]

    def _candidates(self, session: SessionRecord, live: dict[SessionId, SessionRecord], eligible: list[NodeRecord],
                    backends: dict[str, str], over: dict[Range, Share]) -> _Choice:
        """Lock held: each eligible node `session` does not avoid, as a route candidate, sorted by
        whether it may take the session (`live`: the other routes, whose sessions are in use)."""
        in_use: dict[NodeId, tuple[int, int]] = {}
        for other in live.values():
            for hop in other.hops:
                sessions, tokens = in_use.get(hop.node.node_id, (0, 0))
                in_use[hop.node.node_id] = (sessions + 1, tokens + other.expected_tokens)
        choice = _Choice()
        idle, cached = {}, self._idle_candidates
        for node in eligible:
            info = node.info
            node_id = info.node_id
            if node_id in session.avoid:
                continue
            sessions, tokens = in_use.get(node_id, (0, 0))
            stale = self._closed_at.get(node_id, float("-inf")) > node.last_heartbeat
            if sessions:
                candidate = node_candidate(node, sessions, backends, stale)
            else:
                made = cached.get(node_id)
                if made is None or made[0] is not info or made[1] is not node.load or made[2] != stale:
                    made = (info, node.load, stale, node_candidate(node, 0, backends, stale))
                idle[node_id] = made
                candidate = made[3]
            cap = info.capacity or _NO_CAPACITY_LIMITS
            if cap.max_session_tokens and session.expected_tokens > cap.max_session_tokens:
                choice.too_short.append((candidate, cap.max_session_tokens))
            elif ((cap.max_sessions and sessions >= cap.max_sessions)
                    or (cap.kv_tokens and tokens + session.expected_tokens > cap.kv_tokens)):
                choice.full.append(candidate)
            elif (info.layers.start, info.layers.end) in over:
                choice.over.append(candidate)
            else:
                choice.nodes[node_id] = info
                choice.usable.append(candidate)
        self._idle_candidates = idle
        return choice

    def _no_route(self, route: RouteSession, session: SessionRecord, n_layer: int,
                  combinations: list[frozenset[str]], choice: _Choice, over: dict[Range, Share],
                  err: routing.NoRouteError, now: float) -> tt.RouteReply:
        """Lock held: why `session` has no route. When nodes at capacity (or at the opener's
        share) would make one, the opener now waits for their ranges (fair_share.py)."""
        gaps = tuple(tt.LayerRange(s, e) for s, e in err.uncovered)
        blocked = choice.full + choice.over
        longest = longest_route(choice.usable + blocked, choice.too_short, n_layer, combinations)
        if longest is not None and longest < session.expected_tokens:
            status = _error(StatusCode.INVALID_ARGUMENT, f"expected_tokens {session.expected_tokens} (prompt + new "
                            f"tokens) exceeds what any route can hold for one session: at most {longest} tokens")
            return tt.RouteReply(status, route, (), gaps)
        if not blocked or not routable(choice.usable + blocked, n_layer, combinations):
            return tt.RouteReply(_error(StatusCode.UNAVAILABLE, str(err), True), route, (), gaps)
        free = {(c.start, c.end) for c in choice.usable}
        self._contention.refused(session.model, {(c.start, c.end) for c in blocked} - free, session.client_key, now)
        if choice.over and routable(choice.usable + choice.over, n_layer, combinations):
            shares = "; ".join(f"layers {routing.describe_layers([at])}: {held} of {sessions} sessions, its share "
                               f"{share}" for at, (held, share, sessions) in sorted(over.items())
                               if at in {(c.start, c.end) for c in choice.over})
            status = _error(StatusCode.RESOURCE_EXHAUSTED, f"principal {keys.principal(session.client_key)} holds "
                            f"its fair share of sessions other principals wait for ({shares}); retry when one of its "
                            "routes ends", True)
        else:
            status = _error(StatusCode.RESOURCE_EXHAUSTED, f"the nodes serving layers "
                            f"{routing.describe_layers(err.uncovered)} are all at capacity", True)
        return tt.RouteReply(status, route, (), gaps)


@dataclasses.dataclass
class _Choice:
    """The candidates of one route choice, by whether they may take the session."""

    nodes: dict[NodeId, tt.NodeInfo] = dataclasses.field(default_factory=dict)  # the usable ones, by id
    usable: list[routing.Candidate] = dataclasses.field(default_factory=list)
    full: list[routing.Candidate] = dataclasses.field(default_factory=list)  # at their session or KV capacity
    over: list[routing.Candidate] = dataclasses.field(default_factory=list)  # where the opener holds its share
    too_short: list[tuple[routing.Candidate, int]] = dataclasses.field(default_factory=list)  # (node, its limit)


_NO_CAPACITY_LIMITS = tt.Capacity()


def _stale(reported: RouteSession, session: SessionRecord) -> tt.RouteReply:
    """STALE_EPOCH for a report at an epoch the session has left, with its current epoch and hops."""
    return tt.RouteReply(_error(StatusCode.STALE_EPOCH, f"epoch {reported.epoch} is fenced; the session is at "
                                                        f"epoch {session.epoch}"),
                         RouteSession(reported.session_id, session.epoch), session.hops)


def _not_self(node_id: NodeId, caller: bytes) -> Optional[Status]:
    """PERMISSION_DENIED unless `node_id` is the id of the caller's key."""
    if node_id != keys.node_id(caller):
        return _error(StatusCode.PERMISSION_DENIED, f"a node acts only for itself; the caller is {keys.node_id(caller)}, "
                                                    f"not {node_id!r}")
    return None
