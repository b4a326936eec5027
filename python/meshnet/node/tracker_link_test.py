"""TrackerLink: heartbeats, re-registration, backoff through an outage, work kept until acknowledged."""

from __future__ import annotations

import grpc
import pytest

from meshnet.node.tracker_link import NodeRefused, TrackerLink
from meshnet.wire import tracker as tt
from meshnet.wire.ids import NodeId
from meshnet.wire.seam import RouteSession
from meshnet.wire.status import Status, StatusCode

OK = Status(StatusCode.OK)
INFO = tt.NodeInfo(NodeId("n-test"), "127.0.0.1:1", tt.BackendKind.GGUF, "m", "llama", None, "", tt.LayerRange(0, 1),
                   tt.Capacity(), 1)
ENTRY = tt.WorkEntry(RouteSession("rs-1", 1), 10, 2)


class Unreachable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection refused"


class FakeTracker:
    """A test fake of TrackerClient: records calls, can be 'down', forgets nodes on restart."""

    def __init__(self) -> None:
        self.down = False
        self.known = False
        self.refuse = False
        self.calls: list[str] = []
        self.reports: list[tt.WorkReport] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.down:
            raise Unreachable()

    def register(self, request):
        self._call("register")
        if self.refuse:
            return tt.RegisterReply(Status(StatusCode.FINGERPRINT_MISMATCH, "no"), tt.Admission.REFUSED, "recipe")
        self.known = True
        return tt.RegisterReply(OK, tt.Admission.ROUTABLE, "", 10_000)

    def heartbeat(self, node_id, load):
        self._call("heartbeat")
        return tt.HeartbeatReply(OK if self.known else Status(StatusCode.NOT_FOUND, "register again"), 10_000)

    def report_work(self, report):
        self._call("report_work")
        self.reports.append(report)
        return tt.WorkReply(OK)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup():
    tracker, clock = FakeTracker(), Clock()
    link = TrackerLink(tracker, lambda: INFO, max_backoff=8, clock=clock)
    link.register()
    return tracker, clock, link


def no_work():
    return ()


def test_an_outage_backs_off_keeps_work_and_registers_again_when_the_tracker_returns(setup):
    tracker, clock, link = setup
    work = [(ENTRY,)]
    tracker.down = True
    link.tick(tt.Load(), lambda: work.pop() if work else ())  # no heartbeat gets through: nothing taken yet
    assert not link.reachable and work == [(ENTRY,)]
    tracker.calls.clear()
    for _ in range(5):
        link.tick(tt.Load(), no_work)  # within the 1 s backoff: no call at all
    assert tracker.calls == []
    attempts = []
    for second in range(1, 40):
        clock.now = float(second)
        before = len(tracker.calls)
        link.tick(tt.Load(), no_work)
        if len(tracker.calls) > before:
            attempts.append(second)
    assert attempts == [1, 3, 7, 15, 23, 31, 39]  # 1, 2, 4, 8, then capped at 8 s
    tracker.down, tracker.known = False, False  # the tracker restarted and forgot the node
    clock.now = 47.0
    link.tick(tt.Load(), lambda: work.pop() if work else ())
    assert link.reachable and tracker.calls[-3:] == ["heartbeat", "register", "report_work"]
    assert tracker.reports[-1].entries == (ENTRY,)


def test_a_report_lost_in_an_outage_is_sent_again_with_the_same_id(setup):
    tracker, clock, link = setup
    taken = [(ENTRY,)]

    original = tracker.report_work

    def fails_once(report):
        tracker.report_work = original
        tracker.reports.append(report)
        raise Unreachable()

    tracker.report_work = fails_once
    link.tick(tt.Load(), lambda: taken.pop() if taken else ())
    assert not link.reachable and taken == []  # taken from the backend, not acknowledged
    clock.now = 2.0
    link.tick(tt.Load(), no_work)
    assert link.reachable and len(tracker.reports) == 2
    assert tracker.reports[0] == tracker.reports[1] and tracker.reports[0].report_id > 0


def test_a_refusal_on_re_registration_is_raised(setup):
    tracker, clock, link = setup
    tracker.known, tracker.refuse = False, True
    with pytest.raises(NodeRefused):
        link.tick(tt.Load(), no_work)
