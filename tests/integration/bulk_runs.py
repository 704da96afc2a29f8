"""Many real-looking final Runs, fast: one Run driven through the state machine, cloned by direct store
writes (new run, record and event ids everywhere, the RunTrace's record commitment re-encoded), their
records chained in bulk (multi-row inserts onto the locked chain head, as a drain would chain them, with
the chain's own insert trigger checking every link). Every clone verifies like the original (`harness
audit verify`)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, cast

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.documents import pack, unpack
from harness.adapters.sql.store import SqlStore
from harness.audit import commitment
from harness.domain.chain import canonical_json, record_hash
from harness.domain.ids import ordered_id
from harness.domain.records import NewRun
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState

S = RunState
SUCCESS = (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def drive(machine: StateMachine, path: Sequence[RunState] = SUCCESS, tenant: str = "acme",
          user: str = "ana") -> str:
    """Create a Run and move it along `path` (transient states funnel to a final one)."""
    run, _ = cast(SqlStore, machine.store).create_run(NewRun(tenant, user, "s1", {"task": "t"}))
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
    packs = store.engine.dialect.name == "sqlite"
    ids: list[str] = []
    for start in range(0, n, batch):
        runs, jobs, trans, audits = [], [], [], []
        chained: list[tuple[str, str, str, str]] = []
        for _ in range(min(batch, n - start)):
            new = ordered_id()
            mapping = {template: new, **{e["event_id"]: ordered_id() for e in events},
                       **{r.record_id: ordered_id() for r in records}}

            def swap(text: str, mapping: dict[str, str] = mapping) -> str:
                return _UUID.sub(lambda m: mapping.get(m.group(0), m.group(0)), text)

            runs.append({**run, "run_id": new, "tenant_id": tenant or run["tenant_id"], "idempotency_key": None,
                         "request": swap(run["request"]),
                         "context": _swapped_context(run["context"], swap, packs=packs),
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
                chained.append((mapping[rec.record_id], new, rec.kind, payload))
            ids.append(new)
        with store.engine.begin() as conn:
            for table, rows in ((t.runs, runs), (t.jobs, jobs), (t.transitions, trans), (t.audit_events, audits)):
                _insert(conn, table, rows)
            _chain(conn, chained)
    return ids


def _swapped_context(stored: str | bytes | None, swap: Any, *, packs: bool) -> str | bytes | None:
    """A stored RunContext with the template's ids swapped, stored as the store stores it."""
    context = unpack(stored)
    return None if context is None else pack(swap(canonical_json(context)), packs=packs)


def _insert(conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """Bulk INSERTs. psycopg's executemany sends one INSERT per row (pipelined), so on PostgreSQL the rows
    go by COPY (row triggers fire as for INSERT); PyMySQL's executemany already folds the rows into one
    multi-row INSERT, and SQLite's runs in process."""
    if conn.dialect.name != "postgresql":
        conn.execute(table.insert(), rows)
        return
    names = list(rows[0])
    # COPY sends values as they are: a digest column (0016) takes its 32 bytes, not the hex
    digests = {n for n in names if isinstance(table.c[n].type, t.Digest)}
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    with cursor.copy(f"COPY {table.name} ({','.join(names)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row([t.digest_bytes(row[n]) if n in digests else row[n] for n in names])
    cursor.close()


def _chain(conn: sa.Connection, records: list[tuple[str, str, str, str]]) -> None:
    """Append (record_id, run_id, kind, payload) records to the chain, after its locked head."""
    head = conn.execute(sa.select(t.chain_head.c.seq, t.chain_head.c.hash).where(t.chain_head.c.id == 1)
                        .with_for_update()).one()
    seq, prev = int(head.seq), str(head.hash)
    rows = []
    for record_id, run_id, kind, payload in records:
        seq += 1
        digest = record_hash(seq, record_id, run_id, kind, prev, payload)
        rows.append({"seq": seq, "record_id": record_id, "run_id": run_id, "kind": kind, "payload": payload,
                     "prev_hash": prev, "hash": digest})
        prev = digest
    _insert(conn, t.trace_records, rows)
    conn.execute(t.chain_head.update().where(t.chain_head.c.id == 1).values(seq=seq, hash=prev))
