"""The durable work ledger: tokens processed per (session, epoch, node), in SQLite (WAL).

Called by service.py: `issue` when a route epoch is handed out, `record` for ReportWork; by the
tracker's web endpoints (web.py) for totals; and from the command line:
  python -m meshnet.tracker.ledger --db tracker.db totals [by-node | by-client]
Each issued triple carries the route's client_id (as its opener named it: a gateway opens routes
as "key:<API key name>"), so work is attributed per node and per client.
Invariants: `issue` and `record` return only after their transaction is committed with
synchronous=FULL, so an acknowledged report survives a crash (kill -9) of the tracker; work is
counted only for triples the tracker issued, at most once per (node, report id), and never more
than the triple's token cap (the route's expected tokens), so totals stay bounded (no SQL
integer overflow: each row is at most MAX_EXPECTED_TOKENS). Thread-safe (one lock).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

from meshnet.wire.status import StatusCode
from meshnet.wire.tracker import WorkEntry

MAX_REPORT_ID = (1 << 63) - 1

_SCHEMA = """
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
# Work that counts: every row but those of a triple withheld by a failed audit (ADR 0008).
_CREDITED = ("(SELECT * FROM work AS c WHERE NOT EXISTS (SELECT 1 FROM withheld AS h WHERE "
             "h.session_id = c.session_id AND h.epoch = c.epoch AND h.node_id = c.node_id))")


@dataclasses.dataclass(frozen=True)
class NodeTotals:
    node_id: str
    sessions: int  # distinct route sessions
    prefill_tokens: int
    decode_tokens: int


@dataclasses.dataclass(frozen=True)
class ClientTotals:
    client_id: str  # the route opener's client_id ("" for routes issued before it was recorded)
    sessions: int  # distinct route sessions
    prefill_tokens: int
    decode_tokens: int


class WorkRefused(Exception):
    """A report the ledger does not count; nothing of it was written."""

    def __init__(self, code: StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class Ledger:
    def __init__(self, path: str | Path) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(work)")}
        if columns and "report_id" not in columns:
            raise SystemExit(f"ledger {path} predates issued triples (ADR 0003); move it aside to start a new one")
        self._db.executescript(_SCHEMA)
        issued = {row[1] for row in self._db.execute("PRAGMA table_info(issued)")}
        if "client_id" not in issued:  # a ledger from before per-client attribution
            self._db.execute("ALTER TABLE issued ADD COLUMN client_id TEXT NOT NULL DEFAULT ''")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """The lock and one write transaction: committed (durably) on success, rolled back on error."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def issue(self, triples: Iterable[tuple[str, int, str]], max_tokens: int, client_id: str = "") -> None:
        """Records that each (session id, epoch, node id) may report up to `max_tokens`, on a
        route opened by `client_id`."""
        now = time.time()
        rows = [(session_id, epoch, node, max_tokens, now, client_id) for session_id, epoch, node in triples]
        with self._transaction():
            self._db.executemany("INSERT OR IGNORE INTO issued (session_id, epoch, node_id, max_tokens, issued_at, "
                                 "client_id) VALUES (?, ?, ?, ?, ?, ?)", rows)

    def record(self, node_id: str, report_id: int, entries: Sequence[WorkEntry]) -> int:
        """Counts `entries` in one committed transaction and returns how many; 0 for a report
        already counted. Raises WorkRefused (and writes nothing) for any entry that is malformed,
        not issued to `node_id`, or over its triple's cap."""
        if not 0 < report_id <= MAX_REPORT_ID:
            raise WorkRefused(StatusCode.INVALID_ARGUMENT, f"report_id must be in 1..{MAX_REPORT_ID}")
        now = time.time()
        with self._transaction():
            if self._db.execute("SELECT 1 FROM work WHERE node_id = ? AND report_id = ? LIMIT 1",
                                (node_id, report_id)).fetchone():
                return 0
            rows = [self._checked_row(node_id, report_id, e, now) for e in entries]
            self._db.executemany("INSERT INTO work (node_id, report_id, session_id, epoch, prefill_tokens, "
                                 "decode_tokens, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        return len(rows)

    def _checked_row(self, node_id: str, report_id: int, e: WorkEntry, now: float) -> tuple:
        """Lock and transaction held."""
        if e.session is None or not e.session.session_id:
            raise WorkRefused(StatusCode.INVALID_ARGUMENT, "work entry without a route session")
        key = (e.session.session_id, e.session.epoch, node_id)
        issued = self._db.execute("SELECT max_tokens FROM issued WHERE session_id = ? AND epoch = ? AND node_id = ?",
                                  key).fetchone()
        if issued is None:
            raise WorkRefused(StatusCode.PERMISSION_DENIED, f"session {key[0]!r} epoch {key[1]} was not issued to "
                                                            f"node {node_id!r}")
        (done,) = self._db.execute("SELECT COALESCE(SUM(prefill_tokens + decode_tokens), 0) FROM work "
                                   "WHERE session_id = ? AND epoch = ? AND node_id = ?", key).fetchone()
        tokens = e.prefill_tokens + e.decode_tokens
        if e.prefill_tokens < 0 or e.decode_tokens < 0 or done + tokens > issued[0]:
            raise WorkRefused(StatusCode.INVALID_ARGUMENT,
                              f"{tokens} more tokens for session {key[0]!r} epoch {key[1]} exceed its cap of "
                              f"{issued[0]} ({done} already counted)")
        return (node_id, report_id, e.session.session_id, e.session.epoch, e.prefill_tokens, e.decode_tokens, now)

    def totals(self, limit: Optional[int] = None) -> list[NodeTotals]:
        """Per node, by node id; with `limit`, only the `limit` nodes with the most tokens."""
        order = "node_id" if limit is None else "SUM(prefill_tokens + decode_tokens) DESC, node_id"
        with self._lock:
            rows = self._db.execute(
                "SELECT node_id, COUNT(DISTINCT session_id), SUM(prefill_tokens), SUM(decode_tokens) "
                f"FROM {_CREDITED} GROUP BY node_id ORDER BY {order} LIMIT ?", (-1 if limit is None else limit,)).fetchall()
        return [NodeTotals(*row) for row in rows]

    def totals_by_client(self, limit: Optional[int] = None) -> list[ClientTotals]:
        """Per client_id of the routes the work was done on, by client id; with `limit`, only the
        `limit` clients with the most tokens."""
        order = "i.client_id" if limit is None else "SUM(w.prefill_tokens + w.decode_tokens) DESC, i.client_id"
        with self._lock:
            rows = self._db.execute(
                "SELECT i.client_id, COUNT(DISTINCT w.session_id), SUM(w.prefill_tokens), SUM(w.decode_tokens) "
                f"FROM {_CREDITED} AS w JOIN issued AS i "
                "ON i.session_id = w.session_id AND i.epoch = w.epoch AND i.node_id = w.node_id "
                f"GROUP BY i.client_id ORDER BY {order} LIMIT ?", (-1 if limit is None else limit,)).fetchall()
        return [ClientTotals(*row) for row in rows]

    def overall(self) -> tuple[int, int, int]:
        """(distinct route sessions, prefill tokens, decode tokens) over all work counted."""
        with self._lock:
            return self._db.execute("SELECT COUNT(DISTINCT session_id), COALESCE(SUM(prefill_tokens), 0), "
                                    f"COALESCE(SUM(decode_tokens), 0) FROM {_CREDITED}").fetchone()

    def record_audit(self, audit_id: int, session_id: str, epoch: int, model: str, passed: bool, culprit: str,
                     checked: int, evidence: str) -> None:
        """An audit's verdict (ADR 0008); a failed one also quarantines `culprit` and withholds
        its credit for the audited (session, epoch), in the same committed transaction."""
        now = time.time()
        with self._transaction():
            self._db.execute("INSERT OR REPLACE INTO audits (audit_id, session_id, epoch, model, passed, culprit, "
                             "checked, evidence, reported_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (audit_id, session_id, epoch, model, int(passed), culprit, checked, evidence, now))
            if not passed:
                self._db.execute("INSERT OR IGNORE INTO quarantine (node_id, audit_id, at) VALUES (?, ?, ?)",
                                 (culprit, audit_id, now))
                self._db.execute("INSERT OR IGNORE INTO withheld (session_id, epoch, node_id, audit_id) "
                                 "VALUES (?, ?, ?, ?)", (session_id, epoch, culprit, audit_id))

    def quarantined(self) -> set[str]:
        """Nodes that failed an audit."""
        with self._lock:
            return {row[0] for row in self._db.execute("SELECT node_id FROM quarantine")}

    def audits(self) -> list[dict]:
        """Every recorded verdict, oldest first (for the status page and the evidence)."""
        with self._lock:
            rows = self._db.execute("SELECT audit_id, session_id, epoch, model, passed, culprit, checked, evidence "
                                    "FROM audits ORDER BY reported_at").fetchall()
        keys = ("audit_id", "session_id", "epoch", "model", "passed", "culprit", "checked", "evidence")
        return [dict(zip(keys, row)) for row in rows]

    def withheld_tokens(self, node_id: str) -> int:
        """Tokens `node_id` reported for triples a failed audit withheld."""
        with self._lock:
            (tokens,) = self._db.execute(
                "SELECT COALESCE(SUM(w.prefill_tokens + w.decode_tokens), 0) FROM work AS w JOIN withheld AS h "
                "ON h.session_id = w.session_id AND h.epoch = w.epoch AND h.node_id = w.node_id "
                "WHERE w.node_id = ?", (node_id,)).fetchone()
        return tokens

    def sessions(self) -> set[str]:
        with self._lock:
            return {row[0] for row in self._db.execute("SELECT DISTINCT session_id FROM work")}

    def close(self) -> None:
        with self._lock:
            self._db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="Read the tracker's work ledger.")
    parser.add_argument("--db", required=True, type=Path)
    parser.add_argument("command", choices=["totals"])
    parser.add_argument("view", nargs="?", choices=["by-node", "by-client"], default="by-node",
                        help="tokens and sessions per node (default) or per client_id of the routes")
    args = parser.parse_args()
    if not args.db.exists():
        parser.error(f"no ledger at {args.db}")
    ledger = Ledger(args.db)
    totals = ledger.totals() if args.view == "by-node" else ledger.totals_by_client()
    print(json.dumps([dataclasses.asdict(t) for t in totals], indent=2))
    ledger.close()


if __name__ == "__main__":
    main()
