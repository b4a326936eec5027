"""The work ledger's shared store: one PostgreSQL database that several trackers write at once
(issue 20). Made by ledger.py for a `postgresql://` URL (the tracker's `--ledger URL`).

Exactly-once holds in the schema (ledger_schema.py, the SQLite file's too), whichever tracker a
report or a route reaches:
- `issued` has PRIMARY KEY (session_id, epoch, node_id) and is written INSERT ... ON CONFLICT DO
  NOTHING: a triple issued by two trackers is one row (the first one's cap).
- `reports` has PRIMARY KEY (node_id, report_id). A report is claimed by inserting its key ON
  CONFLICT DO NOTHING in the transaction that writes its work; a second tracker's claim of the
  same key waits for the first transaction, then claims nothing (or the key, if the first rolled
  back). Every `work` row references its claimed report and its issued triple (foreign keys).
- Caps: the transaction locks each issued row it counts against (SELECT ... FOR UPDATE, triples
  in sorted order, so two reports never deadlock), then sums the triple's work; at READ
  COMMITTED each statement sees all that committed before it, so the sum includes the work of
  every transaction that held the lock earlier.
Durability: synchronous_commit is on for our sessions, so COMMIT returns once the commit record
is flushed to the server's disk. Bounds: one connection behind one lock (reconnected after a
loss), connect_timeout, lock_timeout (a stalled tracker holding a row lock delays the others at
most that long) and idle_in_transaction_session_timeout. Errors name the URL without a password.
"""

from __future__ import annotations

import functools
import threading
import urllib.parse
from typing import Callable, Optional, TypeVar

import psycopg
import psycopg.errors

from meshnet.tracker.ledger import ledger_schema
from meshnet.tracker.ledger.ledger_store import LedgerUnavailable, Sql

T = TypeVar("T")

CONNECT_TIMEOUT_S = 5
TRANSACTION_ATTEMPTS = 3  # a deadlock or serialization failure is retried; all ledger writes are idempotent
SESSION_SETTINGS = ("SET synchronous_commit = on", "SET lock_timeout = '5s'",
                    "SET idle_in_transaction_session_timeout = '30s'")
SCHEMA_LOCK = 0x6D657368_6E657401  # pg_advisory_xact_lock key: trackers starting together create tables one at a time


def is_postgres_url(location: object) -> bool:
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


def redacted(url: str) -> str:
    """`url` with any password (in the user part or the query) replaced by ***."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:***@{host}"
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    query = [(key, "***" if key == "password" else value) for key, value in query]
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=urllib.parse.urlencode(query, safe="*")))


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


@functools.lru_cache(maxsize=128)
def _placeholders(sql: str) -> str:
    """The ledger's `?` placeholders as psycopg's `%s` (its SQL holds no literal `?`)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _Cursor:
    """A psycopg cursor that takes the ledger's `?` placeholders."""

    def __init__(self, cursor: psycopg.Cursor) -> None:
        self._cursor = cursor

    def execute(self, sql: str, params=()) -> psycopg.Cursor:
        return self._cursor.execute(_placeholders(sql), params)

    def executemany(self, sql: str, rows) -> None:
        self._cursor.executemany(_placeholders(sql), rows)


class PostgresLedgerStore:
    row_lock = " FOR UPDATE"

    def __init__(self, url: str) -> None:
        self.location = redacted(url)
        self._url = url
        self._lock = threading.Lock()
        self._conn: Optional[psycopg.Connection] = None
        try:
            self.write(self._create_schema)
        except psycopg.Error as err:  # e.g. a user without the right to create the tables
            self.close()
            raise LedgerUnavailable(f"ledger database {self.location}: cannot create its tables: "
                                    f"{_one_line(err)}") from None

    @staticmethod
    def _create_schema(sql: Sql) -> None:
        sql.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))
        for statement in ledger_schema.statements(ledger_schema.POSTGRES):
            sql.execute(statement)

    def _connected(self) -> psycopg.Connection:
        """Lock held."""
        if self._conn is None or self._conn.closed:
            try:
                conn = psycopg.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
            except psycopg.Error as err:
                raise LedgerUnavailable(f"cannot reach the ledger database {self.location}: {_one_line(err)}") from None
            try:
                for setting in SESSION_SETTINGS:
                    conn.execute(setting)
            except psycopg.Error as err:
                conn.close()
                raise LedgerUnavailable(f"ledger database {self.location}: {_one_line(err)}") from None
            self._conn = conn
        return self._conn

    def _run(self, work: Callable[[Sql], T], transaction: bool) -> T:
        """`work` on the connection, in a transaction if asked. A deadlock or serialization failure
        runs it again (up to TRANSACTION_ATTEMPTS in all); so does a connection found lost, once,
        on a new connection (the server may have restarted since the last call)."""
        with self._lock:
            rollbacks, reconnected = 0, False
            while True:
                conn = self._connected()
                try:
                    with conn.cursor() as cursor:
                        if not transaction:
                            return work(_Cursor(cursor))
                        with conn.transaction():
                            return work(_Cursor(cursor))
                except psycopg.errors.TransactionRollback as err:
                    rollbacks += 1
                    if rollbacks == TRANSACTION_ATTEMPTS:
                        raise LedgerUnavailable(f"ledger database {self.location}: {_one_line(err)}") from None
                except psycopg.OperationalError as err:  # the connection lost, or a timeout
                    if reconnected or not (conn.broken or conn.closed):
                        raise LedgerUnavailable(f"ledger database {self.location}: {_one_line(err)}") from None
                    conn.close()
                    reconnected = True

    def write(self, work: Callable[[Sql], T]) -> T:
        return self._run(work, transaction=True)

    def read(self, work: Callable[[Sql], T]) -> T:
        return self._run(work, transaction=False)

    def claim_report(self, sql: Sql, node_id: str, report_id: int, now: float) -> bool:
        return sql.execute("INSERT INTO reports (node_id, report_id, recorded_at) VALUES (?, ?, ?) "
                           "ON CONFLICT DO NOTHING RETURNING 1", (node_id, report_id, now)).fetchone() is not None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
