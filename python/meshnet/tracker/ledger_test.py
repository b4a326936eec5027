"""Ledger: records, totals, validation, and persistence across reopen."""

import pytest

from meshnet.tracker.ledger import Ledger, NodeTotals
from meshnet.types.seam import RouteSession
from meshnet.types.tracker import WorkEntry


def test_record_totals_and_reopen(tmp_path):
    db = tmp_path / "ledger.db"
    ledger = Ledger(db)
    assert ledger.record("a", [WorkEntry(RouteSession("s1", 1), 100, 10), WorkEntry(RouteSession("s2", 1), 5, 1)]) == 2
    ledger.record("a", [WorkEntry(RouteSession("s1", 2), 0, 7)])
    ledger.record("b", [WorkEntry(RouteSession("s1", 1), 100, 10)])
    ledger.close()
    reopened = Ledger(db)
    assert reopened.totals() == [NodeTotals("a", 2, 105, 18), NodeTotals("b", 1, 100, 10)]
    assert reopened.sessions() == {"s1", "s2"}


@pytest.mark.parametrize("entry", [WorkEntry(None, 1, 1), WorkEntry(RouteSession("", 1), 1, 1),
                                   WorkEntry(RouteSession("s", 1), -1, 0), WorkEntry(RouteSession("s", 1), 0, 1 << 63)])
def test_bad_entries_are_refused_and_nothing_is_written(tmp_path, entry):
    ledger = Ledger(tmp_path / "ledger.db")
    with pytest.raises(ValueError):
        ledger.record("a", [WorkEntry(RouteSession("ok", 1), 1, 1), entry])
    assert ledger.totals() == []
