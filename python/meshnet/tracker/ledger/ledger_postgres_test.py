"""Several trackers on one PostgreSQL ledger (issue 20), on a real server (postgres_server.py;
skipped with the reason where it cannot start): the same reports recorded by three trackers at
once from threads count exactly once and caps hold; the same triple issued by several trackers is
one row; refused reports raise their exact code, claim nothing, and leave an honest report beside
them counted; the schema itself refuses duplicates; acknowledged work survives a clean restart
and a crash of the server, across which the same Ledger reconnects; errors never show the
password. The behaviours both stores share are in ledger_test.py."""

from __future__ import annotations

import random
import threading
from collections import Counter

import psycopg
import psycopg.errors
import pytest

from meshnet.process import free_port
from meshnet.tracker.ledger.ledger import Ledger, NodeTotals, WorkRefused
from meshnet.tracker.ledger.ledger import main as ledger_main
from meshnet.tracker.ledger.ledger_postgres import redacted
from meshnet.tracker.ledger.ledger_store import LedgerUnavailable
from meshnet.tracker.ledger.postgres_server import server_or_skip
from meshnet.wire.seam import RouteSession
from meshnet.wire.status import StatusCode
from meshnet.wire.tracker import WorkEntry

TRACKERS = 3
THREADS_PER_TRACKER = 2


@pytest.fixture(scope="module")
def postgres():
    server = server_or_skip()
    yield server
    server.teardown()


@pytest.fixture
def trackers(postgres):
    """TRACKERS ledgers on one new schema (each as one tracker holds it), and its URL."""
    url = postgres.new_schema()
    ledgers = [Ledger(url) for _ in range(TRACKERS)]
    yield ledgers, url
    for ledger in ledgers:
        ledger.close()


def together(ledgers: list[Ledger], work) -> None:
    """work(ledger, thread index) on THREADS_PER_TRACKER threads per ledger, all released at once."""
    start = threading.Barrier(len(ledgers) * THREADS_PER_TRACKER)
    failures = []

    def run(ledger: Ledger, index: int) -> None:
        start.wait()
        try:
            work(ledger, index)
        except BaseException as err:  # surfaced below: a thread's failure must fail the test
            failures.append(err)
    threads = [threading.Thread(target=run, args=(ledger, i * len(ledgers) + j))
               for i in range(THREADS_PER_TRACKER) for j, ledger in enumerate(ledgers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures


def rows(url: str, query: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(query).fetchall()


def test_reports_recorded_by_several_trackers_at_once_count_exactly_once(trackers):
    ledgers, url = trackers
    sessions = [f"s{i}" for i in range(20)]
    reports = {i + 1: [WorkEntry(RouteSession(sessions[i], 1), 3, 2),
                       WorkEntry(RouteSession(sessions[(i + 1) % 20], 1), 1, 1)] for i in range(20)}
    counted: Counter[int] = Counter()  # report id -> entries its calls counted, summed over every call
    lock = threading.Lock()

    def issue_and_report(ledger: Ledger, index: int) -> None:
        rng = random.Random(index)
        ledger.issue(rng.sample([(s, 1, "a") for s in sessions], len(sessions)), 100)
        for report_id in rng.sample(sorted(reports), len(reports)):
            entries = ledger.record("a", report_id, reports[report_id])
            with lock:
                counted[report_id] += entries

    together(ledgers, issue_and_report)
    assert counted == {report_id: 2 for report_id in reports}  # one call counted each; every other got 0
    assert rows(url, "SELECT count(*) FROM issued") == [(20,)]
    assert rows(url, "SELECT count(*), count(DISTINCT report_id) FROM work") == [(40, 20)]
    for ledger in ledgers:
        assert ledger.totals() == [NodeTotals("a", 20, 80, 60)]


def test_concurrent_reports_on_a_triple_never_pass_its_cap(trackers):
    """20 triples, each with room for one report; every thread of every tracker sends its own
    report to each triple in turn, so each triple is contended by all of them at once."""
    ledgers, url = trackers
    hot = [f"hot{k}" for k in range(20)]
    ledgers[0].issue([(session, 1, "a") for session in hot], 10)
    outcomes: list[tuple[str, object]] = []
    lock = threading.Lock()

    def report(ledger: Ledger, index: int) -> None:
        for k, session in enumerate(hot):
            try:
                result = ledger.record("a", k * 100 + index + 1, [WorkEntry(RouteSession(session, 1), 6, 4)])
            except WorkRefused as err:
                result = err.code
            with lock:
                outcomes.append((session, result))

    together(ledgers, report)
    assert Counter(session for session, result in outcomes if result == 1) == {session: 1 for session in hot}
    assert Counter(result for _, result in outcomes) == {1: 20, StatusCode.INVALID_ARGUMENT: len(outcomes) - 20}
    assert rows(url, "SELECT sum(prefill_tokens + decode_tokens), count(*) FROM work") == [(200, 20)]
    assert ledgers[1].totals() == [NodeTotals("a", 20, 120, 80)]


def test_a_triple_issued_by_several_trackers_is_one_row_with_the_first_cap(trackers):
    ledgers, url = trackers
    ledgers[0].issue([("s", 1, "a"), ("s", 1, "b")], 100, client_id="key:alice")
    ledgers[1].issue([("s", 1, "b"), ("s", 1, "a")], 500, client_id="key:mallory")
    assert rows(url, "SELECT node_id, max_tokens, client_id FROM issued ORDER BY node_id") == [
        ("a", 100, "key:alice"), ("b", 100, "key:alice")]
    with pytest.raises(WorkRefused) as err:
        ledgers[2].record("a", 1, [WorkEntry(RouteSession("s", 1), 101, 0)])
    assert err.value.code == StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("entry,code", [
    (WorkEntry(RouteSession("unissued", 1), 1, 1), StatusCode.PERMISSION_DENIED),
    (WorkEntry(RouteSession("s", 1 << 63), 1, 1), StatusCode.PERMISSION_DENIED),  # past BIGINT
    (WorkEntry(RouteSession("s\x00", 1), 1, 1), StatusCode.PERMISSION_DENIED),  # TEXT cannot hold NUL
    (WorkEntry(RouteSession("s", 1), 200, 0), StatusCode.INVALID_ARGUMENT),  # over the cap
    (WorkEntry(RouteSession("s", 1), 0, -1), StatusCode.INVALID_ARGUMENT),
    (WorkEntry(None, 1, 1), StatusCode.INVALID_ARGUMENT),
])
def test_a_refused_report_claims_nothing_and_an_honest_one_beside_it_counts(trackers, entry, code):
    ledgers, url = trackers
    ledgers[0].issue([("s", 1, "a"), ("t", 1, "b")], 100)
    with pytest.raises(WorkRefused) as err:
        ledgers[0].record("a", 7, [WorkEntry(RouteSession("s", 1), 1, 1), entry])
    assert err.value.code == code
    assert ledgers[1].record("b", 7, [WorkEntry(RouteSession("t", 1), 5, 5)]) == 1  # the same id, another node
    assert ledgers[1].record("a", 7, [WorkEntry(RouteSession("s", 1), 2, 2)]) == 1  # the refused id was not claimed
    assert ledgers[2].totals() == [NodeTotals("a", 1, 2, 2), NodeTotals("b", 1, 5, 5)]
    assert rows(url, "SELECT node_id, report_id FROM reports ORDER BY node_id") == [("a", 7), ("b", 7)]


def test_the_schema_refuses_a_second_claim_and_work_of_an_unissued_triple(trackers):
    """What holds even for a writer that skips the ledger's checks."""
    ledgers, url = trackers
    ledgers[0].issue([("s", 1, "a")], 100)
    assert ledgers[0].record("a", 1, [WorkEntry(RouteSession("s", 1), 1, 1)]) == 1
    with psycopg.connect(url) as conn:
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO reports (node_id, report_id, recorded_at) VALUES ('a', 1, 0)")
        conn.rollback()
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO issued (session_id, epoch, node_id, max_tokens, issued_at) "
                         "VALUES ('s', 1, 'a', 999, 0)")
        conn.rollback()
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("INSERT INTO work (node_id, report_id, session_id, epoch, prefill_tokens, decode_tokens, "
                         "recorded_at) VALUES ('a', 1, 'unissued', 1, 1, 1, 0)")


def test_acknowledged_work_survives_a_restart_and_a_crash_of_the_server(postgres, trackers):
    ledgers, url = trackers
    ledger = ledgers[0]
    ledger.issue([("s", 1, "a")], 100)
    assert ledger.record("a", 1, [WorkEntry(RouteSession("s", 1), 10, 1)]) == 1
    postgres.stop()  # a clean shutdown
    with pytest.raises(LedgerUnavailable) as err:
        ledger.record("a", 2, [WorkEntry(RouteSession("s", 1), 10, 2)])
    assert err.value.code == StatusCode.UNAVAILABLE and err.value.retryable
    postgres.start()
    assert ledger.record("a", 2, [WorkEntry(RouteSession("s", 1), 10, 2)]) == 1  # the same Ledger reconnects
    postgres.kill()  # a crash right after the acknowledgement: only the WAL on disk survives (the server's
    # default is asynchronous commit with a slow WAL writer: the ledger's own sessions commit synchronously)
    postgres.start()
    assert ledger.record("a", 2, [WorkEntry(RouteSession("s", 1), 10, 2)]) == 0  # the retry after the outage
    assert ledger.totals() == [NodeTotals("a", 1, 20, 3)]
    reopened = Ledger(url)
    assert reopened.totals() == [NodeTotals("a", 1, 20, 3)]
    reopened.close()


def test_an_unreachable_database_is_named_without_its_password(capsys, monkeypatch):
    url = f"postgresql://meshnet:s3cret@127.0.0.1:{free_port()}/ledger"
    with pytest.raises(LedgerUnavailable) as err:
        Ledger(url)
    assert f"cannot reach the ledger database postgresql://meshnet:***@127.0.0.1:{url.split(':')[3]}" in str(err.value)
    assert "s3cret" not in str(err.value) and err.value.code == StatusCode.UNAVAILABLE
    monkeypatch.setattr("sys.argv", ["ledger", "--ledger", url, "totals"])
    with pytest.raises(SystemExit) as exit_:
        ledger_main()
    assert exit_.value.code == 2
    stderr = capsys.readouterr().err
    assert "cannot reach the ledger database" in stderr and "s3cret" not in stderr
    assert redacted("postgresql://u@h/db?password=s3cret&sslmode=require") == \
        "postgresql://u@h/db?password=***&sslmode=require"
