"""Invites in the ledger (issue 50), on a SQLite file and a real PostgreSQL server: only the
secret's hash is stored; a redemption spends one use and binds the key (enrolling it for a role
enrolled by key) in one transaction; every refusal says why and writes nothing."""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time

import pytest

from meshnet.identity.keys import Identity
from meshnet.tracker.ledger.invites import InviteRecord, InviteRefused, secret_sha256
from meshnet.tracker.ledger.ledger import Ledger
from meshnet.tracker.ledger.ledger_fixtures import db, postgres  # noqa: F401


def made(ledger: Ledger, role: str = "node", uses: int = 1, seconds: float = 3600.0) -> tuple[str, bytes]:
    invite_id, secret, now = secrets.token_hex(6), secrets.token_bytes(32), time.time()
    ledger.add_invite(InviteRecord(invite_id, secret_sha256(secret), role, uses, 0, now + seconds, now))
    return invite_id, secret


def test_only_the_secrets_hash_is_kept_and_a_use_is_spent_once(db):
    ledger = Ledger(db)
    try:
        invite_id, secret = made(ledger, uses=2)
        (record,) = ledger.invites()
        assert secret.hex() not in repr(record) and record.secret_sha256 == secret_sha256(secret)
        first, second, third = (Identity.generate().public_key for _ in range(3))
        assert ledger.redeem_invite(invite_id, secret, first) == "node"
        assert ledger.redeem_invite(invite_id, secret, first) == "node"  # again: its reply may have been lost
        assert ledger.invites()[0].used == 1
        assert ledger.redeem_invite(invite_id, secret, second) == "node"
        with pytest.raises(InviteRefused, match=f"invite {invite_id} is used up \\(2 of 2 uses\\)"):
            ledger.redeem_invite(invite_id, secret, third)
        assert ledger.invites()[0].used == 2
        assert ledger.enrolments() == []  # node keys are not enrolled (their key is their node id)
    finally:
        ledger.close()


def test_refusals_say_why_and_write_nothing(db):
    ledger = Ledger(db)
    try:
        key = Identity.generate().public_key
        invite_id, secret = made(ledger)
        with pytest.raises(InviteRefused, match="unknown invite, or not its secret"):
            ledger.redeem_invite(invite_id, secrets.token_bytes(32), key)  # forged
        with pytest.raises(InviteRefused, match="unknown invite, or not its secret"):
            ledger.redeem_invite("000000000000", secret, key)
        expired_id, expired_secret = made(ledger, seconds=0.2)
        time.sleep(0.3)
        with pytest.raises(InviteRefused, match=f"invite {expired_id} is expired"):
            ledger.redeem_invite(expired_id, expired_secret, key)
        assert ledger.revoke_invite(invite_id) == 1 and ledger.revoke_invite(invite_id) == 0
        with pytest.raises(InviteRefused, match=f"invite {invite_id} was revoked"):
            ledger.redeem_invite(invite_id, secret, key)
        assert [r.used for r in ledger.invites()] == [0, 0]
        assert {r.invite_id: r.state(time.time()) for r in ledger.invites()} == {invite_id: "revoked",
                                                                                 expired_id: "expired"}
    finally:
        ledger.close()


def test_a_role_enrolled_by_key_is_enrolled_by_its_redemption(db):
    ledger = Ledger(db)
    try:
        invite_id, secret = made(ledger, role="client")
        key = Identity.generate().public_key
        assert ledger.redeem_invite(invite_id, secret, key) == "client"
        (enrolment,) = ledger.enrolments()
        assert (enrolment.public_key, enrolment.role, enrolment.name) == (key, "client", f"invite {invite_id}")
    finally:
        ledger.close()


def test_the_last_use_is_spent_once_by_racing_redeemers(db):
    ledger = Ledger(db)
    try:
        invite_id, secret = made(ledger, uses=1)
        outcomes: list[str] = []

        def redeem() -> None:
            try:
                outcomes.append(ledger.redeem_invite(invite_id, secret, Identity.generate().public_key))
            except InviteRefused as refused:
                outcomes.append(str(refused))

        threads = [threading.Thread(target=redeem) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert outcomes.count("node") == 1 and ledger.invites()[0].used == 1
    finally:
        ledger.close()


@pytest.mark.parametrize("change, message", [
    (dict(role="admin"), "is not one of"), (dict(uses=0), "uses must be in"),
    (dict(expires_at=0.0), "must expire within"), (dict(expires_at=1e12), "must expire within"),
])
def test_an_invite_that_means_nothing_cannot_be_made(change, message):
    good = InviteRecord("a" * 12, "b" * 64, "node", 1, 0, 1000.0 + 3600, 1000.0)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(good, **change)
