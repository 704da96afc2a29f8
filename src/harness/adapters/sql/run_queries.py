"""Read-only queries the service needs beyond the store's: tenant-scoped listings, change feeds, counts.

Every method that returns Runs or their changes takes the caller's tenant and filters by it, so a
route cannot forget to (SPEC U2).
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.store import SqlStore
from harness.domain.feed import Change, RunRow
from harness.domain.records import RunRecord
from harness.kernel.states import RunState
from harness.kernel.thresholds import DEFAULT, Thresholds


def _task_of(request_json: str) -> str:
    try:
        task = json.loads(request_json).get("task", "")
    except (ValueError, AttributeError):
        return ""
    return str(task)


class RunQueries:
    """The service's read model over one store (on its read-only pool)."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def get_run(self, run_id: str) -> RunRecord:
        """The Run; UnknownRunError when there is none."""
        return self.store.get_run(run_id)

    def list_runs(self, tenant_id: str, *, state: str | None = None, before: float | None = None,
                  limit: int = 50) -> list[RunRow]:
        """The tenant's Runs, newest first, optionally in one state and created before a cursor."""
        query = (
            sa.select(
                t.runs.c.run_id,
                t.runs.c.tenant_id,
                t.runs.c.user_id,
                t.runs.c.state,
                t.runs.c.request,
                t.runs.c.created_at,
                t.runs.c.last_state_change_at,
                t.jobs.c.status,
            )
            .join(t.jobs, t.jobs.c.job_id == t.runs.c.run_id)
            .where(t.runs.c.tenant_id == tenant_id)
            .order_by(t.runs.c.created_at.desc(), t.runs.c.run_id)
            .limit(limit)
        )
        if state is not None:
            query = query.where(t.runs.c.state == state)
        if before is not None:
            query = query.where(t.runs.c.created_at < before)
        with self.store.reader.connect() as conn:
            rows = conn.execute(query).all()
        return [
            RunRow(
                r.run_id,
                r.tenant_id,
                r.user_id,
                r.state,
                _task_of(r.request),
                r.created_at,
                r.last_state_change_at,
                r.status,
            )
            for r in rows
        ]

    def tenant_of(self, run_id: str) -> str | None:
        """The tenant that owns a Run, or None when no Run has this id."""
        with self.store.reader.connect() as conn:
            value = conn.execute(sa.select(t.runs.c.tenant_id).where(t.runs.c.run_id == run_id)).scalar()
        return str(value) if value is not None else None

    def changes_after(self, tenant_id: str, cursor: int, *, run_id: str | None = None, limit: int = 500,
                      through: int | None = None) -> list[Change]:
        """State changes committed after `cursor` (and up to `through`), oldest first, for one Run or the whole
        tenant."""
        query = (
            sa.select(t.transitions)
            .join(t.runs, t.runs.c.run_id == t.transitions.c.run_id)
            .where(t.transitions.c.id > cursor, t.runs.c.tenant_id == tenant_id)
            .order_by(t.transitions.c.id)
            .limit(limit)
        )
        if run_id is not None:
            query = query.where(t.transitions.c.run_id == run_id)
        if through is not None:
            query = query.where(t.transitions.c.id <= through)
        with self.store.reader.connect() as conn:
            rows = conn.execute(query).all()
        return [Change(r.id, r.run_id, r.seq, r.from_state, r.to_state, r.actor, r.reason, r.at) for r in rows]

    def change_ids_after(self, cursor: int, limit: int = 500) -> list[int]:
        """The ids of every committed change after `cursor`, any tenant's, oldest first: where the feed has
        holes (a change whose id was taken by a transaction not committed yet, or rolled back)."""
        query = sa.select(t.transitions.c.id).where(t.transitions.c.id > cursor).order_by(t.transitions.c.id)
        with self.store.reader.connect() as conn:
            return [int(i) for i in conn.execute(query.limit(limit)).scalars()]

    def latest_cursor(self) -> int:
        """The newest change's position (a tenant stream starts from here unless told otherwise)."""
        with self.store.reader.connect() as conn:
            return int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(t.transitions.c.id), 0))).scalar_one())

    def runs_by_state(self) -> dict[str, int]:
        """How many Runs are in each state (every state present, zeros included)."""
        counts = {s.value: 0 for s in RunState}
        with self.store.reader.connect() as conn:
            for state, n in conn.execute(sa.select(t.runs.c.state, sa.func.count()).group_by(t.runs.c.state)):
                counts[state] = int(n)
        return counts

    def zombie_counts(self, now: float, thresholds: Thresholds = DEFAULT) -> dict[str, int]:
        """Runs whose state has outlived its threshold (a deployment's own, see kernel.thresholds), by state.

        A Run whose worker still heartbeats its lease is healthy until its state's heartbeat ceiling; a Run
        waiting for a human is stuck once its pending request's deadline has passed, or once its request was
        decided and the Run did not move.
        """
        counts: dict[str, int] = {}
        healthy_lease = sa.and_(t.runs.c.lease_expires_at.is_not(None), t.runs.c.lease_expires_at > now)
        with self.store.reader.connect() as conn:
            for state, limit in thresholds.per_state.items():
                if limit is None:
                    continue
                ceiling = thresholds.ceiling(state) or limit
                counts[state.value] = int(
                    conn.execute(
                        sa.select(sa.func.count())
                        .select_from(t.runs)
                        .where(
                            t.runs.c.state == state.value,
                            t.runs.c.last_state_change_at < now - limit,
                            sa.or_(sa.not_(healthy_lease), t.runs.c.last_state_change_at < now - ceiling),
                        )
                    ).scalar_one()
                )
            waiting = t.runs.c.state == RunState.AWAITING_HITL.value
            overdue = sa.and_(t.hitl_requests.c.status == "pending", t.hitl_requests.c.deadline_at < now)
            pending = t.hitl_requests.alias("p")
            decided = sa.and_(
                t.hitl_requests.c.status != "pending",
                t.hitl_requests.c.decided_at < now - thresholds.decided_s,
                ~sa.exists().where(pending.c.run_id == t.runs.c.run_id, pending.c.status == "pending"),
            )
            counts[RunState.AWAITING_HITL.value] = int(
                conn.execute(
                    sa.select(sa.func.count(sa.distinct(t.runs.c.run_id)))
                    .select_from(t.runs.join(t.hitl_requests, t.hitl_requests.c.run_id == t.runs.c.run_id))
                    .where(waiting, sa.or_(overdue, decided))
                ).scalar_one()
            )
        return counts

    def pending_approvals(self) -> tuple[int, float | None]:
        """(how many approval requests wait, when the oldest was opened)."""
        with self.store.reader.connect() as conn:
            row = conn.execute(
                sa.select(sa.func.count(), sa.func.min(t.hitl_requests.c.created_at)).where(
                    t.hitl_requests.c.status == "pending"
                )
            ).one()
        return int(row[0]), (float(row[1]) if row[1] is not None else None)

    def decisions_of(self, request_id: str) -> list[dict[str, Any]]:
        """Every decision submitted on an approval request, oldest first (accepted and refused)."""
        d = t.hitl_decisions
        with self.store.reader.connect() as conn:
            rows = conn.execute(
                sa.select(
                    d.c.approver, d.c.decision, d.c.break_glass, d.c.reason, d.c.outcome, d.c.refusal, d.c.at
                )
                .where(d.c.request_id == request_id)
                .order_by(d.c.id)
            ).all()
        return [dict(r._mapping) for r in rows]

    def job(self, job_id: str) -> dict[str, Any] | None:
        """The legacy job row of a Run (job_id, status, run_state_snapshot, updated_at), or None."""
        with self.store.reader.connect() as conn:
            row = conn.execute(sa.select(t.jobs).where(t.jobs.c.job_id == job_id)).first()
        return dict(row._mapping) if row is not None else None
