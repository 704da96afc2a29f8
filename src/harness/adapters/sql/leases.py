"""Leases with epochs (SPEC K5b): which worker drives a Run, proven before every write and side effect.

A worker acquires a Run's lease (bumping its epoch) only when nobody holds it or the holder's lease
has expired; it heartbeats during long steps; every transition it makes carries its epoch, so the
compare-and-set refuses a worker whose lease was taken over (it was paused, swept or declared dead).
Taking over an expired lease counts a stall, unless its holder's drive was waiting on a call outside the
process (a model, a skill, a child Run) when it last renewed it; a Run that stalls too often is failed as
poison input, not retried forever.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.database import autocommit_writes, read_retried, write_retried
from harness.adapters.sql.raw import statements_for
from harness.adapters.sql.store import SqlStore
from harness.adapters.sql.units import joins
from harness.domain.errors import UnknownRunError
from harness.domain.leases import Lease, Standing
from harness.kernel.events import LEASE_TAKEN_OVER
from harness.kernel.states import NOTHING_TO_DRIVE, RunState

b = sa.bindparam

_ACQUIRE = (
    t.runs.update()
    .where(
        t.runs.c.run_id == b("p_run_id"),
        sa.or_(t.runs.c.lease_owner.is_(None), t.runs.c.lease_expires_at < b("p_now"),
              t.runs.c.lease_owner == b("owner")),
    )
    # stall_count first: MySQL evaluates SET left to right on the updated row, so it must read the old
    # lease_owner before lease_owner is assigned (standard SQL, and MariaDB as harness configures it,
    # read the old row whatever the order)
    .ordered_values(
        # a holder that died while its drive waited on a call outside the process (lease_waiting) was
        # not killed by this Run: its takeover counts no stall
        (t.runs.c.stall_count, t.runs.c.stall_count + sa.case(
            (t.runs.c.lease_owner.is_(None), 0), (t.runs.c.lease_owner == b("owner"), 0),
            (t.runs.c.lease_waiting == 1, 0), else_=1)),
        (t.runs.c.lease_owner, b("owner")),
        (t.runs.c.lease_epoch, t.runs.c.lease_epoch + 1),
        (t.runs.c.lease_expires_at, b("expires")),
        (t.runs.c.lease_waiting, 0),
    )
)
#: PostgreSQL and SQLite: the lease taken and read back in one statement
_ACQUIRE_RETURNING = _ACQUIRE.returning(t.runs.c.lease_epoch, t.runs.c.lease_expires_at, t.runs.c.stall_count)
#: the same, only while the Run has something to drive: neither final nor waiting for a human (a drive
#: that takes its lease this way needs no read of the Run before it)
#: (the states written out as constants: the statements run on the DBAPI cursor, which expands no list)
_DRIVABLE = t.runs.c.state.notin_([sa.literal_column(f"'{state}'") for state in sorted(NOTHING_TO_DRIVE)])
_ACQUIRE_TO_DRIVE = _ACQUIRE.where(_DRIVABLE)
_ACQUIRE_TO_DRIVE_RETURNING = _ACQUIRE_RETURNING.where(_DRIVABLE)
#: the same four, only when no other driver holds the lease (free, or this owner's): no takeover, so no
#: read of the holder before it; tried first, as most acquires find the lease free
_NOT_HELD = sa.or_(t.runs.c.lease_owner.is_(None), t.runs.c.lease_owner == b("owner"))
#: (free?, to_drive?, returning?) -> the acquire statement
_ACQUIRES = {
    (free, to_drive, returning): (statement.where(_NOT_HELD) if free else statement)
    for free in (True, False) for to_drive in (True, False) for returning in (True, False)
    for statement in [(_ACQUIRE_TO_DRIVE_RETURNING if to_drive else _ACQUIRE_RETURNING) if returning
                      else (_ACQUIRE_TO_DRIVE if to_drive else _ACQUIRE)]
}
_HEARTBEAT = (
    t.runs.update()
    .where(t.runs.c.run_id == b("p_run_id"), t.runs.c.lease_epoch == b("p_epoch"), t.runs.c.lease_owner == b("owner"))
    .values(lease_expires_at=b("expires"), lease_waiting=b("waiting"))
)
_RELEASE = (
    t.runs.update()
    .where(t.runs.c.run_id == b("p_run_id"), t.runs.c.lease_epoch == b("p_epoch"), t.runs.c.lease_owner == b("owner"))
    .values(lease_owner=None, lease_expires_at=None, lease_waiting=0)
)
_STANDING = sa.select(t.runs.c.state, t.runs.c.lease_owner, t.runs.c.lease_epoch, t.runs.c.lease_expires_at).where(
    t.runs.c.run_id == b("p_run_id")
)
#: who held the lease before an acquire, read (and the row locked) in the acquire's transaction
_HOLDER = sa.select(t.runs.c.lease_owner, t.runs.c.lease_expires_at).where(
    t.runs.c.run_id == b("p_run_id")
).with_for_update()
_READ = sa.select(t.runs.c.lease_owner, t.runs.c.lease_epoch, t.runs.c.lease_expires_at, t.runs.c.stall_count).where(
    t.runs.c.run_id == b("p_run_id")
)


class Leases:
    """Acquire, heartbeat, check and release Run leases."""

    def __init__(self, store: SqlStore, ttl_s: float = 60.0) -> None:
        self.store = store
        self.ttl_s = ttl_s
        # a drive's acquire, its check before each step and its release run on the DBAPI cursor (every
        # parameter and column is a plain str, int or float)
        self._raw = statements_for(store.engine.dialect)
        #: a renewal is one statement that can run twice (it sets the expiry and the waiting mark)
        self._renewals = autocommit_writes(store.engine)

    def acquire(self, run_id: str, owner: str, *, to_drive: bool = False) -> Lease | None:
        """Take the Run's lease if it is free or expired (a takeover counts a stall); None if held, or,
        `to_drive`, if the Run is final or waiting for a human (or there is no such Run)."""
        now = self.store.clock.now()
        params = {"p_run_id": run_id, "p_now": now, "owner": owner, "expires": now + self.ttl_s}
        with self.store.engine.begin() as conn:
            row = self._take(conn, params, free=True, to_drive=to_drive)
            if row is None:
                # held by another driver, or nothing to drive: a takeover (its lease lapsed) leaves
                # lease_taken_over naming both drivers, so the holder is read, and its row locked, first
                holder = self._raw.fetchone(conn, _HOLDER, {"p_run_id": run_id})
                row = self._take(conn, params, free=False, to_drive=to_drive)
                if row is None:
                    return None
                if holder is not None and holder[0] is not None and holder[0] != owner:
                    # taken while another driver held it: it had died, been stopped or been cut off
                    self.store.write_audit(conn, run_id, LEASE_TAKEN_OVER, owner, {
                        "previous_driver": holder[0], "driver": owner, "lapsed_at": holder[1],
                        "epoch": int(row[0])})
        epoch, expires, stalls = row
        return Lease(run_id, owner, int(epoch), float(expires), int(stalls))

    def _take(self, conn: sa.Connection, params: dict[str, Any], *, free: bool,
              to_drive: bool) -> tuple[Any, ...] | None:
        """(epoch, expires, stalls) of the lease this acquire took, or None."""
        returning = bool(conn.dialect.update_returning)
        statement = _ACQUIRES[free, to_drive, returning]
        if returning:
            row = self._raw.fetchone(conn, statement, params)
            return None if row is None else tuple(row)
        if self._raw.execute(conn, statement, params).rowcount != 1:
            return None
        return tuple(self._raw.fetchone(conn, _READ, {"p_run_id": params["p_run_id"]})[1:])

    def heartbeat(self, lease: Lease, *, waiting: bool = False) -> Lease | None:
        """Extend the lease, saying whether the holder's drive now waits on a call outside the process (a
        takeover while it does counts no stall); None when it was taken over (the holder must stop at once)."""
        now = self.store.clock.now()
        params = {"p_run_id": lease.run_id, "p_epoch": lease.epoch, "owner": lease.owner,
                  "expires": now + self.ttl_s, "waiting": int(waiting)}
        if joins(self.store.engine):  # the drive's open transaction has the row: the renewal goes with it
            with self.store.engine.begin() as conn:
                moved = conn.execute(_HEARTBEAT, params).rowcount
        else:
            # run twice (its connection found dead), it sets the same values: one round trip on PostgreSQL
            # (autocommit, no ping) where ping, BEGIN, UPDATE and COMMIT were four
            moved = write_retried(self._renewals, lambda conn: conn.execute(_HEARTBEAT, params).rowcount)
        if moved != 1:
            return None
        return Lease(lease.run_id, lease.owner, lease.epoch, now + self.ttl_s, lease.stalls)

    def holds(self, lease: Lease) -> bool:
        """Whether this lease is still the Run's current one and unexpired (checked before side effects)."""
        row = read_retried(self.store.reader, lambda conn: self._raw.fetchone(conn, _READ, {"p_run_id": lease.run_id}))
        return row is not None and self._held(lease, *row[:3])

    def standing(self, lease: Lease) -> Standing:
        """The Run's state and whether this lease still holds, in one read: the check a drive makes between
        its steps (left EXECUTING? taken over?), which were two reads of the same row."""
        # a read that can run twice: checked out without a ping round trip, run again if its connection was dead
        row = read_retried(self.store.reader,
                           lambda conn: self._raw.fetchone(conn, _STANDING, {"p_run_id": lease.run_id}))
        if row is None:
            raise UnknownRunError(lease.run_id)
        return Standing(RunState(row[0]), self._held(lease, *row[1:]))

    def _held(self, lease: Lease, owner: str | None, epoch: int, expires: float | None) -> bool:
        """Whether the Run's lease columns still name this lease, unexpired."""
        return owner == lease.owner and epoch == lease.epoch and expires is not None and \
            expires > self.store.clock.now()

    def release(self, lease: Lease) -> None:
        """Give the lease up (when the Run is final or parked)."""
        with self.store.engine.begin() as conn:
            self._raw.later(conn, _RELEASE, {"p_run_id": lease.run_id, "p_epoch": lease.epoch, "owner": lease.owner})
