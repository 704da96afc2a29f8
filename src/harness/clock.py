"""Clocks: the system clock, and a fake one that tests and users' own tests move by hand."""

from __future__ import annotations

import threading
import time


class SystemClock:
    """Wall-clock time in seconds since the epoch."""

    def now(self) -> float:
        """The current time."""
        return time.time()


class FakeClock:
    """A clock that only moves when told to; thread-safe."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        """The current fake time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        with self._lock:
            self._now += seconds
