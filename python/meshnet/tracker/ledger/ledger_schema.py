"""The work ledger's schema, written once for both stores (issue 34): its tables, keys, CHECKs,
foreign keys and indexes, with the few words the two dialects spell differently put in by
`statements(dialect)`: ledger_sqlite.py creates its file's tables from SQLITE, ledger_postgres.py
its database's from POSTGRES. ledger.py's rules (which work counts, caps, exactly-once) are the
same on both; the schema holds them a second time, so a write that breaks them fails in either:
- `issued`: one row per (session, epoch, node) a tracker handed out, with its token cap;
- `reports`: one row per (node, report id) counted; every `work` row references its report and
  its issued triple (foreign keys), and token counts are never negative (CHECKs);
- `deliveries`, `audits`, `quarantine`, `withheld`, `principals`: see ledger.py;
- `invites`, `redemptions`: see invites.py.
SCHEMA_VERSION is what a SQLite file records (PRAGMA user_version) once it has this schema; files
from before it (version 0) are moved to it on open (ledger_sqlite.py).
"""

from __future__ import annotations

import dataclasses

SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Dialect:
    """The words a dialect spells its own way."""

    bigint: str  # a 64-bit integer column
    double: str  # a float column
    identity: str  # a generated 64-bit row id that is the primary key


POSTGRES = Dialect("BIGINT", "DOUBLE PRECISION", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY")
# SQLite's integers are 64-bit whatever the name; only `INTEGER PRIMARY KEY` is the rowid.
SQLITE = Dialect("INTEGER", "REAL", "INTEGER PRIMARY KEY")

# (name, body): in the order they are created (a table after those its foreign keys name).
TABLES: tuple[tuple[str, str], ...] = (
    ("issued", """
    session_id TEXT NOT NULL,
    epoch {bigint} NOT NULL,
    node_id TEXT NOT NULL,
    max_tokens {bigint} NOT NULL CHECK (max_tokens >= 0),
    issued_at {double} NOT NULL,
    client_id TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (session_id, epoch, node_id)
"""),
    ("reports", """
    node_id TEXT NOT NULL,
    report_id {bigint} NOT NULL CHECK (report_id > 0),
    recorded_at {double} NOT NULL,
    PRIMARY KEY (node_id, report_id)
"""),
    ("work", """
    id {identity},
    node_id TEXT NOT NULL,
    report_id {bigint} NOT NULL,
    session_id TEXT NOT NULL,
    epoch {bigint} NOT NULL,
    prefill_tokens {bigint} NOT NULL CHECK (prefill_tokens >= 0),
    decode_tokens {bigint} NOT NULL CHECK (decode_tokens >= 0),
    recorded_at {double} NOT NULL,
    FOREIGN KEY (node_id, report_id) REFERENCES reports,
    FOREIGN KEY (session_id, epoch, node_id) REFERENCES issued
"""),
    ("deliveries", """
    session_id TEXT PRIMARY KEY,
    prompt_tokens {bigint} NOT NULL CHECK (prompt_tokens >= 0),
    tokens {bigint} NOT NULL CHECK (tokens >= 0),
    reported_at {double} NOT NULL
"""),
    ("audits", """
    audit_id {bigint} PRIMARY KEY,
    session_id TEXT NOT NULL,
    epoch {bigint} NOT NULL,
    model TEXT NOT NULL,
    passed INTEGER NOT NULL,
    culprit TEXT NOT NULL,
    checked {bigint} NOT NULL,
    evidence TEXT NOT NULL,
    reported_at {double} NOT NULL
"""),
    ("quarantine", """
    node_id TEXT PRIMARY KEY,
    audit_id {bigint} NOT NULL,
    at {double} NOT NULL
"""),
    ("withheld", """
    session_id TEXT NOT NULL,
    epoch {bigint} NOT NULL,
    node_id TEXT NOT NULL,
    audit_id {bigint} NOT NULL,
    PRIMARY KEY (session_id, epoch, node_id)
"""),
    ("principals", """
    public_key TEXT NOT NULL,
    role TEXT NOT NULL,
    name TEXT NOT NULL,
    max_routes {bigint} NOT NULL,
    enrolled_at {double} NOT NULL,
    PRIMARY KEY (public_key, role)
"""),
    ("invites", """
    invite_id TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    role TEXT NOT NULL,
    uses {bigint} NOT NULL CHECK (uses >= 1),
    used {bigint} NOT NULL DEFAULT 0 CHECK (used >= 0 AND used <= uses),
    expires_at {double} NOT NULL,
    created_at {double} NOT NULL,
    revoked_at {double}
"""),
    ("redemptions", """
    invite_id TEXT NOT NULL REFERENCES invites,
    public_key TEXT NOT NULL,
    redeemed_at {double} NOT NULL,
    PRIMARY KEY (invite_id, public_key)
"""),
)

INDEXES: tuple[tuple[str, str], ...] = (  # (name, table and columns)
    ("work_by_node", "work (node_id)"),
    ("work_by_report", "work (node_id, report_id)"),
    ("work_by_triple", "work (session_id, epoch, node_id)"),
)

TABLE_NAMES = tuple(name for name, _ in TABLES)


def create_table(dialect: Dialect, name: str) -> str:
    """The CREATE TABLE IF NOT EXISTS statement of table `name`."""
    body = dict(TABLES)[name].format(**dataclasses.asdict(dialect))
    return f"CREATE TABLE IF NOT EXISTS {name} ({body})"


def statements(dialect: Dialect) -> list[str]:
    """Every table and index, each created if missing, in an order that `dialect` accepts."""
    return ([create_table(dialect, name) for name in TABLE_NAMES]
            + [f"CREATE INDEX IF NOT EXISTS {name} ON {on}" for name, on in INDEXES])
