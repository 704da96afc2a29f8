"""On PostgreSQL the writes of a Run whose results nobody reads, and its reads that do not depend on each
other, cost no round trips of their own (counted on libpq's own trace): a booked cost and its running
totals, and the contents its trace records reference, go with the commit; a budget check's spend and
unpriced calls are one read; a write-back's lookups of several entries are one read; a drain's locked
chain head and its batch are one read. What each does is tested with its own module on every backend;
here, what each costs on the wire."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from psycopg import pq

from harness.adapters.sql import schema as t
from harness.adapters.sql.blobs import blob_refs, blobs, put
from harness.adapters.sql.ledger import CostLedger
from harness.adapters.sql.memory import SqlMemoryRows
from harness.adapters.sql.store import SqlStore
from harness.domain.records import TraceRecordIn
from harness.domain.traces import CostTrace
from tests.integration.test_pipeline_round_trips import _waits
from tests.integration.test_reads_autocommit import store

BACKENDS = ("postgresql",)
__all__ = ["store"]  # the fixture: a store on a fresh, migrated PostgreSQL database


@contextlib.contextmanager
def traced(engine: sa.Engine, folder: Path) -> Iterator[list[int]]:
    """libpq's trace of every connection `engine` hands out while the block runs (after the pool's ping
    at checkout); yields a list that holds the block's round trips, over them all, once it ends."""
    opened: list[tuple[Any, Path, Any]] = []

    def on_checkout(dbapi: Any, _record: Any, _proxy: Any) -> None:
        path = folder / f"pq-{len(opened)}.trace"
        handle = open(path, "w")  # noqa: SIM115 (closed when the block ends)
        dbapi.pgconn.trace(handle.fileno())
        dbapi.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        opened.append((dbapi, path, handle))

    waits: list[int] = []
    sa.event.listen(engine.pool, "checkout", on_checkout)
    try:
        yield waits
    finally:
        sa.event.remove(engine.pool, "checkout", on_checkout)
        for dbapi, _path, handle in opened:
            dbapi.pgconn.untrace()
            handle.close()
    waits.append(sum(_waits(path.read_text()) for _dbapi, path, _handle in opened))


def _cost(run_id: str, usd: float, *, priced: bool = True) -> CostTrace:
    return CostTrace(run_id=run_id, source="llm:fake:plan", input_tokens=10, output_tokens=5, usd=usd,
                     tenant_id="acme", user_id="ana", priced=priced, model=None if priced else "mystery")


def _rows(conn: sa.Connection, query: Any) -> list[Any]:
    return list(conn.execute(query).all())


def test_a_cost_and_the_contents_its_records_reference_go_with_the_commit(store: SqlStore, tmp_path: Path) -> None:
    """BEGIN, the cost, its two totals, two blobs and the COMMIT: one round trip; all of it stored."""
    ledger = CostLedger(store)
    with traced(store.engine, tmp_path) as waits, store.engine.begin() as conn:
        ledger.insert(conn, _cost("r1", 0.25))
        put(conn, {"a" * 64: '"one"', "b" * 64: '"two"'}, "r1")
    assert waits == [1]
    with store.engine.connect() as conn:
        assert [r.usd for r in _rows(conn, sa.select(t.costs.c.usd))] == [0.25]
        assert sorted(r.hash for r in _rows(conn, sa.select(blobs.c.hash))) == ["a" * 64, "b" * 64]
        assert sorted(tuple(r) for r in _rows(conn, sa.select(blob_refs.c.hash, blob_refs.c.run_id))) == [
            ("a" * 64, "r1"), ("b" * 64, "r1")]
    assert ledger.spent_by_scope(tenant_id="acme", user_id="ana", run_id="r1") == (0.25, 0.25, 0.25)


def test_a_failing_write_that_waited_fails_its_transaction(store: SqlStore) -> None:
    """A write that waits for the commit and fails (here a NULL where none is allowed) fails the commit:
    the cost and everything else of the transaction roll back together."""
    ledger = CostLedger(store)
    with pytest.raises(sa.exc.IntegrityError), store.engine.begin() as conn:
        ledger.insert(conn, _cost("r1", 0.25))
        put(conn, {"c" * 64: None}, "r1")  # type: ignore[dict-item]
    with store.engine.connect() as conn:
        assert _rows(conn, sa.select(t.costs.c.id)) == [] and _rows(conn, sa.select(t.spend_totals.c.usd)) == []


def test_the_budget_checks_read_is_one_round_trip(store: SqlStore, tmp_path: Path) -> None:
    ledger = CostLedger(store)
    ledger.record(_cost("r1", 0.5))
    ledger.record(_cost("r1", 0.0, priced=False))
    with traced(store.engine, tmp_path) as waits:
        spend = ledger.spend(tenant_id="acme", user_id="ana", run_id="r1")
    assert waits == [1]
    assert (spend.run_usd, spend.user_usd, spend.tenant_usd, spend.unpriced_models) == (0.5, 0.5, 0.5, ("mystery",))


def test_a_write_backs_lookups_are_one_round_trip(store: SqlStore, tmp_path: Path) -> None:
    """Two entries to write back, four lookups (each entry itself, and the same content in its scope)."""
    rows = SqlMemoryRows(store.engine)
    entry = {"tenant_id": "acme", "scope": "tenant", "team_id": None, "user_id": None, "session_id": None,
             "kind": "note", "source_run_id": None, "created_at": 1.0, "embedding": None, "embedding_model": None}
    stored = {**entry, "entry_id": "e1", "content": "refund", "content_hash": "h1"}
    rows.insert_new([stored])
    again = {**stored, "entry_id": "e2"}  # another id, the same content: the stored entry's id
    new = {**entry, "entry_id": "e3", "content": "new", "content_hash": "h3"}
    with traced(store.engine, tmp_path) as waits:
        found = rows.same_content([stored, again, new])
    assert waits == [1]
    assert found == ["e1", "e1", None]


def test_a_drains_chain_head_and_batch_are_one_round_trip(store: SqlStore, tmp_path: Path) -> None:
    """The drain's locked head and its batch, each record with whether the chain holds it already, in one
    round trip; the records, the head's update, the outbox's delete and the COMMIT in a second. A record
    already chained (re-delivered) is dropped, not chained again."""
    with store.engine.begin() as conn:
        store.enqueue(conn, [TraceRecordIn("note", {"n": i}, "r1", record_id=f"rec-{i}") for i in range(3)], 1.0)
    with traced(store.engine, tmp_path) as waits, store.engine.begin() as conn:
        chained, taken = store._drain_batch(conn, 500)
    assert (chained, taken) == (3, 3) and waits == [2]
    with store.engine.begin() as conn:  # rec-1 again (a re-delivery), and a new one
        store.enqueue(conn, [TraceRecordIn("note", {"n": 1}, "r1", record_id="rec-1"),
                             TraceRecordIn("note", {"n": 3}, "r1", record_id="rec-3")], 2.0)
    with traced(store.engine, tmp_path) as waits, store.engine.begin() as conn:
        chained, taken = store._drain_batch(conn, 500)
    assert (chained, taken) == (1, 2) and waits == [2]
    assert [json.loads(r.payload) for r in store.trace_of("r1")] == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}]
    assert store.outbox_backlog() == 0
