"""The durable work ledger: tokens processed per (session, epoch, node), in SQLite (WAL).

Called by service.py for ReportWork, and from the command line for totals:
  python -m meshnet.tracker.ledger --db tracker.db totals
Invariant: `record` returns only after its transaction is committed with synchronous=FULL, so
an acknowledged report survives a crash (kill -9) of the tracker. Thread-safe (one lock).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Sequence

from meshnet.types.tracker import WorkEntry

MAX_TOKENS = (1 << 62) - 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS work (
    id INTEGER PRIMARY KEY,
    node_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    prefill_tokens INTEGER NOT NULL,
    decode_tokens INTEGER NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS work_by_node ON work (node_id);
"""


@dataclasses.dataclass(frozen=True)
class NodeTotals:
    node_id: str
    sessions: int  # distinct route sessions
    prefill_tokens: int
    decode_tokens: int


class Ledger:
    def __init__(self, path: str | Path) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def record(self, node_id: str, entries: Sequence[WorkEntry]) -> int:
        """Appends `entries` in one committed transaction; raises ValueError for bad entries."""
        rows = []
        now = time.time()
        for e in entries:
            if e.session is None or not e.session.session_id:
                raise ValueError("work entry without a route session")
            if not (0 <= e.prefill_tokens <= MAX_TOKENS and 0 <= e.decode_tokens <= MAX_TOKENS):
                raise ValueError(f"token counts out of range: {e.prefill_tokens}, {e.decode_tokens}")
            rows.append((node_id, e.session.session_id, e.session.epoch, e.prefill_tokens, e.decode_tokens, now))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT INTO work (node_id, session_id, epoch, prefill_tokens, decode_tokens, "
                                     "recorded_at) VALUES (?, ?, ?, ?, ?, ?)", rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return len(rows)

    def totals(self) -> list[NodeTotals]:
        with self._lock:
            rows = self._db.execute(
                "SELECT node_id, COUNT(DISTINCT session_id), SUM(prefill_tokens), SUM(decode_tokens) "
                "FROM work GROUP BY node_id ORDER BY node_id").fetchall()
        return [NodeTotals(*row) for row in rows]

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
    args = parser.parse_args()
    if not args.db.exists():
        parser.error(f"no ledger at {args.db}")
    ledger = Ledger(args.db)
    print(json.dumps([dataclasses.asdict(t) for t in ledger.totals()], indent=2))
    ledger.close()


if __name__ == "__main__":
    main()
