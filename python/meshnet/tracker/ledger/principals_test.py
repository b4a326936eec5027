"""Principals (ADR 0017): enrolment per role, the quotas each key spends, the ledger's table on
both stores (a SQLite file; a PostgreSQL schema on a real server, skipped with the reason where
it cannot start), and the operator's command line."""

from __future__ import annotations

import json

import pytest

from meshnet.identity.keys import Identity
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.ledger.ledger_fixtures import db, postgres  # noqa: F401 (pytest fixtures)
from meshnet.tracker.ledger.principals import (DEFAULT_MAX_ROUTES, MAX_ROUTES_LIMIT, Enrolment, Principals, main,
                                        public_key_of, validate)

ALICE, BOB = Identity.generate().public_key, Identity.generate().public_key


class Clock:
    """Test fake: a monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_enrolled_role_serves_only_enrolled_keys():
    principals = Principals(["verifier"], enrolments=[Enrolment(ALICE, "verifier")])
    assert principals.refusal("verifier", ALICE) is None
    refusal = principals.refusal("verifier", BOB)
    assert refusal is not None and "not enrolled as a verifier" in refusal and BOB.hex() in refusal
    assert principals.refusal("client", BOB) is None  # not an enrolled role: the token is enough
    assert principals.refusal("gateway", ALICE) is None
    principals.sync([])  # the operator revoked it
    assert principals.refusal("verifier", ALICE) is not None
    with pytest.raises(ValueError, match="not enrolled by key"):
        Principals(["node"])


def test_a_key_enrolled_for_one_role_is_not_enrolled_for_another():
    principals = Principals(["client", "gateway"], enrolments=[Enrolment(ALICE, "client")])
    assert principals.refusal("client", ALICE) is None
    assert principals.refusal("gateway", ALICE) is not None


def test_route_quotas_come_from_the_enrolment_else_the_default():
    principals = Principals(default_max_routes=3, enrolments=[Enrolment(ALICE, "gateway", "gw", 500),
                                                              Enrolment(ALICE, "client", "", 0)])
    assert principals.route_quota(ALICE) == 500
    assert principals.route_quota(BOB) == 3
    assert Principals().route_quota(BOB) == DEFAULT_MAX_ROUTES
    with pytest.raises(ValueError):
        Principals(default_max_routes=0)


def test_failure_reports_are_limited_per_key_per_minute():
    clock = Clock()
    principals = Principals(failure_reports_per_minute=3, clock=clock)
    assert [principals.take_failure_report(ALICE) for _ in range(3)] == [None, None, None]
    over = principals.take_failure_report(ALICE)
    assert over is not None and "3 failure reports in the last minute" in over
    assert principals.take_failure_report(BOB) is None  # another principal is not charged
    clock.now += 30
    assert principals.take_failure_report(ALICE) is not None  # a refused report does not count, the window holds
    clock.now += 30.5
    assert principals.take_failure_report(ALICE) is None  # a minute after the first three


def test_a_principal_with_many_routes_may_report_each_twice_a_minute():
    """A gateway's routes fail over together when a hop dies: its allowance grows with the routes
    it holds, two reports each, never below the flat quota."""
    principals = Principals(failure_reports_per_minute=3, clock=Clock())
    assert [principals.take_failure_report(ALICE, routes_held=4) for _ in range(8)] == [None] * 8
    assert principals.take_failure_report(ALICE, routes_held=4) is not None
    assert principals.take_failure_report(BOB, routes_held=1) is None  # max(3, 2): three


def test_an_enrolment_the_tracker_could_not_act_on_is_refused():
    validate(Enrolment(ALICE, "gateway", "gw", MAX_ROUTES_LIMIT))
    for bad in (Enrolment(ALICE, "node"), Enrolment(b"short", "client"), Enrolment(ALICE, "client", "", -1),
                Enrolment(ALICE, "client", "", MAX_ROUTES_LIMIT + 1), Enrolment(ALICE, "client", "a\nb")):
        with pytest.raises(ValueError):
            validate(bad)


def test_enrolments_are_kept_in_the_ledger(db):
    ledger = Ledger(db)
    try:
        ledger.enroll(Enrolment(ALICE, "verifier", "v1", 0, 1.0))
        ledger.enroll(Enrolment(BOB, "gateway", "gw", 100, 2.0))
        ledger.enroll(Enrolment(ALICE, "verifier", "renamed", 4, 3.0))  # again: replaced
        assert ledger.enrolments() == [Enrolment(BOB, "gateway", "gw", 100, 2.0),
                                       Enrolment(ALICE, "verifier", "renamed", 4, 3.0)]
        assert ledger.revoke(ALICE) == 1 and ledger.revoke(ALICE) == 0
        assert ledger.enrolments() == [Enrolment(BOB, "gateway", "gw", 100, 2.0)]
    finally:
        ledger.close()
    reopened = Ledger(db)
    try:
        assert [e.public_key for e in reopened.enrolments()] == [BOB]
    finally:
        reopened.close()


def test_the_operators_command_line(tmp_path, capsys):
    db = tmp_path / "ledger.db"
    Ledger(db).close()
    identity = tmp_path / "verifier.pem"
    verifier = Identity.generate()
    identity.write_bytes(verifier.to_pem())

    assert main(["show-key", str(identity)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == {"public_key": verifier.public_key.hex(), "principal": verifier.principal}
    assert public_key_of(shown["public_key"]) == verifier.public_key

    assert main(["enroll", "--db", str(db), "verifier", str(identity), "--name", "v1"]) == 0
    assert main(["enroll", "--db", str(db), "gateway", ALICE.hex(), "--max-routes", "300"]) == 0
    capsys.readouterr()
    assert main(["list", "--db", str(db)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(e["role"], e["public_key"], e["name"], e["max_routes"]) for e in listed] == [
        ("verifier", verifier.public_key.hex(), "v1", 0), ("gateway", ALICE.hex(), "", 300)]

    assert main(["revoke", "--db", str(db), verifier.public_key.hex()]) == 0
    assert json.loads(capsys.readouterr().out)["enrolments_removed"] == 1
    assert main(["revoke", "--db", str(db), verifier.public_key.hex()]) == 1  # nothing was enrolled

    for bad in (["enroll", "--db", str(db), "node", ALICE.hex()],  # not a role enrolled by key
                ["enroll", "--db", str(db), "client", "abc"],  # neither a key nor a file
                ["enroll", "--db", str(db), "client", ALICE.hex(), "--max-routes", "-2"],
                ["list", "--db", str(tmp_path / "missing.db")]):
        with pytest.raises(SystemExit) as exit_:
            main(bad)
        assert exit_.value.code == 2, bad
    assert [e.role for e in Ledger(db).enrolments()] == ["gateway"]
