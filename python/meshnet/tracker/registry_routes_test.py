"""Registry, route sessions: routes, epochs, bans, capacity, route leases and quotas, the prefill
grace and fair shares (issue 55, finding 12), and who may do what (a route's client alone
reports and closes). Nodes are in registry_test.py."""

from __future__ import annotations

import dataclasses

from meshnet.tracker.registry import Registry
from meshnet.tracker.registry_fixtures import (CLIENT, MODEL, OTHER_CLIENT, fail, key, nid, open_route, register,
                                               route_names)
from meshnet.tracker.registry_fixtures import clock, registry  # noqa: F401 (pytest fixtures)
from meshnet.wire import tracker as tt
from meshnet.wire.seam import RouteSession
from meshnet.wire.status import StatusCode


def test_a_relayed_node_is_routed_only_where_no_direct_one_is_cheaper(registry):
    register(registry, "relayed", 0, 30, relay="10.0.0.1:7700", relay_rtt_ms=0.5, address="10.0.0.1:41000")
    register(registry, "direct", 0, 30)
    # equal compute and load: the relay's round trip decides
    assert route_names(open_route(registry)) == [("direct", 0, 30)]
    assert registry.drain(nid("direct"), key("direct").public_key).ok
    route = open_route(registry)
    assert route_names(route) == [("relayed", 0, 30)]
    assert route.hops[0].node.address == "10.0.0.1:41000" and route.hops[0].node.relay == "10.0.0.1:7700"


def test_failure_fences_the_epoch_and_bans_the_node(registry, clock):
    register(registry, "a", 0, 30)
    register(registry, "b", 0, 30, capacity=tt.Capacity(4, 4096, 1))
    first = open_route(registry)
    failed = first.hops[0].node.node_id
    again = fail(registry, first.session, failed)
    assert again.status.ok and again.session.epoch == 2 and failed not in [h.node.node_id for h in again.hops]
    stale = fail(registry, first.session, failed)
    assert stale.status.code == StatusCode.STALE_EPOCH and stale.session.epoch == 2
    assert registry.close_route(first.session, CLIENT.public_key).code == StatusCode.STALE_EPOCH
    # The ban keeps the failed node out of other sessions' routes until it runs out, and out of
    # Coverage's routable counts (issue 35, finding 16: a banned node was counted routable).
    other = open_route(registry)
    assert failed not in [h.node.node_id for h in other.hops]
    cover = registry.coverage("smol")
    assert cover.routable_count == 1 and all(failed not in layer.node_ids for layer in cover.layers)
    clock.now += 6
    registry.heartbeat(nid("a"), None, key("a").public_key)
    registry.heartbeat(nid("b"), None, key("b").public_key)
    assert registry.close_route(again.session, CLIENT.public_key).ok
    assert registry.close_route(other.session, CLIENT.public_key).ok


def test_only_the_routes_client_reports_on_it_and_only_about_its_hops(registry):
    register(registry, "a", 0, 30)
    register(registry, "b", 0, 30)
    route = open_route(registry)
    hop = route.hops[0].node.node_id
    bystander = nid("b") if hop == nid("a") else nid("a")
    foreign = fail(registry, route.session, hop, client=OTHER_CLIENT)
    assert foreign.status.code == StatusCode.PERMISSION_DENIED
    off_route = fail(registry, route.session, bystander)
    assert off_route.status.code == StatusCode.INVALID_ARGUMENT and "not a hop" in off_route.status.message
    assert registry.close_route(route.session, OTHER_CLIENT.public_key).code == StatusCode.PERMISSION_DENIED
    # Neither report banned anyone: each node still serves a new route that avoids the other.
    for serving, avoided in ((hop, bystander), (bystander, hop)):
        reply = open_route(registry, tt.OpenRouteRequest("smol", avoid_node_ids=(avoided,)))
        assert [h.node.node_id for h in reply.hops] == [serving]
    assert registry.close_route(route.session, CLIENT.public_key).ok


def test_failure_with_no_alternative_reports_the_gap(registry):
    register(registry, "a", 0, 10)
    register(registry, "b", 10, 30)
    first = open_route(registry)
    reply = fail(registry, first.session, nid("b"))
    assert reply.status.code == StatusCode.UNAVAILABLE and reply.status.retryable
    assert reply.uncovered == (tt.LayerRange(10, 30),) and reply.session.epoch == 2


def test_capacity_limits_routes(registry):
    register(registry, "a", 0, 30, capacity=tt.Capacity(2, 1000, 1))
    request = tt.OpenRouteRequest("smol", expected_tokens=100)
    ok = [open_route(registry, request) for _ in range(2)]
    assert all(r.status.ok for r in ok)
    full = open_route(registry, request)
    assert full.status.code == StatusCode.RESOURCE_EXHAUSTED and "at capacity" in full.status.message
    registry.close_route(ok[0].session, CLIENT.public_key)
    assert open_route(registry, request).status.ok
    too_big = open_route(registry, tt.OpenRouteRequest("smol", expected_tokens=5000))
    assert too_big.status.code == StatusCode.RESOURCE_EXHAUSTED


def test_bad_route_requests(registry):
    assert open_route(registry, tt.OpenRouteRequest("mystery")).status.code == StatusCode.NOT_FOUND
    assert open_route(registry, tt.OpenRouteRequest("smol", expected_tokens=1 << 30)).status.code == \
        StatusCode.INVALID_ARGUMENT
    assert registry.coverage("mystery").status.code == StatusCode.NOT_FOUND
    unknown = RouteSession("rs-nope", 1)
    assert fail(registry, unknown, nid("a")).status.code == StatusCode.NOT_FOUND
    assert registry.close_route(None, CLIENT.public_key).code == StatusCode.INVALID_ARGUMENT


def test_an_abandoned_route_expires_and_its_capacity_returns(clock):
    registry = Registry([MODEL], lease_seconds=1000, route_lease_seconds=30, clock=clock)
    register(registry, "a", 0, 30, capacity=tt.Capacity(1, 4096, 1))
    abandoned = open_route(registry)
    assert abandoned.status.ok and abandoned.lease_ms == 30_000
    assert open_route(registry).status.code == StatusCode.RESOURCE_EXHAUSTED
    clock.now += 31  # the client never renewed nor closed it
    assert fail(registry, abandoned.session, nid("a")).status.code == StatusCode.NOT_FOUND
    kept = open_route(registry)
    assert kept.status.ok
    for _ in range(3):  # renewals keep a route alive past its first lease
        clock.now += 20
        renewed = registry.renew_route(kept.session, CLIENT.public_key)
        assert renewed.status.ok and renewed.lease_ms == 30_000
    assert registry.renew_route(kept.session, OTHER_CLIENT.public_key).status.code == StatusCode.PERMISSION_DENIED
    assert open_route(registry).status.code == StatusCode.RESOURCE_EXHAUSTED
    assert registry.renew_route(abandoned.session, CLIENT.public_key).status.code == StatusCode.NOT_FOUND
    assert registry.close_route(kept.session, CLIENT.public_key).ok


def test_expected_tokens_beyond_every_routes_session_limit_is_refused_up_front(registry):
    register(registry, "a", 0, 10, capacity=tt.Capacity(4, 1 << 20, 1, 2048))
    register(registry, "b", 10, 30, capacity=tt.Capacity(4, 1 << 20, 1, 8192))
    too_long = open_route(registry, tt.OpenRouteRequest("smol", expected_tokens=4096))
    assert too_long.status.code == StatusCode.INVALID_ARGUMENT and not too_long.status.retryable
    assert "at most 2048 tokens" in too_long.status.message and too_long.hops == ()
    register(registry, "a-long", 0, 10, capacity=tt.Capacity(4, 1 << 20, 1, 4096))
    assert route_names(open_route(registry, tt.OpenRouteRequest("smol", expected_tokens=4096))) == \
        [("a-long", 0, 10), ("b", 10, 30)]
    assert open_route(registry, tt.OpenRouteRequest("smol", expected_tokens=2048)).status.ok


def test_overlapping_gguf_ranges_meet_only_at_exact_boundaries(registry):
    register(registry, "a", 0, 12)
    register(registry, "b", 10, 30)
    reply = open_route(registry)
    assert reply.status.code == StatusCode.UNAVAILABLE and "past layer 12" in reply.status.message
    register(registry, "r", 10, 30, backend=tt.BackendKind.REFERENCE)
    assert route_names(open_route(registry)) == [("a", 0, 12), ("r", 12, 30)]


def test_a_route_keeps_its_client_id_across_epochs(registry):
    register(registry, "a", 0, 30)
    register(registry, "b", 0, 30)
    first = open_route(registry, tt.OpenRouteRequest("smol", client_id="key:alice"))
    assert registry.client_id(first.session) == "key:alice"
    second = fail(registry, first.session, first.hops[0].node.node_id)
    assert second.status.ok and second.session.epoch == 2
    assert registry.client_id(second.session) == "key:alice"
    assert registry.client_id(RouteSession("rs-unknown", 1)) == ""
    too_long = open_route(registry, tt.OpenRouteRequest("smol", client_id="k" * 129))
    assert too_long.status.code == StatusCode.INVALID_ARGUMENT


def test_a_route_just_closed_is_not_load_but_a_newer_heartbeat_is(registry, clock):
    """A node's heartbeat during a route counts that route's session; once this tracker closed
    the route, that heartbeat is stale and does not make the node look busier than a relayed
    replica (which pays its relay round trip): the next route stays on the direct node. A
    heartbeat after the close is believed again."""
    register(registry, "direct", 0, 30)
    register(registry, "relayed", 0, 30, relay="127.0.0.1:9999", relay_rtt_ms=0.8)
    measured = tt.Load(decode_tokens_per_second=10.0)  # 3.3 ms a layer: a session's share of it outweighs 0.8 ms
    for name in ("direct", "relayed"):
        assert registry.heartbeat(nid(name), measured, key(name).public_key).status.ok
    first = open_route(registry)
    assert route_names(first) == [("direct", 0, 30)]
    clock.now += 0.5
    busy = dataclasses.replace(measured, active_sessions=1)
    assert registry.heartbeat(nid("direct"), busy, key("direct").public_key).status.ok  # during the route
    clock.now += 0.1
    assert registry.close_route(first.session, CLIENT.public_key).ok
    again = open_route(registry)
    assert route_names(again) == [("direct", 0, 30)]  # the stale heartbeat's session is gone
    assert registry.close_route(again.session, CLIENT.public_key).ok
    clock.now += 0.5
    assert registry.heartbeat(nid("direct"), busy, key("direct").public_key).status.ok  # a session the tracker did not open
    assert route_names(open_route(registry)) == [("relayed", 0, 30)]


def test_a_principal_holds_at_most_its_route_quota(clock):
    """ADR 0017: one key squatted every node's sessions (issue 35, finding 4); now it holds at
    most its quota of open routes, and another principal beside it is still routed."""
    registry = Registry([MODEL], clock=clock, route_quota=lambda caller: 2 if caller == CLIENT.public_key else 8)
    register(registry, "a", 0, 30)  # four sessions
    held = [open_route(registry) for _ in range(2)]
    assert all(r.status.ok for r in held)
    over = open_route(registry)
    assert over.status.code == StatusCode.RESOURCE_EXHAUSTED and over.status.retryable and not over.hops
    assert "its quota" in over.status.message
    assert open_route(registry, client=OTHER_CLIENT).status.ok  # the node still has room for others
    assert registry.close_route(held[0].session, CLIENT.public_key).ok
    assert open_route(registry).status.ok  # a closed route frees a place in the quota


def test_a_route_that_carries_no_prefill_within_the_grace_gives_its_session_back(clock):
    """Issue 55, finding 12: a route nobody sends a prefill on held its hop's session for a whole
    lease. Now, when the ledger shows no work by a hop at the route's epoch (`worked` stands in
    for it) a grace after the route was opened, the next route choice closes it; a route whose
    hop reported work keeps its session for as long as its lease is renewed."""
    registry = Registry([MODEL], lease_seconds=1000, route_lease_seconds=60, prefill_grace_seconds=5, clock=clock)
    register(registry, "a", 0, 30, capacity=tt.Capacity(1, 4096, 1))  # one session
    worked: set[RouteSession] = set()

    def open_on(client):
        return registry.open_route(tt.OpenRouteRequest("smol"), client.public_key, lambda r: r in worked)

    idle = open_on(CLIENT)
    assert idle.status.ok and idle.lease_ms == 60_000
    clock.now += 4.9  # within the grace: the session is still held
    assert open_on(OTHER_CLIENT).status.code == StatusCode.RESOURCE_EXHAUSTED and registry.reclaimed_routes == 0
    clock.now += 0.1
    honest = open_on(OTHER_CLIENT)  # the grace is over: the idle route is closed first, and its session is free
    assert honest.status.ok and route_names(honest) == [("a", 0, 30)] and registry.reclaimed_routes == 1
    assert registry.renew_route(idle.session, CLIENT.public_key).status.code == StatusCode.NOT_FOUND
    assert registry.close_route(idle.session, CLIENT.public_key).code == StatusCode.NOT_FOUND

    worked.add(honest.session)  # its hop reported the prefill
    for _ in range(3):  # many graces later, the route that carries traffic still holds its session
        clock.now += 20
        assert registry.renew_route(honest.session, OTHER_CLIENT.public_key).status.ok
        full = open_on(CLIENT)
        assert full.status.code == StatusCode.RESOURCE_EXHAUSTED and "at capacity" in full.status.message
    assert registry.reclaimed_routes == 1
    assert registry.close_route(honest.session, OTHER_CLIENT.public_key).ok
    assert open_on(CLIENT).status.ok


def test_a_failover_epoch_shows_its_own_prefill(clock):
    """A failure report on a route whose hop never finished its prefill is acted on, not
    answered NOT_FOUND for the route it names (the probe and the ban need it); the new epoch's
    hops must then see the replayed prefill within a grace of the failover, and work at epoch 1
    does not vouch for epoch 2."""
    registry = Registry([MODEL], lease_seconds=1000, ban_seconds=100, prefill_grace_seconds=5, clock=clock)
    register(registry, "a", 0, 30, capacity=tt.Capacity(1, 4096, 1))
    register(registry, "b", 0, 30, capacity=tt.Capacity(1, 4096, 1))
    worked: set[RouteSession] = set()

    def carried(route):
        return route in worked
    first = registry.open_route(tt.OpenRouteRequest("smol"), CLIENT.public_key, carried)
    clock.now += 6  # past the grace: its first hop never reported the prefill, and the client reports it
    moved = registry.report_failure_with_record(tt.ReportFailureRequest(first.session, first.hops[0].node.node_id),
                                                CLIENT.public_key, carried)[0]
    assert moved.status.ok and moved.session.epoch == 2 and registry.reclaimed_routes == 0
    worked.add(first.session)  # epoch 1's work, reported late
    clock.now += 4.9
    assert registry.open_route(tt.OpenRouteRequest("smol"), OTHER_CLIENT.public_key, carried).status.code == \
        StatusCode.RESOURCE_EXHAUSTED  # the failed hop is banned, the other holds epoch 2
    clock.now += 0.1
    assert registry.open_route(tt.OpenRouteRequest("smol"), OTHER_CLIENT.public_key, carried).status.ok
    assert registry.reclaimed_routes == 1
    assert registry.renew_route(moved.session, CLIENT.public_key).status.code == StatusCode.NOT_FOUND


def test_a_squatter_reopening_as_its_routes_lapse_cannot_keep_an_honest_principal_out(clock):
    """Issue 55, finding 12: a key that re-opened routes as fast as they lapsed held every
    session of a node; the gateway answered 429 at once and still after 75 s. Now, while the
    honest principal waits, the squatter's new routes stop at its fair share of the range
    (ceil(4 sessions / 2 principals) = 2; the places of its routes closed for carrying no
    prefill count one more grace), refused RESOURCE_EXHAUSTED and retryable as over its quota,
    and the honest principal is served within a grace, round after round, up to its own share."""
    registry = Registry([MODEL], lease_seconds=1000, route_lease_seconds=60, prefill_grace_seconds=5, clock=clock)
    register(registry, "a", 0, 30)  # four sessions
    worked: set[RouteSession] = set()  # the squatter never sends a prefill; the honest client always does

    def open_on(client):
        return registry.open_route(tt.OpenRouteRequest("smol"), client.public_key, lambda r: r in worked)

    def squat() -> tuple[int, tt.RouteReply]:  # opens until refused
        for opened in range(8):
            reply = open_on(CLIENT)
            if not reply.status.ok:
                return opened, reply
        raise AssertionError("the squatter was never refused")

    held, refused = squat()
    assert held == 4 and "at capacity" in refused.status.message  # nobody waited: it may take every session
    honest: list[tt.RouteReply] = []
    for _ in range(2):
        waiting = open_on(OTHER_CLIENT)
        assert waiting.status.code == StatusCode.RESOURCE_EXHAUSTED and "at capacity" in waiting.status.message
        clock.now += 5  # the squatter's routes lapse for carrying no prefill; it opens again at once
        held, refused = squat()
        assert held == 0, "its closed routes' places still count: at its share while the honest principal waits"
        status = refused.status
        assert status.code == StatusCode.RESOURCE_EXHAUSTED and status.retryable and refused.hops == ()
        assert f"fair share of sessions other principals wait for (layers 0..29: {4 - len(honest)} of 4 sessions, " \
            "its share 2)" in status.message
        served = open_on(OTHER_CLIENT)
        assert served.status.ok and route_names(served) == [("a", 0, 30)]
        worked.add(served.session)
        honest.append(served)
        clock.now += 5  # the closed routes' places are forgotten; nobody waits: the squatter fills the rest
        held, refused = squat()
        assert held == 4 - len(honest) and "at capacity" in refused.status.message
    assert registry.reclaimed_routes == 4 + 3
    for served in honest:  # the honest routes were never closed: each principal holds its share, 2
        assert registry.renew_route(served.session, OTHER_CLIENT.public_key).status.ok
