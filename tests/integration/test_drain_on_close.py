"""A Run's close chains the outbox in its own transaction, under a savepoint (SPEC A4, issue 9)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from harness.adapters.sql import statements as q
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.audit.verify import verify_chain
from harness.clock import FakeClock
from harness.domain.records import NewRun, TraceRecordIn
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState

S = RunState


@pytest.fixture
def store(backend_url: str) -> Iterator[SqlStore]:
    """A store on a fresh, migrated database of the backend under test."""
    s = SqlStore.open(backend_url, FakeClock())
    yield s
    s.close()


def test_the_close_leaves_nothing_in_the_outbox(store: SqlStore) -> None:
    """Every record of the Run, the closing ones included, is chained when the close commits."""
    run, _ = store.create_run(NewRun("acme", "alice", "s", {}))
    StateMachine(store).transition(run.run_id, S.CREATED, S.FAILED, actor="sweeper", reason="stuck")
    assert store.get_run(run.run_id).state == S.CLOSED_FAILED
    assert store.outbox_backlog() == 0
    assert {r.kind for r in store.trace_of(run.run_id)} >= {"transition", "run", "audit"}
    assert verify_chain(SqlAuditReads(store)).ok


def test_a_failing_drain_does_not_keep_the_run_from_closing(store: SqlStore,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The drain fails inside the closing transaction: its savepoint rolls back alone, the Run closes, the
    records wait in the outbox, and the next drain chains them."""
    run, _ = store.create_run(NewRun("acme", "alice", "s", {}))
    chained_before = len(store.trace_of(run.run_id))

    def broken(conn: sa.Connection, batch_size: int, locked: object = None) -> tuple[int, int]:
        conn.execute(sa.text("SELECT 1"))  # the savepoint is live: fail after doing some work in it
        raise sa.exc.OperationalError("INSERT INTO trace_records", {}, Exception("trace store is down"))

    monkeypatch.setattr(store, "_drain_batch", broken)
    StateMachine(store).transition(run.run_id, S.CREATED, S.FAILED, actor="sweeper", reason="stuck")
    monkeypatch.undo()
    assert store.get_run(run.run_id).state == S.CLOSED_FAILED
    assert store.outbox_backlog() > 0 and len(store.trace_of(run.run_id)) == chained_before
    store.drain_all()
    assert store.outbox_backlog() == 0
    assert "run" in {r.kind for r in store.trace_of(run.run_id)}
    assert verify_chain(SqlAuditReads(store)).ok


def test_a_drain_that_fails_half_way_leaves_no_trace_of_its_half(store: SqlStore,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The drain chains part of the outbox, then the database refuses a statement (on PostgreSQL that
    aborts the whole transaction until the savepoint is rolled back): what it chained is undone, the
    Run still closes, and the chain stays whole and verifiable."""
    run, _ = store.create_run(NewRun("acme", "alice", "s", {}))
    head_before = store.chain_head()
    real = store._drain_batch

    def half_then_broken(conn: sa.Connection, batch_size: int, locked: object = None) -> tuple[int, int]:
        assert real(conn, 1) == (1, 1)  # one record chained and taken out of the outbox, inside the savepoint
        conn.exec_driver_sql("SELECT no_such_column FROM trace_records")  # refused by the database
        raise AssertionError("unreachable")

    monkeypatch.setattr(store, "_drain_batch", half_then_broken)
    StateMachine(store).transition(run.run_id, S.CREATED, S.FAILED, actor="sweeper", reason="stuck")
    monkeypatch.undo()
    assert store.get_run(run.run_id).state == S.CLOSED_FAILED
    assert store.chain_head() == head_before  # the half-drain was rolled back with its savepoint
    backlog = store.outbox_backlog()
    assert backlog > 0
    assert store.drain_all() == backlog
    assert verify_chain(SqlAuditReads(store)).ok


def test_a_close_that_would_wait_for_the_chain_leaves_its_records_to_the_next_drain(store: SqlStore) -> None:
    """Where a housekeeper drains the outbox anyway (the service), a close does not queue on the chain head:
    while another transaction holds the head (a drain under way), a Run closes at once, its records wait
    in the outbox, and the next drain chains them, the chain whole. With nobody on the head the close
    chains its records as always. (SQLite has one writer at a time: nobody holds the head while a close
    writes, and it always drains.)"""
    machine = StateMachine(store)
    machine.close_waits_for_chain = False
    first, _ = store.create_run(NewRun("acme", "alice", "s", {}))
    machine.transition(first.run_id, S.CREATED, S.FAILED, actor="sweeper", reason="stuck")
    assert store.outbox_backlog() == 0  # the head was free: chained in the close
    if store.engine.dialect.name == "sqlite":
        return
    run, _ = store.create_run(NewRun("acme", "alice", "s", {}))
    with store.engine.connect() as holder, concurrent.futures.ThreadPoolExecutor(1) as pool:
        holder.begin()
        holder.execute(q.HEAD_LOCKED).one()  # a drainer holds the head
        closing = pool.submit(machine.transition, run.run_id, S.CREATED, S.FAILED, actor="sweeper",
                              reason="stuck")
        try:
            closing.result(20)  # it would wait for the holder's commit if it queued on the head
        finally:
            holder.rollback()
    assert store.get_run(run.run_id).state == S.CLOSED_FAILED
    assert store.outbox_backlog() > 0 and "run" not in {r.kind for r in store.trace_of(run.run_id)}
    store.drain_all()
    assert store.outbox_backlog() == 0
    assert "run" in {r.kind for r in store.trace_of(run.run_id)}
    assert verify_chain(SqlAuditReads(store)).ok


def test_a_drain_reads_its_batch_without_reading_the_whole_chain(store: SqlStore) -> None:
    """With thousands of records chained and hundreds waiting (a busy service's outbox), the drain's batch
    read looks each waiting record up in the chain by its id: PostgreSQL does not hash the whole chain,
    which made every drain grow with the chain (10.7 ms with 20,000 chained, 1.0 ms by the index)."""
    if store.engine.dialect.name != "postgresql":
        pytest.skip("the planner's choice is PostgreSQL's (SQLite and MariaDB probe the index as written)")
    for i in range(4):
        store.record([TraceRecordIn("step", {"i": i, "j": j, "pad": "x" * 200}) for j in range(500)])
        store.drain_all()
    store.record([TraceRecordIn("step", {"waiting": j}) for j in range(300)])
    statement = str(q.OUTBOX_BATCH_CHAINED.compile(dialect=store.engine.dialect))
    with store.engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE trace_records")
        conn.exec_driver_sql("ANALYZE outbox")
        plan = "\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + statement, {"p_limit": 500}))
    assert "Seq Scan on trace_records" not in plan, plan
    assert "trace_records_record_id" in plan, plan
    assert store.drain_all() == 300
    assert verify_chain(SqlAuditReads(store)).ok
