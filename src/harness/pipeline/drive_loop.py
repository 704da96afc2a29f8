"""A process's drives, each a greenlet on an asyncio loop: waits hold no thread.

`DriveLoop.submit(fn)` runs `fn` (a whole drive of a Run: lease, steps, park or close) in a
`DriveGreenlet` on one of the drive loop's threads. The drive runs its short stretches of work (reads,
transitions, policy, records) on that thread; where it waits for something outside the process it
switches back to its loop (harness.pipeline.waits), and the loop runs other drives until the awaited
thing is done. So the Runs in flight are bounded by `concurrency`, not by threads or database
connections: a drive holds a connection only inside a transaction, and it never waits inside one.

A statement to a database server blocks the loop's thread for its round trip (the drivers are
synchronous). With one loop, every drive of the process waits for it; so a drive loop has `threads`
loops, each in a thread of its own, and a new drive goes to the loop with the fewest drives: while one
loop's thread waits for the server (without the interpreter's lock), the others run. On SQLite (no round
trip) one thread is enough.

Drives beyond `concurrency` wait, in the order they were submitted to their loop, for a drive to end.
When the drive loop stops, a drive that has not started by then never starts (its Run stays where it is,
queued, for whoever drives it next): stopping waits for the drives in flight, not for the queue behind them.

A loop also starts no new drive while it is late: when the CPU (or the interpreter's lock) is the limit,
more drives in flight only make every one of them slower, until Runs that are moving pass their states'
time limits. Each loop measures its lag (how late a timer fires, smoothed) and, while it is over
`max_lag_s`, holds the next drive before it starts, so that Run waits as a queued Run (in CREATED, which
the sweeper never fails) instead of crawling through PLANNING. Drives already started go on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from harness.pipeline.waits import run_in_greenlet

T = TypeVar("T")
log = logging.getLogger("harness.drive.worker")


class DriveNotStartedError(RuntimeError):
    """The drive loop stopped before this drive started: it never ran."""


#: how often a loop measures its lag, and how much of each new measure the smoothed lag takes
LAG_PROBE_S = 0.1
LAG_WEIGHT = 0.3


class _Shard:
    """One loop of a drive loop, in its own thread, with its share of the places."""

    def __init__(self, places: int, name: str) -> None:
        self.places = places
        self.name = name
        #: how late the loop's timers fire (smoothed seconds), and the gate new drives pass one at a time
        self.lag = 0.0
        self.gate: asyncio.Lock | None = None
        self.probe: asyncio.Task[None] | None = None
        self.held = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.slots: asyncio.Semaphore | None = None
        self.tasks: set[asyncio.Task[Any]] = set()
        #: drives submitted here and not yet ended (waiting for a place included)
        self.load = 0
        #: set when the loop stops: a drive that has not started by then does not start
        self.stopping = False

    def start(self) -> asyncio.AbstractEventLoop:
        self.stopping = False
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            self.slots = asyncio.Semaphore(self.places)
            self.gate = asyncio.Lock()
            self.probe = loop.create_task(self._probe())
            ready.set()
            loop.run_forever()

        self.thread = threading.Thread(target=run, name=self.name, daemon=True)
        self.thread.start()
        ready.wait()
        self.loop = loop
        return loop

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(LAG_PROBE_S)
            late = max(0.0, loop.time() - asked - LAG_PROBE_S)
            self.lag += LAG_WEIGHT * (late - self.lag)

    async def admit(self, max_lag_s: float) -> None:
        """Wait, in turn, until the loop is not late."""
        assert self.gate is not None
        if self.lag <= max_lag_s and not self.gate.locked():
            return
        async with self.gate:
            while self.lag > max_lag_s:
                self.held += 1
                await asyncio.sleep(LAG_PROBE_S)

    def stop(self, timeout_s: float) -> None:
        loop, self.loop = self.loop, None
        thread, self.thread = self.thread, None
        if loop is None:
            return
        self.stopping = True  # the drives waiting for a place end as they get one, without starting

        async def drain() -> None:
            tasks = list(self.tasks)
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=timeout_s)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=2.0)
            if self.probe is not None:
                self.probe.cancel()
                await asyncio.gather(self.probe, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(drain(), loop).result(timeout_s + 5.0)
        except Exception:  # a drive that will not end must not keep the process from stopping
            log.exception("drives did not stop in time")
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(5.0)
        if not loop.is_running():
            loop.close()


class DriveLoop:
    """Runs drives as greenlets on `threads` asyncio loops, each in a thread of its own."""

    def __init__(self, *, concurrency: int = 1000, threads: int = 1, max_lag_s: float = 0.5,
                 name: str = "harness-drives") -> None:
        if concurrency < 1:
            raise ValueError(f"a drive loop needs a concurrency of at least 1, got {concurrency}")
        if threads < 1:
            raise ValueError(f"a drive loop needs at least 1 thread, got {threads}")
        threads = min(threads, concurrency)
        self.concurrency = concurrency
        self.threads = threads
        #: a loop later than this starts no new drive until it has caught up
        self.max_lag_s = max_lag_s
        self.name = name
        self._lock = threading.Lock()
        shares = [concurrency // threads + (1 if i < concurrency % threads else 0) for i in range(threads)]
        self._shards = [_Shard(share, name if threads == 1 else f"{name}-{i}") for i, share in enumerate(shares)]
        self._started = False
        #: stop() was called: a submit does not start the loops again (only start() does)
        self._stopped = False
        self._driving = 0
        #: the most drives ever in flight at once (between their first step and their end)
        self.peak = 0

    @property
    def driving(self) -> int:
        """Drives started and not yet ended (waiting ones included)."""
        return self._driving

    @property
    def lag_s(self) -> float:
        """The latest of the loops' smoothed lags, in seconds."""
        return max(shard.lag for shard in self._shards)

    @property
    def held(self) -> int:
        """How many times a new drive was held because its loop was late (a probe's interval each)."""
        return sum(shard.held for shard in self._shards)

    def start(self) -> None:
        """Start the loops' threads (idempotent)."""
        with self._lock:
            self._stopped = False
            if self._started:
                return
            for shard in self._shards:
                shard.start()
            self._started = True

    def submit(self, fn: Callable[[], T], *, not_started: Callable[[], None] | None = None
               ) -> concurrent.futures.Future[T]:
        """Run `fn` as a drive on the loop with the fewest drives (from any thread); its future. The
        drive runs in a copy of the caller's context (its log fields, for example).

        A drive the loop stops before it starts (waiting for a place, or held while the loop was late)
        never runs `fn`: `not_started` is called instead, on the loop's thread, and the future raises
        `DriveNotStartedError` (or is cancelled, if the stop's timeout cancelled it still waiting)."""
        if not self._stopped:
            self.start()  # the first submit starts the loops
        ctx = contextvars.copy_context()
        with self._lock:
            shard = min(self._shards, key=lambda s: s.load / s.places)
            loop = shard.loop
            if loop is None:  # stopped (a submit racing a stop does not start the loops again)
                raise RuntimeError("the drive loop is stopped")
            shard.load += 1
        return asyncio.run_coroutine_threadsafe(self._drive(shard, fn, ctx, not_started), loop)

    async def _drive(self, shard: _Shard, fn: Callable[[], T], ctx: contextvars.Context,
                     not_started: Callable[[], None] | None) -> T:
        task = asyncio.current_task()
        assert task is not None and shard.slots is not None
        shard.tasks.add(task)
        started = False
        try:
            async with shard.slots:
                await shard.admit(self.max_lag_s)
                if shard.stopping:
                    raise DriveNotStartedError("the drive loop stopped before this drive started")
                started = True
                with self._lock:
                    self._driving += 1
                    self.peak = max(self.peak, self._driving)
                try:
                    return await run_in_greenlet(fn, ctx)
                finally:
                    with self._lock:
                        self._driving -= 1
        finally:
            shard.tasks.discard(task)
            with self._lock:
                shard.load -= 1
            if not started and not_started is not None:
                not_started()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Start no further drive (one waiting for a place never starts: `DriveNotStartedError`), let
        drives in flight reach their next stop for up to `timeout_s`, then cancel what is left (a cancelled
        drive stops where it waits and gives its lease back: another worker resumes it), and end the loops."""
        with self._lock:
            started, self._started = self._started, False
            self._stopped = True
        if not started:
            return
        stoppers = [threading.Thread(target=shard.stop, args=(timeout_s,), daemon=True) for shard in self._shards]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join(timeout_s + 10.0)
