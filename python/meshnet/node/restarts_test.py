"""RestartBudget counts restarts over a sliding window: a worker that keeps dying is given up on,
crashes long past are forgotten (issue 55, finding 1: four crashes over any time ended a node)."""

import pytest

from meshnet.node.restarts import RestartBudget


def test_the_limit_holds_within_any_window_and_old_restarts_are_forgotten():
    budget = RestartBudget(limit=3, window=600.0)
    assert [budget.allow(t) for t in (0.0, 10.0, 20.0)] == [True, True, True]
    assert not budget.allow(30.0)  # a fourth within ten minutes: give up
    assert not budget.allow(599.0)
    assert budget.allow(600.0)  # the first has left the window
    assert budget.recent(600.0) == 3
    assert not budget.allow(605.0)


def test_crashes_spread_over_a_long_life_never_end_the_node():
    budget = RestartBudget(limit=3, window=600.0)
    assert all(budget.allow(hour * 3600.0) for hour in range(48))


def test_a_refused_restart_is_not_counted():
    budget = RestartBudget(limit=1, window=10.0)
    assert budget.allow(0.0)
    assert not budget.allow(1.0) and not budget.allow(2.0)
    assert budget.allow(10.0)


@pytest.mark.parametrize("limit,window", [(-1, 60.0), (3, 0.0), (3, -5.0)])
def test_a_budget_that_means_nothing_is_refused(limit, window):
    with pytest.raises(ValueError):
        RestartBudget(limit, window)


def test_a_zero_limit_allows_no_restart():
    assert not RestartBudget(limit=0, window=60.0).allow(0.0)
