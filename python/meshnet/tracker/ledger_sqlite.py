"""The work ledger's embedded store: one SQLite file (WAL), the default for one tracker.

Made by ledger.py for a ledger path (`--db PATH`). Invariants: one connection behind one lock;
every write is a BEGIN IMMEDIATE transaction (the file's single writer, also against other
processes on the same file) committed with synchronous=FULL before `write` returns, so an
acknowledged report survives a crash (kill -9) of the tracker. The schema is the one ledgers
have been written with since ADR 0003 (plus client_id, added in place to older files).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Callable, TypeVar

from meshnet.tracker.ledger_store import Sql

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS issued (
    session_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    max_tokens INTEGER NOT NULL,
    issued_at REAL NOT NULL,
    client_id TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (session_id, epoch, node_id)
);
CREATE TABLE IF NOT EXISTS work (
    id INTEGER PRIMARY KEY,
    node_id TEXT NOT NULL,
    report_id INTEGER NOT NULL,
    session_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    prefill_tokens INTEGER NOT NULL,
    decode_tokens INTEGER NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS work_by_node ON work (node_id);
CREATE INDEX IF NOT EXISTS work_by_report ON work (node_id, report_id);
CREATE INDEX IF NOT EXISTS work_by_triple ON work (session_id, epoch, node_id);
CREATE TABLE IF NOT EXISTS audits (
    audit_id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    model TEXT NOT NULL,
    passed INTEGER NOT NULL,
    culprit TEXT NOT NULL,
    checked INTEGER NOT NULL,
    evidence TEXT NOT NULL,
    reported_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantine (
    node_id TEXT PRIMARY KEY,
    audit_id INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS withheld (
    session_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    audit_id INTEGER NOT NULL,
    PRIMARY KEY (session_id, epoch, node_id)
);
"""


class SqliteLedgerStore:
    row_lock = ""  # BEGIN IMMEDIATE already holds the file's write lock for the whole transaction

    def __init__(self, path: Path) -> None:
        self.location = str(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(work)")}
        if columns and "report_id" not in columns:
            raise SystemExit(f"ledger {path} predates issued triples (ADR 0003); move it aside to start a new one")
        self._db.executescript(SCHEMA)
        issued = {row[1] for row in self._db.execute("PRAGMA table_info(issued)")}
        if "client_id" not in issued:  # a ledger from before per-client attribution
            self._db.execute("ALTER TABLE issued ADD COLUMN client_id TEXT NOT NULL DEFAULT ''")

    def write(self, work: Callable[[Sql], T]) -> T:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                result = work(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return result

    def read(self, work: Callable[[Sql], T]) -> T:
        with self._lock:
            return work(self._db)

    def claim_report(self, sql: Sql, node_id: str, report_id: int, now: float) -> bool:
        # A counted report is its rows in `work`; the write lock keeps anyone from adding them meanwhile.
        return sql.execute("SELECT 1 FROM work WHERE node_id = ? AND report_id = ? LIMIT 1",
                           (node_id, report_id)).fetchone() is None

    def close(self) -> None:
        with self._lock:
            self._db.close()
