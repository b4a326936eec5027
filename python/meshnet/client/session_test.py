"""The client's flow control: frames in flight stay below the first hop's credits.

A _Connection is built without its gRPC streams (a test fake of the first hop's Seam stream
takes the frames sent and feeds `_read_seam`), so only the credit accounting is under test."""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import pytest

from meshnet.client import session
from meshnet.protocol import seam
from meshnet.wire import seam as t
from meshnet.wire.status import Status, StatusCode

ROUTE = t.RouteSession("rs-credit", 1)
_END = object()


class FakeSeam:
    """The first hop's Seam stream (test fake of shard_client.SeamStream): queues the frames sent
    (bounded as the real one), yields the replies the test puts, ends on _END."""

    def __init__(self) -> None:
        self.frames: queue.Queue = queue.Queue(maxsize=session.MAX_QUEUED_FRAMES)
        self.replies: queue.Queue = queue.Queue()

    def send(self, frame: t.SeamFrame, timeout=None) -> None:
        self.frames.put(frame, timeout=timeout)

    def __iter__(self):
        return iter(self.replies.get, _END)

    def reply(self, credits: int) -> None:
        self.replies.put(t.SeamReply(seam.PROTOCOL_VERSION, ROUTE, 1, credits, None, Status(StatusCode.OK)))


@pytest.fixture
def conn():
    c = session._Connection.__new__(session._Connection)
    c.route, c.events = ROUTE, queue.Queue()
    c.hops = (SimpleNamespace(node=SimpleNamespace(node_id="n-first")),)
    c._credit = threading.Condition()
    c._in_flight, c._credits, c._ended, c.frames_sent = 0, 2, False, 0
    c._seam = FakeSeam()
    reader = threading.Thread(target=c._read_seam, daemon=True)
    reader.start()
    yield c
    c._seam.replies.put(_END)
    reader.join(5)


def frame() -> t.SeamFrame:
    return t.SeamFrame(seam.PROTOCOL_VERSION, ROUTE, t.Phase.DECODE, 2)


def test_a_sender_waits_for_credit_and_a_reply_grants_more(conn):
    conn.send(frame())
    conn.send(frame())
    with pytest.raises(session._HopFailure) as err:  # two in flight, two credits: no third
        conn.send(frame(), timeout=0.2)
    assert err.value.status.code == StatusCode.UNAVAILABLE and err.value.node_id == "n-first"
    conn._seam.reply(credits=3)  # one answered; the hop now grants three
    for _ in range(2):
        conn.send(frame(), timeout=2)
    with pytest.raises(session._HopFailure):
        conn.send(frame(), timeout=0.2)
    assert conn._seam.frames.qsize() == 4


def test_a_stream_that_ends_releases_waiting_senders(conn):
    conn.send(frame())
    conn.send(frame())
    conn._seam.replies.put(_END)
    conn.send(frame(), timeout=2)  # the reader ended: the failure surfaces as an event, not a hang
