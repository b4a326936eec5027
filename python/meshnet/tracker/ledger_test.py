"""Ledger, on both stores (a SQLite file; a PostgreSQL database on a real server started by
postgres_server.py, skipped with the reason where it cannot start): only issued triples count,
once per report, within their cap; totals survive reopen; work is attributed per client; the
command line prints totals. SQLite only: an old ledger gains the client column. Several trackers
on one PostgreSQL database: ledger_postgres_test.py."""

import json
import sqlite3
import sys
import threading
import time

import pytest

from meshnet.tracker.ledger import ClientTotals, Ledger, NodeTotals, WorkRefused
from meshnet.tracker.ledger import main as ledger_main
from meshnet.tracker.ledger_fixtures import db, postgres  # noqa: F401 (pytest fixtures)
from meshnet.wire.seam import RouteSession
from meshnet.wire.status import StatusCode
from meshnet.wire.tracker import WorkEntry

CAP = 1 << 24  # the registry's MAX_EXPECTED_TOKENS: the largest cap a route can have


@pytest.fixture
def opened():
    """Ledger(location), closed after the test."""
    ledgers = []

    def open_ledger(location):
        ledgers.append(Ledger(location))
        return ledgers[-1]
    yield open_ledger
    for ledger in ledgers:
        ledger.close()


def test_record_totals_and_reopen(opened, db):
    ledger = opened(db)
    ledger.issue([("s1", 1, "a"), ("s1", 1, "b"), ("s1", 2, "a"), ("s2", 1, "a")], 200)
    assert ledger.record("a", 1, [WorkEntry(RouteSession("s1", 1), 100, 10), WorkEntry(RouteSession("s2", 1), 5, 1)]) == 2
    assert ledger.record("a", 2, [WorkEntry(RouteSession("s1", 2), 0, 7)]) == 1
    assert ledger.record("b", 1, [WorkEntry(RouteSession("s1", 1), 100, 10)]) == 1
    ledger.close()
    reopened = opened(db)
    assert reopened.totals() == [NodeTotals("a", 2, 105, 18), NodeTotals("b", 1, 100, 10)]
    assert reopened.sessions() == {"s1", "s2"}


def test_a_repeated_report_is_acknowledged_and_not_counted_again(opened, db):
    ledger = opened(db)
    ledger.issue([("s", 1, "a")], 100)
    entry = [WorkEntry(RouteSession("s", 1), 10, 5)]
    assert ledger.record("a", 7, entry) == 1
    assert ledger.record("a", 7, entry) == 0
    assert ledger.record("a", 8, entry) == 1  # a new report of more work counts
    assert ledger.totals() == [NodeTotals("a", 1, 20, 10)]


@pytest.mark.parametrize("node,entry,code", [
    ("a", WorkEntry(RouteSession("unissued", 1), 1, 1), StatusCode.PERMISSION_DENIED),
    ("a", WorkEntry(RouteSession("s", 2), 1, 1), StatusCode.PERMISSION_DENIED),  # another epoch
    ("a", WorkEntry(RouteSession("s", (1 << 64) - 1), 1, 1), StatusCode.PERMISSION_DENIED),  # the wire's largest
    ("a", WorkEntry(RouteSession("s\x00", 1), 1, 1), StatusCode.PERMISSION_DENIED),  # no database key holds NUL
    ("intruder", WorkEntry(RouteSession("s", 1), 1, 1), StatusCode.PERMISSION_DENIED),  # not on the route
    ("a", WorkEntry(RouteSession("s", 1), 90, 11), StatusCode.INVALID_ARGUMENT),  # over the cap of 100
    ("a", WorkEntry(RouteSession("s", 1), (1 << 62) - 1, (1 << 62) - 1), StatusCode.INVALID_ARGUMENT),
    ("a", WorkEntry(RouteSession("s", 1), -1, 0), StatusCode.INVALID_ARGUMENT),
    ("a", WorkEntry(None, 1, 1), StatusCode.INVALID_ARGUMENT),
    ("a", WorkEntry(RouteSession("", 1), 1, 1), StatusCode.INVALID_ARGUMENT),
])
def test_refused_reports_write_nothing(opened, db, node, entry, code):
    ledger = opened(db)
    ledger.issue([("s", 1, "a")], 100)
    with pytest.raises(WorkRefused) as err:
        ledger.record(node, 1, [WorkEntry(RouteSession("s", 1), 1, 1), entry])
    assert err.value.code == code
    assert ledger.totals() == []


def test_entries_of_one_report_count_together_against_their_cap(opened, db):
    ledger = opened(db)
    ledger.issue([("s", 1, "a")], 100)
    half = WorkEntry(RouteSession("s", 1), 30, 30)
    with pytest.raises(WorkRefused) as err:
        ledger.record("a", 1, [half, half])  # 120 tokens on one triple capped at 100
    assert err.value.code == StatusCode.INVALID_ARGUMENT and "(60 already counted)" in str(err.value)
    assert ledger.totals() == []
    assert ledger.record("a", 1, [half, WorkEntry(RouteSession("s", 1), 20, 20)]) == 2  # exactly the cap
    assert ledger.totals() == [NodeTotals("a", 1, 50, 50)]


def test_maximum_size_work_keeps_totals_exact(opened, db):
    """Three reports at the largest cap a route can have (the old ledger's SUM overflowed)."""
    ledger = opened(db)
    for i in range(3):
        ledger.issue([(f"s{i}", 1, "a")], CAP)
        assert ledger.record("a", i + 1, [WorkEntry(RouteSession(f"s{i}", 1), CAP - 1, 1)]) == 1
    assert ledger.totals() == [NodeTotals("a", 3, 3 * (CAP - 1), 3)]
    with pytest.raises(WorkRefused):
        ledger.record("a", 9, [WorkEntry(RouteSession("s0", 1), 1, 0)])  # the triple is full
    with pytest.raises(WorkRefused):
        ledger.record("a", 0, [WorkEntry(RouteSession("s0", 1), 0, 0)])  # report ids start at 1


def test_work_is_attributed_to_the_client_of_its_route(opened, db):
    ledger = opened(db)
    ledger.issue([("s1", 1, "a"), ("s1", 1, "b")], 100, client_id="key:alice")
    ledger.issue([("s1", 2, "a")], 100, client_id="key:alice")  # a failover keeps the route's client
    ledger.issue([("s2", 1, "a")], 100, client_id="key:bob")
    ledger.issue([("s3", 1, "b")], 100)  # a route opened without a client id
    ledger.record("a", 1, [WorkEntry(RouteSession("s1", 1), 10, 1), WorkEntry(RouteSession("s1", 2), 10, 4),
                           WorkEntry(RouteSession("s2", 1), 7, 2)])
    ledger.record("b", 1, [WorkEntry(RouteSession("s1", 1), 10, 5), WorkEntry(RouteSession("s3", 1), 3, 3)])
    assert ledger.totals_by_client() == [ClientTotals("", 1, 3, 3), ClientTotals("key:alice", 1, 30, 10),
                                         ClientTotals("key:bob", 1, 7, 2)]
    assert ledger.totals_by_client(limit=1) == [ClientTotals("key:alice", 1, 30, 10)]  # the most tokens first
    assert ledger.totals(limit=1) == [NodeTotals("a", 2, 27, 7)]
    assert ledger.overall() == (3, 40, 15)


def test_credit_is_capped_by_what_the_client_says_was_delivered(opened, db):
    """Issue 35, finding 7: a session cancelled after 5 tokens was credited 205 (its hops may
    report up to the route's budget). Once its client reports the delivery at CloseRoute, each
    (session, epoch, node) is credited at most prompt + delivered tokens, prefill first; a session
    without a report, or whose work is within its delivery, is credited as reported."""
    ledger = opened(db)
    ledger.issue([("cut", 1, "a"), ("cut", 1, "b"), ("cut", 2, "a")], 205, client_id="key:alice")
    ledger.issue([("full", 1, "a")], 205, client_id="key:bob")
    ledger.issue([("open", 1, "b")], 205, client_id="key:carol")
    ledger.record("a", 1, [WorkEntry(RouteSession("cut", 1), 10, 195),  # claims the whole budget
                           WorkEntry(RouteSession("cut", 2), 14, 1),  # the replay after a failover, within it
                           WorkEntry(RouteSession("full", 1), 10, 20)])
    ledger.record("b", 1, [WorkEntry(RouteSession("cut", 1), 20, 3),  # more prefill than the cap leaves
                           WorkEntry(RouteSession("open", 1), 10, 195)])
    ledger.record_delivery("cut", 10, 5)  # the client got 5 tokens of a 10-token prompt, then cancelled
    ledger.record_delivery("cut", 10, 200)  # a repeated close does not move the first report
    ledger.record_delivery("full", 10, 21)
    assert ledger.totals() == [NodeTotals("a", 2, 10 + 14 + 10, 5 + 1 + 20), NodeTotals("b", 2, 15 + 10, 195)]
    assert ledger.totals_by_client() == [ClientTotals("key:alice", 1, 10 + 14 + 15, 5 + 1),
                                         ClientTotals("key:bob", 1, 10, 20), ClientTotals("key:carol", 1, 10, 195)]
    assert ledger.overall() == (3, 59, 221)
    with pytest.raises(ValueError):
        ledger.record_delivery("full", -1, 0)


def test_an_old_ledger_gains_the_client_column_and_keeps_its_work(opened, tmp_path):
    """A ledger written before per-client attribution: its `issued` table has no client_id."""
    db = tmp_path / "old.db"
    old = sqlite3.connect(db)
    old.executescript("""
        CREATE TABLE issued (session_id TEXT NOT NULL, epoch INTEGER NOT NULL, node_id TEXT NOT NULL,
                             max_tokens INTEGER NOT NULL, issued_at REAL NOT NULL,
                             PRIMARY KEY (session_id, epoch, node_id));
        CREATE TABLE work (id INTEGER PRIMARY KEY, node_id TEXT NOT NULL, report_id INTEGER NOT NULL,
                           session_id TEXT NOT NULL, epoch INTEGER NOT NULL, prefill_tokens INTEGER NOT NULL,
                           decode_tokens INTEGER NOT NULL, recorded_at REAL NOT NULL);
        INSERT INTO issued VALUES ('old', 1, 'a', 100, 0.0);
        INSERT INTO work VALUES (1, 'a', 1, 'old', 1, 20, 5, 0.0);
    """)
    old.commit()
    old.close()
    ledger = opened(db)
    assert ledger.totals() == [NodeTotals("a", 1, 20, 5)]
    assert ledger.totals_by_client() == [ClientTotals("", 1, 20, 5)]
    ledger.issue([("new", 1, "a")], 100, client_id="key:carol")
    assert ledger.record("a", 2, [WorkEntry(RouteSession("new", 1), 1, 1)]) == 1
    ledger.close()
    reopened = opened(db)  # the migration ran once; reopening finds the column
    assert reopened.totals_by_client() == [ClientTotals("", 1, 20, 5), ClientTotals("key:carol", 1, 1, 1)]


def test_the_command_line_prints_totals_by_client(opened, db, capsys, monkeypatch):
    ledger = opened(db)
    ledger.issue([("s", 1, "a")], 100, client_id="key:alice")
    ledger.record("a", 1, [WorkEntry(RouteSession("s", 1), 4, 2)])
    ledger.close()
    where = ["--ledger", db] if isinstance(db, str) else ["--db", str(db)]
    monkeypatch.setattr(sys, "argv", ["ledger", *where, "totals", "by-client"])
    ledger_main()
    assert json.loads(capsys.readouterr().out) == [
        {"client_id": "key:alice", "sessions": 1, "prefill_tokens": 4, "decode_tokens": 2}]
    monkeypatch.setattr(sys, "argv", ["ledger", *where, "totals"])
    ledger_main()
    assert json.loads(capsys.readouterr().out) == [
        {"node_id": "a", "sessions": 1, "prefill_tokens": 4, "decode_tokens": 2}]


def test_the_operator_releases_a_quarantined_node_from_the_command_line(opened, db, capsys, monkeypatch):
    """ADR 0016: a quarantine has a release path; the node's withheld credit counts again."""
    ledger = opened(db)
    ledger.issue([("s", 1, "a")], 100)
    ledger.record("a", 1, [WorkEntry(RouteSession("s", 1), 4, 2)])
    ledger.record_audit(1, "s", 1, "smol", False, "a", 6, "{}")
    assert ledger.quarantined() == {"a"} and ledger.totals() == []
    ledger.close()
    where = ["--ledger", db] if isinstance(db, str) else ["--db", str(db)]
    monkeypatch.setattr(sys, "argv", ["ledger", *where, "release", "a"])
    ledger_main()
    assert json.loads(capsys.readouterr().out) == {"node_id": "a", "was_quarantined": True, "rows_removed": 2}
    monkeypatch.setattr(sys, "argv", ["ledger", *where, "release", "a"])
    with pytest.raises(SystemExit) as exit_:
        ledger_main()
    assert exit_.value.code == 1 and "was not quarantined" in capsys.readouterr().err
    reopened = opened(db)
    assert reopened.quarantined() == set() and reopened.totals() == [NodeTotals("a", 1, 4, 2)]


def test_concurrent_writes_commit_together_and_a_refused_one_alone_is_undone(tmp_path):
    # SQLite's group commit: writes that queue while a transaction commits share the next one;
    # each keeps its own answer, and a refused report inside the group writes nothing.
    ledger = Ledger(tmp_path / "ledger.db")
    store = ledger._store  # noqa: SLF001 - the test holds the connection's lock to make writers queue
    commits = []
    store._db.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)  # noqa: SLF001
    ledger.issue([("s", 1, f"n{i}") for i in range(8)], 100)
    writers, answers = [], {}

    def report(i: int) -> None:
        entries = [WorkEntry(RouteSession("s", 1), 1000 if i == 3 else 5, 1)]  # 3 is over its cap of 100
        try:
            answers[i] = ledger.record(f"n{i}", 1, entries)
        except WorkRefused as err:
            answers[i] = err.code

    commits.clear()
    with store._lock:  # noqa: SLF001 - a commit in progress: every report queues behind it
        for i in range(8):
            writers.append(threading.Thread(target=report, args=(i,)))
            writers[-1].start()
        deadline = time.monotonic() + 10
        while len(store._queue) < 8 and time.monotonic() < deadline:  # noqa: SLF001
            time.sleep(0.01)
    for w in writers:
        w.join(10)
    assert answers == {i: (StatusCode.INVALID_ARGUMENT if i == 3 else 1) for i in range(8)}, answers
    assert len(commits) == 1  # the eight reports in one transaction
    totals = {t.node_id: (t.prefill_tokens, t.decode_tokens) for t in ledger.totals()}
    assert totals == {f"n{i}": (5, 1) for i in range(8) if i != 3}
    assert ledger.record("n0", 1, [WorkEntry(RouteSession("s", 1), 5, 1)]) == 0  # counted once
    ledger.close()
