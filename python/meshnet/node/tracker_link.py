"""The node's standing with the tracker, kept through tracker outages.

Called once per heartbeat tick from the node's main thread. While the tracker answers, `tick`
heartbeats with load telemetry, registers again when the tracker no longer knows the node (its
lease lapsed, or the tracker restarted: the tracker rebuilds its view of nodes from these
re-registrations), and moves the backend's work counters to the ledger. When the tracker cannot
be reached, `tick` backs off exponentially (1 s up to `max_backoff`), never raises, and never
blocks the caller, so the node keeps serving the sessions it has and keeps supervising its
worker. Work taken from the backend stays pending, and is sent again with the same report id
until the tracker acknowledges it, so an outage neither loses nor double-counts work.
"""

from __future__ import annotations

import secrets
import time
from typing import Callable, Optional

import grpc

from meshnet.process import log
from meshnet.protocol.tracker_client import TrackerClient
from meshnet.wire import tracker as tt
from meshnet.wire.seam import ProtocolVersion
from meshnet.wire.status import StatusCode


class NodeRefused(Exception):
    """The tracker refused the node's registration (a reason an outage cannot explain)."""

    def __init__(self, reply: tt.RegisterReply) -> None:
        super().__init__(f"{reply.status.code.name}: {reply.reason or reply.status.message}")
        self.reply = reply


class TrackerLink:
    def __init__(self, tracker: TrackerClient, node_info: Callable[[], tt.NodeInfo], *,
                 max_backoff: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._tracker = tracker
        self._node_info = node_info
        self._max_backoff = max_backoff
        self._clock = clock
        self._backoff = 0.0
        self._retry_at = 0.0
        self._down_since: Optional[float] = None
        self._pending: Optional[tt.WorkReport] = None
        self.registered = False

    @property
    def reachable(self) -> bool:
        return self._down_since is None

    def register(self) -> tt.RegisterReply:
        """Registers now (raises grpc.RpcError if unreachable, NodeRefused if refused)."""
        reply = self._tracker.register(tt.RegisterRequest(ProtocolVersion(1, 0), self._node_info()))
        info = self._node_info()
        log("registered", node=info.node_id, address=info.address, layers=[info.layers.start, info.layers.end],
            admission=reply.admission.name, status=reply.status.code.name, reason=reply.reason)
        if not reply.status.ok or reply.admission == tt.Admission.REFUSED:
            raise NodeRefused(reply)
        self.registered = True
        return reply

    def tick(self, load: tt.Load, take_work: Callable[[], tuple[tt.WorkEntry, ...]]) -> None:
        """One heartbeat with `load` (and a work report), or nothing while backing off. Raises
        NodeRefused. `take_work` failing (the worker did not answer) only postpones the report."""
        now = self._clock()
        if now < self._retry_at:
            return
        node_id = self._node_info().node_id
        try:
            if not self.registered:
                self.register()
            beat = self._tracker.heartbeat(node_id, load)
            if beat.status.code == StatusCode.NOT_FOUND:  # lease lapsed or tracker restarted
                self.registered = False
                self.register()
            self._report_work(node_id, take_work)
        except grpc.RpcError as err:
            self._backoff = min(self._max_backoff, max(1.0, self._backoff * 2))
            self._retry_at = now + self._backoff
            if self._down_since is None:
                self._down_since = now
            log("tracker_unreachable", node=node_id, error=err.code().name, retry_in_s=self._backoff,
                down_for_s=round(now - self._down_since, 1), work_pending=self._pending is not None)
            return
        if self._down_since is not None:
            log("tracker_back", node=node_id, outage_s=round(now - self._down_since, 1))
        self._down_since, self._backoff = None, 0.0

    def _report_work(self, node_id: str, take_work: Callable[[], tuple[tt.WorkEntry, ...]]) -> None:
        if self._pending is None:
            try:
                entries = take_work()
            except grpc.RpcError as err:  # the backend, not the tracker: try again next tick
                log("work_unavailable", node=node_id, error=err.code().name)
                return
            if not entries:
                return
            self._pending = tt.WorkReport(node_id, entries, secrets.randbits(62) + 1)
        reply = self._tracker.report_work(self._pending)  # an RpcError keeps it pending (same id)
        report, self._pending = self._pending, None
        if not reply.status.ok:
            log("work_report_refused", node=node_id, entries=len(report.entries), status=reply.status.code.name,
                message=reply.status.message)

    def flush(self, take_work: Callable[[], tuple[tt.WorkEntry, ...]]) -> None:
        """Final work report at shutdown (best effort: an unreachable tracker is logged)."""
        try:
            self._report_work(self._node_info().node_id, take_work)
        except grpc.RpcError as err:
            log("work_report_lost", node=self._node_info().node_id, error=err.code().name)
