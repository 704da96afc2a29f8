"""The tenant-wide change stream on servers whose change ids can commit out of order (PostgreSQL
sequences, MariaDB auto-increment): a change committed late is delivered, in id order, not skipped."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest
import sqlalchemy as sa

from harness.adapters.change_feed import LocalChangeFeed
from harness.adapters.sql import schema as t
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.domain.records import NewRun
from harness.kernel.states import RunState
from harness.service.sse import ChangeHub, change_stream
from harness.stores import read_model

#: SQLite has one writer at a time: its ids cannot commit out of order
BACKENDS = ("postgresql", "mariadb")
S = RunState


@pytest.fixture
def store(backend_url: str) -> Iterator[SqlStore]:
    """A store on a fresh, migrated database of the backend under test."""
    s = SqlStore.open(backend_url, FakeClock())
    yield s
    s.close()


class Collector:
    """Reads a change stream in the background, keeping its `state` events."""

    def __init__(self, stream: AsyncIterator[str]) -> None:
        self.frames: list[str] = []
        self._task = asyncio.ensure_future(self._pull(stream))

    async def _pull(self, stream: AsyncIterator[str]) -> None:
        async for frame in stream:
            if "event: state" in frame:
                self.frames.append(frame)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def test_a_change_that_commits_after_a_later_one_is_still_delivered(store: SqlStore) -> None:
    """Transaction A takes change id N and stays open; B takes N+1 and commits. The stream must not move
    past N while A is open; once A commits, both arrive, N first."""
    slow, _ = store.create_run(NewRun("acme", "alice", "s", {}))
    fast, _ = store.create_run(NewRun("acme", "bob", "s", {}))
    start = read_model(store).latest_cursor()

    async def scenario() -> tuple[list[str], list[str]]:
        collector = Collector(change_stream(ChangeHub(LocalChangeFeed()), read_model(store), "acme", run_id=None,
                                            cursor=start, lifetime_s=30, poll_s=0.05, stop=lambda: False))
        with store.engine.connect() as held:
            held.execute(t.transitions.insert().values(
                run_id=slow.run_id, seq=1, from_state="CREATED", to_state="PREPARING", actor="test",
                reason="held open", forced_by=None, at=0.0))  # takes id N, not committed
            await asyncio.to_thread(store.transition, fast.run_id, S.CREATED, S.PREPARING, actor="test",
                                    reason="commits first")  # takes N+1 and commits
            await asyncio.sleep(0.6)
            before = list(collector.frames)
            held.commit()
        await asyncio.sleep(0.6)
        await collector.stop()
        return before, collector.frames

    before, after = asyncio.run(scenario())
    assert before == []
    assert len(after) == 2 and slow.run_id in after[0] and fast.run_id in after[1]


def test_a_rolled_back_change_id_holds_the_stream_only_for_the_grace(store: SqlStore,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An id drawn by a transaction that rolled back never commits: later changes still arrive."""
    monkeypatch.setattr("harness.service.sse.HOLE_GRACE_S", 0.3)
    lost, _ = store.create_run(NewRun("acme", "alice", "s", {}))
    kept, _ = store.create_run(NewRun("acme", "bob", "s", {}))
    start = read_model(store).latest_cursor()
    with store.engine.connect() as conn:
        conn.execute(t.transitions.insert().values(
            run_id=lost.run_id, seq=1, from_state="CREATED", to_state="PREPARING", actor="test",
            reason="rolled back", forced_by=None, at=0.0))
        conn.rollback()
    store.transition(kept.run_id, S.CREATED, S.PREPARING, actor="test", reason="committed")
    with store.reader.connect() as conn:
        assert conn.execute(sa.select(sa.func.max(t.transitions.c.id))).scalar_one() > start + 1  # a hole

    async def scenario() -> list[str]:
        collector = Collector(change_stream(ChangeHub(LocalChangeFeed()), read_model(store), "acme", run_id=None,
                                            cursor=start, lifetime_s=30, poll_s=0.05, stop=lambda: False))
        await asyncio.sleep(1.2)
        await collector.stop()
        return collector.frames

    frames = asyncio.run(scenario())
    assert len(frames) == 1 and kept.run_id in frames[0]
