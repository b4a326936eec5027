"""What the work ledger (ledger.py) asks of its database: the LedgerStore seam and its errors.

Two implementations: ledger_sqlite.py (one local file; the embedded default) and ledger_postgres.py
(one PostgreSQL database shared by several trackers, issue 20). The ledger's logic (which work
counts, caps, exactly-once) lives in ledger.py and speaks SQL both dialects accept, with `?`
placeholders; the schema is ledger_schema.py's, in each dialect's words; a store supplies the
connection, the transactions, its tables (made from that schema) and the two things that differ
between the dialects: how a report id is claimed and how an issued row is locked.
Invariant: `write` returns only after its transaction is durably committed, and it may run `work`
again when a try failed before its commit was known, so every write the ledger makes is
idempotent (a repeated report claims nothing; issued rows and verdicts are upserts).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, TypeVar

from meshnet.tracker.store.state_store import StoreUnavailable

T = TypeVar("T")


class LedgerUnavailable(StoreUnavailable):
    """The ledger's database could not be reached or did not answer in time; nothing was counted
    that the caller was told of. The tracker answers UNAVAILABLE (retryable): a retried report is
    still counted at most once."""


class Sql(Protocol):
    """A cursor inside one transaction; statements use `?` placeholders."""

    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...  # returns a cursor (fetchone, fetchall)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> Any: ...


class LedgerStore(Protocol):
    """Thread-safe: each call runs under the store's own lock or connection."""

    location: str  # where the ledger is, for logs and errors (never a password)

    # Appended to the SELECT of an `issued` row inside `write`: locks the row until the
    # transaction ends, so concurrent reports on one triple count against its cap one at a time
    # ("" where the transaction already excludes every other writer).
    row_lock: str

    def write(self, work: Callable[[Sql], T]) -> T:
        """`work` in one transaction, committed durably before this returns; rolled back when
        `work` raises (which this re-raises). Raises LedgerUnavailable when the database fails."""
        ...

    def read(self, work: Callable[[Sql], T]) -> T:
        """`work`'s reads, each seeing committed data. Raises LedgerUnavailable."""
        ...

    def claim_report(self, sql: Sql, node_id: str, report_id: int, now: float) -> bool:
        """Inside `write`: True when (node_id, report_id) was never counted and is now this
        transaction's to count; False when it already was (by any tracker on this database)."""
        ...

    def close(self) -> None: ...
