"""Recorded cost per Run, user and tenant: what budgets are checked against (SPEC G1)."""

from __future__ import annotations

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.store import SqlStore
from harness.pipeline.trace_recorder import CostTrace


class CostLedger:
    """Appends costs (with their CostTrace, in one transaction) and sums them by scope."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def record(self, cost: CostTrace) -> None:
        """Record one cost and its trace record."""
        now = self.store.clock.now()
        with self.store.engine.begin() as conn:
            conn.execute(t.costs.insert().values(
                run_id=cost.run_id, tenant_id=cost.tenant_id, user_id=cost.user_id, source=cost.source,
                input_tokens=cost.input_tokens, output_tokens=cost.output_tokens, usd=cost.usd, at=now,
            ))
            self.store.enqueue(conn, [cost.to_record()], now)

    def spent(self, *, tenant_id: str, user_id: str | None = None, run_id: str | None = None) -> float:
        """USD recorded for a tenant, optionally narrowed to one user or one Run."""
        query = sa.select(sa.func.coalesce(sa.func.sum(t.costs.c.usd), 0.0)).where(t.costs.c.tenant_id == tenant_id)
        if user_id is not None:
            query = query.where(t.costs.c.user_id == user_id)
        if run_id is not None:
            query = query.where(t.costs.c.run_id == run_id)
        with self.store.engine.connect() as conn:
            return float(conn.execute(query).scalar_one())
