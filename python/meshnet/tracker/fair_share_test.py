"""The fair-share rule on its own (fair_share.py): shares, who counts, and the memory of who
waits. The registry's use of it is in registry_routes_test.py."""

from __future__ import annotations

from meshnet.tracker.fair_share import MAX_WAITING, Contention, Share, shares

R = (0, 30)
SQUATTER, HONEST, OTHER = b"s" * 32, b"h" * 32, b"o" * 32


def test_nobody_else_waiting_means_no_share():
    assert shares(SQUATTER, {R: 4}, {R: {SQUATTER: 4}}, {}) == {}
    assert shares(SQUATTER, {R: 4}, {R: {SQUATTER: 4}}, {R: frozenset({SQUATTER})}) == {}  # only itself


def test_the_share_is_the_capacity_over_the_principals_rounded_up():
    waiting = {R: frozenset({HONEST})}
    assert shares(SQUATTER, {R: 4}, {R: {SQUATTER: 2}}, waiting) == {R: Share(2, 2, 4)}
    assert shares(SQUATTER, {R: 4}, {R: {SQUATTER: 1}}, waiting) == {}
    assert shares(SQUATTER, {R: 5}, {R: {SQUATTER: 2}}, waiting) == {}  # ceil(5 / 2) = 3
    assert shares(SQUATTER, {R: 1}, {R: {SQUATTER: 1}}, waiting) == {R: Share(1, 1, 1)}
    assert shares(SQUATTER, {R: 1}, {}, waiting) == {}  # at least 1: a principal holding nothing may take one
    # a holder counts whether or not it waits: 6 sessions, 3 principals, 2 each
    assert shares(SQUATTER, {R: 6}, {R: {SQUATTER: 2, OTHER: 1}}, waiting) == {R: Share(2, 2, 6)}


def test_waiting_principals_holding_nothing_count_as_one():
    """Keys minted only to ask cannot shrink every share: 1,000 waiters count as one principal."""
    minted = frozenset(bytes([i % 256, i // 256]) * 16 for i in range(1000))
    assert shares(HONEST, {R: 8}, {R: {HONEST: 3}}, {R: minted}) == {}  # ceil(8 / 2) = 4
    assert shares(HONEST, {R: 8}, {R: {HONEST: 4}}, {R: minted}) == {R: Share(4, 4, 8)}


def test_a_range_without_a_session_limit_has_no_share():
    assert shares(SQUATTER, {R: None}, {R: {SQUATTER: 100}}, {R: frozenset({HONEST})}) == {}


def test_waiting_expires_ends_when_served_and_is_bounded():
    contention = Contention(wait_seconds=60)
    contention.refused("smol", [R], HONEST, now=0)
    contention.refused("other-model", [R], OTHER, now=0)
    assert contention.waiting("smol", now=59) == {R: frozenset({HONEST})}
    assert contention.waiting("smol", now=60) == {}
    contention.refused("smol", [R], HONEST, now=100)
    contention.served("smol", HONEST)
    assert contention.waiting("smol", now=100) == {}
    assert contention.waiting("other-model", now=59) == {R: frozenset({OTHER})}
    for i in range(MAX_WAITING + 10):
        contention.refused("smol", [R], i.to_bytes(32, "big"), now=200 + i / 1000)
    waiting = contention.waiting("smol", now=202)[R]
    assert len(waiting) == MAX_WAITING and (0).to_bytes(32, "big") not in waiting  # the oldest went first


def test_a_reclaimed_routes_places_count_for_one_grace():
    contention = Contention(wait_seconds=60)
    contention.reclaimed("smol", SQUATTER, [R, (30, 40)], until=15)
    assert contention.reclaimed_places("smol", now=14.9) == [(SQUATTER, (R, (30, 40)))]
    assert contention.reclaimed_places("other-model", now=14.9) == []
    assert contention.reclaimed_places("smol", now=15) == []


def test_a_principal_enrolled_with_a_larger_quota_holds_a_larger_share():
    """A gateway carries many users under one key: enrolled at ten times the default quota it
    holds ten elevenths of a range while one other key waits, not half (issue 55)."""
    gateway = b"g" * 32
    weight = {gateway: 10.0}.get

    def weights(key: bytes) -> float:
        return weight(key, 1.0)

    waiting = {R: frozenset({HONEST})}
    assert shares(gateway, {R: 22}, {R: {gateway: 11}}, waiting, weights) == {}  # equal weights: at 11 of 22
    assert shares(gateway, {R: 22}, {R: {gateway: 20}}, waiting, weights) == {R: Share(20, 20, 22)}  # ceil(22x10/11)
    assert shares(HONEST, {R: 22}, {R: {gateway: 20, HONEST: 2}}, {R: frozenset({gateway})}, weights) == {
        R: Share(2, 2, 22)}  # the single key keeps its own share: ceil(22 x 1 / 11)
    # weights below 1 count as 1: a quota under the default never shrinks a share
    assert shares(SQUATTER, {R: 4}, {R: {SQUATTER: 2}}, waiting, lambda key: 0.1) == {R: Share(2, 2, 4)}


def test_the_weight_is_the_enrolled_quota_over_the_default():
    from meshnet.identity.keys import Identity
    from meshnet.tracker.ledger.principals import Enrolment, Principals

    gateway, minted = Identity.generate().public_key, Identity.generate().public_key
    principals = Principals(("gateway",), default_max_routes=64, enrolments=[Enrolment(gateway, "gateway", "gw", 640)])
    assert principals.share_weight(gateway) == 10.0
    assert principals.share_weight(minted) == 1.0
