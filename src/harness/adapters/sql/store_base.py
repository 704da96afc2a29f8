"""The SQL store's shared state (engine, reader pool, clock, dialect statements) and row helpers."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import sqlalchemy as sa

from harness.adapters.sql.database import read_only
from harness.adapters.sql.documents import unpack
from harness.adapters.sql.pg_listen import listens
from harness.adapters.sql.raw import statements_for
from harness.adapters.sql.schema import digest_hex
from harness.adapters.sql.units import MODES, JoiningEngine, Units, joining
from harness.clock import SystemClock
from harness.domain.errors import InvalidRequestError
from harness.domain.records import (
    RunRecord,
    StoredTraceRecord,
    TransitionRow,
)
from harness.kernel.states import CloseReason, RunState
from harness.ports import Clock, TraceBuffer


class WrongExitError(Exception):
    """TRACING asked to exit somewhere its close reason does not lead (rolls the transaction back)."""

    def __init__(self, reason: CloseReason | None) -> None:
        super().__init__(str(reason))
        self.reason = reason


class CasRow(NamedTuple):
    state: str
    close_reason: str | None
    version: int
    lease_epoch: int


class OutboxRow(NamedTuple):
    id: int
    record_id: str
    run_id: str | None
    kind: str
    payload: str


def stored_record(row: Any) -> StoredTraceRecord:
    """A trace record read on the cursor (seq, record_id, run_id, kind, payload, prev_hash, hash), its
    hashes as hex whichever form the columns hold (bytes from migration 0016 on)."""
    seq, record_id, run_id, kind, payload, prev_hash, digest = row
    return StoredTraceRecord(seq, record_id, run_id, kind, payload, digest_hex(prev_hash), digest_hex(digest))


def without_run_id(payload: dict[str, Any], run_id: str | None) -> dict[str, Any]:
    if run_id is None or payload.get("run_id") != run_id:
        return payload
    return {k: v for k, v in payload.items() if k != "run_id"}


def transition_of(m: dict[str, Any]) -> TransitionRow:
    source = RunState(m["from_state"]) if m["from_state"] else None
    return TransitionRow(m["seq"], source, RunState(m["to_state"]), m["actor"], m["reason"], m["forced_by"], m["at"])


def run_from_row(row: sa.Row[Any]) -> RunRecord:
    return run_of(row._mapping)


def run_of(m: Mapping[Any, Any]) -> RunRecord:
    return RunRecord(
        run_id=m["run_id"],
        tenant_id=m["tenant_id"],
        user_id=m["user_id"],
        session_id=m["session_id"],
        state=RunState(m["state"]),
        close_reason=CloseReason(m["close_reason"]) if m["close_reason"] else None,
        version=m["version"],
        retry_of=m["retry_of"],
        parent_run_id=m["parent_run_id"],
        idempotency_key=m["idempotency_key"],
        created_at=m["created_at"],
        last_state_change_at=m["last_state_change_at"],
        deadline_at=m["deadline_at"],
        lease_owner=m["lease_owner"],
        lease_epoch=m["lease_epoch"],
        stall_count=m["stall_count"],
        request=json.loads(m["request"]),
        context=unpack(m["context"], m["run_id"]),
        result=json.loads(m["result"]) if m["result"] else None,
    )



class StoreBase:
    """What every part of the SQL store shares: the engine, its read-only pool, the clock, the trace buffer."""

    def __init__(self, engine: sa.Engine, clock: Clock | None = None, *, commit_mode: str | None = None) -> None:
        if isinstance(engine, JoiningEngine):  # another store's engine: share its units of work
            self.units: Units = engine.units
        else:
            mode = commit_mode or os.environ.get("HARNESS_COMMIT_MODE") or MODES[0]
            if mode not in MODES:
                raise InvalidRequestError(f"HARNESS_COMMIT_MODE must be one of {', '.join(MODES)}, not {mode!r}")
            self.units = Units(engine, enabled=mode == "boundaries")
            # PostgreSQL: writes whose result nobody reads go with the connection's next statement
            statements_for(engine.dialect).install(engine)
            engine = joining(engine, self.units)
            # the unit's own connections come through the joining engine too, so that listeners on the
            # store's engine (the benchmarks' statement counters, say) see them
            self.units.engine = engine
        #: the engine, joining the drive's unit of work when one is open (harness.adapters.sql.units)
        self.engine = engine
        #: the same pool, for reads only: on SQLite they do not take the write lock
        self.reader = read_only(engine)
        self._batches_by_array = engine.dialect.name == "postgresql"
        self.clock: Clock = clock or SystemClock()
        self._locks_rows = engine.dialect.name != "sqlite"  # SQLite serializes with BEGIN IMMEDIATE
        #: a long RunContext is stored compressed where the database keeps long text in its rows (SQLite)
        self._packs_context = engine.dialect.name == "sqlite"
        # the compare-and-set as one UPDATE … RETURNING where the database has it (PostgreSQL, SQLite from
        # 3.35; MariaDB has none for UPDATE: there it reads the row under a lock first)
        self._cas_returns = bool(engine.dialect.update_returning)
        self._raw = statements_for(engine.dialect)
        #: every state change sends a NOTIFY in its transaction, waking waiters in every process
        #: (harness.adapters.sql.pg_listen); the composition root turns it off with HARNESS_EVENTS_PUSH
        self.notify_changes = listens(engine)
        #: carries the outbox to the chain through e.g. Redis Streams (SPEC D2); None: drained directly
        self.trace_buffer: TraceBuffer | None = None
        self._database_id: str | None = None

    # ------------------------------------------------------------------ units of work (ports.units)

    def unit(self, run_id: str) -> contextlib.AbstractContextManager[object]:
        """A unit of work for the drive of a Run: its writes commit at its boundaries and at its end."""
        return self.units.unit(run_id)

    def effect(self) -> contextlib.AbstractContextManager[None]:
        """A block that leaves the process: committed before, and nothing inside joins the unit."""
        return self.units.effect()

    def release(self) -> None:
        """Commit the drive's open transaction, if any, before a call that must not hold it."""
        self.units.release()

    def defer(self, write: Callable[[], None]) -> None:
        """Run `write` in the drive's next transaction (now when one is open or outside a drive)."""
        self.units.defer(write)

    def joined(self) -> bool:
        """Whether this thread's writes join a drive's open unit now (they commit together at its boundary)."""
        return self.units.current() is not None

    def boundary(self) -> None:
        """Commit what this drive wrote since its last boundary, before an effect leaves the process."""
        self.units.boundary()

    def after_commit(self, told: Callable[[], None]) -> None:
        """Run `told` once what was written so far has committed."""
        self.units.after_commit(told)

    def close(self) -> None:
        """Release every pooled connection."""
        if self.trace_buffer is not None:
            self.trace_buffer.close()
        self.engine.dispose()
