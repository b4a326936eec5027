"""Heartbeat telemetry a node measures itself: the compute rate its backend achieves.

Used by both backends (node/worker.py from the worker's Health counters, node/backends.py from
the reference engine's). The rate is what the tracker's route cost divides by, so a slow or
throttled node is avoided once measured. Single-threaded: the node's main thread only.
"""

from __future__ import annotations

from typing import Optional


class RateMeter:
    """Rows per second of compute from cumulative (rows, compute seconds) counters: the rate over
    the interval since the previous update, smoothed (half old, half new); unchanged while idle.
    Counters that go backwards (a restarted worker) start a new measurement."""

    def __init__(self) -> None:
        self._last: Optional[tuple[float, float]] = None
        self.rate = 0.0

    def update(self, rows: float, compute_s: float) -> float:
        last, self._last = self._last, (rows, compute_s)
        if last is None or rows < last[0] or compute_s < last[1]:
            return self.rate
        d_rows, d_s = rows - last[0], compute_s - last[1]
        if d_rows > 0 and d_s > 0:
            measured = d_rows / d_s
            self.rate = measured if self.rate == 0 else 0.5 * self.rate + 0.5 * measured
        return self.rate

