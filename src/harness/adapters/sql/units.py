"""Commit at effect boundaries: one transaction for the writes of a drive between two of its effects.

A drive (one thread carrying one Run forward) opens a unit of work (`Units.unit()`). Inside it, every
write the store and the adapters built on it make — through `engine.begin()` or a read through
`reader.connect()` once something was written — joins one open transaction on one connection, and
nothing is committed until the drive reaches a boundary (`Units.boundary()`): before anything leaves the
process (an LLM call, a tool call that is not an idempotent in-process one, a child Run, parallel steps
on other threads), when a Run is accepted, and when the drive ends (the Run parked or closed). Each
transition is still its own row, audit event and chained record, in order, through the compare-and-set;
what changes is only how many of them one commit makes durable. After a crash the Run resumes from its
last committed boundary, exactly as if the crash had come a moment earlier.

The transaction is opened lazily, by the first write after a boundary: until then reads go through the
pool as before (nothing uncommitted exists for them to miss), and between boundaries the unit holds no
connection. Reads after a write join the transaction, so they see the drive's own changes.

Only the thread (on a drive loop: the greenlet) that opened the unit joins it; other threads (parallel plan
steps, a heartbeat) use the pool as before. A failure inside a joined block rolls the whole open
transaction back — everything since the last boundary — and goes on: what the drive believed written
since then is not, so its next compare-and-set finds the Run where the last boundary left it and stops,
as a crash would have.

Listeners told of a committed change (`after_commit`) are told once the boundary that makes it durable
has committed; a rollback drops them with the writes they describe.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections.abc import Callable, Iterator
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine.base import OptionEngine

from harness.adapters.sql.raw import statements_for
from harness.pipeline import waits

#: numbers the savepoints of `guarded` blocks, so that each has a name of its own
_SAVEPOINTS = itertools.count(1)

#: HARNESS_COMMIT_MODE: "boundaries" (the default) or "transition" (every write its own commit, as before)
MODES = ("boundaries", "transition")


class Unit:
    """The open unit of work of one drive: its thread, its connection and transaction while one is open,
    and what to tell once it commits."""

    def __init__(self, engine: sa.Engine, key: str) -> None:
        self.engine = engine
        self.key = key
        #: the drive's line of execution: its thread, or its greenlet on a drive loop's thread
        self.strand = waits.strand()
        self.conn: sa.Connection | None = None
        self.tx: sa.RootTransaction | None = None
        self.pending: list[Callable[[], None]] = []
        #: inside an effect (`Units.effect`): nothing joins, every block commits itself as outside a unit
        self.suspended = False
        #: writes that wait for the next transaction (`Units.defer`), in order
        self.deferred: list[Callable[[], None]] = []

    @property
    def open(self) -> bool:
        return self.conn is not None

    def connection(self) -> sa.Connection:
        """The open transaction's connection, opening one (the first write after a boundary)."""
        if self.conn is None:
            conn = self.engine.connect()
            try:
                self.tx = conn.begin()
            except BaseException:
                conn.close()
                raise
            self.conn = conn
            while self.deferred:  # what waited goes first, in its order
                write = self.deferred.pop(0)
                try:
                    write()
                except BaseException:
                    self.rollback()
                    raise
        return self.conn

    def commit(self) -> None:
        """Make the writes since the last boundary durable, then tell their listeners."""
        if self.deferred and self.conn is None:
            self.connection()  # opened for what waited
        conn, tx = self.conn, self.tx
        self.conn = self.tx = None
        if conn is not None and tx is not None:
            try:
                tx.commit()
            except BaseException:
                self.pending.clear()
                raise
            finally:
                conn.close()
        self.flush()

    def flush(self) -> None:
        """Tell the listeners of what has committed, in order. They run outside the unit, as effects do:
        what they write commits by itself (a listener's write must never open a transaction of the unit
        that its end would not commit)."""
        was, self.suspended = self.suspended, True
        try:
            while self.pending:
                told = self.pending.pop(0)
                told()
        finally:
            self.suspended = was

    def rollback(self) -> None:
        """Undo everything since the last boundary."""
        conn, tx = self.conn, self.tx
        self.conn = self.tx = None
        self.pending.clear()
        self.deferred.clear()
        if conn is not None:
            try:
                if tx is not None and tx.is_active:
                    tx.rollback()
            finally:
                conn.close()

    @contextlib.contextmanager
    def joined(self, *, write: bool) -> Iterator[sa.Connection]:
        """A block of the drive's work on the open transaction (opened by a write if none is). A write
        block that raises rolls the transaction back (its own writes may be half done); a read block only
        when the database failed (a failed statement aborts a PostgreSQL transaction), not when a read
        found nothing and said so."""
        conn = self.connection()
        try:
            yield conn
        except sa.exc.SQLAlchemyError:
            self.rollback()
            raise
        except BaseException:
            if write:
                self.rollback()
            raise


class Units:
    """The units of work of the drives on one engine (one per thread and context)."""

    def __init__(self, engine: sa.Engine, *, enabled: bool = True) -> None:
        self.engine = engine
        self.enabled = enabled
        self._current: contextvars.ContextVar[Unit | None] = contextvars.ContextVar(
            f"harness_unit_{id(self)}", default=None)

    def current(self) -> Unit | None:
        """The unit this thread's drive has open, if any (a copied context in another thread has none)."""
        unit = self._current.get()
        if unit is None or unit.suspended or unit.strand is not waits.strand():
            return None
        return unit

    @contextlib.contextmanager
    def unit(self, key: str) -> Iterator[Unit | None]:
        """A unit of work for the drive of Run `key`. Opened again for the same Run (the leased drive
        around the Run manager's) it joins and only the outermost end commits; opened for another Run
        (a child Run driven inside its parent's call) the parent's is committed first and the child gets
        its own, committed at its end. The end is a boundary even when the drive raised: every block that
        completed is consistent, and one that failed has rolled back already."""
        if not self.enabled:
            yield None
            return
        outer = self.current()
        if outer is not None and outer.key == key:
            yield outer  # the outer drive's end commits
            return
        if outer is not None:
            outer.commit()
        unit = Unit(self.engine, key)
        token = self._current.set(unit)
        try:
            with waits.holding(lambda: unit.open):  # a drive holding a transaction is never switched out
                yield unit
        finally:
            try:
                while unit.open or unit.pending or unit.deferred:  # never leave a transaction behind
                    unit.commit()
            finally:
                self._current.reset(token)

    @contextlib.contextmanager
    def effect(self) -> Iterator[None]:
        """A block that leaves the process (a model or tool call, a child Run): what the drive wrote
        commits first, and inside nothing joins the unit — every write commits by itself, as outside a
        drive, so a call that waits (for a child Run, a sandbox, a retry) never holds the drive's
        transaction while it waits."""
        unit = self.current()
        if unit is None:
            yield
            return
        unit.commit()
        unit.suspended = True
        try:
            yield
        finally:
            unit.suspended = False

    def release(self) -> None:
        """Commit the drive's open transaction, if one is open, so that nothing is held during what comes
        next (an idempotent read-only call); writes deferred stay deferred."""
        unit = self.current()
        if unit is not None and unit.open:
            unit.commit()

    def defer(self, write: Callable[[], None]) -> None:
        """Run `write` in the drive's next transaction: now if one is open, else when the next write or
        boundary opens one (outside a unit: now). What waits is lost with a rollback or a crash, as
        everything since the last boundary is: only the results of calls that may run again go here."""
        unit = self.current()
        if unit is None or unit.open:
            write()
        else:
            unit.deferred.append(write)

    def boundary(self) -> None:
        """Commit what the drive has written since its last boundary (nothing outside a unit)."""
        unit = self.current()
        if unit is not None:
            unit.commit()

    def after_commit(self, told: Callable[[], None]) -> None:
        """Run `told` once what was written so far is durable: now outside a unit or when nothing is open,
        else at the next boundary (never, if it rolls back)."""
        unit = self.current()
        if unit is None or not unit.open:
            told()
        else:
            unit.pending.append(told)


class JoiningEngine(OptionEngine):
    """An engine whose `begin()` and `connect()` join this thread's unit of work when one is open.

    It is an engine (SQLAlchemy's option engine over the real one, with no options of its own), so events
    and everything else work on it as on the engine; `execution_options()` returns a joining engine too,
    so the store's read-only view joins as well."""

    def __init__(self, proxied: sa.Engine, units: Units) -> None:
        super().__init__(proxied, {})
        self.units = units

    @contextlib.contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        unit = self.units.current()
        if unit is None:
            with super().begin() as conn:
                yield conn
            return
        with unit.joined(write=True) as conn:
            yield conn

    def connect(self) -> sa.Connection:
        unit = self.units.current()
        if unit is None or not unit.open:
            return super().connect()
        # the unit's connection, in a `with` that neither closes it nor ends its transaction
        return cast(sa.Connection, unit.joined(write=False))

    def execution_options(self, **options: Any) -> JoiningEngine:
        return JoiningEngine(OptionEngine(self, options), self.units)


def joining(engine: sa.Engine, units: Units) -> sa.Engine:
    """`engine`, joining the units of work of `units`."""
    return JoiningEngine(engine, units)


@contextlib.contextmanager
def guarded(engine: sa.Engine, *, write: bool) -> Iterator[sa.Connection]:
    """`engine.begin()` (write) or `engine.connect()`, for a block whose failure its caller catches and
    survives (a memory outage degrades a Run instead of failing it): inside a drive's open unit of work
    the block runs under a savepoint, so a failure undoes only itself and the drive's writes stay."""
    unit = engine.units.current() if isinstance(engine, JoiningEngine) else None
    if unit is None or not (unit.open or write):
        with engine.begin() if write else engine.connect() as conn:
            yield conn
        return
    conn = unit.connection()
    # a name of its own per block (MySQL replaces a savepoint of the same name: nested blocks would share one);
    # a write the block queued is sent, and fails, inside the savepoint, as if sent at once
    with statements_for(conn.dialect).savepoint(conn, f"harness_guarded_{next(_SAVEPOINTS)}"):
        yield conn


def joins(engine: sa.Engine) -> bool:
    """Whether a block on `engine` would join this thread's drive's open transaction."""
    unit = engine.units.current() if isinstance(engine, JoiningEngine) else None
    return unit is not None and unit.open


def begun(conn: sa.Connection) -> contextlib.AbstractContextManager[Any]:
    """`conn.begin()`, unless the connection is a unit's, already in its transaction."""
    return contextlib.nullcontext() if conn.in_transaction() else conn.begin()
