"""Ledger, on both stores (a SQLite file; a PostgreSQL database on a real server started by
postgres_server.py, skipped with the reason where it cannot start): only issued triples count,
once per report, within their cap; totals survive reopen; work is attributed per client; the
command line prints totals. SQLite only: an old ledger gains the client column. Issue 34: both
stores have one schema (tables, columns, keys, CHECKs, foreign keys, indexes), whose CHECKs and
foreign keys refuse a row the rules would; an old SQLite file moves to it keeping every row, or
is refused unchanged when a row breaks it. Several trackers on one PostgreSQL database:
ledger_postgres_test.py."""

import json
import re
import sqlite3
import sys
import threading
import time

import psycopg
import pytest

from meshnet.tracker.ledger import ledger_schema
from meshnet.tracker.ledger.ledger import ClientTotals, Ledger, NodeTotals, WorkRefused
from meshnet.tracker.ledger.ledger import main as ledger_main
from meshnet.tracker.ledger.ledger_fixtures import db, postgres  # noqa: F401 (pytest fixtures)
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


def sqlite_schema(path) -> dict:
    """table -> (columns, primary key, not-null columns, foreign keys, CHECKs), and the indexes."""
    db = sqlite3.connect(path)
    tables = {}
    for name, sql in db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall():
        info = db.execute(f"PRAGMA table_info({name})").fetchall()  # cid, name, type, notnull, default, pk
        key = tuple(row[1] for row in sorted((row for row in info if row[5]), key=lambda row: row[5]))
        parents: dict[int, tuple[str, list[str]]] = {}
        for row in db.execute(f"PRAGMA foreign_key_list({name})"):  # id, seq, parent, from, to, ...
            parents.setdefault(row[0], (row[2], []))[1].append(row[3])
        tables[name] = ([row[1] for row in info], key, {row[1] for row in info if row[3]} | set(key),
                        sorted((parent, tuple(columns)) for parent, columns in parents.values()),
                        sorted(_condition(check) for check in re.findall(r"CHECK \(([^()]*)\)", sql)))
    indexes = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")}
    db.close()
    return {"tables": tables, "indexes": indexes}


def postgres_schema(url: str) -> dict:
    """As sqlite_schema, of the schema first on `url`'s search path."""
    with psycopg.connect(url) as conn:
        columns = conn.execute("SELECT table_name, column_name, is_nullable FROM information_schema.columns "
                               "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position").fetchall()
        constraints = conn.execute("SELECT conrelid::regclass::text, contype, pg_get_constraintdef(oid) "
                                   "FROM pg_constraint WHERE connamespace = current_schema()::regnamespace "
                                   "AND contype IN ('p', 'f', 'c')").fetchall()
        indexes = {row[0] for row in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = "
                                                  "current_schema() AND indexname NOT LIKE '%\\_pkey'")}
    tables = {}
    for table in {row[0] for row in columns}:
        mine = [c for c in constraints if c[0] == table]
        (key,) = [tuple(re.fullmatch(r"PRIMARY KEY \((.*)\)", c[2]).group(1).split(", ")) for c in mine if c[1] == "p"]
        parents = [re.fullmatch(r"FOREIGN KEY \((.*)\) REFERENCES (\w+)\(.*\)", c[2]).groups()
                   for c in mine if c[1] == "f"]
        tables[table] = ([row[1] for row in columns if row[0] == table], key,
                         {row[1] for row in columns if row[0] == table and row[2] == "NO"},
                         sorted((parent, tuple(cols.split(", "))) for cols, parent in parents),
                         sorted(_condition(c[2].removeprefix("CHECK ")) for c in mine if c[1] == "c"))
    return {"tables": tables, "indexes": indexes}


def _condition(check: str) -> str:
    return re.sub(r"[()\s]", "", check)


def test_both_stores_have_one_schema(postgres, tmp_path):
    """Issue 34: the SQLite file relied on ledger.py alone while PostgreSQL had CHECKs, foreign
    keys and a `reports` table. Both are now made from ledger_schema.py; this fails on any drift."""
    url = postgres.new_schema()
    Ledger(tmp_path / "ledger.db").close()
    Ledger(url).close()
    on_sqlite, on_postgres = sqlite_schema(tmp_path / "ledger.db"), postgres_schema(url)
    assert on_sqlite == on_postgres
    assert sorted(on_sqlite["tables"]) == sorted(ledger_schema.TABLE_NAMES)
    assert on_sqlite["tables"]["work"][3] == [("issued", ("session_id", "epoch", "node_id")),
                                              ("reports", ("node_id", "report_id"))]
    assert "report_id>0" in on_sqlite["tables"]["reports"][4]


def test_the_schema_refuses_rows_that_break_the_rules(opened, db):
    """What ledger.py never writes, the database refuses too (a CHECK or a foreign key)."""
    ledger = opened(db)
    ledger.issue([("s", 1, "a")], 100)
    assert ledger.record("a", 1, [WorkEntry(RouteSession("s", 1), 1, 1)]) == 1
    store = ledger._store  # noqa: SLF001 - the test writes past the ledger's rules
    refused = (sqlite3.IntegrityError, psycopg.errors.IntegrityError)
    for statement, row in [
        ("INSERT INTO work (node_id, report_id, session_id, epoch, prefill_tokens, decode_tokens, recorded_at) "
         "VALUES (?, ?, ?, ?, ?, ?, ?)", ("a", 2, "s", 1, 1, 1, 0.0)),  # a report never claimed
        ("INSERT INTO work (node_id, report_id, session_id, epoch, prefill_tokens, decode_tokens, recorded_at) "
         "VALUES (?, ?, ?, ?, ?, ?, ?)", ("a", 1, "s", 2, 1, 1, 0.0)),  # a triple never issued
        ("INSERT INTO work (node_id, report_id, session_id, epoch, prefill_tokens, decode_tokens, recorded_at) "
         "VALUES (?, ?, ?, ?, ?, ?, ?)", ("a", 1, "s", 1, -1, 1, 0.0)),
        ("INSERT INTO issued (session_id, epoch, node_id, max_tokens, issued_at) VALUES (?, ?, ?, ?, ?)",
         ("t", 1, "a", -1, 0.0)),
        ("INSERT INTO reports (node_id, report_id, recorded_at) VALUES (?, ?, ?)", ("a", 0, 0.0)),
        ("INSERT INTO deliveries (session_id, prompt_tokens, tokens, reported_at) VALUES (?, ?, ?, ?)",
         ("s", 1, -1, 0.0)),
    ]:
        with pytest.raises(refused):
            store.write(lambda sql: sql.execute(statement, row))  # noqa: B023 - called at once
    assert ledger.totals() == [NodeTotals("a", 1, 1, 1)]


# The SQLite ledger's schema before issue 34 (schema version 0), and a row in each of its tables.
SCHEMA_0 = """
    CREATE TABLE issued (session_id TEXT NOT NULL, epoch INTEGER NOT NULL, node_id TEXT NOT NULL,
                         max_tokens INTEGER NOT NULL, issued_at REAL NOT NULL, client_id TEXT NOT NULL DEFAULT '',
                         PRIMARY KEY (session_id, epoch, node_id));
    CREATE TABLE work (id INTEGER PRIMARY KEY, node_id TEXT NOT NULL, report_id INTEGER NOT NULL,
                       session_id TEXT NOT NULL, epoch INTEGER NOT NULL, prefill_tokens INTEGER NOT NULL,
                       decode_tokens INTEGER NOT NULL, recorded_at REAL NOT NULL);
    CREATE INDEX work_by_node ON work (node_id);
    CREATE INDEX work_by_report ON work (node_id, report_id);
    CREATE INDEX work_by_triple ON work (session_id, epoch, node_id);
    CREATE TABLE deliveries (session_id TEXT PRIMARY KEY, prompt_tokens INTEGER NOT NULL, tokens INTEGER NOT NULL,
                             reported_at REAL NOT NULL);
    CREATE TABLE audits (audit_id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, epoch INTEGER NOT NULL,
                         model TEXT NOT NULL, passed INTEGER NOT NULL, culprit TEXT NOT NULL, checked INTEGER NOT NULL,
                         evidence TEXT NOT NULL, reported_at REAL NOT NULL);
    CREATE TABLE quarantine (node_id TEXT PRIMARY KEY, audit_id INTEGER NOT NULL, at REAL NOT NULL);
    CREATE TABLE withheld (session_id TEXT NOT NULL, epoch INTEGER NOT NULL, node_id TEXT NOT NULL,
                           audit_id INTEGER NOT NULL, PRIMARY KEY (session_id, epoch, node_id));
    CREATE TABLE principals (public_key TEXT NOT NULL, role TEXT NOT NULL, name TEXT NOT NULL,
                             max_routes INTEGER NOT NULL, enrolled_at REAL NOT NULL, PRIMARY KEY (public_key, role));
    INSERT INTO issued VALUES ('s', 1, 'a', 100, 1.0, 'key:alice'), ('s', 1, 'b', 100, 1.0, 'key:alice'),
                              ('t', 1, 'a', 50, 2.0, '');
    INSERT INTO work VALUES (1, 'a', 7, 's', 1, 10, 5, 3.0), (2, 'a', 7, 't', 1, 4, 4, 3.5),
                            (3, 'b', 7, 's', 1, 10, 6, 4.0), (4, 'a', 8, 's', 1, 0, 20, 5.0);
    INSERT INTO deliveries VALUES ('t', 2, 3, 6.0);
    INSERT INTO audits VALUES (9, 's', 1, 'smol', 0, 'b', 6, '{}', 7.0);
    INSERT INTO quarantine VALUES ('b', 9, 7.0);
    INSERT INTO withheld VALUES ('s', 1, 'b', 9);
    INSERT INTO principals VALUES ('ab', 'verifier', 'v1', 0, 8.0);
"""


def _rows(path) -> dict[str, list[tuple]]:
    db = sqlite3.connect(path)
    rows = {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall()) for (t,) in
            db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}
    db.close()
    return rows


def test_an_old_sqlite_ledger_moves_to_the_schema_keeping_every_row(opened, tmp_path):
    """A file written before issue 34 is moved to the one schema on open, in one transaction:
    every row of every table is kept, each counted report gets its `reports` row (so a repeated
    report is still counted once), and the CHECKs and foreign keys hold from then on."""
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(SCHEMA_0)
    old.close()
    before = _rows(path)
    ledger = opened(path)
    assert ledger.totals() == [NodeTotals("a", 2, 14, 26)]  # b's credit withheld; t capped by its delivery
    assert ledger.record("a", 7, [WorkEntry(RouteSession("s", 1), 1, 1)]) == 0  # counted before the move
    assert ledger.record("a", 9, [WorkEntry(RouteSession("s", 1), 1, 1)]) == 1
    with pytest.raises(WorkRefused):
        ledger.record("a", 10, [WorkEntry(RouteSession("s", 1), 60, 10)])  # 37 + 70 over the cap of 100
    ledger.close()
    after = _rows(path)
    counted = after["work"].pop()  # the report counted after the move
    assert counted[:7] == (5, "a", 9, "s", 1, 1, 1)
    assert after.pop("reports") == [("a", 7, 3.0), ("a", 8, 5.0), ("a", 9, counted[7]), ("b", 7, 4.0)]
    assert (after.pop("invites"), after.pop("redemptions")) == ([], [])  # tables newer than the file, made empty
    assert after == before
    assert sqlite_schema(path) == sqlite_schema(_new_file(tmp_path))
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == ledger_schema.SCHEMA_VERSION
    reopened = opened(path)  # moved once: reopening finds the schema
    assert reopened.totals() == [NodeTotals("a", 2, 15, 27)]


def _new_file(tmp_path):
    path = tmp_path / "new.db"
    Ledger(path).close()
    return path


def test_an_old_sqlite_ledger_whose_rows_break_the_schema_is_refused_unchanged(tmp_path):
    """A row the new schema refuses (here work for a triple never issued, which no release of the
    ledger wrote, but a hand edit could): the open is refused with the reason and what to do,
    and the file is left exactly as it was."""
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(SCHEMA_0 + "INSERT INTO work VALUES (5, 'c', 1, 'nowhere', 1, 1, 1, 9.0);")
    old.close()
    before = _rows(path)
    with pytest.raises(SystemExit) as refused:
        Ledger(path)
    assert "FOREIGN KEY constraint failed" in str(refused.value) and "nothing was changed" in str(refused.value)
    assert _rows(path) == before
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 0
