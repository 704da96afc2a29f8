"""The zombie sweeper closes stuck Runs through the compare-and-set, and only stuck ones (S1-S3)."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from harness.adapters.sql.leases import Leases
from harness.adapters.sql.store import NewRun, SqlStore
from harness.clock import FakeClock
from harness.config import Runtime
from harness.kernel import RunState
from harness.state_machine import StateMachine
from harness.sweeper import ZombieSweeper

S = RunState
WAY_TO = {
    S.CREATED: [],
    S.PREPARING: [S.PREPARING],
    S.PLANNING: [S.PREPARING, S.PLANNING],
    S.POLICY_CHECK: [S.PREPARING, S.PLANNING, S.POLICY_CHECK],
    S.EXECUTING: [S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING],
    S.TRACING: [S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING],
    S.FAILED: [S.PREPARING, S.FAILED],
    S.CANCELLED: [S.PREPARING, S.PLANNING, S.CANCELLED],
    S.REJECTED: [S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.REJECTED],
}


def stuck_in(store: SqlStore, state: RunState) -> str:
    """A Run left in `state` by a writer that died (raw store transitions, no automatic funnel)."""
    run, _ = store.create_run(NewRun("t1", "u1", "s1", {"task": "x"}))
    current = S.CREATED
    for nxt in WAY_TO[state]:
        assert store.transition(run.run_id, current, nxt, actor="dead-worker", reason="step").applied
        current = nxt
    return run.run_id


def path(store: SqlStore, run_id: str) -> list[str]:
    return [t.to_state.value for t in store.transitions_of(run_id)]


@pytest.mark.parametrize("state,tail,final", [
    (S.CREATED, ["FAILED", "TRACING"], "CLOSED_FAILED"),
    (S.PREPARING, ["FAILED", "TRACING"], "CLOSED_FAILED"),
    (S.PLANNING, ["TIMEOUT", "TRACING"], "CLOSED_FAILED"),
    (S.POLICY_CHECK, ["FAILED", "TRACING"], "CLOSED_FAILED"),
    (S.EXECUTING, ["TIMEOUT", "TRACING"], "CLOSED_FAILED"),
    (S.TRACING, ["FAILED", "TRACING"], "CLOSED_FAILED"),
    (S.FAILED, ["TRACING"], "CLOSED_FAILED"),
    (S.CANCELLED, ["TRACING"], "CLOSED_CANCELLED"),
    (S.REJECTED, ["TRACING"], "CLOSED_REJECTED"),
])
def test_each_stuck_state_is_forced_to_its_mapped_end(store: SqlStore, machine: StateMachine, clock: FakeClock,
                                                      state: RunState, tail: list[str], final: str) -> None:
    """A Run stuck past its state's threshold is forced through the seed's mapping, via TRACING, and audited."""
    run_id = stuck_in(store, state)
    sweeper = ZombieSweeper(store, machine)
    assert sweeper.sweep_once().detected == []
    clock.advance(601)
    report = sweeper.sweep_once()
    assert report.recovered == [run_id]
    assert path(store, run_id)[-len(tail) - 1:] == [*tail, final]
    forced = [t for t in store.transitions_of(run_id) if t.forced_by == "zombie_sweeper"]
    assert forced and forced[0].from_state == state
    events = [e.event for e in store.audit_events(run_id=run_id)]
    assert events.index("zombie_detected") < events.index("zombie_recovered")
    recovered = store.audit_events(run_id=run_id, event="zombie_recovered")[0]
    assert recovered.detail["forced_by"] == "zombie_sweeper" and recovered.detail["final_state"] == final


def test_runs_within_their_threshold_are_left_alone(store: SqlStore, machine: StateMachine, clock: FakeClock) -> None:
    """A Run in PLANNING for 100 s (threshold 180 s) is not touched."""
    run_id = stuck_in(store, S.PLANNING)
    clock.advance(100)
    assert ZombieSweeper(store, machine).sweep_once().detected == []
    assert store.get_run(run_id).state == S.PLANNING


def test_a_heartbeating_long_step_is_not_swept(store: SqlStore, machine: StateMachine, clock: FakeClock) -> None:
    """A Run in EXECUTING for longer than the threshold whose worker heartbeats its lease is healthy."""
    run_id = stuck_in(store, S.EXECUTING)
    leases = Leases(store, ttl_s=60)
    lease = leases.acquire(run_id, "worker-1")
    assert lease is not None
    for _ in range(12):
        clock.advance(55)
        lease = leases.heartbeat(lease)
        assert lease is not None
    report = ZombieSweeper(store, machine).sweep_once()
    assert report.healthy == [run_id] and report.detected == []
    clock.advance(61)  # the worker stopped heartbeating
    assert ZombieSweeper(store, machine).sweep_once().recovered == [run_id]


def test_controller_timeout_and_sweeper_are_told_apart(store: SqlStore, machine: StateMachine,
                                                        clock: FakeClock) -> None:
    """The audit trail says whether the tool controller's own timer or the sweeper fired (S2)."""
    own = stuck_in(store, S.EXECUTING)
    machine.transition(own, S.EXECUTING, S.TIMEOUT, actor="run_manager", reason="run_time_limit")
    swept = stuck_in(store, S.EXECUTING)
    clock.advance(601)
    ZombieSweeper(store, machine).sweep_once()
    timeout_row = {r: next(t for t in store.transitions_of(r) if t.to_state == S.TIMEOUT) for r in (own, swept)}
    assert timeout_row[own].forced_by is None and timeout_row[own].actor == "run_manager"
    assert timeout_row[swept].forced_by == "zombie_sweeper"
    assert not store.audit_events(run_id=own, event="zombie_detected")


def test_several_sweepers_at_once_close_each_run_once(store: SqlStore, clock: FakeClock) -> None:
    """Four sweepers racing over 120 stuck Runs: every Run final exactly once, one recovery per Run (S3)."""
    runs = [stuck_in(store, state) for state in (S.EXECUTING, S.PREPARING, S.TRACING) for _ in range(40)]
    clock.advance(601)
    barrier = threading.Barrier(4)
    reports = []

    def sweep() -> None:
        machine = StateMachine(store)
        barrier.wait()
        reports.append(ZombieSweeper(store, machine).sweep_once())

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    recovered = [r for report in reports for r in report.recovered]
    assert sorted(recovered) == sorted(runs)
    for run_id in runs:
        finals = [s for s in path(store, run_id) if s.startswith("CLOSED_") or s == "SUCCEEDED"]
        assert finals == ["CLOSED_FAILED"]
        assert len(store.audit_events(run_id=run_id, event="zombie_recovered")) == 1
    store.drain_all()
    from harness.audit.reconcile import reconcile

    assert reconcile(store).ok


def test_overdue_approvals_are_expired_by_the_sweep(test_runtime: Runtime, clock: FakeClock) -> None:
    """A parked Run whose approval deadline passed is closed CLOSED_REJECTED by the sweep (default-deny)."""
    parked = test_runtime.runs.create_run({"task": "update T-1", "tenant_id": "t1", "user_id": "tess",
                                           "roles": ["tester"]})
    sweeper = ZombieSweeper(test_runtime.store, test_runtime.machine,
                            expire_approvals=test_runtime.runs.expire_approvals)
    clock.advance(3601)
    assert sweeper.sweep_once().approvals_expired == [parked.approval_request_id]
    assert test_runtime.store.get_run(parked.run_id).state == S.CLOSED_REJECTED


def test_the_scan_uses_the_state_index(store: SqlStore) -> None:
    """The sweeper's query is answered from the (state, last_state_change_at) index, not a table scan."""
    with store.engine.connect() as conn:
        plan = conn.exec_driver_sql(
            "EXPLAIN QUERY PLAN SELECT run_id FROM runs WHERE state = 'EXECUTING' "
            "AND last_state_change_at < 1 ORDER BY last_state_change_at LIMIT 500").all()
    assert any("ix_runs_state_changed" in str(row) for row in plan), plan


def test_lease_takeover_fences_the_old_worker(store: SqlStore, machine: StateMachine, clock: FakeClock) -> None:
    """A worker whose lease expired and was taken over can make no further transition (K5b)."""
    run_id = stuck_in(store, S.EXECUTING)
    leases = Leases(store, ttl_s=30)
    old = leases.acquire(run_id, "worker-a")
    assert old is not None and leases.acquire(run_id, "worker-b") is None
    clock.advance(31)
    new = leases.acquire(run_id, "worker-b")
    assert new is not None and new.epoch == old.epoch + 1 and new.stalls == 1
    assert not leases.holds(old) and leases.heartbeat(old) is None
    late = machine.transition(run_id, S.EXECUTING, S.TRACING, actor="worker-a", reason="done",
                              lease_epoch=old.epoch)
    assert not late.applied and late.fenced
    assert store.get_run(run_id).state == S.EXECUTING
    with store.engine.connect() as conn:
        stalls = conn.execute(sa.text("SELECT stall_count FROM runs WHERE run_id = :r"), {"r": run_id}).scalar()
    assert stalls == 1
