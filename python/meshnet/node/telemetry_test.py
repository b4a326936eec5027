"""RateMeter: rows per compute second between updates, smoothed, steady while idle, reset-safe."""

import pytest

from meshnet.node.telemetry import RateMeter


def test_the_rate_is_measured_between_updates_and_smoothed():
    meter = RateMeter()
    assert meter.update(0, 0.0) == 0.0  # no interval yet
    assert meter.update(100, 1.0) == pytest.approx(100.0)
    assert meter.update(100, 1.0) == pytest.approx(100.0)  # idle: unchanged
    assert meter.update(150, 2.0) == pytest.approx(75.0)  # half the old, half 50 rows/s


def test_counters_that_go_backwards_start_over():
    meter = RateMeter()
    meter.update(1000, 10.0)
    assert meter.update(1100, 11.0) == pytest.approx(100.0)
    assert meter.update(5, 0.5) == pytest.approx(100.0)  # a restarted worker: no negative interval
    assert meter.update(25, 1.5) == pytest.approx(60.0)
