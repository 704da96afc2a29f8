"""Recorded cost per Run, user and tenant: what budgets are checked against (SPEC G1)."""

from __future__ import annotations

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.store import SqlStore
from harness.pipeline.trace_recorder import CostTrace

_INSERT = t.costs.insert()
_BY_SCOPE = sa.select(
    sa.func.coalesce(sa.func.sum(sa.case((t.costs.c.run_id == sa.bindparam("p_run"), t.costs.c.usd), else_=0.0)),
                     0.0).label("run_usd"),
    sa.func.coalesce(sa.func.sum(sa.case((t.costs.c.user_id == sa.bindparam("p_user"), t.costs.c.usd), else_=0.0)),
                     0.0).label("user_usd"),
    sa.func.coalesce(sa.func.sum(t.costs.c.usd), 0.0).label("tenant_usd"),
).where(t.costs.c.tenant_id == sa.bindparam("p_tenant"))


class CostLedger:
    """Appends costs (with their CostTrace, in one transaction) and sums them by scope."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def record(self, cost: CostTrace) -> None:
        """Record one cost and its trace record, in their own transaction."""
        with self.store.engine.begin() as conn:
            self.insert(conn, cost)
            self.store.enqueue(conn, [cost.to_record()], self.store.clock.now())

    def insert(self, conn: sa.Connection, cost: CostTrace) -> None:
        """Record one cost inside the caller's transaction (its CostTrace goes with that transaction)."""
        conn.execute(_INSERT, {
            "run_id": cost.run_id, "tenant_id": cost.tenant_id, "user_id": cost.user_id, "source": cost.source,
            "input_tokens": cost.input_tokens, "output_tokens": cost.output_tokens, "usd": cost.usd,
            "at": self.store.clock.now(),
        })

    def spent_by_scope(self, *, tenant_id: str, user_id: str, run_id: str) -> tuple[float, float, float]:
        """(run, user, tenant) spend in one query: the budget check's three numbers."""
        with self.store.engine.connect() as conn:
            row = conn.execute(_BY_SCOPE, {"p_tenant": tenant_id, "p_user": user_id, "p_run": run_id}).one()
        return float(row.run_usd), float(row.user_usd), float(row.tenant_usd)

    def spent(self, *, tenant_id: str, user_id: str | None = None, run_id: str | None = None) -> float:
        """USD recorded for a tenant, optionally narrowed to one user or one Run."""
        query = sa.select(sa.func.coalesce(sa.func.sum(t.costs.c.usd), 0.0)).where(t.costs.c.tenant_id == tenant_id)
        if user_id is not None:
            query = query.where(t.costs.c.user_id == user_id)
        if run_id is not None:
            query = query.where(t.costs.c.run_id == run_id)
        with self.store.engine.connect() as conn:
            return float(conn.execute(query).scalar_one())
