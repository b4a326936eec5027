"""The client's flow control, and the route's shape taken from the tracker and the last hop.

A _Connection is built without its gRPC streams (a test fake of the first hop's Seam stream
takes the frames sent and feeds `_read_seam`), so only the credit accounting is under test.
`_run` is driven over a test fake connection (frames sent are kept, result frames are queued as
the last hop's Results would deliver them): the downstream list is the other hops' tickets, the
ring is the route reply's, and the end is the finish reason the last hop reports (issue 34)."""

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


def fake_connection(rings: bool):
    """Test fake of a _Connection over three hops: keeps what `_run` sends, feeds it `events`."""
    hops = tuple(SimpleNamespace(node=SimpleNamespace(node_id=f"n-{i}"),
                                 ticket=t.RouteTicket(f"body-{i}".encode(), b"signature")) for i in range(3))
    sent: list = []
    conn = SimpleNamespace(route=ROUTE, hops=hops, rings=rings, events=queue.Queue(),
                           send=lambda f, timeout=5.0: sent.append(f))
    return conn, sent


def token(token_id: int, finish: t.FinishReason = t.FinishReason.UNSPECIFIED) -> t.ResultFrame:
    return t.ResultFrame(seam.PROTOCOL_VERSION, ROUTE, 1, (t.SampledToken(token_id, 0, 0.0),), finish,
                         Status(StatusCode.OK))


@pytest.mark.parametrize("rings, asked, ring", [(True, True, True), (False, True, False), (True, False, False)])
def test_the_route_s_shape_is_the_tracker_s_and_the_end_the_last_hop_s(rings, asked, ring):
    conn, sent = fake_connection(rings)
    for event in (token(11), token(2), token(12, t.FinishReason.STOP), token(13)):
        conn.events.put(event)  # 2 is a stop token the last hop did not end at: not the client's call
    client = session.RouteClient(None, "smol")
    params = session.GenerationParams(max_tokens=10, stop_token_ids=(2,), ring=asked)
    assert [s.token_id for s in client._run(conn, [1, 5, 9], params, 10, ())] == [11, 2, 12]
    assert client.finish_reason == t.FinishReason.STOP
    prefill = sent[0]
    later = list(conn.hops[1:]) + ([conn.hops[0]] if ring else [])
    assert [d.ticket for d in prefill.downstream] == [h.ticket for h in later]  # tickets, in route order
    assert all((d.node_id, d.address, d.range) == ("", "", None) for d in prefill.downstream)
    assert prefill.ring is ring and prefill.range is None and prefill.expected_cache is None
    assert prefill.sampling.max_tokens == 10 and prefill.sampling.stop_token_ids == (2,)
    decodes = sent[1:]
    assert [f.token_ids for f in decodes] == ([] if ring else [(11,), (2,)])  # none after the finish
    assert all(f.expected_cache is None and f.work_id == "" for f in decodes)


def test_length_is_the_last_hop_s_and_a_silent_one_is_bounded_by_the_budget():
    conn, _ = fake_connection(True)
    for event in (token(11), token(12, t.FinishReason.LENGTH), token(13)):
        conn.events.put(event)
    client = session.RouteClient(None, "smol")
    assert [s.token_id for s in client._run(conn, [1], session.GenerationParams(max_tokens=5), 5, ())] == [11, 12]
    assert client.finish_reason == t.FinishReason.LENGTH
    for rings in (True, False):  # a 1.0 last hop reports no finish: the budget still bounds the read
        conn, sent = fake_connection(rings)
        for event in (token(11), token(12), token(13)):
            conn.events.put(event)
        client = session.RouteClient(None, "smol")
        assert [s.token_id for s in client._run(conn, [1], session.GenerationParams(max_tokens=2), 2, ())] == [11, 12]
        assert client.finish_reason == t.FinishReason.LENGTH
        assert [f.token_ids for f in sent[1:]] == ([] if rings else [(11,)])  # no step past the budget
