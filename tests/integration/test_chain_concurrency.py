"""Concurrent writers and drainers never fork the hash chain; re-delivery is idempotent (SPEC A3, A4)."""

from __future__ import annotations

import multiprocessing as mp
import threading
import traceback
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.store import SqlStore
from harness.domain.records import NewRun, TraceRecordIn
from harness.drive.state_machine import StateMachine
from harness.kernel.states import FINAL, RunState
from tests.integration.test_races import (
    assert_chain_intact,
    assert_runs_consistent,
    expected_records,
    start_forked,
)

pytestmark = pytest.mark.slow
#: SQLite here; test_chain_servers.py runs these tests on PostgreSQL and MariaDB
BACKENDS = ("sqlite",)

S = RunState
RUNS_PER_WRITER = 15
PATHS = [
    [S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING],
    [S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL, S.TIMEOUT],
    [S.PREPARING, S.CANCELLED],
]


def _write_runs(store: SqlStore, writer: int) -> None:
    """Create Runs and close them; the machine drains after every close, so writers also drain."""
    machine = StateMachine(store)
    actor = f"writer-{writer}"
    for i in range(RUNS_PER_WRITER):
        run, _ = store.create_run(NewRun("acme", actor, f"s{i}", {"i": i}))
        source = S.CREATED
        for target in PATHS[(writer + i) % len(PATHS)]:
            assert machine.transition(run.run_id, source, target, actor=actor, reason="go").applied
            source = target
        store.record([TraceRecordIn("step", {"writer": writer, "i": i}, run.run_id)])


def _drain_until(store: SqlStore, done: Any) -> None:
    while not done.is_set():
        store.drain(batch_size=7)


def _writer_process(db: str, writer: int, start: Any) -> None:
    store = SqlStore.open(db, migrate_schema=False)
    start.wait()
    _write_runs(store, writer)
    store.close()


def _drainer_process(db: str, start: Any, done: Any) -> None:
    store = SqlStore.open(db, migrate_schema=False)
    start.wait()
    _drain_until(store, done)
    store.close()


def _assert_linear_and_complete(store: SqlStore, writers: int) -> None:
    store.drain_all()
    assert store.outbox_backlog() == 0
    paths = assert_runs_consistent(store)
    assert len(paths) == writers * RUNS_PER_WRITER
    assert all(p[-1] in FINAL for p in paths.values())
    with store.engine.connect() as conn:
        steps = conn.execute(sa.select(sa.func.count()).where(t.trace_records.c.kind == "step")).scalar_one()
    assert steps == writers * RUNS_PER_WRITER
    assert assert_chain_intact(store) == expected_records(store) + steps


def test_threads_writing_and_draining_never_fork_the_chain(store: SqlStore) -> None:
    """A3: writer threads and drainer threads sharing one store keep the chain linear and complete."""
    errors: list[str] = []
    done = threading.Event()

    def guarded(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            errors.append(traceback.format_exc())

    writers = [threading.Thread(target=guarded, args=(_write_runs, store, w)) for w in range(4)]
    drainers = [threading.Thread(target=guarded, args=(_drain_until, store, done)) for _ in range(2)]
    for th in writers + drainers:
        th.start()
    for th in writers:
        th.join(120)
    done.set()
    for th in drainers:
        th.join(60)
    assert errors == [], errors[0]
    _assert_linear_and_complete(store, writers=4)


def test_processes_writing_and_draining_never_fork_the_chain(backend_url: str) -> None:
    """A3: writer and drainer processes on one SQLite file keep the chain linear and complete."""
    db = backend_url
    store = SqlStore.open(db)
    ctx = mp.get_context("fork")
    start, done = ctx.Barrier(4), ctx.Event()
    writers = [ctx.Process(target=_writer_process, args=(db, w, start)) for w in range(3)]
    drainer = ctx.Process(target=_drainer_process, args=(db, start, done))
    try:
        start_forked(store, *writers, drainer)
        for p in writers:
            p.join(120)
        done.set()
        drainer.join(60)
        assert [p.exitcode for p in [*writers, drainer]] == [0, 0, 0, 0]
        _assert_linear_and_complete(store, writers=3)
    finally:
        store.close()


def _redeliver(store: SqlStore, record_id: str, payload: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(t.outbox.insert().values(
            record_id=record_id, run_id=None, kind="audit", payload=payload, created_at=0.0
        ))


def test_a_redelivered_record_is_dropped_and_the_chain_is_unchanged(
    store: SqlStore, machine: StateMachine
) -> None:
    """A4: an outbox row whose record_id is already chained is dropped by the drain, not chained twice."""
    run, _ = store.create_run(NewRun("acme", "alice", "s", {}))
    machine.transition(run.run_id, S.CREATED, S.FAILED, actor="sweeper", reason="stuck")
    store.drain_all()
    head = store.chain_head()
    chained = list(store.iter_trace())
    victim = chained[len(chained) // 2]
    _redeliver(store, victim.record_id, victim.payload)
    _redeliver(store, chained[0].record_id, '{"tampered":true}')
    assert store.drain() == 0
    assert store.outbox_backlog() == 0
    assert store.chain_head() == head
    assert list(store.iter_trace()) == chained


def test_a_redelivered_record_in_a_mixed_batch_is_dropped_and_the_rest_chained_once(store: SqlStore) -> None:
    """A4: re-delivery next to new records chains only the new ones, each once, in outbox order."""
    store.record([TraceRecordIn("step", {"n": 1})])
    store.drain_all()
    (first,) = store.iter_trace()
    store.record([TraceRecordIn("step", {"n": 2})])
    _redeliver(store, first.record_id, first.payload)
    fresh = str(uuid.uuid4())
    _redeliver(store, fresh, '{"n":3}')
    assert store.drain() == 2
    records = list(store.iter_trace())
    assert [r.payload for r in records] == [first.payload, '{"n":2}', '{"n":3}']
    assert [r.record_id for r in records].count(first.record_id) == 1
    assert assert_chain_intact(store) == 3
