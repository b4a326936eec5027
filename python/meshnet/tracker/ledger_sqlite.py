"""The work ledger's embedded store: one SQLite file (WAL), the default for one tracker.

Made by ledger.py for a ledger path (`--db PATH`). Invariants: one connection behind one lock;
every write runs inside a BEGIN IMMEDIATE transaction (the file's single writer, also against
other processes on the same file) committed with synchronous=FULL before `write` returns, so an
acknowledged report survives a crash (kill -9) of the tracker. Writes that arrive together share
a transaction (group commit, see _Pending), each in a savepoint, so a refused one writes nothing.
The schema is the one ledgers have been written with since ADR 0003 (plus client_id, added in
place to older files).
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
CREATE TABLE IF NOT EXISTS deliveries (
    session_id TEXT PRIMARY KEY,
    prompt_tokens INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    reported_at REAL NOT NULL
);
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
CREATE TABLE IF NOT EXISTS principals (
    public_key TEXT NOT NULL,
    role TEXT NOT NULL,
    name TEXT NOT NULL,
    max_routes INTEGER NOT NULL,
    enrolled_at REAL NOT NULL,
    PRIMARY KEY (public_key, role)
);
"""


class _Pending:
    """One write waiting for its group. Group commit: a writer queues its work, then takes the
    connection's lock; whoever holds it runs every queued write in one transaction and commits
    once (one fsync of the log for the group, not one per write), and the writers whose work it
    ran find theirs done when they get the lock. Durability is unchanged: no writer returns
    before the transaction holding its write has committed."""

    def __init__(self, work: Callable[[Sql], object]) -> None:
        self.work, self.result, self.error, self.done = work, None, None, False

    def outcome(self):
        if self.error is not None:
            raise self.error
        return self.result


class SqliteLedgerStore:
    row_lock = ""  # BEGIN IMMEDIATE already holds the file's write lock for the whole transaction

    def __init__(self, path: Path) -> None:
        self.location = str(path)
        self._lock = threading.Lock()  # the connection's: held by the writer committing a group
        self._queue_lock = threading.Lock()
        self._queue: list[_Pending] = []  # writes waiting for the next group
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
        """Runs `work` in a committed transaction, grouped with the writes that arrived while the
        previous group committed (see _Pending); returns once its group is committed."""
        pending = _Pending(work)
        with self._queue_lock:
            self._queue.append(pending)
        with self._lock:
            if not pending.done:  # no earlier group took it: lead the next one
                with self._queue_lock:
                    group, self._queue = self._queue, []
                self._commit(group)
        return pending.outcome()

    def _commit(self, group: list["_Pending"]) -> None:
        """Lock held. One transaction; each write in a savepoint of its own, so one that raises
        is undone alone; every write in the group gets the commit's failure if it fails."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for one in group:
                    self._db.execute("SAVEPOINT one_write")
                    try:
                        one.result = one.work(self._db)
                    except BaseException as err:  # the caller's own error (WorkRefused...), re-raised to it
                        self._db.execute("ROLLBACK TO one_write")
                        one.error = err
                    self._db.execute("RELEASE one_write")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except BaseException as err:
            for one in group:
                one.result, one.error = None, err
        finally:
            for one in group:
                one.done = True

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
