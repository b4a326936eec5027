"""The durable work ledger: tokens processed per (session, epoch, node), for billing and attribution.

Called by tracker/service.py: `issue` when a route epoch is handed out, `record` for ReportWork;
by tracker/audits.py for verdicts; by the tracker's web endpoints (tracker/web/web.py,
tracker/metrics.py) for totals; and from the command line:
  python -m meshnet.tracker.ledger.ledger (--db tracker.db | --ledger postgresql://...) totals [by-node | by-client]
  python -m meshnet.tracker.ledger.ledger (--db tracker.db | --ledger postgresql://...) release NODE_ID
It also keeps the operator's enrolled principals (tracker/ledger/principals.py, ADR 0017): the accounts
that quotas and billing attach to live beside the bill; and the invites that enrol them
(tracker/ledger/invites.py, issue 50).
Each issued triple carries the route's client_id (as its opener named it: a gateway opens routes
as "key:<API key name>"), so work is attributed per node and per client.
This module holds the rules; a store holds the rows (ledger_store.py): a SQLite file, the
embedded default (ledger_sqlite.py), or a PostgreSQL database that several trackers share
(ledger_postgres.py, issue 20). The SQL here is what both accept.
Invariants, on either store and across trackers sharing one database: `issue`, `record` and
`record_audit` return only after their transaction is durably committed, so an acknowledged
report survives a crash (kill -9) of the tracker; work is counted only for triples a tracker
issued, at most once per (node, report id), and never more than the triple's token cap (the
route's expected tokens), so totals stay bounded (no SQL integer overflow: each row is at most
MAX_EXPECTED_TOKENS). What is credited (totals) is further capped per triple by the session's
delivery, when its client reported one at CloseRoute (`record_delivery`, issue 35 finding 7): a
node is paid for what reached the client, not for whatever it reports up to the route's budget.
Thread-safe (the store serializes its connection).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Iterable, Optional, Sequence

from meshnet.tracker.ledger.ledger_postgres import PostgresLedgerStore, is_postgres_url
from meshnet.tracker.ledger.ledger_sqlite import SqliteLedgerStore
from meshnet.tracker.ledger.ledger_store import LedgerStore, LedgerUnavailable, Sql
from meshnet.tracker.ledger import invites
from meshnet.tracker.ledger.invites import InviteRecord
from meshnet.tracker.ledger.principals import Enrolment
from meshnet.wire.status import StatusCode
from meshnet.wire.tracker import WorkEntry

MAX_REPORT_ID = (1 << 63) - 1
MAX_SQL_INTEGER = (1 << 63) - 1  # a larger epoch (the wire's is uint64) was never issued

# Work that counts, one row per (session, epoch, node): its work rows but those of a triple
# withheld by a failed audit (ADR 0008), summed, then capped by the session's delivery when its
# client reported one at CloseRoute (no epoch's hop computes more than the prompt plus the tokens
# delivered): prefill first, then decode within what the cap leaves.
_TRIPLES = ("SELECT session_id, epoch, node_id, SUM(prefill_tokens) AS prefill, SUM(decode_tokens) AS decode "
            "FROM work AS c WHERE NOT EXISTS (SELECT 1 FROM withheld AS h WHERE h.session_id = c.session_id AND "
            "h.epoch = c.epoch AND h.node_id = c.node_id) GROUP BY session_id, epoch, node_id")
_CREDITED = (
    "(SELECT t.session_id, t.epoch, t.node_id, "
    "CASE WHEN d.cap IS NULL OR t.prefill <= d.cap THEN t.prefill ELSE d.cap END AS prefill_tokens, "
    "CASE WHEN d.cap IS NULL OR t.prefill + t.decode <= d.cap THEN t.decode WHEN t.prefill >= d.cap THEN 0 "
    "ELSE d.cap - t.prefill END AS decode_tokens "
    f"FROM ({_TRIPLES}) AS t LEFT JOIN (SELECT session_id, prompt_tokens + tokens AS cap FROM deliveries) AS d "
    "ON d.session_id = t.session_id)")


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


@dataclasses.dataclass
class _Allowance:
    """One issued triple, inside the transaction counting a report (its issued row locked)."""

    cap: int  # the triple's max_tokens
    counted: int  # its tokens counted so far, this report's accepted entries included


class Ledger:
    def __init__(self, location: str | Path) -> None:
        """`location`: a postgresql:// URL, or the path of a SQLite file (created if missing).
        Raises LedgerUnavailable when the database cannot be reached."""
        self._store: LedgerStore = (PostgresLedgerStore(location) if is_postgres_url(location)
                                    else SqliteLedgerStore(Path(location)))

    @property
    def location(self) -> str:
        """The file or the URL (without its password), for logs."""
        return self._store.location

    def issue(self, triples: Iterable[tuple[str, int, str]], max_tokens: int, client_id: str = "") -> None:
        """Records that each (session id, epoch, node id) may report up to `max_tokens`, on a
        route opened by `client_id`. A triple already issued keeps its first cap and client."""
        now = time.time()
        # Sorted: trackers issuing overlapping triples at once wait on each other's keys in one order.
        rows = [(session, epoch, node, max_tokens, now, client_id) for session, epoch, node in sorted(set(triples))]
        self._store.write(lambda sql: sql.executemany(
            "INSERT INTO issued (session_id, epoch, node_id, max_tokens, issued_at, client_id) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", rows))

    def record(self, node_id: str, report_id: int, entries: Sequence[WorkEntry]) -> int:
        """Counts `entries` in one committed transaction and returns how many; 0 for a report
        already counted (by any tracker on this ledger's database) or without entries. Raises
        WorkRefused (and writes nothing) for any entry that is malformed, not issued to
        `node_id`, or over its triple's cap (together with the report's other entries on it)."""
        if not 0 < report_id <= MAX_REPORT_ID:
            raise WorkRefused(StatusCode.INVALID_ARGUMENT, f"report_id must be in 1..{MAX_REPORT_ID}")
        if not entries:
            return 0
        now = time.time()
        return self._store.write(lambda sql: self._record(sql, node_id, report_id, entries, now))

    def _record(self, sql: Sql, node_id: str, report_id: int, entries: Sequence[WorkEntry], now: float) -> int:
        """Inside the write transaction."""
        if not self._store.claim_report(sql, node_id, report_id, now):
            return 0
        allowances = self._allowances(sql, node_id, entries)
        rows = [_checked_row(node_id, report_id, e, allowances, now) for e in entries]
        sql.executemany("INSERT INTO work (node_id, report_id, session_id, epoch, prefill_tokens, decode_tokens, "
                        "recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        return len(rows)

    def _allowances(self, sql: Sql, node_id: str, entries: Sequence[WorkEntry]) -> dict[tuple[str, int], _Allowance]:
        """(session id, epoch) -> allowance, for each triple of `node_id` that `entries` name and
        a tracker issued. Locks their issued rows in sorted order, then sums their work: any
        other transaction counting against them has committed by then, or waits for this one."""
        allowances = {}
        for session_id, epoch in sorted({(e.session.session_id, e.session.epoch) for e in entries if _issuable(e)}):
            key = (session_id, epoch, node_id)
            issued = sql.execute("SELECT max_tokens FROM issued WHERE session_id = ? AND epoch = ? AND node_id = ?"
                                 + self._store.row_lock, key).fetchone()
            if issued is not None:
                (counted,) = sql.execute("SELECT CAST(COALESCE(SUM(prefill_tokens + decode_tokens), 0) AS BIGINT) "
                                         "FROM work WHERE session_id = ? AND epoch = ? AND node_id = ?", key).fetchone()
                allowances[(session_id, epoch)] = _Allowance(issued[0], counted)
        return allowances

    def totals(self, limit: Optional[int] = None) -> list[NodeTotals]:
        """Per node, by node id; with `limit`, only the `limit` nodes with the most tokens."""
        order = "node_id" if limit is None else "SUM(prefill_tokens + decode_tokens) DESC, node_id"
        query = ("SELECT node_id, COUNT(DISTINCT session_id), CAST(SUM(prefill_tokens) AS BIGINT), "
                 f"CAST(SUM(decode_tokens) AS BIGINT) FROM {_CREDITED} AS w GROUP BY node_id ORDER BY {order}")
        return [NodeTotals(*row) for row in self._store.read(lambda sql: _limited(sql, query, limit))]

    def totals_by_client(self, limit: Optional[int] = None) -> list[ClientTotals]:
        """Per client_id of the routes the work was done on, by client id; with `limit`, only the
        `limit` clients with the most tokens."""
        order = "i.client_id" if limit is None else "SUM(w.prefill_tokens + w.decode_tokens) DESC, i.client_id"
        query = ("SELECT i.client_id, COUNT(DISTINCT w.session_id), CAST(SUM(w.prefill_tokens) AS BIGINT), "
                 f"CAST(SUM(w.decode_tokens) AS BIGINT) FROM {_CREDITED} AS w JOIN issued AS i "
                 "ON i.session_id = w.session_id AND i.epoch = w.epoch AND i.node_id = w.node_id "
                 f"GROUP BY i.client_id ORDER BY {order}")
        return [ClientTotals(*row) for row in self._store.read(lambda sql: _limited(sql, query, limit))]

    def overall(self) -> tuple[int, int, int]:
        """(distinct route sessions, prefill tokens, decode tokens) over all work counted."""
        return self._store.read(lambda sql: tuple(sql.execute(
            "SELECT COUNT(DISTINCT session_id), CAST(COALESCE(SUM(prefill_tokens), 0) AS BIGINT), "
            f"CAST(COALESCE(SUM(decode_tokens), 0) AS BIGINT) FROM {_CREDITED} AS w").fetchone()))

    def record_audit(self, audit_id: int, session_id: str, epoch: int, model: str, passed: bool, culprit: str,
                     checked: int, evidence: str, enforce: bool = True) -> None:
        """An audit's verdict (ADR 0008); a failed one with `enforce` (its quorum of verifiers
        reached, ADR 0016) also quarantines `culprit` and withholds its credit for the audited
        (session, epoch), in the same committed transaction."""
        now = time.time()

        def write(sql: Sql) -> None:
            sql.execute("INSERT INTO audits (audit_id, session_id, epoch, model, passed, culprit, checked, evidence, "
                        "reported_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (audit_id) DO UPDATE SET "
                        "session_id = excluded.session_id, epoch = excluded.epoch, model = excluded.model, "
                        "passed = excluded.passed, culprit = excluded.culprit, checked = excluded.checked, "
                        "evidence = excluded.evidence, reported_at = excluded.reported_at",
                        (audit_id, session_id, epoch, model, int(passed), culprit, checked, evidence, now))
            if not passed and enforce:
                sql.execute("INSERT INTO quarantine (node_id, audit_id, at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                            (culprit, audit_id, now))
                sql.execute("INSERT INTO withheld (session_id, epoch, node_id, audit_id) VALUES (?, ?, ?, ?) "
                            "ON CONFLICT DO NOTHING", (session_id, epoch, culprit, audit_id))
        self._store.write(write)

    def quarantined(self) -> set[str]:
        """Nodes that failed an audit."""
        return self._store.read(lambda sql: {row[0] for row in sql.execute("SELECT node_id FROM quarantine")})

    def release(self, node_id: str) -> int:
        """The operator's release of a quarantined node (ADR 0016): it may be routed again (a
        running tracker takes this from the ledger within QUARANTINE_SYNC_SECONDS) and the credit
        its quarantine withheld is counted again. How many quarantine and withheld rows went."""
        def write(sql: Sql) -> int:
            removed = sql.execute("DELETE FROM quarantine WHERE node_id = ?", (node_id,)).rowcount
            return removed + sql.execute("DELETE FROM withheld WHERE node_id = ?", (node_id,)).rowcount
        return self._store.write(write)

    def audits(self) -> list[dict]:
        """Every recorded verdict, oldest first (for the status page and the evidence)."""
        rows = self._store.read(lambda sql: sql.execute(
            "SELECT audit_id, session_id, epoch, model, passed, culprit, checked, evidence "
            "FROM audits ORDER BY reported_at").fetchall())
        keys = ("audit_id", "session_id", "epoch", "model", "passed", "culprit", "checked", "evidence")
        return [dict(zip(keys, row)) for row in rows]

    def withheld_tokens(self, node_id: str) -> int:
        """Tokens `node_id` reported for triples a failed audit withheld."""
        return self._store.read(lambda sql: sql.execute(
            "SELECT CAST(COALESCE(SUM(w.prefill_tokens + w.decode_tokens), 0) AS BIGINT) FROM work AS w "
            "JOIN withheld AS h ON h.session_id = w.session_id AND h.epoch = w.epoch AND h.node_id = w.node_id "
            "WHERE w.node_id = ?", (node_id,)).fetchone()[0])

    def record_delivery(self, session_id: str, prompt_tokens: int, tokens: int) -> None:
        """What the client of `session_id` says it received (CloseRoute); from then on each hop's
        credit for the session is at most `prompt_tokens + tokens` per epoch. The first report
        stands (a retried CloseRoute repeats it)."""
        if not (0 <= prompt_tokens <= MAX_SQL_INTEGER and 0 <= tokens <= MAX_SQL_INTEGER):
            raise ValueError("delivery counts out of range")
        now = time.time()
        self._store.write(lambda sql: sql.execute(
            "INSERT INTO deliveries (session_id, prompt_tokens, tokens, reported_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT DO NOTHING", (session_id, prompt_tokens, tokens, now)))

    def last_work_at(self, session_id: str, epoch: int) -> Optional[float]:
        """When work was last recorded for any hop of (session, epoch) (Unix time), or None."""
        return self._store.read(lambda sql: sql.execute(
            "SELECT MAX(recorded_at) FROM work WHERE session_id = ? AND epoch = ?", (session_id, epoch)).fetchone()[0])

    def enroll(self, enrolment: Enrolment) -> None:
        """Enrolls a key for a role (ADR 0017); enrolling it again replaces its name and quota."""
        self._store.write(lambda sql: sql.execute(
            "INSERT INTO principals (public_key, role, name, max_routes, enrolled_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (public_key, role) DO UPDATE SET name = excluded.name, max_routes = excluded.max_routes, "
            "enrolled_at = excluded.enrolled_at",
            (enrolment.public_key.hex(), enrolment.role, enrolment.name, enrolment.max_routes, enrolment.enrolled_at)))

    def revoke(self, public_key: bytes) -> int:
        """Removes every enrolment of `public_key`; how many there were."""
        return self._store.write(lambda sql: sql.execute(
            "DELETE FROM principals WHERE public_key = ?", (public_key.hex(),)).rowcount)

    def enrolments(self) -> list[Enrolment]:
        """Every enrolled key, oldest first."""
        rows = self._store.read(lambda sql: sql.execute(
            "SELECT public_key, role, name, max_routes, enrolled_at FROM principals ORDER BY enrolled_at").fetchall())
        return [Enrolment(bytes.fromhex(key), role, name, max_routes, at) for key, role, name, max_routes, at in rows]

    def add_invite(self, record: InviteRecord) -> None:
        self._store.write(lambda sql: invites.add(sql, record))

    def invites(self) -> list[InviteRecord]:
        """Every invite, newest first."""
        return self._store.read(invites.listed)

    def revoke_invite(self, invite_id: str) -> int:
        """1 when the invite was open (now revoked), 0 when there was none to revoke."""
        return self._store.write(lambda sql: invites.revoke(sql, invite_id, time.time()))

    def redeem_invite(self, invite_id: str, secret: bytes, public_key: bytes) -> str:
        """The invite's role, bound to `public_key` (invites.redeem); InviteRefused otherwise."""
        return self._store.write(lambda sql: invites.redeem(sql, invite_id, secret, public_key, time.time(),
                                                            self._store.row_lock))

    def sessions(self) -> set[str]:
        return self._store.read(lambda sql: {row[0] for row in sql.execute("SELECT DISTINCT session_id FROM work")})

    def close(self) -> None:
        self._store.close()


def _issuable(e: WorkEntry) -> bool:
    """Whether a tracker could have issued the entry's triple (a key the database can hold)."""
    return (e.session is not None and bool(e.session.session_id) and "\x00" not in e.session.session_id
            and 0 <= e.session.epoch <= MAX_SQL_INTEGER)


def _checked_row(node_id: str, report_id: int, e: WorkEntry, allowances: dict[tuple[str, int], _Allowance],
                 now: float) -> tuple:
    """The work row of `e`, counted against its allowance; raises WorkRefused."""
    if e.session is None or not e.session.session_id:
        raise WorkRefused(StatusCode.INVALID_ARGUMENT, "work entry without a route session")
    allowance = allowances.get((e.session.session_id, e.session.epoch))
    if allowance is None:
        raise WorkRefused(StatusCode.PERMISSION_DENIED, f"session {e.session.session_id!r} epoch {e.session.epoch} "
                                                        f"was not issued to node {node_id!r}")
    tokens = e.prefill_tokens + e.decode_tokens
    if e.prefill_tokens < 0 or e.decode_tokens < 0 or allowance.counted + tokens > allowance.cap:
        raise WorkRefused(StatusCode.INVALID_ARGUMENT,
                          f"{tokens} more tokens for session {e.session.session_id!r} epoch {e.session.epoch} exceed "
                          f"its cap of {allowance.cap} ({allowance.counted} already counted)")
    allowance.counted += tokens
    return (node_id, report_id, e.session.session_id, e.session.epoch, e.prefill_tokens, e.decode_tokens, now)


def _limited(sql: Sql, query: str, limit: Optional[int]) -> list[tuple]:
    return sql.execute(query + " LIMIT ?", (limit,)).fetchall() if limit is not None else sql.execute(query).fetchall()


def add_location_arguments(parser: argparse.ArgumentParser) -> None:
    """--db or --ledger: where a command line finds the tracker's ledger."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", type=Path, help="the SQLite ledger file")
    where.add_argument("--ledger", metavar="URL", help="the PostgreSQL ledger: postgresql://USER@HOST:PORT/DATABASE")


def open_ledger(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Ledger:
    """The ledger add_location_arguments named; a usage error (exit 2) when there is none."""
    if args.db is not None and not args.db.exists():
        parser.error(f"no ledger at {args.db}")
    if args.ledger is not None and not is_postgres_url(args.ledger):
        parser.error("--ledger takes a postgresql:// URL (a SQLite file is --db)")
    try:
        return Ledger(args.db if args.db is not None else args.ledger)
    except LedgerUnavailable as err:
        parser.error(str(err))
        raise  # parser.error exits


def main() -> None:
    parser = argparse.ArgumentParser(description="Read the tracker's work ledger.")
    add_location_arguments(parser)
    parser.add_argument("command", choices=["totals", "release"],
                        help="totals [by-node|by-client]: tokens and sessions per node (default) or per client_id "
                        "of the routes; release NODE_ID: end a node's quarantine (the operator's call, ADR 0016)")
    parser.add_argument("what", nargs="?", help="by-node or by-client (totals); the node id (release)")
    args = parser.parse_args()
    if args.command == "totals" and args.what not in (None, "by-node", "by-client"):
        parser.error(f"totals takes by-node or by-client, not {args.what!r}")
    if args.command == "release" and not args.what:
        parser.error("release takes the quarantined node's id")
    ledger = open_ledger(parser, args)
    if args.command == "release":
        quarantined = args.what in ledger.quarantined()
        removed = ledger.release(args.what)
        print(json.dumps({"node_id": args.what, "was_quarantined": quarantined, "rows_removed": removed}))
        ledger.close()
        if not quarantined:
            parser.exit(1, f"{args.what} was not quarantined\n")
        return
    totals = ledger.totals() if args.what in (None, "by-node") else ledger.totals_by_client()
    print(json.dumps([dataclasses.asdict(t) for t in totals], indent=2))
    ledger.close()


if __name__ == "__main__":
    main()
