"""SLO attainment and goodput of an app's requests over a sliding window."""

from __future__ import annotations

import time
from collections import deque


class SLOWindow:
    """The requests with an SLO that ended in the last `window_s` seconds, and whether each met it.

    Goodput is the requests that met their SLO per second; attainment the share that met it. The
    autoscaler reads attainment (ModServe scales out below 0.99, 003 §4.3), the metrics both.
    """

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._ended: deque[tuple[float, bool]] = deque()
        self._met = 0
        self._since = time.monotonic()  # goodput over less than a window until one has passed

    def record(self, met: bool, now: float | None = None) -> None:
        """Count one request that ended at `now` (monotonic seconds)."""
        now = time.monotonic() if now is None else now
        self._ended.append((now, met))
        self._met += met
        self._expire(now)

    def goodput(self, now: float | None = None) -> float:
        """Requests that met their SLO per second over the window."""
        now = time.monotonic() if now is None else now
        self._expire(now)
        return self._met / max(1e-9, min(self.window_s, now - self._since))

    def attainment(self, now: float | None = None) -> float | None:
        """The share of the window's requests that met their SLO (None: no request ended in it)."""
        now = time.monotonic() if now is None else now
        self._expire(now)
        return self._met / len(self._ended) if self._ended else None

    def count(self, now: float | None = None) -> int:
        """Requests with an SLO that ended within the window."""
        self._expire(time.monotonic() if now is None else now)
        return len(self._ended)

    def _expire(self, now: float) -> None:
        while self._ended and self._ended[0][0] < now - self.window_s:
            _, met = self._ended.popleft()
            self._met -= met
