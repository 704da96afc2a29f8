"""Many real-looking final Runs, fast: one Run driven through the state machine, cloned by direct store
writes (new run, record and event ids everywhere, the RunTrace's record commitment re-encoded), then the
outbox drained into the chain. Every clone verifies like the original (`harness audit verify`)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.store import SqlStore
from harness.audit import commitment
from harness.domain.chain import canonical_json
from harness.domain.ids import ordered_id
from harness.domain.records import NewRun
from harness.kernel import RunState
from harness.state_machine import StateMachine

S = RunState
SUCCESS = (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def drive(machine: StateMachine, path: Sequence[RunState] = SUCCESS, tenant: str = "acme",
          user: str = "ana") -> str:
    """Create a Run and move it along `path` (transient states funnel to a final one)."""
    run, _ = machine.store.create_run(NewRun(tenant, user, "s1", {"task": "t"}))
    state = S.CREATED
    for target in path:
        machine.transition(run.run_id, state, target, actor="test", reason=f"to {target}")
        state = target
    return run.run_id


def _rows(conn: sa.Connection, table: sa.Table, column: sa.Column[Any], run_id: str) -> list[dict[str, Any]]:
    """The template's rows, without their autoincrement ids (the copies get their own)."""
    rows = [dict(r) for r in conn.execute(sa.select(table).where(column == run_id)).mappings()]
    for r in rows:
        r.pop("id", None)
    return rows


def clone(store: SqlStore, template: str, n: int, *, tenant: str | None = None, batch: int = 1000) -> list[str]:
    """`n` copies of the final Run `template` (optionally of another tenant), chained; their ids."""
    store.drain_all()
    with store.reader.connect() as conn:
        run = _rows(conn, t.runs, t.runs.c.run_id, template)[0]
        job = _rows(conn, t.jobs, t.jobs.c.job_id, template)[0]
        transitions = _rows(conn, t.transitions, t.transitions.c.run_id, template)
        events = _rows(conn, t.audit_events, t.audit_events.c.run_id, template)
    records = store.trace_of(template)
    ids: list[str] = []
    for start in range(0, n, batch):
        runs, jobs, trans, audits, outbox = [], [], [], [], []
        for _ in range(min(batch, n - start)):
            new = ordered_id()
            mapping = {template: new, **{e["event_id"]: ordered_id() for e in events},
                       **{r.record_id: ordered_id() for r in records}}

            def swap(text: str, mapping: dict[str, str] = mapping) -> str:
                return _UUID.sub(lambda m: mapping.get(m.group(0), m.group(0)), text)

            runs.append({**run, "run_id": new, "tenant_id": tenant or run["tenant_id"], "idempotency_key": None,
                         "request": swap(run["request"]), "context": run["context"] and swap(run["context"]),
                         "result": run["result"] and swap(run["result"])})
            jobs.append({**job, "job_id": new})
            trans += [{**r, "run_id": new} for r in transitions]
            audits += [{**e, "run_id": new, "event_id": mapping[e["event_id"]], "detail": swap(e["detail"])}
                       for e in events]
            for rec in records:
                payload = swap(rec.payload)
                if rec.kind == "run":
                    doc = json.loads(payload)
                    named = commitment.decode(doc[commitment.RECORDS_KEY])
                    doc[commitment.RECORDS_KEY] = commitment.encode((mapping[i], k) for i, k in named.items())
                    payload = canonical_json(doc)
                outbox.append({"record_id": mapping[rec.record_id], "run_id": new, "kind": rec.kind,
                               "payload": payload, "created_at": store.clock.now()})
            ids.append(new)
        with store.engine.begin() as conn:
            for table, rows in ((t.runs, runs), (t.jobs, jobs), (t.transitions, trans), (t.audit_events, audits),
                                (t.outbox, outbox)):
                conn.execute(table.insert(), rows)
        store.drain_all(batch_size=5000)
    return ids
