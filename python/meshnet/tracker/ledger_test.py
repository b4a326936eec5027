"""Ledger: only issued triples count, once per report, within their cap; totals survive reopen."""

import pytest

from meshnet.tracker.ledger import Ledger, NodeTotals, WorkRefused
from meshnet.types.seam import RouteSession
from meshnet.types.status import StatusCode
from meshnet.types.tracker import WorkEntry

CAP = 1 << 24  # the registry's MAX_EXPECTED_TOKENS: the largest cap a route can have


def test_record_totals_and_reopen(tmp_path):
    db = tmp_path / "ledger.db"
    ledger = Ledger(db)
    ledger.issue([("s1", 1, "a"), ("s1", 1, "b"), ("s1", 2, "a"), ("s2", 1, "a")], 200)
    assert ledger.record("a", 1, [WorkEntry(RouteSession("s1", 1), 100, 10), WorkEntry(RouteSession("s2", 1), 5, 1)]) == 2
    assert ledger.record("a", 2, [WorkEntry(RouteSession("s1", 2), 0, 7)]) == 1
    assert ledger.record("b", 1, [WorkEntry(RouteSession("s1", 1), 100, 10)]) == 1
    ledger.close()
    reopened = Ledger(db)
    assert reopened.totals() == [NodeTotals("a", 2, 105, 18), NodeTotals("b", 1, 100, 10)]
    assert reopened.sessions() == {"s1", "s2"}


def test_a_repeated_report_is_acknowledged_and_not_counted_again(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.issue([("s", 1, "a")], 100)
    entry = [WorkEntry(RouteSession("s", 1), 10, 5)]
    assert ledger.record("a", 7, entry) == 1
    assert ledger.record("a", 7, entry) == 0
    assert ledger.record("a", 8, entry) == 1  # a new report of more work counts
    assert ledger.totals() == [NodeTotals("a", 1, 20, 10)]


@pytest.mark.parametrize("node,entry,code", [
    ("a", WorkEntry(RouteSession("unissued", 1), 1, 1), StatusCode.PERMISSION_DENIED),
    ("a", WorkEntry(RouteSession("s", 2), 1, 1), StatusCode.PERMISSION_DENIED),  # another epoch
    ("intruder", WorkEntry(RouteSession("s", 1), 1, 1), StatusCode.PERMISSION_DENIED),  # not on the route
    ("a", WorkEntry(RouteSession("s", 1), 90, 11), StatusCode.INVALID_ARGUMENT),  # over the cap of 100
    ("a", WorkEntry(RouteSession("s", 1), (1 << 62) - 1, (1 << 62) - 1), StatusCode.INVALID_ARGUMENT),
    ("a", WorkEntry(RouteSession("s", 1), -1, 0), StatusCode.INVALID_ARGUMENT),
    ("a", WorkEntry(None, 1, 1), StatusCode.INVALID_ARGUMENT),
    ("a", WorkEntry(RouteSession("", 1), 1, 1), StatusCode.INVALID_ARGUMENT),
])
def test_refused_reports_write_nothing(tmp_path, node, entry, code):
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.issue([("s", 1, "a")], 100)
    with pytest.raises(WorkRefused) as err:
        ledger.record(node, 1, [WorkEntry(RouteSession("s", 1), 1, 1), entry])
    assert err.value.code == code
    assert ledger.totals() == []


def test_maximum_size_work_keeps_totals_exact(tmp_path):
    """Three reports at the largest cap a route can have (the old ledger's SUM overflowed)."""
    ledger = Ledger(tmp_path / "ledger.db")
    for i in range(3):
        ledger.issue([(f"s{i}", 1, "a")], CAP)
        assert ledger.record("a", i + 1, [WorkEntry(RouteSession(f"s{i}", 1), CAP - 1, 1)]) == 1
    assert ledger.totals() == [NodeTotals("a", 3, 3 * (CAP - 1), 3)]
    with pytest.raises(WorkRefused):
        ledger.record("a", 9, [WorkEntry(RouteSession("s0", 1), 1, 0)])  # the triple is full
    with pytest.raises(WorkRefused):
        ledger.record("a", 0, [WorkEntry(RouteSession("s0", 1), 0, 0)])  # report ids start at 1
