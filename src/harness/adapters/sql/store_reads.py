"""The SQL store's reads of Runs and its probes (write probe, database id, integrity check)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql import statements as q
from harness.adapters.sql.database import SQLITE_BUSY_TIMEOUT_MS, read_retried
from harness.adapters.sql.store_base import (
    StoreBase,
    run_from_row,
    run_of,
    transition_of,
)
from harness.adapters.sql.units import begun
from harness.domain.errors import StoreError, UnknownRunError
from harness.domain.records import (
    AuditEvent,
    QueuedRun,
    RunRecord,
    StuckRun,
    TransitionRow,
)
from harness.kernel.states import FINAL, RunState

#: Runs in one state unchanged since a cutoff, oldest first
_STUCK = (
    sa.select(t.runs.c.run_id, t.runs.c.version, t.runs.c.last_state_change_at, t.runs.c.lease_expires_at,
              t.runs.c.stall_count, t.runs.c.close_reason)
    .where(t.runs.c.state == sa.bindparam("p_state"), t.runs.c.last_state_change_at < sa.bindparam("p_cutoff"))
    .order_by(t.runs.c.last_state_change_at)
    .limit(sa.bindparam("p_limit"))
)

_CREATED = RunState.CREATED.value
#: how many Runs wait to start, counted no further than the bound: the CREATED range of the (state,
#: last_state_change_at) index, read at most p_bound entries deep however long the queue is
_BACKLOG = sa.select(sa.func.count()).select_from(
    sa.select(sa.literal(1).label("one")).where(t.runs.c.state == _CREATED).limit(sa.bindparam("p_bound")).subquery()
)
#: queued Runs whose start deadline passed, the most overdue first
_OVERDUE = (
    sa.select(t.runs.c.run_id, t.runs.c.version, t.runs.c.created_at, t.runs.c.start_by)
    .where(t.runs.c.state == _CREATED, t.runs.c.start_by < sa.bindparam("p_now"))
    .order_by(t.runs.c.start_by, t.runs.c.run_id)
    .limit(sa.bindparam("p_limit"))
)


class RunReads(StoreBase):
    """Runs, transitions, audit events and outcomes read back, on the read-only pool; the health probes."""

    # ------------------------------------------------------------------ reads

    def get_run(self, run_id: str) -> RunRecord:
        """The Run with this id; UnknownRunError when there is none."""
        # a read that can run twice: checked out without a ping round trip (the same below)
        rows = read_retried(self.reader, lambda conn: self._raw.mappings(conn, q.RUN_BY_ID, {"p_run_id": run_id}))
        if not rows:
            raise UnknownRunError(run_id)
        return run_of(rows[0])

    def state_of(self, run_id: str) -> RunState:
        """Only the Run's state: the cheap check made between steps (cancelled? swept?)."""
        found = read_retried(self.reader, lambda conn: self._raw.fetchone(conn, q.STATE_OF, {"p_run_id": run_id}))
        if found is None:
            raise UnknownRunError(run_id)
        return RunState(found[0])

    def final_among(self, run_ids: Sequence[str]) -> set[str]:
        """Which of these Runs are in a final state (ids of no Run are not)."""
        if not run_ids:
            return set()
        final = [s.value for s in FINAL]
        query = sa.select(t.runs.c.run_id).where(t.runs.c.run_id.in_(list(run_ids)), t.runs.c.state.in_(final))
        with self.reader.connect() as conn:
            return set(conn.execute(query).scalars())

    def list_runs(self, *, tenant_id: str | None = None, limit: int = 50) -> list[RunRecord]:
        """The newest Runs first."""
        query = sa.select(*q.RUN_RECORD).order_by(t.runs.c.created_at.desc()).limit(limit)
        if tenant_id is not None:
            query = query.where(t.runs.c.tenant_id == tenant_id)
        with self.reader.connect() as conn:
            return [run_from_row(r) for r in conn.execute(query)]

    def stuck_runs(self, state: RunState, cutoff: float, limit: int) -> list[StuckRun]:
        """Runs in `state` unchanged since before `cutoff`, oldest first (what the sweeper looks at)."""
        with self.reader.connect() as conn:
            rows = conn.execute(_STUCK, {"p_state": state.value, "p_cutoff": cutoff, "p_limit": limit}).all()
        return [StuckRun(str(r.run_id), int(r.version), float(r.last_state_change_at),
                         None if r.lease_expires_at is None else float(r.lease_expires_at), int(r.stall_count),
                         r.close_reason) for r in rows]

    def backlog(self, bound: int) -> int:
        """How many accepted Runs wait to start (CREATED), across every process on this database; counted
        up to `bound` only, so the answer is min(backlog, bound) and its cost never grows past the bound."""
        with self.reader.connect() as conn:
            return int(conn.execute(_BACKLOG, {"p_bound": bound}).scalar_one())

    def overdue_unstarted(self, now: float, limit: int) -> list[QueuedRun]:
        """Runs still in CREATED whose start deadline is before `now`, the most overdue first."""
        with self.reader.connect() as conn:
            rows = conn.execute(_OVERDUE, {"p_now": now, "p_limit": limit}).all()
        return [QueuedRun(str(r.run_id), int(r.version), float(r.created_at), float(r.start_by)) for r in rows]

    def unowned_runs(self, grace_s: float, limit: int = 1000) -> list[str]:
        """Runs a driver should be driving and nobody is: in a state that moves on by itself (not final,
        not waiting for a human), with no live lease, unchanged for `grace_s` — their driver died or
        never started. Oldest first: a queued Run (CREATED) since it was accepted, in the order it was
        accepted (ties, e.g. on a clock that stands still, by id: ids are time-ordered to the millisecond)."""
        now = self.clock.now()
        active = [s.value for s in RunState if s not in FINAL and s != RunState.AWAITING_HITL]
        query = (
            sa.select(t.runs.c.run_id)
            .where(t.runs.c.state.in_(active), t.runs.c.last_state_change_at <= now - grace_s,
                   sa.or_(t.runs.c.lease_expires_at.is_(None), t.runs.c.lease_expires_at < now))
            .order_by(t.runs.c.last_state_change_at, t.runs.c.run_id)
            .limit(limit)
        )
        with self.reader.connect() as conn:
            return list(conn.execute(query).scalars())

    def audited(self, run_ids: Sequence[str], event: str) -> set[str]:
        """Which of these Runs already have an audit event named `event` (one query, by the run index)."""
        if not run_ids:
            return set()
        query = sa.select(t.audit_events.c.run_id).distinct().where(
            t.audit_events.c.run_id.in_(list(run_ids)), t.audit_events.c.event == event)
        with self.reader.connect() as conn:
            return {str(r) for r in conn.execute(query).scalars()}

    def transitions_of(self, run_id: str) -> list[TransitionRow]:
        """A Run's state changes in order, CREATED first."""
        rows = read_retried(self.reader, lambda conn: self._raw.mappings(conn, q.TRANSITIONS_OF, {"p_run_id": run_id}))
        return [transition_of(r) for r in rows]

    def run_with_transitions(self, run_id: str) -> tuple[RunRecord, list[TransitionRow]]:
        """A Run and its state changes from one snapshot, in one round trip (what closing a Run needs)."""
        with self.reader.connect() as conn, begun(conn):  # raw cursors do not autobegin: begin here
            found, rows = self._raw.mappings_each(conn, (q.RUN_BY_ID, {"p_run_id": run_id}),
                                                  (q.TRANSITIONS_OF, {"p_run_id": run_id}))
            if not found:
                raise UnknownRunError(run_id)
        return run_of(found[0]), [transition_of(r) for r in rows]

    def outcome_of(self, run_id: str) -> tuple[RunState, dict[str, Any] | None, list[RunState]]:
        """(state, result, path) of a Run from one snapshot: what its caller is answered, without the
        request and RunContext a full read decodes."""
        with self.reader.connect() as conn, begun(conn):
            outcome, steps = self._raw.fetch_each(conn, (q.OUTCOME_OF, {"p_run_id": run_id}),
                                                  (q.PATH_OF, {"p_run_id": run_id}))
        if not outcome:
            raise UnknownRunError(run_id)
        (state, result), path = outcome[0], [RunState(r[0]) for r in steps]
        return RunState(state), json.loads(result) if result else None, path

    def audit_events(self, *, run_id: str | None = None, event: str | None = None) -> list[AuditEvent]:
        """AuditLog events, oldest first, optionally for one Run or one event name."""
        query = sa.select(t.audit_events).order_by(t.audit_events.c.id)
        if run_id is not None:
            query = query.where(t.audit_events.c.run_id == run_id)
        if event is not None:
            query = query.where(t.audit_events.c.event == event)
        with self.reader.connect() as conn:
            return [AuditEvent(r.event_id, r.run_id, r.event, r.actor, json.loads(r.detail), r.at)
                    for r in conn.execute(query)]

    def legacy_job(self, run_id: str) -> tuple[str, str]:
        """(status, run_state_snapshot) of the legacy job row; for legacy consumers and checks only."""
        with self.reader.connect() as conn:
            row = conn.execute(
                sa.select(t.jobs.c.status, t.jobs.c.run_state_snapshot).where(t.jobs.c.job_id == run_id)
            ).first()
        if row is None:
            raise UnknownRunError(run_id)
        return str(row.status), str(row.run_state_snapshot)

    # ------------------------------------------------------------------ probes

    def probe_write(self, by: str = "health", timeout_s: float = 2.0) -> None:
        """Prove the database takes writes now: commit an update of the health heartbeat row. Raises the
        database's error when it refuses; waits at most about `timeout_s` for a lock (SQLite's busy
        timeout, PostgreSQL's statement timeout) instead of a writer's usual minute."""
        with self.engine.connect() as conn:
            sqlite = conn.dialect.name == "sqlite"
            driver = conn.connection.driver_connection
            if sqlite:
                driver.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")  # type: ignore[union-attr]
            try:
                with conn.begin():
                    if conn.dialect.name == "postgresql":
                        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {int(timeout_s * 1000)}")
                    beat = {"at": self.clock.now(), "prober": by[:128]}
                    updated = conn.execute(t.health_heartbeat.update().where(t.health_heartbeat.c.id == 1), beat)
                    if updated.rowcount == 0:
                        conn.execute(t.health_heartbeat.insert().values(id=1, **beat))
            finally:
                if sqlite:
                    driver.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")  # type: ignore[union-attr]

    def database_id(self) -> str:
        """The id written when the database was created (migration 0013): what checkpoints name."""
        if self._database_id is None:
            with self.reader.connect() as conn:
                found = conn.execute(sa.select(t.database_identity.c.database_id)
                                     .where(t.database_identity.c.id == 1)).scalar()
            if found is None:
                raise StoreError("database_identity has no row: the database was damaged")
            self._database_id = str(found)
        return self._database_id

    def raise_if_corrupt(self) -> None:
        """Raise StoreError when the chain head table is missing its row (a damaged database)."""
        with self.reader.connect() as conn:
            if conn.execute(sa.select(t.chain_head.c.id)).first() is None:
                raise StoreError("chain_head row is missing: the database was damaged")
