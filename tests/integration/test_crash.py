"""Processes killed with SIGKILL at random moments leave a consistent store (SPEC K4, K5, A3, A4).

A transition is one database transaction: after a crash either all of it (state, transition row, audit
events, projection, outbox records) is there, or none of it. A drainer killed mid-batch neither loses
a record nor chains one twice.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from typing import Any

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.store import SqlStore
from harness.domain.records import NewRun, TraceRecordIn
from harness.drive.state_machine import StateMachine
from harness.kernel.states import FINAL, TRANSIENT, RunState
from harness.kernel.transitions import targets_from
from tests.integration.test_races import (
    assert_chain_intact,
    assert_runs_consistent,
    expected_records,
    start_forked,
)

pytestmark = pytest.mark.slow
#: SQLite here; test_crash_servers.py runs these tests on PostgreSQL and MariaDB
BACKENDS = ("sqlite",)

S = RunState
ROUNDS = 5
#: records queued per kill round, besides the real Runs' own: enough that a drain in batches of 50 outlasts
#: the kill's random delay (a drain of 1,200 records took only ~17 ms once the chain lost its random indexes)
BULK_BATCHES, BULK_SIZE = 20, 200
MAIN_PATH = [S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING]


def _driver(db: str, seed: int, ready: Any) -> None:
    """Drive Runs along random legal paths forever (until killed), draining after every close."""
    rng = random.Random(seed)
    store = SqlStore.open(db, migrate_schema=False)
    machine = StateMachine(store)
    ready.set()
    while True:
        run, _ = store.create_run(NewRun("acme", "alice", "s", {"seed": seed, "n": rng.random()}))
        state = S.CREATED
        while state not in FINAL:
            targets = sorted(targets_from(state) - FINAL)
            forward = MAIN_PATH[MAIN_PATH.index(state) + 1] if state in MAIN_PATH[:-1] else None
            target = forward if forward and rng.random() < 0.7 else rng.choice(targets)
            if rng.random() < 0.1:  # a stale competitor: its lost race is audited in its own transaction
                machine.transition(run.run_id, S.AWAITING_HITL, S.CANCELLED, actor="stale", reason="late")
            machine.transition(run.run_id, state, target, actor="driver", reason="random walk")
            state = S(store.get_run(run.run_id).state)


def _drainer(db: str, batch: int, ready: Any) -> None:
    """Drain the outbox in small batches until killed; ready once the first batch is committed, so the
    kill lands mid-drain rather than before it started."""
    store = SqlStore.open(db, migrate_schema=False)
    while store.drain(batch):
        ready.set()
    ready.set()
    time.sleep(60)  # nothing left: wait to be killed like the others


def _kill_after(process: Any, ready: Any, delay: float) -> None:
    assert ready.wait(60), "child never became ready"
    time.sleep(delay)
    os.kill(process.pid, signal.SIGKILL)
    process.join(30)
    assert process.exitcode == -signal.SIGKILL


def test_killed_writers_leave_every_run_consistent(backend_url: str) -> None:
    """K4: after SIGKILLs at random moments, each Run's state, rows, projection and records agree."""
    db = backend_url
    store = SqlStore.open(db)
    ctx = mp.get_context("fork")
    rng = random.Random()
    left_open = 0
    try:
        for round_no in range(ROUNDS):
            ready = ctx.Event()
            child = ctx.Process(target=_driver, args=(db, round_no, ready))
            start_forked(store, child)
            _kill_after(child, ready, rng.uniform(0.2, 1.2))
            paths = assert_runs_consistent(store)
            left_open = max(left_open, sum(1 for p in paths.values() if p[-1] not in FINAL))
        assert left_open > 0, "no kill landed while a Run was in flight; the test proved nothing"
        # the sweeper's job: Runs a dead worker left in a transient state or TRACING still close
        machine = StateMachine(store)
        for run_id, path in paths.items():
            if path[-1] in TRANSIENT or path[-1] == S.TRACING:
                assert machine.advance(run_id, path[-1], forced_by="zombie_sweeper") in FINAL
        assert_runs_consistent(store)
        store.drain_all()
        assert store.outbox_backlog() == 0
        assert assert_chain_intact(store) == expected_records(store)
    finally:
        store.close()


def _record_ids(store: SqlStore, table: sa.Table) -> set[str]:
    with store.engine.connect() as conn:
        return set(conn.execute(sa.select(table.c.record_id)).scalars())


def test_a_drainer_killed_mid_drain_neither_loses_nor_repeats_a_record(backend_url: str) -> None:
    """A3/A4: a SIGKILLed drainer leaves every pending record either chained once or still queued."""
    db = backend_url
    store = SqlStore.open(db)
    machine = StateMachine(store, drain_on_close=False)
    ctx = mp.get_context("fork")
    rng = random.Random()
    interrupted = 0
    try:
        for round_no in range(ROUNDS):
            for i in range(3):  # real Runs as well as bulk records
                run, _ = store.create_run(NewRun("acme", "alice", "s", {"round": round_no, "i": i}))
                source = S.CREATED
                for target in (*MAIN_PATH[1:], S.TRACING):
                    machine.transition(run.run_id, source, target, actor="test", reason="walk")
                    source = target
            for _ in range(BULK_BATCHES):
                store.record([TraceRecordIn("step", {"round": round_no, "n": n}) for n in range(BULK_SIZE)])
            pending = _record_ids(store, t.outbox)
            chained = _record_ids(store, t.trace_records)
            ready = ctx.Event()
            child = ctx.Process(target=_drainer, args=(db, 50, ready))
            start_forked(store, child)
            _kill_after(child, ready, rng.uniform(0.0, 0.03))
            still_pending = _record_ids(store, t.outbox)
            newly_chained = _record_ids(store, t.trace_records) - chained
            assert still_pending <= pending
            assert still_pending.isdisjoint(newly_chained), "a record is both chained and still queued"
            assert still_pending | newly_chained == pending, "a record was lost"
            assert assert_chain_intact(store) == len(chained) + len(newly_chained)
            interrupted += bool(still_pending and newly_chained)
        store.drain_all()
        assert assert_chain_intact(store) == expected_records(store) + ROUNDS * BULK_BATCHES * BULK_SIZE
        assert interrupted > 0, "no kill landed mid-drain; the test proved nothing"
    finally:
        store.close()
