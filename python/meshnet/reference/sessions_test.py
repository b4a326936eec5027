"""SessionTable and ResultsTable on fake clocks: admission by ticket, fences, stream binding,
bounds, idle sessions and result queues (no gRPC, no model)."""

from __future__ import annotations

import pytest

from meshnet.identity import tickets
from meshnet.identity.keys import Identity
from meshnet.reference.sessions import Options, Refusal, ResultsTable, SessionTable, check_downstream, next_hop
from meshnet.wire import seam as t
from meshnet.wire.status import StatusCode

TRACKER = Identity.generate()
NODE, LAYERS = "n-self", (0, 2)
T0 = 1_000_000  # fake wall clock, ms


class Clocks:
    def __init__(self) -> None:
        self.mono, self.wall = 0.0, T0


def ticket(sid="s", epoch=1, *, node=NODE, expires=T0 + 60_000, signer=TRACKER, downstream=("", ""),
           cert="") -> t.RouteTicket:
    body = t.TicketBody(sid, epoch, node, t.ShardRange(*LAYERS, LAYERS[0]), downstream[0], downstream[1],
                        downstream_tls_certificate=cert, expires_unix_ms=expires)
    return tickets.issue(signer, body)


def table(clocks: Clocks, **options) -> SessionTable:
    return SessionTable(Options(TRACKER.public_key, NODE, LAYERS, **options), lambda: clocks.mono, lambda: clocks.wall)


def route(sid="s", epoch=1) -> t.RouteSession:
    return t.RouteSession(sid, epoch)


A, B, C = object(), object(), object()  # three streams


def test_a_session_needs_a_valid_ticket_and_then_its_stream():
    sessions = table(Clocks())
    assert sessions.admit(route(), None, A, True).status.code == StatusCode.UNAUTHENTICATED
    assert sessions.admit(route(), ticket(signer=Identity.generate()), A, True).status.code == StatusCode.UNAUTHENTICATED
    assert sessions.admit(route(), ticket(epoch=2), A, True).status.code == StatusCode.PERMISSION_DENIED
    assert sessions.admit(route(), ticket(node="n-other"), A, True).status.code == StatusCode.PERMISSION_DENIED
    assert sessions.admit(route(), ticket(expires=T0 - 1), A, True).status.code == StatusCode.PERMISSION_DENIED
    assert sessions.count() == 0 and sessions.fence_count() == 0  # refusals create nothing
    admitted = sessions.admit(route(), ticket(), A, True, make_state=lambda: "live")
    assert admitted.status.ok and admitted.created and admitted.verified and admitted.session.state == "live"
    again = sessions.admit(route(), None, A, True)  # bound: no ticket needed
    assert again.status.ok and again.session is admitted.session and not again.created and not again.verified
    for opens in (True, False):  # another stream, even with a valid ticket, cannot act on it
        assert sessions.admit(route(), ticket(), B, opens).status.code == StatusCode.PERMISSION_DENIED
        assert sessions.admit(route(), None, B, opens).status.code == StatusCode.UNAUTHENTICATED
    assert sessions.count() == 1


def test_release_of_an_unknown_session_creates_no_session_but_raises_the_fence():
    sessions = table(Clocks())
    old = sessions.admit(route(epoch=1), ticket(epoch=1), A, True).session
    released = sessions.admit(route(epoch=2), ticket(epoch=2), B, opens=False)
    assert released.status.ok and released.session is None and released.fenced == (old,)
    assert sessions.count() == 0 and sessions.fence_count() == 1
    assert sessions.admit(route(epoch=1), ticket(epoch=1), C, True).status.code == StatusCode.STALE_EPOCH


def test_a_newer_epoch_proven_by_its_ticket_fences_older_ones():
    sessions = table(Clocks())
    old = sessions.admit(route(epoch=1), ticket(epoch=1), A, True).session
    forged = sessions.admit(route(epoch=2**64 - 1), ticket(epoch=2**64 - 1, signer=Identity.generate()), B, True)
    assert forged.status.code == StatusCode.UNAUTHENTICATED and sessions.admit(route(), None, A, True).status.ok
    newer = sessions.admit(route(epoch=2), ticket(epoch=2), B, True)
    assert newer.status.ok and newer.fenced == (old,)
    assert sessions.admit(route(epoch=1), None, A, True).status.code == StatusCode.STALE_EPOCH  # its own stream
    assert sessions.admit(route(epoch=1), ticket(epoch=1), B, True).status.code == StatusCode.STALE_EPOCH
    assert sessions.count() == 1 and sessions.fence_count() == 1
    assert sessions.drop_stream(A) == []  # the fenced session was already gone; its tombstone goes
    assert sessions.admit(route(epoch=1), None, A, True).status.code == StatusCode.UNAUTHENTICATED


def test_pending_sessions_count_against_the_limit():
    sessions = table(Clocks(), max_sessions=2)
    assert sessions.admit(route("a"), ticket("a"), A, True).status.ok
    assert sessions.admit(route("b"), ticket("b"), A, True).status.ok
    full = sessions.admit(route("c"), ticket("c"), A, True)
    assert full.status.code == StatusCode.RESOURCE_EXHAUSTED and full.status.retryable
    assert sessions.fence_count() == 2  # the refused session left no fence
    failover = sessions.admit(route("a", 2), ticket("a", 2), B, True)  # fencing "a"@1 frees its slot
    assert failover.status.ok and [s.key for s in failover.fenced] == [("a", 1)]


def test_fences_are_bounded_and_dropped_once_their_tickets_expired():
    clocks = Clocks()
    sessions = table(clocks, max_fences=2)
    for sid in ("a", "b"):
        assert sessions.admit(route(sid), ticket(sid), A, True).status.ok
    assert sessions.admit(route("c"), ticket("c"), A, True).status.code == StatusCode.RESOURCE_EXHAUSTED
    sessions.remove(("a", 1))
    clocks.wall = T0 + 60_001  # every ticket has expired
    sessions.prune()
    assert sessions.fence_count() == 1  # "b" is live: its fence stays
    assert sessions.admit(route("c"), ticket("c", expires=T0 + 120_000), A, True).status.ok
    assert sessions.fence_count() == 2


def test_the_downstream_is_the_ticket_s():
    """Seam minor 1 (ADR 0021): the hop dials what its ticket names; the list carries tickets."""
    next_ticket = t.RouteTicket(b"body", b"signature")
    entry = t.DownstreamHop("", "", None, next_ticket)
    body = tickets.open_ticket(ticket(downstream=("n-next", "10.0.0.2:7000"), cert="PEM"), TRACKER.public_key)
    last = tickets.open_ticket(ticket(), TRACKER.public_key)
    assert check_downstream(body, (entry,), last_hop=False, insecure=False).ok
    assert next_hop(body, (entry,)) == t.DownstreamHop("n-next", "10.0.0.2:7000", None, next_ticket)
    stray = t.DownstreamHop("n-other", "10.0.0.9:7000", t.ShardRange(2, 4, 2), next_ticket)  # as 1.0 wrote it
    assert check_downstream(body, (stray,), False, False).ok
    assert next_hop(body, (stray,)) == t.DownstreamHop("n-next", "10.0.0.2:7000", None, next_ticket)  # ignored
    unticketed = t.DownstreamHop("n-next", "10.0.0.2:7000", None)
    assert check_downstream(body, (unticketed,), False, False).code == StatusCode.INVALID_ARGUMENT
    assert check_downstream(last, (entry,), True, False).code == StatusCode.PERMISSION_DENIED  # last hop: none
    assert check_downstream(last, (), False, True).code == StatusCode.PERMISSION_DENIED  # middle hop, no downstream
    plain = tickets.open_ticket(ticket(downstream=("n-next", "10.0.0.2:7000")), TRACKER.public_key)
    assert check_downstream(plain, (entry,), False, False).code == StatusCode.PERMISSION_DENIED
    assert check_downstream(plain, (entry,), False, True).ok
    middle = table(Clocks(), last_hop=False)
    refused = middle.admit(route(), ticket(downstream=("n-next", "10.0.0.2:7000"), cert="PEM"), A, True, (unticketed,))
    assert refused.status.code == StatusCode.INVALID_ARGUMENT and middle.count() == 0 and middle.fence_count() == 0


def test_steps_replay_work_and_idle():
    clocks = Clocks()
    sessions = table(clocks, idle_seconds=5)
    session = sessions.admit(route(), ticket(), A, True).session
    assert sessions.replay(session, 1) == (None, sessions.replay(session, 1)[1])
    reply = t.SeamReply(None, route(), 1, 8)
    sessions.record_step(session, 1, reply, t.Phase.PREFILL, 3)
    replayed, status = sessions.replay(session, 1)
    assert replayed.replayed and status.ok
    sessions.record_step(session, 2, reply, t.Phase.DECODE, 1)
    assert sessions.replay(session, 1)[1].code == StatusCode.INVALID_ARGUMENT
    assert sessions.take_work() == {("s", 1): (3, 1)} and sessions.take_work() == {}
    clocks.mono = 6
    assert sessions.idle() == [("s", 1)]
    sessions.admit(route(), None, A, True)  # a frame marks it active
    assert sessions.idle() == []
    assert [s.key for s in sessions.drop_stream(A)] == [("s", 1)] and sessions.count() == 0


def test_results_have_one_reader_a_bound_and_a_grace():
    clocks = Clocks()
    results = ResultsTable(2, grace_seconds=10, clock=lambda: clocks.mono)
    items, refusal = results.attach(("a", 1))
    assert refusal is None and results.attach(("a", 1)) == (None, Refusal.HAS_READER)
    assert results.push(("a", 1), ("tok",)) and items.get_nowait() == "tok"
    assert results.push(("b", 1), ("tok", "end"), close=True)  # unread, closed
    assert results.attach(("c", 1)) == (None, Refusal.FULL)
    assert results.push(("c", 1), ("tok",))  # a live session's push evicts the oldest closed, unread queue
    assert len(results) == 2 and results.readers() == 1
    clocks.mono = 5
    results.push(("c", 1), ("end",), close=True)
    clocks.mono = 14
    results.reap()
    assert len(results) == 2  # within the grace
    clocks.mono = 21
    results.reap()
    assert len(results) == 1  # ("c", 1) dropped; the read queue stays until its reader leaves
    results.detach(("a", 1), items)
    assert len(results) == 0 and results.readers() == 0


@pytest.mark.parametrize("opens", [True, False])
def test_a_frame_bound_elsewhere_changes_nothing(opens):
    sessions = table(Clocks())
    session = sessions.admit(route(), ticket(), A, True).session
    sessions.admit(route(), ticket(), B, opens)
    assert sessions.admit(route(), None, A, True).session is session and session.stream is A
