"""The change feed: what wakes a caller waiting for a Run to change, instead of a sleep between reads.

A feed only wakes; the changes themselves are read from the committed `transitions` table, so a waiter
misses nothing and sees nothing twice whatever the feed delivers (a wake-up with nothing new costs one
read). Subscribe before the first read: a change committed after `subscribe` returns wakes the waiter's
next `wait` even if it came before that call.
"""

from __future__ import annotations

from types import TracebackType
from typing import Protocol


class ChangeWaiter(Protocol):
    """One subscription: a flag raised by every change it covers, lowered by the `wait` that sees it."""

    def wait(self, timeout_s: float | None) -> bool:
        """Block the thread until a change came since the last wait (True) or `timeout_s` passed (False).
        The feed bounds the wait by its own re-read interval where it cannot see every process's
        changes (None: as long as the feed allows)."""
        ...

    async def wait_async(self, timeout_s: float | None) -> bool:
        """`wait` for asyncio: awaits on the running loop, holding no thread."""
        ...

    def wake(self) -> None:
        """Wake the current (or next) wait now, from any thread: its caller reads again."""
        ...

    def close(self) -> None:
        """End the subscription."""
        ...

    def __enter__(self) -> ChangeWaiter: ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


class ChangeFeed(Protocol):
    """Tells waiters that a Run changed: in this process only, or (`reaches_other_processes`) in any
    process on the database (PostgreSQL's LISTEN/NOTIFY)."""

    def subscribe(self, run_id: str | None = None, *, poll_s: float) -> ChangeWaiter:
        """A waiter woken by changes of `run_id` (None: of every Run). `poll_s` bounds each of its waits
        while changes made by other processes cannot wake it, so that those are still seen by reading."""
        ...

    def reaches_other_processes(self) -> bool:
        """Whether a change committed by any process wakes this feed's waiters now."""
        ...

    def changed(self, run_id: str) -> None:
        """Wake the waiters of `run_id` (and of every Run): a change of it committed in this process."""
        ...

    def close(self) -> None:
        """Stop listening; waiters fall back to reading every `poll_s`."""
        ...
