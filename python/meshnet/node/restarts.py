"""RestartBudget: how many times a node may restart its worker, counted over a sliding window.

Called by the node's supervision loop (`main.py`) each time the worker died or hung. Counting over
the node's whole life let four crashes, spread over any length of time, end the node and take its
range off the swarm (issue 55, finding 1); a budget per window still stops a worker that cannot
stay up, and forgets crashes that are long past. Invariant: `allow` is true at most `limit` times
within any `window` seconds. Pure: the clock is the caller's.
"""

from __future__ import annotations

import collections


class RestartBudget:
    def __init__(self, limit: int, window: float) -> None:
        """`limit`: restarts allowed within any `window` seconds (0: none)."""
        if limit < 0 or window <= 0:
            raise ValueError(f"a restart budget needs limit >= 0 and window > 0 (got {limit}, {window})")
        self.limit = limit
        self.window = window
        self._times: collections.deque[float] = collections.deque()

    def allow(self, now: float) -> bool:
        """True, and the restart counted, when fewer than `limit` happened in the `window` before `now`."""
        while self._times and self._times[0] <= now - self.window:
            self._times.popleft()
        if len(self._times) >= self.limit:
            return False
        self._times.append(now)
        return True

    def recent(self, now: float) -> int:
        """Restarts counted within the window before `now`."""
        return sum(1 for t in self._times if t > now - self.window)
