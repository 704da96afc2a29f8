"""Live Run state for callers: wait for a Run to settle, or follow its changes as server-sent events.

Both read the committed change feed (the transitions table) so they see Runs driven by any process,
and between reads they wait on the runtime's ChangeFeed: woken by every process's changes on PostgreSQL
(LISTEN/NOTIFY), by this process's elsewhere, where other processes' changes are seen by reading again
every poll interval. A wake-up only says "read again": nothing is missed or sent twice.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from starlette.concurrency import run_in_threadpool

from harness.domain.feed import Change
from harness.kernel.projection import job_status
from harness.kernel.states import RunState, is_final
from harness.ports.changes import ChangeFeed, ChangeWaiter
from harness.ports.queries import ReadModel
from harness.stores import DatabaseError, is_outage

ANY_RUN = "*"
SETTLED = frozenset({"SUCCEEDED", "CLOSED_REJECTED", "CLOSED_FAILED", "CLOSED_CANCELLED", "AWAITING_HITL"})
KEEPALIVE_S = 15.0
#: how long a tenant-wide stream waits at a hole in the change feed (see CommitHorizon)
HOLE_GRACE_S = 2.0
#: how often a stream held at a hole reads again (the hole's commit may announce itself, a rollback never)
HOLE_LOOK_S = 0.2
#: changes_after's page size: a full page means there may be more up to the horizon
CHANGES_PER_READ = 500


class ChangeHub:
    """The service's waits on the runtime's change feed, which it can all wake at once as it stops."""

    def __init__(self, feed: ChangeFeed) -> None:
        self.feed = feed
        self._lock = threading.Lock()
        self._waiters: set[ChangeWaiter] = set()

    @contextmanager
    def watch(self, key: str, poll_s: float) -> Iterator[ChangeWaiter]:
        """A waiter woken whenever `key` (a run id, or ANY_RUN) changes, for the life of the block; a
        change of another process reaches it within `poll_s` where the feed cannot push it."""
        with self.feed.subscribe(None if key == ANY_RUN else key, poll_s=poll_s) as waiter:
            with self._lock:
                self._waiters.add(waiter)
            try:
                yield waiter
            finally:
                with self._lock:
                    self._waiters.discard(waiter)

    def wake_all(self) -> None:
        """Wake every wait (the service is stopping: the streams see it and end)."""
        with self._lock:
            waiters = list(self._waiters)
        for waiter in waiters:
            waiter.wake()

    def watchers(self) -> int:
        """How many waiters are registered (for tests and health)."""
        with self._lock:
            return len(self._waiters)


async def wait_settled(hub: ChangeHub, reads: ReadModel, run_id: str, timeout_s: float, poll_s: float) -> str:
    """Wait until the Run is final or parked for a human, or the timeout passes; returns its state."""
    deadline = time.monotonic() + timeout_s
    with hub.watch(run_id, poll_s) as changes:  # before the first read: a change after it wakes the wait
        while True:
            state = (await run_in_threadpool(reads.get_run, run_id)).state.value
            remaining = deadline - time.monotonic()
            if state in SETTLED or remaining <= 0:
                return state
            await changes.wait_async(remaining)


class CommitHorizon:
    """How far a tenant-wide stream may read the change feed without ever skipping a change.

    Change ids come from one counter (a PostgreSQL sequence, a MySQL/MariaDB auto-increment) that a
    transaction draws from when it inserts, not when it commits: with concurrent writers, change 11 can
    commit before change 10. A stream that moved past 11 would never deliver 10. So a stream reads only
    up to the end of the run of consecutive committed ids after its position; it waits at a hole for up
    to `grace_s` (the transaction commits), then takes the hole for a rolled-back insert and goes on.
    A single Run's changes cannot overtake each other (each waits for the Run's row), and SQLite has one
    writer at a time, so only tenant-wide streams on the servers ever wait here.
    """

    def __init__(self, grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_s = grace_s
        self._clock = clock
        self._hole: int | None = None
        self._seen_at = 0.0

    def through(self, position: int, committed: list[int]) -> int:
        """The last id a stream at `position` may read, given the committed ids after it, ascending."""
        expected = position + 1
        for change_id in committed:
            if change_id != expected:
                if self._hole != expected:
                    self._hole, self._seen_at = expected, self._clock()
                if self._clock() - self._seen_at < self.grace_s:
                    return expected - 1
            expected = change_id + 1
        return expected - 1


def change_document(change: Change) -> dict[str, Any]:
    """What one event carries."""
    return {
        "run_id": change.run_id,
        "seq": change.seq,
        "from": change.from_state,
        "to": change.to_state,
        "legacy_status": job_status(RunState(change.to_state)).value,
        "actor": change.actor,
        "reason": change.reason,
        "at": change.at,
    }


def _frame(change: Change) -> str:
    return f"id: {change.cursor}\nevent: state\ndata: {json.dumps(change_document(change))}\n\n"


async def change_stream(
    hub: ChangeHub,
    reads: ReadModel,
    tenant_id: str,
    *,
    run_id: str | None,
    cursor: int,
    lifetime_s: float,
    poll_s: float,
    stop: Callable[[], bool],
) -> AsyncIterator[str]:
    """SSE frames for committed changes after `cursor` (one Run's, or the tenant's), oldest first.

    A single Run's stream ends after its final state; every stream ends after `lifetime_s` (the
    browser reconnects with Last-Event-ID) or when the service stops.
    """
    ends = time.monotonic() + lifetime_s
    quiet_since = time.monotonic()
    horizon = CommitHorizon(HOLE_GRACE_S) if run_id is None else None
    yield "retry: 1000\n\n"
    with hub.watch(run_id or ANY_RUN, poll_s) as woken:
        while not stop() and time.monotonic() < ends:
            through, at_hole = None, False
            if horizon is not None:  # read only as far as every earlier change has committed
                committed = await run_in_threadpool(reads.change_ids_after, cursor)
                through = horizon.through(cursor, committed)
                at_hole = bool(committed) and through < committed[-1]
            changes = await run_in_threadpool(reads.changes_after, tenant_id, cursor, run_id=run_id,
                                              through=through, limit=CHANGES_PER_READ)
            for change in changes:
                cursor = change.cursor
                yield _frame(change)
            if through is not None and len(changes) < CHANGES_PER_READ:
                cursor = max(cursor, through)  # other tenants' changes up to there: nothing of ours left
            if run_id is not None:
                last = (
                    changes[-1].to_state
                    if changes
                    else (await run_in_threadpool(reads.get_run, run_id)).state.value
                )
                if is_final(RunState(last)):
                    yield "event: end\ndata: {}\n\n"
                    return
            if changes:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > KEEPALIVE_S:
                quiet_since = time.monotonic()
                yield ": keepalive\n\n"
            if len(changes) == CHANGES_PER_READ:
                continue  # a full page: read on at once
            # a stream held at a hole looks again soon: a rolled-back insert announces nothing
            wait_s = min(ends - time.monotonic(), HOLE_LOOK_S if at_hole else KEEPALIVE_S)
            await woken.wait_async(wait_s)


async def guarded(frames: AsyncIterator[str]) -> AsyncIterator[str]:
    """`frames`, ended by an `error` event (the service's JSON error shape) when the database fails
    mid-stream: the headers are sent by then, so the client learns why instead of seeing a cut."""
    try:
        async for frame in frames:
            yield frame
    except DatabaseError as exc:
        code = "database_unavailable" if is_outage(exc) else "internal_error"
        detail = f"the database failed during the stream ({type(exc).__name__}); reconnect with Last-Event-ID"
        yield f"event: error\ndata: {json.dumps({'error': code, 'detail': detail})}\n\n"
