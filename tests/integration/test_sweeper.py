"""The zombie sweeper closes stuck Runs through the compare-and-set, and only stuck ones (S1-S3)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.leases import Leases
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.config import Runtime
from harness.domain.errors import InvalidRequestError
from harness.domain.records import NewRun
from harness.drive.state_machine import StateMachine
from harness.drive.sweeper import ZombieSweeper
from harness.kernel.states import FINAL, RunState
from harness.kernel.thresholds import DEFAULT, SWEEP_INTERVAL_S
from harness.settings import Settings

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


@pytest.mark.parametrize("state,tail,final", [  # never CREATED: a Run that has not started is queued (test_queue.py)
    (S.PREPARING, ["FAILED", "TRACING"], "CLOSED_FAILED"),
    (S.PLANNING, ["TIMEOUT", "TRACING"], "CLOSED_FAILED"),
    (S.POLICY_CHECK, ["FAILED", "TRACING"], "CLOSED_FAILED"),
    (S.EXECUTING, ["TIMEOUT", "TRACING"], "CLOSED_FAILED"),
    (S.TRACING, [], "SUCCEEDED"),  # only the close was missing: it is completed, not failed
    (S.FAILED, ["TRACING"], "CLOSED_FAILED"),
    (S.CANCELLED, ["TRACING"], "CLOSED_CANCELLED"),
    (S.REJECTED, ["TRACING"], "CLOSED_REJECTED"),
])
def test_each_stuck_state_is_forced_to_its_mapped_end(store: SqlStore, machine: StateMachine, clock: FakeClock,
                                                      state: RunState, tail: list[str], final: str) -> None:
    """A Run stuck past its own state's threshold (not before) is forced through the seed's mapping, via
    TRACING, and audited; a Run stuck in TRACING has its close completed with the reason it entered with."""
    run_id = stuck_in(store, state)
    sweeper = ZombieSweeper(store, machine)
    threshold = DEFAULT.threshold(state)
    assert threshold is not None
    clock.advance(threshold - 1)
    assert sweeper.sweep_once().detected == []
    clock.advance(2)
    report = sweeper.sweep_once()
    assert report.recovered == [run_id]
    assert path(store, run_id)[-len(tail) - 1:] == [*tail, final]
    forced = [t for t in store.transitions_of(run_id) if t.forced_by == "zombie_sweeper"]
    assert forced and forced[0].from_state == state
    events = [e.event for e in store.audit_events(run_id=run_id)]
    assert events.index("zombie_detected") < events.index("zombie_recovered")
    recovered = store.audit_events(run_id=run_id, event="zombie_recovered")[0]
    assert recovered.detail["forced_by"] == "zombie_sweeper" and recovered.detail["final_state"] == final


@pytest.mark.parametrize("state", [S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING, S.FAILED])
def test_each_threshold_is_a_setting_of_its_own(tmp_path: Path, clock: FakeClock, state: RunState) -> None:
    """A deployment's threshold for one state (environment or config file) moves that state's sweep, and no
    other's: a Run in `state` and one in every other state, 7 s old, only the first is swept at 5 s."""
    thresholds = Settings(state_thresholds={state.value: 5.0}).thresholds()
    assert Settings.from_env().thresholds().threshold(state) == DEFAULT.threshold(state)
    store = SqlStore.open(str(tmp_path / "t.db"), clock)
    try:
        machine = StateMachine(store)
        target = stuck_in(store, state)
        others = [stuck_in(store, s) for s in (S.CREATED, S.EXECUTING, S.TRACING) if s != state]
        clock.advance(4)
        assert ZombieSweeper(store, machine, thresholds=thresholds).sweep_once().detected == []
        clock.advance(3)
        report = ZombieSweeper(store, machine, thresholds=thresholds).sweep_once()
        assert report.detected == [target]
        assert all(store.get_run(r).state not in FINAL for r in others)
    finally:
        store.close()


def test_thresholds_come_from_the_environment_and_a_config_file(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """HARNESS_STATE_THRESHOLDS and a YAML config file set per-state thresholds; the environment wins; a
    misspelt state or a bad number is named at start-up, not at the first sweep."""
    config = tmp_path / "harness.yaml"
    config.write_text("state_thresholds: {PLANNING: 300, TRACING: 90}\nheartbeat_ceiling_factor: 3\n")
    monkeypatch.setenv("HARNESS_CONFIG_FILE", str(config))
    from_file = Settings.from_env().thresholds()
    assert from_file.threshold(S.PLANNING) == 300 and from_file.threshold(S.TRACING) == 90
    assert from_file.ceiling(S.TRACING) == 270
    monkeypatch.setenv("HARNESS_STATE_THRESHOLDS", "planning=120")
    assert Settings.from_env().thresholds().threshold(S.PLANNING) == 120
    for bad, named in (("PLANING=120", "PLANING"), ("PLANNING=soon", "soon"), ("SUCCEEDED=5", "SUCCEEDED"),
                       ("EXECUTING=-1", "above 0")):
        monkeypatch.setenv("HARNESS_STATE_THRESHOLDS", bad)
        with pytest.raises(InvalidRequestError, match=named):
            Settings.from_env()


def test_the_executing_threshold_follows_the_execution_limit(store: SqlStore, machine: StateMachine,
                                                             clock: FakeClock) -> None:
    """EXECUTING is swept one sweep interval after the Run's execution limit, so the tool controller's own
    timer fires first (two layers), whatever the limit is set to."""
    thresholds = Settings(execution_limit_s=100).thresholds()
    assert thresholds.threshold(S.EXECUTING) == 100 + SWEEP_INTERVAL_S
    run_id = stuck_in(store, S.EXECUTING)
    clock.advance(101)
    assert ZombieSweeper(store, machine, thresholds=thresholds).sweep_once().detected == []
    clock.advance(SWEEP_INTERVAL_S)
    assert ZombieSweeper(store, machine, thresholds=thresholds).sweep_once().recovered == [run_id]


def test_the_executing_threshold_follows_the_configured_sweep_interval(store: SqlStore, machine: StateMachine,
                                                                      clock: FakeClock) -> None:
    """The sweeper's margin past the execution limit is the deployment's sweep interval, not the default
    one: with a 5 s interval a Run stuck in EXECUTING is swept 5 s after its limit, not 30 s."""
    thresholds = Settings(execution_limit_s=100, sweep_interval_s=5).thresholds()
    assert thresholds.threshold(S.EXECUTING) == 105
    run_id = stuck_in(store, S.EXECUTING)
    clock.advance(104)
    assert ZombieSweeper(store, machine, thresholds=thresholds).sweep_once().detected == []
    clock.advance(2)
    assert ZombieSweeper(store, machine, thresholds=thresholds).sweep_once().recovered == [run_id]


def test_a_heartbeat_hides_a_run_only_until_its_ceiling(store: SqlStore, machine: StateMachine,
                                                        clock: FakeClock) -> None:
    """A Run whose lease is heartbeated forever (a hung step with a live heartbeat thread) is forced past its
    state's ceiling, a multiple of the threshold, with the ceiling named in the audit."""
    thresholds = Settings(state_thresholds={"EXECUTING": 100}, heartbeat_ceiling_factor=3).thresholds()
    run_id = stuck_in(store, S.EXECUTING)
    leases = Leases(store, ttl_s=60)
    lease = leases.acquire(run_id, "hung-worker")
    for _ in range(5):  # 275 s: past the threshold, within the ceiling of 300 s
        clock.advance(55)
        assert lease is not None
        lease = leases.heartbeat(lease)
    assert ZombieSweeper(store, machine, thresholds=thresholds).sweep_once().healthy == [run_id]
    clock.advance(30)
    assert lease is not None and leases.heartbeat(lease) is not None
    report = ZombieSweeper(store, machine, thresholds=thresholds).sweep_once()
    assert report.recovered == [run_id] and store.get_run(run_id).state == S.CLOSED_FAILED
    detected = store.audit_events(run_id=run_id, event="zombie_detected")[0]
    assert detected.detail["heartbeat_ceiling_s"] == 300


def test_a_resumable_stuck_run_is_handed_back_not_failed(store: SqlStore, machine: StateMachine,
                                                          clock: FakeClock) -> None:
    """With a driver at hand, an unowned Run stuck in a resumable state is resumed (audited), not forced; once
    its workers died `max_stalls` times, or past its ceiling, it is forced after all."""
    resumed: list[str] = []
    thresholds = Settings(state_thresholds={"EXECUTING": 100}).thresholds()  # PLANNING: 180 s, ceiling 360 s
    sweeper = ZombieSweeper(store, machine, thresholds=thresholds, resume=resumed.append, max_stalls=2)
    fresh = stuck_in(store, S.PLANNING)
    poisoned = stuck_in(store, S.EXECUTING)
    with store.engine.begin() as conn:
        conn.execute(sa.update(t.runs).where(t.runs.c.run_id == poisoned).values(stall_count=2))
    clock.advance(200)
    report = sweeper.sweep_once()
    assert report.resumed == [fresh] and resumed == [fresh] and store.get_run(fresh).state == S.PLANNING
    assert store.audit_events(run_id=fresh, event="zombie_resumed")
    assert report.recovered == [poisoned]
    clock.advance(200)  # nobody resumed it: past its ceiling the sweeper is the backstop again
    assert sweeper.sweep_once().recovered == [fresh]


def test_a_tracing_run_whose_close_cannot_be_completed_is_failed(store: SqlStore, clock: FakeClock) -> None:
    """TRACING is failed only when its close cannot be established: a Run with no close reason on record is
    failed at once; one whose close keeps failing is retried until its ceiling, then failed."""
    calls: list[RunState] = []

    def flaky_hook(_run: object, final: RunState) -> list[object]:
        calls.append(final)
        if final == S.SUCCEEDED:
            raise RuntimeError("memory store down")
        return []

    machine = StateMachine(store)
    machine.on_close(flaky_hook)  # type: ignore[arg-type]
    no_reason = stuck_in(store, S.TRACING)
    with store.engine.begin() as conn:
        conn.execute(sa.update(t.runs).where(t.runs.c.run_id == no_reason).values(close_reason=None))
    failing = stuck_in(store, S.TRACING)
    clock.advance((DEFAULT.threshold(S.TRACING) or 0) + 1)
    report = ZombieSweeper(store, machine).sweep_once()
    assert report.recovered == [no_reason] and store.get_run(no_reason).state == S.CLOSED_FAILED
    assert report.lost == [failing] and store.get_run(failing).state == S.TRACING
    clock.advance(DEFAULT.ceiling(S.TRACING) or 0)
    report = ZombieSweeper(store, machine).sweep_once()
    assert report.recovered == [failing]
    assert path(store, failing)[-3:] == ["FAILED", "TRACING", "CLOSED_FAILED"]


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
    for _ in range(12):  # 660 s: past the threshold of 630 s, within the ceiling
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
    clock.advance((DEFAULT.threshold(S.EXECUTING) or 0) + 1)
    ZombieSweeper(store, machine).sweep_once()
    timeout_row = {r: next(t for t in store.transitions_of(r) if t.to_state == S.TIMEOUT) for r in (own, swept)}
    assert timeout_row[own].forced_by is None and timeout_row[own].actor == "run_manager"
    assert timeout_row[swept].forced_by == "zombie_sweeper"
    assert not store.audit_events(run_id=own, event="zombie_detected")


def test_several_sweepers_at_once_close_each_run_once(store: SqlStore, clock: FakeClock) -> None:
    """Four sweepers racing over 120 stuck Runs: every Run final exactly once, one recovery per Run (S3)."""
    expected = {S.EXECUTING: "CLOSED_FAILED", S.PREPARING: "CLOSED_FAILED", S.TRACING: "SUCCEEDED"}
    stuck = {stuck_in(store, state): expected[state] for state in expected for _ in range(40)}
    runs = list(stuck)
    clock.advance((DEFAULT.threshold(S.EXECUTING) or 0) + 1)
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
        assert finals == [stuck[run_id]]
        assert len(store.audit_events(run_id=run_id, event="zombie_recovered")) == 1
    store.drain_all()
    from harness.audit.reconcile import reconcile

    assert reconcile(SqlReconcileReads(store)).ok


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
