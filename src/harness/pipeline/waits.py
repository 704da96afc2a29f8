"""How a drive waits without holding a thread.

A drive is plain synchronous code: read the Run, transition, call the model, record, call a skill. Run by
a `DriveLoop` (harness.pipeline.drive_loop), each drive is a greenlet on the loop's thread. Where it waits
for something outside the process (a model's answer, a skill on a pool thread, a sandboxed process, a
child Run, a retry's back-off), `wait` switches back to the loop, which awaits that thing among every other
drive's waits and switches the drive back in with the result. A thousand waiting drives are then a
thousand greenlets of a few KB each, not a thousand threads. The same code run anywhere else (a CLI
command, `Harness.run`, a Celery task, a test) blocks its own thread, as it always did.

A drive never waits inside an open database transaction: the unit of work commits before anything leaves
the process. `suspendable()` checks that too (the guard its unit of work sets with `holding`): a drive that
would wait holding a transaction blocks its thread instead, since another drive on the same thread could
otherwise queue behind its locks for ever.

`Lane` is a bounded pool of threads for one kind of call that cannot suspend by itself (a local skill's
Python, a sandboxed process, a model client without async I/O). Each kind has its own lane, sized by
settings, so a burst of one kind never starves another, and a call's timeout starts when its thread picks
it up: time spent queued behind other calls is not the call's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

import greenlet

T = TypeVar("T")
C = TypeVar("C")

#: the time by which the current wait must end (time.monotonic()), set around a call with `deadline`
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("harness_wait_deadline", default=None)
#: says whether the current drive holds a database transaction now (set by its unit of work)
_HOLDING: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar("harness_holding",
                                                                                      default=None)
#: told True when the current drive switches out on a wait outside the process and False when it is
#: switched back in (set around a leased drive with `watched`)
_WATCH: contextvars.ContextVar[Callable[[bool], None] | None] = contextvars.ContextVar("harness_watch",
                                                                                       default=None)
#: set while a drive waits for its own process's code (a local skill's Python on a lane): a death then may
#: be the Run's doing, so the watch is not told
_IN_PROCESS: contextvars.ContextVar[bool] = contextvars.ContextVar("harness_in_process", default=False)


class LateError(TimeoutError):
    """A wait ran past the deadline set around it (`deadline`)."""


class DriveGreenlet(greenlet.greenlet):  # type: ignore[misc]
    """A drive run by a DriveLoop: the greenlets `wait` may switch out of."""


@contextlib.contextmanager
def holding(holds_transaction: Callable[[], bool]) -> Iterator[None]:
    """Inside the block, `holds_transaction()` says whether the drive holds a database transaction, and
    a drive that does is not switched out (it blocks its thread instead)."""
    token = _HOLDING.set(holds_transaction)
    try:
        yield
    finally:
        _HOLDING.reset(token)


@contextlib.contextmanager
def watched(switched: Callable[[bool], None]) -> Iterator[None]:
    """Inside the block, `switched(True)` is called when the drive switches out on a wait outside the
    process (a model's answer, a sandboxed process, a child Run, a back-off) and `switched(False)` when it
    is switched back in, before it runs on."""
    token = _WATCH.set(switched)
    try:
        yield
    finally:
        _WATCH.reset(token)


def strand() -> object:
    """What identifies the current line of execution: its greenlet (a thread's own main greenlet outside
    a drive loop), so that two drives sharing a thread are told apart like two threads."""
    return greenlet.getcurrent()


def strand_tag() -> str:
    """A suffix that tells this drive's greenlet from the others on its thread ("" outside a drive loop),
    for names that must be one per drive, such as a lease's owner."""
    current = greenlet.getcurrent()
    return f":g{id(current):x}" if isinstance(current, DriveGreenlet) else ""


def suspendable() -> bool:
    """Whether the caller is a drive that may switch out to its loop now."""
    if not isinstance(greenlet.getcurrent(), DriveGreenlet):
        return False
    holds = _HOLDING.get()
    return holds is None or not holds()


def wait(awaitable: Awaitable[T]) -> T:
    """The awaitable's result, awaited on the drive's loop while the drive is switched out. Only for a
    caller that checked `suspendable()`; a deadline set with `deadline` bounds it (LateError past it)."""
    current = greenlet.getcurrent()
    if not isinstance(current, DriveGreenlet):
        raise RuntimeError("wait() outside a drive loop: check suspendable() first")
    until = _DEADLINE.get()
    if until is not None:
        awaitable = _bounded(awaitable, until - time.monotonic())
    assert current.parent is not None
    watch = None if _IN_PROCESS.get() else _WATCH.get()
    if watch is None:
        return current.parent.switch(awaitable)  # type: ignore[no-any-return]
    watch(True)
    try:
        return current.parent.switch(awaitable)  # type: ignore[no-any-return]
    finally:
        watch(False)


async def _bounded(awaitable: Awaitable[T], seconds: float) -> T:
    try:
        return await asyncio.wait_for(awaitable, max(seconds, 0.0))
    except TimeoutError as exc:
        raise LateError(f"the wait ran past its deadline ({seconds:.3g}s)") from exc


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Bound every suspended wait inside the block to end within `seconds` from now (None: unbounded)."""
    token = _DEADLINE.set(None if seconds is None else time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def sleep(seconds: float) -> None:
    """Pause the drive: switched out when it can be, else the thread sleeps."""
    if seconds <= 0:
        return
    if suspendable():
        wait(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


def result(future: concurrent.futures.Future[T], timeout: float | None = None) -> T:
    """A thread's future's result, waited for without holding the drive's thread when it can be
    (concurrent.futures.TimeoutError after `timeout` seconds, as Future.result raises it)."""
    if not suspendable():
        return future.result(timeout)
    try:
        if timeout is None:
            return wait(asyncio.wrap_future(future))
        return wait(asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), max(timeout, 0.0)))
    except TimeoutError as exc:
        if isinstance(exc, LateError):
            raise
        raise concurrent.futures.TimeoutError() from exc


async def run_in_greenlet(fn: Callable[[], T], ctx: contextvars.Context | None = None) -> T:
    """Run the sync `fn` in a DriveGreenlet of this loop's thread, awaiting for it whatever it hands over
    with `wait`, until it returns."""
    drive = DriveGreenlet(fn)
    drive.gr_context = ctx if ctx is not None else contextvars.copy_context()
    asked: Any = drive.switch()
    while not drive.dead:
        awaitable: Awaitable[Any] = asked
        try:
            value = await awaitable
        except BaseException as exc:  # handed back to the drive, which may handle it
            asked = drive.throw(exc)
        else:
            asked = drive.switch(value)
    return asked  # type: ignore[no-any-return]


def run_all(calls: list[Callable[[], T]], pool: concurrent.futures.Executor) -> list[T]:
    """Run the calls at once and return their results in order (the first failure raised, once all have
    ended). A drive on a loop runs each in a greenlet of its own on the loop, with a copy of the drive's
    context, and switches out until all are done; anyone else runs them on `pool`'s threads."""
    if not suspendable():
        return gather([pool.submit(contextvars.copy_context().run, call) for call in calls])

    async def each() -> list[T]:
        done = await asyncio.gather(*(run_in_greenlet(call, contextvars.copy_context()) for call in calls),
                                    return_exceptions=True)
        for item in done:
            if isinstance(item, BaseException):
                raise item
        return list(done)  # type: ignore[arg-type]

    return wait(each())


def gather(futures: list[concurrent.futures.Future[T]]) -> list[T]:
    """The results of several threads' futures, in order (the first failure raised, after all ended)."""
    if not suspendable():
        return [f.result() for f in futures]

    async def both() -> list[T]:
        done = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
        for item in done:
            if isinstance(item, BaseException):
                raise item
        return list(done)  # type: ignore[arg-type]

    return wait(both())


class Lane:
    """A bounded pool of threads for one kind of call, whose timeouts start when the call starts."""

    def __init__(self, name: str, size: int, *, in_process: bool = False) -> None:
        if size < 1:
            raise ValueError(f"lane {name!r} needs at least one thread, got {size}")
        self.name = name
        self.size = size
        #: whether the lane's calls run this process's own code (a local skill's Python), which could kill
        #: the process, rather than wait on something outside it (a sandboxed process, a model's answer)
        self.in_process = in_process
        self._pool = concurrent.futures.ThreadPoolExecutor(size, thread_name_prefix=f"lane-{name}")
        self._lock = threading.Lock()
        self._queued = 0
        self._running = 0

    @property
    def running(self) -> int:
        """Calls running on the lane's threads now."""
        return self._running

    @property
    def queued(self) -> int:
        """Calls waiting for one of the lane's threads now."""
        return self._queued

    def run(self, fn: Callable[[], T], *, timeout: float | None, until: float | None = None,
            late: Callable[[], BaseException] | None = None,
            queue_late: Callable[[], BaseException] | None = None) -> T:
        """`fn()` on one of the lane's threads. `timeout`: seconds from when a thread picks the call up
        (the thread cannot be killed; the caller stops waiting and gets `late()`). `until`: a
        time.monotonic() that bounds both the wait for a thread (`queue_late()` if it has not started by
        then; the call is withdrawn) and the call."""
        began: list[float] = []  # when a thread picked it up
        ended: list[float] = []
        with self._lock:
            self._queued += 1

        def go() -> T:
            with self._lock:
                self._queued -= 1
                self._running += 1
            began.append(time.monotonic())
            try:
                return fn()
            finally:
                ended.append(time.monotonic())
                with self._lock:
                    self._running -= 1

        done = self._pool.submit(contextvars.copy_context().run, go)
        while True:
            # the call cannot be late before `timeout` seconds from its start: until it has started, that
            # is `timeout` from now, so one wait covers the usual call, queued or not
            start = began[0] if began else time.monotonic()
            end = None if timeout is None else start + timeout
            if until is not None:
                end = until if end is None else min(end, until)
            token = _IN_PROCESS.set(True) if self.in_process else None
            try:
                return result(done, None if end is None else end - time.monotonic())
            except concurrent.futures.TimeoutError:
                now = time.monotonic()
                if done.done() and (end is None or (ended and ended[0] <= end)):
                    return done.result()  # it ended in time; only a busy loop saw it late
                if not began and (until is None or now < until):
                    continue  # still queued: its time has not begun
                if not began and done.cancel():
                    with self._lock:
                        self._queued -= 1
                    raise (queue_late or _late(self.name, "waited for a thread"))() from None
                if began and (until is None or now < until) and timeout is not None and now < began[0] + timeout:
                    continue  # it started while this wait was under way: its own time is not up
                done.cancel()
                raise (late or _late(self.name, f"ran longer than {timeout}s"))() from None
            finally:
                if token is not None:
                    _IN_PROCESS.reset(token)

    def close(self) -> None:
        """Take no more calls; calls running finish on their threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _late(name: str, what: str) -> Callable[[], BaseException]:
    return lambda: TimeoutError(f"a {name} call {what}")


def call_blocking(fn: Callable[[], T], lane: Lane | None) -> T:
    """`fn()`, which blocks on I/O: on the lane when the caller is a drive that can switch out (so the
    drive's thread is free while it blocks), inline otherwise."""
    if lane is not None and suspendable():
        return lane.run(fn, timeout=None)
    return fn()


class PerLoop(Generic[C]):
    """One object per event loop, made on first use from a drive on that loop: an asynchronous HTTP
    client's connection pool belongs to the loop it was made on."""

    def __init__(self, make: Callable[[], C]) -> None:
        self._make = make
        self._made: dict[asyncio.AbstractEventLoop, C] = {}
        self._lock = threading.Lock()

    def get(self) -> C:
        """The running loop's object (made now if it has none)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            made = self._made.get(loop)
            if made is None:
                made = self._made[loop] = self._make()
            return made

    def close(self, closing: Callable[[C], Awaitable[object]]) -> None:
        """Close every loop's object on its own loop (those whose loop is gone are dropped)."""
        with self._lock:
            made, self._made = self._made, {}
        for loop, item in made.items():
            if loop.is_running():
                asyncio.run_coroutine_threadsafe(_awaited(closing(item)), loop)


async def _awaited(awaitable: Awaitable[object]) -> None:
    await awaitable
