"""The in-process change feed: waiters woken when this process's state machine commits a change.

The composition root subscribes `LocalChangeFeed.changed` to the state machine (its listeners are told
after commit), so a waiter in this process wakes as soon as a change made here is readable. Changes made
by other processes reach it only through the PostgreSQL adapter (harness.adapters.sql.pg_listen); where
there is none (SQLite and MySQL/MariaDB across processes) each wait is bounded by the caller's `poll_s`,
after which it reads again.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType

#: how long a waiter waits without a re-read while every process's changes wake it (a safety net: a
#: wake-up lost to a dropped listener connection is made up for at reconnection anyway)
RECHECK_S = 15.0


class Waiter:
    """One subscription (ports.changes.ChangeWaiter): a flag raised by a change, taken by a wait."""

    def __init__(self, feed: LocalChangeFeed, key: str | None, poll_s: float) -> None:
        self._feed = feed
        self.key = key
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._raised = False
        self._event = threading.Event()
        self._futures: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
        #: waits that ended because of a change, and because their time ran out (for tests and metrics)
        self.woken = 0
        self.timed_out = 0

    def wake(self) -> None:
        """See ChangeWaiter.wake (a change this waiter covers committed, or its owner stops it)."""
        with self._lock:
            self._raised = True
            self._event.set()
            futures = list(self._futures)
        for loop, future in futures:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, future)

    def _take(self) -> bool:
        with self._lock:
            raised, self._raised = self._raised, False
            self._event.clear()
        return raised

    def _counted(self, woke: bool) -> bool:
        if woke:
            self.woken += 1
        else:
            self.timed_out += 1
        return woke

    def wait(self, timeout_s: float | None) -> bool:
        """See ChangeWaiter.wait."""
        if not self._take():
            self._event.wait(self._feed.bound(timeout_s, self.poll_s))
            return self._counted(self._take())
        return self._counted(True)

    async def wait_async(self, timeout_s: float | None) -> bool:
        """See ChangeWaiter.wait_async."""
        if self._take():
            return self._counted(True)
        loop = asyncio.get_running_loop()
        entry = (loop, loop.create_future())
        with self._lock:
            self._futures.add(entry)
            raised = self._raised
        try:
            if not raised:
                await asyncio.wait({entry[1]}, timeout=self._feed.bound(timeout_s, self.poll_s))
        finally:
            with self._lock:
                self._futures.discard(entry)
        return self._counted(self._take())

    def close(self) -> None:
        """See ChangeWaiter.close."""
        self._feed.unsubscribe(self)

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class LocalChangeFeed:
    """Wakes this process's waiters for changes committed in this process (ports.changes.ChangeFeed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str | None, set[Waiter]] = {}

    def subscribe(self, run_id: str | None = None, *, poll_s: float) -> Waiter:
        """See ChangeFeed.subscribe."""
        waiter = Waiter(self, run_id, poll_s)
        with self._lock:
            self._waiters.setdefault(run_id, set()).add(waiter)
        return waiter

    def unsubscribe(self, waiter: Waiter) -> None:
        """Forget a waiter (its `close`)."""
        with self._lock:
            bucket = self._waiters.get(waiter.key)
            if bucket is not None:
                bucket.discard(waiter)
                if not bucket:
                    del self._waiters[waiter.key]

    def reaches_other_processes(self) -> bool:
        """See ChangeFeed.reaches_other_processes: never, for this feed alone."""
        return False

    def bound(self, timeout_s: float | None, poll_s: float) -> float:
        """How long one wait may last: the caller's time, cut to `poll_s` while other processes' changes
        cannot wake it (to RECHECK_S while they can)."""
        cap = RECHECK_S if self.reaches_other_processes() else poll_s
        return max(0.0, cap if timeout_s is None else min(timeout_s, cap))

    def changed(self, run_id: str) -> None:
        """See ChangeFeed.changed."""
        with self._lock:
            targets = [*self._waiters.get(run_id, ()), *self._waiters.get(None, ())]
        for waiter in targets:
            waiter.wake()

    def wake_all(self) -> None:
        """Wake every waiter (to read again: changes may have gone unannounced)."""
        with self._lock:
            targets = [w for bucket in self._waiters.values() for w in bucket]
        for waiter in targets:
            waiter.wake()

    def waiters(self) -> int:
        """How many waiters are subscribed (for tests and health)."""
        with self._lock:
            return sum(len(bucket) for bucket in self._waiters.values())

    def close(self) -> None:
        """See ChangeFeed.close: nothing to stop here; every waiter is woken to read once more."""
        self.wake_all()
