"""Approval requests, approvals and decisions in SQL: the adapter of the approval desk's port
(harness.ports.approvals.ApprovalRows).

Every write chains the row as it now stands (harness.audit.mirror_records) in the transaction that wrote
it. A uniqueness collision inside a decision's transaction (one person's second approval, written by a
decider that skipped the row locks) becomes ApprovalConflictError: callers never see SQLAlchemy's errors.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.database import connection_of, read_retried
from harness.adapters.sql.store import SqlStore
from harness.audit import mirror_records
from harness.domain.approvals import ApprovalConflictError, HitlRequest
from harness.domain.chain import canonical_json
from harness.domain.records import TraceRecordIn
from harness.kernel.states import RunState
from harness.ports import Clock, Tx

r = t.hitl_requests


def _request_from_row(row: sa.Row[Any]) -> HitlRequest:
    m = row._mapping
    return HitlRequest(
        request_id=m["request_id"], run_id=m["run_id"], tenant_id=m["tenant_id"], requester=m["requester"],
        level=m["level"], required_approvals=m["required_approvals"],
        approver_roles=tuple(json.loads(m["approver_roles"])), actions=json.loads(m["actions"]),
        actions_hash=m["actions_hash"], status=m["status"], created_at=m["created_at"],
        deadline_at=m["deadline_at"],
    )


class SqlApprovals:
    """The approval desk's rows in the Run store's database."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    @property
    def clock(self) -> Clock:
        """The store's clock."""
        return self.store.clock

    # ------------------------------------------------------------------ reads

    def _all(self, query: sa.Select[Any]) -> list[HitlRequest]:
        return read_retried(self.store.reader,
                            lambda conn: [_request_from_row(row) for row in conn.execute(query)])

    def get(self, request_id: str, tenant_id: str | None = None) -> HitlRequest | None:
        """The request with this id (in this tenant, when given)."""
        query = sa.select(r).where(r.c.request_id == request_id)
        if tenant_id is not None:
            query = query.where(r.c.tenant_id == tenant_id)
        found = self._all(query)
        return found[0] if found else None

    def for_run(self, run_id: str) -> list[HitlRequest]:
        """A Run's requests, oldest first."""
        return self._all(sa.select(r).where(r.c.run_id == run_id).order_by(r.c.created_at))

    def pending(self, tenant_id: str | None, limit: int) -> list[HitlRequest]:
        """Requests still waiting, oldest deadline first."""
        query = sa.select(r).where(r.c.status == "pending").order_by(r.c.deadline_at).limit(limit)
        if tenant_id is not None:
            query = query.where(r.c.tenant_id == tenant_id)
        return self._all(query)

    def due(self, now: float, limit: int) -> list[HitlRequest]:
        """Pending requests whose deadline has passed."""
        return self._all(sa.select(r).where(r.c.status == "pending", r.c.deadline_at <= now)
                         .order_by(r.c.deadline_at).limit(limit))

    def pending_count(self, tenant_id: str, requester: str) -> int:
        """How many requests of this requester still wait."""
        with self.store.reader.connect() as conn:
            return int(conn.execute(
                sa.select(sa.func.count()).select_from(r).where(
                    r.c.tenant_id == tenant_id, r.c.requester == requester, r.c.status == "pending")
            ).scalar_one())

    def parent_runs(self, run_ids: Sequence[str]) -> dict[str, str]:
        """The parent Run of each child Run among `run_ids`."""
        if not run_ids:
            return {}
        with self.store.reader.connect() as conn:
            rows = conn.execute(sa.select(t.runs.c.run_id, t.runs.c.parent_run_id).where(
                t.runs.c.run_id.in_(list(run_ids)), t.runs.c.parent_run_id.is_not(None))).all()
        return {str(row.run_id): str(row.parent_run_id) for row in rows}

    def stranded(self, decided_before: float, limit: int) -> list[HitlRequest]:
        """The newest closed request of each Run still waiting in AWAITING_HITL with no pending one."""
        runs = t.runs
        pending = r.alias("p")
        newer = r.alias("n")
        return self._all(
            sa.select(r).join(runs, runs.c.run_id == r.c.run_id)
            .where(runs.c.state == RunState.AWAITING_HITL.value, r.c.status != "pending",
                   r.c.decided_at < decided_before,
                   ~sa.exists().where(pending.c.run_id == r.c.run_id, pending.c.status == "pending"),
                   ~sa.exists().where(newer.c.run_id == r.c.run_id, newer.c.created_at > r.c.created_at))
            .order_by(r.c.decided_at).limit(limit)
        )

    def approvals(self, request_id: str, tx: Tx | None = None) -> list[str]:
        """Approvers whose approval of this request was accepted."""
        query = sa.select(t.hitl_approvals.c.approver).where(t.hitl_approvals.c.request_id == request_id)
        if tx is not None:
            return list(connection_of(tx).execute(query).scalars())
        with self.store.reader.connect() as conn:
            return list(conn.execute(query).scalars())

    # ------------------------------------------------------------------ writes

    @contextmanager
    def transaction(self) -> Iterator[Tx]:
        """A transaction of its own; a uniqueness collision becomes ApprovalConflictError."""
        try:
            with self.store.engine.begin() as conn:
                yield conn
        except sa.exc.IntegrityError as exc:
            raise ApprovalConflictError(f"a decision collided with a stored row: {exc.orig}") from exc

    def lock_run(self, tx: Tx, run_id: str) -> RunState:
        """Lock the Run's row for the rest of `tx`."""
        return self.store.lock_run(connection_of(tx), run_id)

    def lock_request(self, tx: Tx, request_id: str) -> HitlRequest | None:
        """The request's row, locked until `tx` ends."""
        conn = connection_of(tx)
        query = sa.select(r).where(r.c.request_id == request_id)
        if conn.dialect.name != "sqlite":  # SQLite: the transaction already holds the write lock
            query = query.with_for_update()
        row = conn.execute(query).first()
        return None if row is None else _request_from_row(row)

    def insert(self, tx: Tx, request: HitlRequest, escalated_from: str | None) -> None:
        """Insert a pending request with the record that chains it."""
        conn = connection_of(tx)
        row = dict(
            request_id=request.request_id, run_id=request.run_id, tenant_id=request.tenant_id,
            requester=request.requester, level=request.level, required_approvals=request.required_approvals,
            approver_roles=json.dumps(list(request.approver_roles)), actions=canonical_json(request.actions),
            actions_hash=request.actions_hash, status="pending", created_at=request.created_at,
            deadline_at=request.deadline_at, decided_at=None, escalated_from=escalated_from,
        )
        conn.execute(r.insert().values(**row))
        self._chain(conn, mirror_records.HITL_REQUEST, mirror_records.hitl_request(row), request.run_id)

    def add_approval(self, tx: Tx, request_id: str, approver: str, decision_id: str, at: float) -> None:
        """One person's accepted approval (the table's uniqueness makes the person count once)."""
        connection_of(tx).execute(t.hitl_approvals.insert().values(
            request_id=request_id, approver=approver, decision_id=decision_id, at=at))

    def add_decision(self, tx: Tx, decision: dict[str, Any]) -> None:
        """A submitted decision, with the record that chains it."""
        conn = connection_of(tx)
        conn.execute(t.hitl_decisions.insert().values(**decision))
        self._chain(conn, mirror_records.HITL_DECISION, mirror_records.hitl_decision(decision), decision["run_id"])

    def close(self, tx: Tx, request_id: str, status: str, now: float) -> bool:
        """Close a pending request and chain it as it now stands."""
        conn = connection_of(tx)
        moved = conn.execute(r.update().where(r.c.request_id == request_id, r.c.status == "pending")
                             .values(status=status, decided_at=now)).rowcount
        if moved != 1:
            return False
        row = conn.execute(sa.select(r).where(r.c.request_id == request_id)).one()
        self._chain(conn, mirror_records.HITL_REQUEST, mirror_records.hitl_request(row._mapping), row.run_id)
        return True

    def pending_of_run(self, tx: Tx, run_id: str) -> list[str]:
        """Ids of the Run's pending requests."""
        return list(connection_of(tx).execute(sa.select(r.c.request_id).where(
            r.c.run_id == run_id, r.c.status == "pending")).scalars())

    def trace(self, tx: Tx, records: Sequence[TraceRecordIn], now: float) -> None:
        """Queue trace records for the chain."""
        self.store.enqueue(connection_of(tx), records, now)

    def audit(self, tx: Tx, run_id: str, event: str, actor: str, detail: dict[str, Any]) -> None:
        """Write an audit event."""
        self.store.write_audit(connection_of(tx), run_id, event, actor, detail)

    def _chain(self, conn: sa.Connection, kind: str, payload: dict[str, Any], run_id: str) -> None:
        """Chain a row as it now stands, in the transaction that wrote it (audit.mirror_records)."""
        self.store.enqueue(conn, [TraceRecordIn(kind, payload, run_id)], self.store.clock.now())
