"""Route tickets: issued by the tracker's key, refused when forged, foreign or expired."""

import dataclasses

import pytest

from meshnet.identity import tickets
from meshnet.identity.keys import Identity
from meshnet.wire import seam as t
from meshnet.wire.status import StatusCode

TRACKER, CLIENT, NODE = Identity.generate(), Identity.generate(), Identity.generate()
SESSION = t.RouteSession("rs-1", 3)
BODY = t.TicketBody("rs-1", 3, NODE.node_id, t.ShardRange(0, 10, 2), "n-next", "127.0.0.1:9", b"k" * 32,
                    "PEM", CLIENT.public_key, CLIENT.principal, tickets.now_ms() + 3_600_000)


def test_a_ticket_round_trips_and_admits_its_hop():
    ticket = tickets.issue(TRACKER, BODY)
    body = tickets.open_ticket(ticket, TRACKER.public_key)
    assert body == BODY
    tickets.admit(body, SESSION, NODE.node_id, (0, 10))


@pytest.mark.parametrize("mutate,code", [
    (lambda tk: None, StatusCode.UNAUTHENTICATED),
    (lambda tk: dataclasses.replace(tk, signature=bytes(64)), StatusCode.UNAUTHENTICATED),
    (lambda tk: dataclasses.replace(tk, body=tk.body + b"\x00"), StatusCode.UNAUTHENTICATED),
    (lambda tk: tickets.issue(Identity.generate(), BODY), StatusCode.UNAUTHENTICATED),  # another "tracker"
])
def test_forged_tickets_are_unauthenticated(mutate, code):
    with pytest.raises(tickets.TicketError) as err:
        tickets.open_ticket(mutate(tickets.issue(TRACKER, BODY)), TRACKER.public_key)
    assert err.value.status.code == code


@pytest.mark.parametrize("session,node,layers,now", [
    (t.RouteSession("rs-2", 3), NODE.node_id, (0, 10), None),  # another session
    (t.RouteSession("rs-1", 4), NODE.node_id, (0, 10), None),  # another epoch
    (SESSION, "n-someone-else", (0, 10), None),  # another node
    (SESSION, NODE.node_id, (0, 11), None),  # another range
    (SESSION, NODE.node_id, (0, 10), BODY.expires_unix_ms + 1),  # expired
])
def test_valid_tickets_admit_nothing_else(session, node, layers, now):
    with pytest.raises(tickets.TicketError) as err:
        tickets.admit(BODY, session, node, layers, now=now)
    assert err.value.status.code == StatusCode.PERMISSION_DENIED


def test_an_effective_start_outside_the_range_admits_nothing():
    for effective in (10, 11):
        body = dataclasses.replace(BODY, range=t.ShardRange(0, 10, effective))
        with pytest.raises(tickets.TicketError) as err:
            tickets.admit(body, SESSION, NODE.node_id, (0, 10))
        assert err.value.status.code == StatusCode.PERMISSION_DENIED and "effective start" in err.value.status.message


def test_results_are_for_the_routes_client_only():
    ticket = tickets.issue(TRACKER, BODY)
    tickets.check_results_signature(BODY, ticket, tickets.results_signature(CLIENT, ticket))
    for forged in (tickets.results_signature(Identity.generate(), ticket), b"", bytes(64)):
        with pytest.raises(tickets.TicketError) as err:
            tickets.check_results_signature(BODY, ticket, forged)
        assert err.value.status.code == StatusCode.PERMISSION_DENIED
