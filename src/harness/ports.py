"""Ports: the small interfaces through which the kernel reaches what varies."""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    """Where time comes from; inject a FakeClock to test timeouts without sleeping."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...
