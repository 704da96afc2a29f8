"""Waiting for a Run's changes is pushed, not polled: `events`, `wait` and the service's SSE wake when the
Run changes (in any process on PostgreSQL through LISTEN/NOTIFY, in this process on every backend), and
where nothing can push (another process on SQLite or MariaDB) they still see every change by reading
again each poll interval. The events are always read from the committed transitions: none is missed or
repeated whatever wakes the reader.

The push tests set every poll and re-check interval to a minute: a change that arrived within the test's
bound can only have come by a wake-up.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import AsyncHarness, Harness, RunEvent
from harness.adapters.sql.pg_listen import PgChangeFeed

TASK = "Where is order A-1001?"
SLOW_S = 60.0  # every fallback interval in the push tests: far beyond what they wait
#: drives one Run in a process of its own
DRIVER = "import sys\nfrom harness import Harness\nwith Harness(db=sys.argv[1], data_dir=sys.argv[2]) as h:\n" \
         "    print(h.drive(sys.argv[3]).state)\n"


@pytest.fixture(autouse=True)
def _example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setattr("harness.adapters.change_feed.RECHECK_S", SLOW_S)


def _counting(h: Harness) -> list[int]:
    """Count the reads of the Run's transitions `h` makes (one per look at its changes)."""
    reads = [0]
    store = h.runtime.store
    read = store.transitions_of

    def counted(run_id: str) -> Any:
        reads[0] += 1
        return read(run_id)
    store.transitions_of = counted
    return reads


class Follower:
    """Follows a Run's events on a thread of its own, as a caller of Harness.events would."""

    def __init__(self, h: Harness, run_id: str) -> None:
        self.events: list[RunEvent] = []
        self.ended_at: float | None = None
        self._thread = threading.Thread(target=self._follow, args=(h, run_id), daemon=True)
        self._thread.start()

    def _follow(self, h: Harness, run_id: str) -> None:
        for event in h.events(run_id, timeout_s=SLOW_S):
            self.events.append(event)
        self.ended_at = time.monotonic()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


def _drive_elsewhere(url: str, data_dir: Path, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", DRIVER, url, str(data_dir), run_id], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())


def _eventually(check: Callable[[], bool], timeout_s: float) -> bool:
    ends = time.monotonic() + timeout_s
    while time.monotonic() < ends:
        if check():
            return True
        time.sleep(0.02)
    return check()


@pytest.fixture
def harness_for(backend_url: str, tmp_path: Path) -> Iterator[Callable[[float], Harness]]:
    made: list[Harness] = []

    def make(poll_s: float) -> Harness:
        made.append(Harness(db=backend_url, data_dir=tmp_path / "data", poll_s=poll_s))
        return made[-1]
    yield make
    for h in made:
        h.close()


def test_a_run_driven_by_another_process_reaches_a_waiting_follower(
        backend: str, backend_url: str, harness_for: Callable[[float], Harness], tmp_path: Path) -> None:
    """A Run driven by another OS process: on PostgreSQL its changes wake the follower (a read per
    wake-up, none a minute's poll could have made); on SQLite and MariaDB nothing pushes across processes
    and the follower reads every poll interval: both see every change once, in order, to SUCCEEDED."""
    pushed = backend == "postgresql"
    h = harness_for(SLOW_S if pushed else 0.1)
    run = h.create(TASK, user="alice")
    if pushed:
        assert isinstance(h.runtime.feed, PgChangeFeed) and h.runtime.feed.wait_listening(10)
    reads = _counting(h)
    follower = Follower(h, run.run_id)
    assert _eventually(lambda: reads[0] >= 1, 10)  # it has read the Run once and waits
    driver = _drive_elsewhere(backend_url, tmp_path / "data", run.run_id)
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0 and out.strip() == "SUCCEEDED", err
    follower.join(SLOW_S / 2)
    assert follower.ended_at is not None, "the follower never saw the Run end"
    targets = [e.target for e in follower.events]
    assert targets[0] == "PREPARING" and targets[-1] == "SUCCEEDED"
    assert [e.seq for e in follower.events] == list(range(1, len(targets) + 1))  # none missed or repeated
    assert h.runtime.feed.reaches_other_processes() is pushed
    if pushed:
        # one read before the drive, then at most one per committed change (each commit notifies once)
        assert reads[0] <= len(targets) + 2, reads[0]
    else:
        assert reads[0] > 2  # the fallback: it read again and again while the other process drove


def test_a_change_made_in_this_process_wakes_waiters_at_once(harness_for: Callable[[float], Harness]) -> None:
    """In-process push on every backend: a follower and `wait` in the process that drives the Run wake at
    each committed change, though their poll interval is a minute."""
    h = harness_for(SLOW_S)
    run = h.create(TASK, user="alice")
    reads = _counting(h)
    follower = Follower(h, run.run_id)
    assert _eventually(lambda: reads[0] >= 1, 10)
    waited: list[str] = []
    waiter = threading.Thread(target=lambda: waited.append(h.wait(run.run_id, timeout_s=SLOW_S).state))
    waiter.start()
    waiter.join(SLOW_S / 2)
    follower.join(SLOW_S / 2)
    assert waited == ["SUCCEEDED"]
    assert follower.ended_at is not None and follower.events[-1].target == "SUCCEEDED"
    assert [e.seq for e in follower.events] == list(range(1, len(follower.events) + 1))


def test_async_events_are_awaited_not_polled(backend_url: str, tmp_path: Path) -> None:
    """AsyncHarness.events awaits the feed on the caller's loop while AsyncHarness.run drives the Run on
    the same loop: every change arrives, with a poll interval of a minute."""
    async def main() -> tuple[list[str], str]:
        async with AsyncHarness(db=backend_url, data_dir=tmp_path / "data", poll_s=SLOW_S) as h:
            run = await h.create(TASK, user="alice")

            async def follow() -> list[str]:
                return [e.target async for e in h.events(run.run_id, timeout_s=SLOW_S)]
            following = asyncio.ensure_future(follow())
            await asyncio.sleep(0.2)
            driven = await h.wait(run.run_id)
            return await asyncio.wait_for(following, SLOW_S / 2), driven.state

    started = time.monotonic()
    targets, state = asyncio.run(main())
    assert state == "SUCCEEDED" and targets[0] == "PREPARING" and targets[-1] == "SUCCEEDED"
    assert time.monotonic() - started < SLOW_S / 2


def test_the_service_stream_of_a_run_driven_elsewhere_is_pushed(
        backend: str, backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SSE on PostgreSQL: the stream of a Run another OS process drives gives every change and its end,
    with the service's poll interval at a minute."""
    if backend != "postgresql":
        pytest.skip("only PostgreSQL pushes changes across processes")
    from harness.config import build_runtime
    from harness.settings import Settings
    from tests.acceptance.api_helpers import key, make_client

    runtime = build_runtime(Settings(db=backend_url, data_dir=tmp_path / "data"))
    try:
        client = make_client(runtime, poll_interval_s=SLOW_S, stream_lifetime_s=2 * SLOW_S)
        h = Harness(db=backend_url, data_dir=tmp_path / "data")
        try:
            run = h.create(TASK, user="alice")
        finally:
            h.close()
        assert isinstance(runtime.feed, PgChangeFeed) and runtime.feed.wait_listening(10)
        driver = _drive_elsewhere(backend_url, tmp_path / "data", run.run_id)
        started = time.monotonic()
        with client.stream("GET", f"/api/v1/runs/{run.run_id}/events", headers=key("alice")) as response:
            text = "".join(response.iter_text())
        driver.communicate(timeout=60)
        assert time.monotonic() - started < SLOW_S / 2
        assert "event: end" in text and '"to": "SUCCEEDED"' in text
    finally:
        runtime.close()
