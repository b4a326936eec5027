"""Invites in the ledger (issue 50, item 2): what an operator hands a newcomer instead of a role
token, a certificate and an enrolment made by hand.

An invite is an id, a secret, a role, a number of uses and an expiry. The ledger keeps the
secret's SHA-256 only (`invites`), so a copy of the ledger redeems nothing. Redeeming checks the
secret in constant time, then the invite's state; a good redemption spends one use, records the
key that redeemed it (`redemptions`) and, for a role enrolled by key (client, gateway,
verifier), enrols that key (principals, ADR 0017), all in one transaction: two trackers on one
PostgreSQL ledger never spend the last use twice. A key that redeemed an invite may redeem it
again while it is not revoked (its first reply may have been lost), spending nothing.
Replicated trackers share invites through their shared ledger.

The functions take the ledger's open transaction (`Sql`); ledger.py calls them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from typing import Optional

from meshnet.identity.roles import ROLES
from meshnet.tracker.ledger.ledger_store import Sql
from meshnet.tracker.ledger.principals import ENROLLED_ROLES

MAX_USES = 1 << 16
MAX_SECONDS = 366 * 86400.0  # the longest an invite may stay good


@dataclasses.dataclass(frozen=True)
class InviteRecord:
    invite_id: str  # the public half, 12 hex digits
    secret_sha256: str  # hex SHA-256 of the secret half; the secret itself is never stored
    role: str  # node, client, gateway or verifier
    uses: int  # how many keys may redeem it
    used: int  # how many have
    expires_at: float  # Unix time after which it redeems nothing
    created_at: float
    revoked_at: Optional[float] = None  # when the operator revoked it, if they did

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role {self.role!r} is not one of {ROLES}")
        if not 1 <= self.uses <= MAX_USES:
            raise ValueError(f"uses must be in [1, {MAX_USES}], not {self.uses}")
        if not 0 < self.expires_at - self.created_at <= MAX_SECONDS:
            raise ValueError(f"an invite must expire within {MAX_SECONDS / 86400:g} days of being made")

    def state(self, now: float) -> str:
        """'revoked', 'expired', 'used up' or 'open'."""
        if self.revoked_at is not None:
            return "revoked"
        if now >= self.expires_at:
            return "expired"
        return "used up" if self.used >= self.uses else "open"


class InviteRefused(Exception):
    """A redemption the ledger refused; nothing was written."""


def secret_sha256(secret: bytes) -> str:
    return hashlib.sha256(secret).hexdigest()


_COLUMNS = "invite_id, secret_sha256, role, uses, used, expires_at, created_at, revoked_at"


def add(sql: Sql, record: InviteRecord) -> None:
    sql.execute(f"INSERT INTO invites ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                dataclasses.astuple(record))


def listed(sql: Sql) -> list[InviteRecord]:
    """Every invite, newest first."""
    return [InviteRecord(*row) for row in sql.execute(f"SELECT {_COLUMNS} FROM invites ORDER BY created_at DESC")]


def revoke(sql: Sql, invite_id: str, now: float) -> int:
    """Revokes an invite that is not yet revoked; 1 if it did, 0 if there was none."""
    return sql.execute("UPDATE invites SET revoked_at = ? WHERE invite_id = ? AND revoked_at IS NULL",
                       (now, invite_id)).rowcount


def redeem(sql: Sql, invite_id: str, secret: bytes, public_key: bytes, now: float, row_lock: str = "") -> str:
    """The invite's role, bound to `public_key`; InviteRefused (nothing written) when the id is
    unknown, the secret is not its secret, or it is revoked, expired or used up."""
    row = sql.execute(f"SELECT {_COLUMNS} FROM invites WHERE invite_id = ?{row_lock}", (invite_id,)).fetchone()
    if row is None or not hmac.compare_digest(row[1], secret_sha256(secret)):
        raise InviteRefused("unknown invite, or not its secret")
    record = InviteRecord(*row)
    if record.revoked_at is not None:
        raise InviteRefused(f"invite {invite_id} was revoked")
    key = public_key.hex()
    again = sql.execute("SELECT 1 FROM redemptions WHERE invite_id = ? AND public_key = ?", (invite_id, key)).fetchone()
    if again is not None:
        return record.role
    state = record.state(now)
    if state != "open":
        raise InviteRefused(f"invite {invite_id} is {state}" + (f" ({record.uses} of {record.uses} uses)"
                                                                  if state == "used up" else ""))
    if sql.execute("UPDATE invites SET used = used + 1 WHERE invite_id = ? AND used < uses",
                   (invite_id,)).rowcount != 1:
        raise InviteRefused(f"invite {invite_id} is used up")
    sql.execute("INSERT INTO redemptions (invite_id, public_key, redeemed_at) VALUES (?, ?, ?)", (invite_id, key, now))
    if record.role in ENROLLED_ROLES:  # an enrolment the operator made already keeps its name and quota
        sql.execute("INSERT INTO principals (public_key, role, name, max_routes, enrolled_at) VALUES (?, ?, ?, 0, ?) "
                    "ON CONFLICT (public_key, role) DO NOTHING", (key, record.role, f"invite {invite_id}", now))
    return record.role
