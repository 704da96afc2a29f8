"""What a replay reads of a recorded Run beyond the store's reads, and writes into its scratch database."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.blobs import BlobStore
from harness.adapters.sql.ledger import recount_totals
from harness.adapters.sql.store import SqlStore
from harness.domain.recorded import RecordedDecision
from harness.kernel.states import RunState


class ReplayReads:
    """The recorded Run's database, read for a replay (never written)."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def outbox_records(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        """(kind, payload) of the Run's trace records still in the outbox (not chained yet), in order."""
        with self.store.reader.connect() as conn:
            pending = conn.execute(sa.select(t.outbox.c.kind, t.outbox.c.payload)
                                   .where(t.outbox.c.run_id == run_id).order_by(t.outbox.c.id)).all()
        return [(k, {"run_id": run_id, **json.loads(p)}) for k, p in pending]

    def blobs(self, digests: set[str]) -> dict[str, str] | None:
        """The recorded contents by digest; None when this database records no contents."""
        blobs = BlobStore(self.store.engine)
        if not blobs.available():
            return None
        return blobs.raw(h for h in digests if h)

    def decisions(self, run_id: str) -> list[RecordedDecision]:
        """Every decision submitted on the Run's approval requests, oldest first."""
        d = t.hitl_decisions
        with self.store.reader.connect() as conn:
            rows = conn.execute(sa.select(d.c.approver, d.c.decision, d.c.break_glass, d.c.reason, d.c.at)
                                .where(d.c.run_id == run_id).order_by(d.c.id)).all()
        return [RecordedDecision(r.approver, r.decision, bool(r.break_glass), r.reason, float(r.at)) for r in rows]

    def approval_timeouts(self, run_id: str) -> list[float]:
        """When the Run's approval requests timed out or were escalated."""
        r = t.hitl_requests
        with self.store.reader.connect() as conn:
            return [float(at) for at in conn.execute(sa.select(r.c.decided_at).where(
                r.c.run_id == run_id, r.c.status.in_(("timed_out", "escalated")),
                r.c.decided_at.is_not(None))).scalars()]

    def seed(self, target: SqlStore, tenant_id: str, before: float) -> None:
        """Copy the tenant's recorded spend, memory and knowledge-base documents from before `before` into the
        replay's database, so budgets, recall and the snippets given decide as they did. Memory written by a Run
        counts only once that Run SUCCEEDED (C5); its source Run is not in the scratch database, so such entries
        are copied as plain entries. A document removed since is not there to copy: the replay then diverges at
        the model's request, which no longer holds its snippets."""
        source = self.store
        succeeded = sa.select(t.runs.c.run_id).where(t.runs.c.state == RunState.SUCCEEDED.value)
        for name, time_column in (("costs", "at"), ("memory_entries", "created_at"), ("kb_documents", "created_at"),
                                  ("kb_chunks", "created_at")):
            if not (sa.inspect(source.engine).has_table(name) and sa.inspect(target.engine).has_table(name)):
                continue
            table = sa.Table(name, sa.MetaData(), autoload_with=source.engine)
            query = sa.select(table).where(table.c.tenant_id == tenant_id, table.c[time_column] < before)
            if name == "memory_entries":
                query = query.where(sa.or_(table.c.source_run_id.is_(None), table.c.source_run_id.in_(succeeded)))
            with source.reader.connect() as conn:
                rows = [dict(r._mapping) for r in conn.execute(query)]
            if name == "memory_entries":
                rows = [{**r, "source_run_id": None} for r in rows]
            if rows:
                with target.engine.begin() as conn:
                    conn.execute(sa.Table(name, sa.MetaData(), autoload_with=conn).insert(), rows)
                    if name == "costs":
                        recount_totals(conn, tenant_id)  # the budget check reads the totals, not the rows


def set_deadline(store: SqlStore, run_id: str, deadline_at: float) -> None:
    """Give a Run the deadline its recorded original had (a child Run is due when its parent gave it)."""
    with store.engine.begin() as conn:
        conn.execute(t.runs.update().where(t.runs.c.run_id == run_id).values(deadline_at=deadline_at))
