"""The sweeper's default thresholds, pinned as the numbers the seed gives, on SQLite, PostgreSQL and MariaDB.

The other sweeper tests read the thresholds back from the code (`DEFAULT.threshold(state)`), so they follow
any change of a default. These write the seed's numbers out: a Run is left alone 5 s before its state's
threshold and acted on 5 s after it, by the real sweeper on the fake clock, and the settings a deployment
starts from hold exactly these numbers. Changing a default makes one of them fail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.records import NewRun
from harness.drive.state_machine import StateMachine
from harness.drive.sweeper import ZombieSweeper
from harness.kernel.events import RUN_REQUEUED
from harness.kernel.states import RunState
from harness.kernel.thresholds import DEFAULT
from harness.policy.config import Hitl, PolicyFile
from harness.settings import Settings

from ..conftest import FIXTURES

S = RunState
DAY_S = 24 * 3600
#: the seed's thresholds in seconds, written out; EXECUTING is the execution limit (600 s) plus one sweep
#: interval (30 s), so the tool controller's own timer fires first
SEED_THRESHOLDS_S: dict[RunState, float | None] = {
    S.CREATED: 30.0, S.PREPARING: 60.0, S.PLANNING: 180.0, S.POLICY_CHECK: 30.0, S.AWAITING_HITL: None,
    S.EXECUTING: 630.0, S.TRACING: 60.0,
    S.REJECTED: 30.0, S.FAILED: 30.0, S.TIMEOUT: 30.0, S.CANCELLED: 30.0,
}
WAY_TO = {
    S.CREATED: [],
    S.PREPARING: [S.PREPARING],
    S.PLANNING: [S.PREPARING, S.PLANNING],
    S.POLICY_CHECK: [S.PREPARING, S.PLANNING, S.POLICY_CHECK],
    S.EXECUTING: [S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING],
    S.TRACING: [S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING],
    S.REJECTED: [S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.REJECTED],
    S.FAILED: [S.PREPARING, S.FAILED],
    S.TIMEOUT: [S.PREPARING, S.PLANNING, S.TIMEOUT],
    S.CANCELLED: [S.PREPARING, S.PLANNING, S.CANCELLED],
}
TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


@pytest.fixture
def db_path(backend_url: str) -> Path:
    """The shared `store` fixture opens the backend under test (a SQLite path or a server URL)."""
    return backend_url  # type: ignore[return-value]  # SqlStore.open takes str(db_path): a URL works


def stuck_in(store: SqlStore, state: RunState) -> str:
    """A Run left in `state` by a writer that died (raw store transitions, no automatic funnel)."""
    run, _ = store.create_run(NewRun("t1", "u1", "s1", {"task": "x"}))
    current = S.CREATED
    for nxt in WAY_TO[state]:
        assert store.transition(run.run_id, current, nxt, actor="dead-worker", reason="step").applied
        current = nxt
    return run.run_id


def test_the_settings_start_from_the_seeds_numbers() -> None:
    """What a deployment runs with when it sets nothing: every state's threshold, the sweep interval, the
    execution limit EXECUTING follows, and the approval wait of a policy that names none (24 h); the
    thresholds a sweeper or the metrics use when given none are the same; a heartbeat hides a Run up to
    twice its threshold, and a decided approval waits 30 s for its Run to move."""
    settings = Settings()
    assert dict(settings.thresholds().per_state) == SEED_THRESHOLDS_S
    assert dict(DEFAULT.per_state) == SEED_THRESHOLDS_S
    assert (settings.thresholds().ceiling_factor, settings.thresholds().decided_s) == (2.0, 30.0)
    assert settings.state_thresholds == {}
    assert settings.sweep_interval_s == 30.0
    assert settings.execution_limit_s == 600.0
    assert Hitl().timeout_s == DAY_S == 86_400
    assert PolicyFile.model_validate({"version": 1, "permissions": {"cedar": "p.cedar"}}).hitl.timeout_s == DAY_S


@pytest.mark.parametrize(("state", "threshold_s", "path"), [
    (S.PREPARING, 60, ["FAILED", "TRACING", "CLOSED_FAILED"]),
    (S.PLANNING, 180, ["TIMEOUT", "TRACING", "CLOSED_FAILED"]),
    (S.POLICY_CHECK, 30, ["FAILED", "TRACING", "CLOSED_FAILED"]),
    (S.EXECUTING, 630, ["TIMEOUT", "TRACING", "CLOSED_FAILED"]),
    (S.TRACING, 60, ["TRACING", "SUCCEEDED"]),
    (S.REJECTED, 30, ["REJECTED", "TRACING", "CLOSED_REJECTED"]),
    (S.FAILED, 30, ["FAILED", "TRACING", "CLOSED_FAILED"]),
    (S.TIMEOUT, 30, ["TIMEOUT", "TRACING", "CLOSED_FAILED"]),
    (S.CANCELLED, 30, ["CANCELLED", "TRACING", "CLOSED_CANCELLED"]),
])
def test_a_stuck_run_is_left_5_s_before_its_threshold_and_closed_5_s_after(
        store: SqlStore, machine: StateMachine, clock: FakeClock, state: RunState, threshold_s: int,
        path: list[str]) -> None:
    """The seed's number for each state, as the default settings give it to the sweeper: a Run stuck in
    `state` is untouched at threshold - 5 s and closed at threshold + 5 s."""
    run_id = stuck_in(store, state)
    sweeper = ZombieSweeper(store, machine, thresholds=Settings().thresholds())
    clock.advance(threshold_s - 5)
    report = sweeper.sweep_once()
    assert report.detected == [] and report.recovered == [] and store.get_run(run_id).state == state
    clock.advance(10)
    report = sweeper.sweep_once()
    assert report.recovered == [run_id]
    assert [t.to_state.value for t in store.transitions_of(run_id)][-len(path):] == path
    detected = store.audit_events(run_id=run_id, event="zombie_detected")
    assert [e.detail["threshold_s"] for e in detected] == [threshold_s]


def test_a_queued_run_is_requeued_5_s_after_30_s_and_never_failed(store: SqlStore, machine: StateMachine,
                                                                   clock: FakeClock) -> None:
    """CREATED's 30 s is when a Run that has not started counts as waiting too long: before it the sweep
    leaves it alone, after it the sweep hands it back to a driver (audited once, with the threshold), and
    with no driver at hand leaves it queued; a day later it is still queued, never failed."""
    run_id = stuck_in(store, S.CREATED)
    handed: list[str] = []
    requeuing = ZombieSweeper(store, machine, thresholds=Settings().thresholds(), resume=handed.append)
    no_driver = ZombieSweeper(store, machine, thresholds=Settings().thresholds())
    clock.advance(25)
    report = requeuing.sweep_once()
    assert report.requeued == [] and handed == [] and no_driver.sweep_once().queued == []
    clock.advance(10)
    report = requeuing.sweep_once()
    assert report.requeued == [run_id] and handed == [run_id] and report.detected == []
    assert no_driver.sweep_once().queued == [run_id]
    requeued = store.audit_events(run_id=run_id, event=RUN_REQUEUED)
    assert [e.detail["threshold_s"] for e in requeued] == [30]
    clock.advance(DAY_S)
    assert requeuing.sweep_once().recovered == [] and store.get_run(run_id).state == S.CREATED
    assert not store.audit_events(run_id=run_id, event="zombie_detected")


@pytest.fixture
def default_wait_runtime(backend_url: str, tmp_path: Path, clock: FakeClock, call_log: Path) -> Iterator[Runtime]:
    """The test skills and policy on the backend under test, with the policy's approval settings taken out
    but for its approvers: the approval wait is the default one."""
    policy = yaml.safe_load((FIXTURES / "policy.yaml").read_text())
    policy["hitl"] = {"approvers": policy["hitl"]["approvers"]}
    policy["permissions"]["cedar"] = str(FIXTURES / "policies.cedar")
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    rt = build_runtime(Settings(db=backend_url, skills_dirs=(FIXTURES / "skills",),
                                policy_file=tmp_path / "policy.yaml", llm_rules=FIXTURES / "llm_rules.yaml",
                                identities_file=FIXTURES / "identities.yaml", data_dir=tmp_path / "data",
                                memory="off"), clock=clock)
    yield rt
    rt.close()


def test_a_run_awaiting_approval_waits_exactly_24_h(default_wait_runtime: Runtime, clock: FakeClock) -> None:
    """With the default approval wait a parked Run is still waiting at 24 h - 5 s (the sweep expires
    nothing and forces nothing) and closed CLOSED_REJECTED through TIMEOUT at 24 h + 5 s (default-deny)."""
    rt = default_wait_runtime
    parked = rt.runs.create_run({"task": "update T-1", **TESS})
    assert parked.state == "AWAITING_HITL" and parked.approval_request_id
    sweeper = ZombieSweeper(rt.store, rt.machine, thresholds=rt.settings.thresholds(),
                            expire_approvals=rt.runs.expire_approvals)
    clock.advance(DAY_S - 5)
    report = sweeper.sweep_once()
    assert report.approvals_expired == [] and report.detected == []
    assert rt.store.get_run(parked.run_id).state == S.AWAITING_HITL
    clock.advance(10)
    assert sweeper.sweep_once().approvals_expired == [parked.approval_request_id]
    closed = rt.store.get_run(parked.run_id)
    assert closed.state == S.CLOSED_REJECTED
    assert [t.to_state.value for t in rt.store.transitions_of(parked.run_id)][-3:] == [
        "TIMEOUT", "TRACING", "CLOSED_REJECTED"]
