"""The SQL store's contract around creating Runs and its single write path (SPEC K3, K4, K5, K5b)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.domain.errors import InvalidTransitionError, UnknownRunError
from harness.domain.records import NewRun
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState

S = RunState
TO_TRACING = [
    (S.CREATED, S.PREPARING),
    (S.PREPARING, S.PLANNING),
    (S.PLANNING, S.POLICY_CHECK),
    (S.POLICY_CHECK, S.EXECUTING),
    (S.EXECUTING, S.TRACING),
]


def _new(tenant: str = "acme", key: str | None = None, retry_of: str | None = None) -> NewRun:
    return NewRun(tenant, "alice", "s1", {"task": "summarise"}, idempotency_key=key, retry_of=retry_of)


def _walk(store: SqlStore, run_id: str, moves: list[tuple[RunState, RunState]]) -> None:
    for source, target in moves:
        assert store.transition(run_id, source, target, actor="test", reason="walk").applied


def _run_traces(store: SqlStore, run_id: str) -> int:
    with store.engine.connect() as conn:
        total = 0
        for table in (t.trace_records, t.outbox):
            query = sa.select(sa.func.count()).where(table.c.run_id == run_id, table.c.kind == "run")
            total += conn.execute(query).scalar_one()
    return total


def test_repeated_submit_with_an_idempotency_key_returns_the_existing_run(store: SqlStore) -> None:
    """K5: a second create with the same tenant and key returns the first Run and creates nothing."""
    first, created = store.create_run(_new(key="k-1"))
    again, created_again = store.create_run(_new(key="k-1"))
    assert created and not created_again
    assert again.run_id == first.run_id
    assert len(store.list_runs(tenant_id="acme")) == 1
    assert len(store.audit_events(event="run_created")) == 1


def test_idempotency_keys_are_independent_across_tenants(store: SqlStore) -> None:
    """K5: the same key used by two tenants names two different Runs."""
    a, created_a = store.create_run(_new("acme", key="k-1"))
    b, created_b = store.create_run(_new("globex", key="k-1"))
    assert created_a and created_b
    assert a.run_id != b.run_id
    assert store.find_by_idempotency_key("globex", "alice", "k-1") == store.get_run(b.run_id)


def test_concurrent_submits_with_one_key_create_exactly_one_run(store: SqlStore) -> None:
    """K5: racing submits with one key all get the same Run; exactly one of them created it."""
    results: list[tuple[str, bool]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def submit() -> None:
        start.wait()
        try:
            run, created = store.create_run(_new(key="same"))
            results.append((run.run_id, created))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert errors == []
    assert len({run_id for run_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert len(store.list_runs(tenant_id="acme")) == 1


def test_a_run_is_readable_through_a_new_engine_once_create_run_returns(
    db_path: Path, clock: FakeClock
) -> None:
    """K5: CREATED is committed before the id is returned, so another connection sees it at once."""
    first = SqlStore.open(str(db_path), clock)
    run, _ = first.create_run(_new())
    other = SqlStore.open(str(db_path), clock)
    try:
        assert other.get_run(run.run_id).state == S.CREATED
        assert other.legacy_job(run.run_id) == ("pending", "CREATED")
        assert [r.to_state for r in other.transitions_of(run.run_id)] == [S.CREATED]
    finally:
        other.close()
        first.close()


def test_a_run_survives_its_creator_being_killed_right_after_create_run(db_path: Path) -> None:
    """K5: an accepted Run is never lost, even when the process dies the moment it got the id."""
    SqlStore.open(str(db_path)).close()
    code = (
        "import sys, time\n"
        "from harness.adapters.sql.store import SqlStore\n"
        "from harness.domain.records import NewRun\n"
        "store = SqlStore.open(sys.argv[1])\n"
        "run, _ = store.create_run(NewRun('acme', 'alice', 's1', {'task': 'x'}))\n"
        "print(run.run_id, flush=True)\n"
        "time.sleep(120)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(db_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        run_id = child.stdout.readline().strip()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    store = SqlStore.open(str(db_path))
    try:
        assert store.get_run(run_id).state == S.CREATED
    finally:
        store.close()


def test_unknown_run_id_is_named_as_such(store: SqlStore) -> None:
    """K4: reading or moving a Run that does not exist raises UnknownRunError, not a silent no-op."""
    with pytest.raises(UnknownRunError):
        store.get_run("no-such-run")
    with pytest.raises(UnknownRunError):
        store.transition("no-such-run", S.CREATED, S.PREPARING, actor="test", reason="x")
    with pytest.raises(UnknownRunError):
        store.legacy_job("no-such-run")
    assert store.audit_events(event="transition_lost_race") == []


def test_an_illegal_attempt_on_an_unknown_run_is_still_audited(store: SqlStore) -> None:
    """K2: an illegal pair raises InvalidTransitionError and is audited even when the run id is unknown."""
    with pytest.raises(InvalidTransitionError):
        store.transition("no-such-run", S.CREATED, S.SUCCEEDED, actor="test", reason="x")
    (event,) = store.audit_events(event="illegal_transition")
    assert event.run_id is None
    assert event.detail["run_id"] == "no-such-run"
    assert event.detail["known_run"] is False


def test_retry_of_is_recorded_on_the_new_run_and_its_audit_event(store: SqlStore) -> None:
    """K5: a retry is a new Run with a new id that names the old one in retry_of."""
    old, _ = store.create_run(_new())
    retry, _ = store.create_run(_new(retry_of=old.run_id))
    assert retry.run_id != old.run_id
    assert store.get_run(retry.run_id).retry_of == old.run_id
    (created,) = store.audit_events(run_id=retry.run_id, event="run_created")
    assert created.detail["retry_of"] == old.run_id


def test_a_stale_lease_epoch_is_fenced_and_audited(store: SqlStore) -> None:
    """K5b: a transition under a lease epoch that no longer matches changes nothing and is audited."""
    run, _ = store.create_run(_new())
    with store.engine.begin() as conn:  # another worker took the Run over
        conn.execute(t.runs.update().where(t.runs.c.run_id == run.run_id).values(lease_epoch=2))
    outcome = store.transition(run.run_id, S.CREATED, S.PREPARING, actor="old", reason="x", lease_epoch=1)
    assert not outcome.applied
    assert outcome.fenced
    assert outcome.actual == S.CREATED
    assert store.get_run(run.run_id).version == 0
    assert store.legacy_job(run.run_id) == ("pending", "CREATED")
    (event,) = store.audit_events(run_id=run.run_id, event="transition_lost_race")
    assert event.detail["fenced"] is True
    assert event.detail["attempted_to"] == "PREPARING"
    current = store.transition(run.run_id, S.CREATED, S.PREPARING, actor="new", reason="x", lease_epoch=2)
    assert current.applied and not current.fenced


def test_a_caller_cannot_choose_tracings_exit(store: SqlStore) -> None:
    """K3: TRACING's exit is decided by the close reason, never by the caller; a wrong exit is illegal."""
    run, _ = store.create_run(_new())
    _walk(store, run.run_id, TO_TRACING)  # close reason: success
    with pytest.raises(InvalidTransitionError):
        store.transition(run.run_id, S.TRACING, S.CLOSED_CANCELLED, actor="caller", reason="I say so")
    assert store.get_run(run.run_id).state == S.TRACING
    assert len(store.audit_events(run_id=run.run_id, event="illegal_transition")) == 1


def test_a_run_closed_by_a_caller_through_the_machine_still_gets_its_run_trace(
    store: SqlStore, machine: StateMachine
) -> None:
    """A1: every closed Run has exactly one RunTrace, even when a caller asks the machine for the exit."""
    run, _ = store.create_run(_new())
    _walk(store, run.run_id, TO_TRACING)  # a worker died in TRACING; someone closes the Run by hand
    machine.transition(run.run_id, S.TRACING, S.SUCCEEDED, actor="operator", reason="close it")
    assert store.get_run(run.run_id).state == S.SUCCEEDED
    assert _run_traces(store, run.run_id) == 1
