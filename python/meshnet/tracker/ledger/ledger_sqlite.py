"""The work ledger's embedded store: one SQLite file (WAL), the default for one tracker.

Made by ledger.py for a ledger path (`--db PATH`). Invariants: one connection behind one lock;
every write runs inside a BEGIN IMMEDIATE transaction (the file's single writer, also against
other processes on the same file) committed with synchronous=FULL before `write` returns, so an
acknowledged report survives a crash (kill -9) of the tracker. Writes that arrive together share
a transaction (group commit, see _Pending), each in a savepoint, so a refused one writes nothing.
The schema is ledger_schema.py's, the PostgreSQL ledger's too (issue 34): its CHECKs and foreign
keys hold here (PRAGMA foreign_keys=ON on the connection), and a report is claimed by its row in
`reports`, as on PostgreSQL. A file written before that schema (PRAGMA user_version 0: no
`reports`, no CHECKs or foreign keys, perhaps no client_id) is moved to it on open, in one
transaction (see _migrate): every row is kept, and a file whose rows break the schema's rules is
refused with the reason and left as it was. A file written since ADR 0003 by any release
migrates; older ones are refused, as they always were.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Callable, TypeVar

from meshnet.tracker.ledger import ledger_schema
from meshnet.tracker.ledger.ledger_store import Sql

T = TypeVar("T")

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
        self._db.execute("PRAGMA foreign_keys=ON")  # per connection, outside any transaction
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(work)")}
        if columns and "report_id" not in columns:
            raise SystemExit(f"ledger {path} predates issued triples (ADR 0003); move it aside to start a new one")
        self._db.execute("BEGIN IMMEDIATE")  # one process at a time creates or migrates the tables
        try:
            self._create_schema(path)
        except BaseException:
            if self._db.in_transaction:  # SQLite may have rolled it back itself (a full disk)
                self._db.execute("ROLLBACK")
            self._db.close()
            raise
        self._db.execute("COMMIT")

    def _create_schema(self, path: Path) -> None:
        """In the opening transaction: the tables, created, or moved from an older schema."""
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > ledger_schema.SCHEMA_VERSION:
            raise SystemExit(f"ledger {path} has schema version {version}, newer than this tracker's "
                             f"{ledger_schema.SCHEMA_VERSION}; open it with the release that wrote it")
        tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if version < ledger_schema.SCHEMA_VERSION and tables & set(ledger_schema.TABLE_NAMES):
            try:
                _migrate(self._db, tables & set(ledger_schema.TABLE_NAMES))
            except (sqlite3.IntegrityError, ValueError) as err:  # a row the new CHECKs or foreign keys refuse
                raise SystemExit(f"ledger {path} predates the ledger's CHECKs and foreign keys and cannot be moved "
                                 f"to them ({err}); nothing was changed. Fix or remove the rows at fault with the "
                                 "sqlite3 shell, or move the file aside to start a new ledger") from None
        for statement in ledger_schema.statements(ledger_schema.SQLITE):
            self._db.execute(statement)
        self._db.execute(f"PRAGMA user_version = {ledger_schema.SCHEMA_VERSION}")

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
        # As on PostgreSQL: the key in `reports`, which every work row of the report references.
        return sql.execute("INSERT INTO reports (node_id, report_id, recorded_at) VALUES (?, ?, ?) "
                           "ON CONFLICT DO NOTHING", (node_id, report_id, now)).rowcount == 1

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _migrate(db: sqlite3.Connection, old: set[str]) -> None:
    """Inside the opening transaction: moves the ledger tables `old` of a file of schema version 0
    to ledger_schema.py's. Each is renamed aside, created anew and refilled with every row and
    column it had (`reports` from the work it counted: one row per (node, report id), when it
    was first recorded; client_id '' where the file predates it); the new tables' CHECKs and
    foreign keys check each row as it goes in (sqlite3.IntegrityError, and the caller rolls
    back). Raises ValueError, changing nothing, for a column the new schema would not keep."""
    for name, _ in ledger_schema.INDEXES:  # they would stay on the renamed tables under their names
        db.execute(f"DROP INDEX IF EXISTS {name}")
    for table in old:
        db.execute(f"ALTER TABLE {table} RENAME TO {table}_schema0")
    for statement in ledger_schema.statements(ledger_schema.SQLITE):
        db.execute(statement)
    for table in ledger_schema.TABLE_NAMES:  # parents before the tables whose foreign keys name them
        if table == "reports" and "reports" not in old and "work" in old:
            db.execute("INSERT INTO reports (node_id, report_id, recorded_at) SELECT node_id, report_id, "
                       "MIN(recorded_at) FROM work_schema0 GROUP BY node_id, report_id")
        if table not in old:
            continue
        kept = [row[1] for row in db.execute(f"PRAGMA table_info({table}_schema0)")]
        lost = set(kept) - {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if lost:
            raise ValueError(f"table {table} has columns the ledger's schema does not: {sorted(lost)}")
        columns = ", ".join(kept)
        db.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {table}_schema0")
        before, after = (db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in (f"{table}_schema0", table))
        if before != after:
            raise ValueError(f"table {table}: {after} rows of {before} moved")
        db.execute(f"DROP TABLE {table}_schema0")
