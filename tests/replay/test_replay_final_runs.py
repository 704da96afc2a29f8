"""Replay of every kind of final Run (SPEC A5): what came from outside the pipeline — a cancel at each
cancellable state, a sweeper's close from each sweepable state, a worker failed as poison input, a worker
that died mid-call, approval rejects and timeouts — is re-applied, so a faithful replay reports no
divergence, while an altered recording of such a Run still does.

Each scenario makes a real Run on the test runtime (a "crash" is a listener that raises where the
process would have died, leaving the Run where it was), then replays it from the same database.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.adapters.sql.blobs import BlobStore
from harness.adapters.sql.leases import Leases
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.contracts import CallerIdentity
from harness.drive.sweeper import ZombieSweeper
from harness.drive.worker import RunWorker
from harness.kernel.states import RunState
from harness.replay.runner import replay
from harness.settings import Settings
from tests.acceptance.agent_skills import agent_settings
from tests.integration.conftest import backend_url, pytest_generate_tests, servers
from tests.replay.test_replay import cli, cli_settings, replayed, tamper

__all__ = ["backend_url", "pytest_generate_tests", "servers"]  # fixtures and the backend parametrization

S = RunState
TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
TESS_ID = CallerIdentity(tenant_id="t1", user_id="tess", roles=("tester",))
LEE = CallerIdentity(tenant_id="t1", user_id="lee", roles=("tester", "lead"))
PAT = CallerIdentity(tenant_id="t1", user_id="pat", roles=("prod_approver",))
QUINN = CallerIdentity(tenant_id="t1", user_id="quinn", roles=("prod_approver", "break_glass"))
Scenario = Callable[[Runtime, FakeClock], str]


class Crash(BaseException):
    """The source Run's process dies here: nothing after this point runs."""


def when_entering(rt: Runtime, state: RunState, action: Callable[[str], object]) -> None:
    """Do `action(run_id)` the first time a Run enters `state`, right after that change was applied: a
    Crash raised there ends the drive, whose end commits what it applied, so the Run is left in `state`
    as a worker that died right after committing it would leave it."""
    fired: list[str] = []

    def listener(run_id: str, _source: RunState, target: RunState) -> None:
        if target == state and not fired:
            fired.append(run_id)
            action(run_id)

    rt.machine.subscribe(listener, at_commit=False)


def crash(_run_id: str) -> None:
    raise Crash


def cancel(rt: Runtime) -> Callable[[str], object]:
    return lambda run_id: rt.runs.cancel(run_id, by="t1/op", reason="no longer needed")


def sweep(rt: Runtime, clock: FakeClock) -> None:
    """Long past every state's threshold, the sweeper closes whatever is stuck."""
    clock.advance(700)
    assert ZombieSweeper(rt.store, rt.machine).sweep_once().recovered


def driven(rt: Runtime, task: str) -> str:
    """Submit and drive a Run; a crash leaves it where it was."""
    run = rt.runs.submit({"task": task, **TESS})[0]
    with contextlib.suppress(Crash):
        rt.runs.drive(run.run_id)
    return run.run_id


def cancelled_in(state: RunState, task: str = "echo hi") -> Scenario:
    def make(rt: Runtime, _clock: FakeClock) -> str:
        when_entering(rt, state, cancel(rt))
        return driven(rt, task)
    return make


def cancelled_created(rt: Runtime, _clock: FakeClock) -> str:
    run = rt.runs.submit({"task": "echo hi", **TESS})[0]
    rt.runs.cancel(run.run_id, by="t1/op")
    return run.run_id


def cancelled_waiting(rt: Runtime, _clock: FakeClock) -> str:
    parked = rt.runs.create_run({"task": "update T-3", **TESS})
    rt.runs.cancel(parked.run_id, by="t1/op", reason="wrong ticket")
    return parked.run_id


def cancelled_during_a_call(rt: Runtime, _clock: FakeClock) -> str:
    """A cancel from another thread while step b is in flight: b finishes and is traced, c never starts."""
    run = rt.runs.submit({"task": "hang 0.5", **TESS})[0]
    thread = threading.Thread(target=rt.runs.drive, args=(run.run_id,))
    thread.start()
    log = Path(os.environ["HARNESS_TEST_CALL_LOG"])
    deadline = time.monotonic() + 30
    while '"test.hang"' not in log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    rt.runs.cancel(run.run_id, by="t1/op")
    thread.join(30)
    return run.run_id


def swept_from(state: RunState, task: str = "echo hi") -> Scenario:
    def make(rt: Runtime, clock: FakeClock) -> str:
        when_entering(rt, state, crash)
        run_id = driven(rt, task)
        assert rt.store.state_of(run_id) == state
        sweep(rt, clock)
        return run_id
    return make


def not_started(by_driver: bool) -> Scenario:
    """A queued Run whose start deadline passed before anyone started it: closed by the sweeper, or by the
    driver that reached it late (a queued Run is never swept as a zombie)."""
    def make(rt: Runtime, clock: FakeClock) -> str:
        start_by = dt.datetime.fromtimestamp(clock.now() + 60, dt.UTC).isoformat()
        run = rt.runs.submit({"task": "echo hi", "start_by": start_by, **TESS})[0]
        clock.advance(700)
        if by_driver:
            rt.runs.drive(run.run_id)
        else:
            assert ZombieSweeper(rt.store, rt.machine).sweep_once().not_started == [run.run_id]
        return run.run_id
    return make


def driven_dying_in(rt: Runtime, task: str, step_id: str) -> str:
    """Submit and drive a Run whose worker dies as step `step_id`'s call starts (after its started mark)."""
    real = rt.runs.tools.call

    def die(*args: Any, **kwargs: Any) -> Any:
        if kwargs["step_id"] == step_id:
            raise Crash
        return real(*args, **kwargs)

    rt.runs.tools.call = die  # type: ignore[method-assign]
    try:
        return driven(rt, task)
    finally:
        rt.runs.tools.call = real  # type: ignore[method-assign]


def swept_mid_plan(rt: Runtime, clock: FakeClock) -> str:
    """The worker dies as step b starts, step a done and traced: the sweeper times out EXECUTING."""
    run_id = driven_dying_in(rt, "fail", "b")
    sweep(rt, clock)
    return run_id


def swept_waiting_timeout(rt: Runtime, clock: FakeClock) -> str:
    """The approval timed out (default-deny) and the process died before the funnel: TIMEOUT is swept."""
    parked = rt.runs.create_run({"task": "update T-8", **TESS})
    clock.advance(3_601)
    when_entering(rt, S.TIMEOUT, crash)
    with pytest.raises(Crash):
        rt.runs.expire_approvals()
    sweep(rt, clock)
    return parked.run_id


def swept_cancelled(rt: Runtime, clock: FakeClock) -> str:
    """A cancel committed and the process died before the funnel: CANCELLED is swept."""
    parked = rt.runs.create_run({"task": "update T-4", **TESS})
    when_entering(rt, S.CANCELLED, crash)
    with pytest.raises(Crash):
        rt.runs.cancel(parked.run_id, by="t1/op")
    sweep(rt, clock)
    return parked.run_id


def rejected_by_approver(rt: Runtime, _clock: FakeClock) -> str:
    parked = rt.runs.create_run({"task": "update T-5", **TESS})
    rt.runs.decide(parked.approval_request_id or "", TESS_ID, "reject", reason="not this one")
    return parked.run_id


def rejected_l4_after_one_approval(rt: Runtime, _clock: FakeClock) -> str:
    parked = rt.runs.create_run({"task": "ship prod", "tenant_id": "t1", "user_id": "tess",
                                 "roles": ["tester", "deployer"]})
    rt.runs.decide(parked.approval_request_id or "", PAT, "approve")
    rt.runs.decide(parked.approval_request_id or "", QUINN, "reject", reason="freeze")
    return parked.run_id


def escalated_then_timed_out(rt: Runtime, clock: FakeClock) -> str:
    parked = rt.runs.create_run({"task": "purge logs", **TESS})
    clock.advance(3_601)
    rt.runs.expire_approvals()  # L3 escalates to L4
    clock.advance(3_601)
    rt.runs.expire_approvals()  # the L4 request times out: default-deny
    return parked.run_id


def poisoned(rt: Runtime, clock: FakeClock) -> str:
    """The Run's worker died in PREPARING; the worker that took over found it had stalled too often."""
    when_entering(rt, S.PREPARING, crash)
    run_id = driven(rt, "echo hi")
    assert Leases(rt.store, ttl_s=10).acquire(run_id, "dead-worker") is not None
    clock.advance(11)
    RunWorker(rt, owner="next-worker", max_stalls=1).execute(run_id)
    assert "worker_stalled" in (rt.runs.result(run_id).error or "")
    return run_id


def outcome_unknown(rt: Runtime, _clock: FakeClock) -> str:
    """The worker died during a non-idempotent call; the next drive refuses to repeat it."""
    run_id = driven_dying_in(rt, "hang 0.01", "b")
    rt.runs.drive(run_id)
    assert "outcome of b unknown" in (rt.runs.result(run_id).error or "")
    return run_id


SCENARIOS: dict[str, tuple[Scenario, str]] = {
    "cancelled in CREATED": (cancelled_created, "CLOSED_CANCELLED"),
    "cancelled in PREPARING": (cancelled_in(S.PREPARING), "CLOSED_CANCELLED"),
    "cancelled in PLANNING": (cancelled_in(S.PLANNING), "CLOSED_CANCELLED"),
    "cancelled in POLICY_CHECK": (cancelled_in(S.POLICY_CHECK), "CLOSED_CANCELLED"),
    "cancelled in AWAITING_HITL": (cancelled_waiting, "CLOSED_CANCELLED"),
    "cancelled entering EXECUTING": (cancelled_in(S.EXECUTING, "fail"), "CLOSED_CANCELLED"),
    "cancelled during a call": (cancelled_during_a_call, "CLOSED_CANCELLED"),
    "not started by its deadline, closed by the sweeper": (not_started(by_driver=False), "CLOSED_FAILED"),
    "not started by its deadline, refused by the driver": (not_started(by_driver=True), "CLOSED_FAILED"),
    "swept from PREPARING": (swept_from(S.PREPARING), "CLOSED_FAILED"),
    "swept from PLANNING": (swept_from(S.PLANNING), "CLOSED_FAILED"),
    "swept from POLICY_CHECK": (swept_from(S.POLICY_CHECK), "CLOSED_FAILED"),
    "swept from EXECUTING": (swept_from(S.EXECUTING), "CLOSED_FAILED"),
    "swept from EXECUTING after a step": (swept_mid_plan, "CLOSED_FAILED"),
    "swept from TRACING": (swept_from(S.TRACING), "SUCCEEDED"),  # only its close was missing: completed
    "swept from FAILED": (swept_from(S.FAILED, "fail"), "CLOSED_FAILED"),
    "swept from REJECTED": (swept_from(S.REJECTED, "echo DROP TABLE users"), "CLOSED_REJECTED"),
    "swept from TIMEOUT": (swept_waiting_timeout, "CLOSED_REJECTED"),
    "swept from CANCELLED": (swept_cancelled, "CLOSED_CANCELLED"),
    "rejected by the approver": (rejected_by_approver, "CLOSED_REJECTED"),
    "L4 rejected after one approval": (rejected_l4_after_one_approval, "CLOSED_REJECTED"),
    "escalated, then timed out": (escalated_then_timed_out, "CLOSED_REJECTED"),
    "failed as poison input": (poisoned, "CLOSED_FAILED"),
    "failed: outcome of a call unknown": (outcome_unknown, "CLOSED_FAILED"),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_faithful_replay_of_any_final_run_has_no_divergence(test_runtime: Runtime, clock: FakeClock,
                                                               call_log: Path, name: str) -> None:
    """A final Run of every kind — cancelled, swept, poisoned, crashed mid-call, rejected, timed out —
    replays to the same path, verdicts, calls and result: outside events are re-applied where they came."""
    make, final = SCENARIOS[name]
    run_id = make(test_runtime, clock)
    assert test_runtime.store.state_of(run_id).value == final
    report = replayed(test_runtime, run_id, call_log)
    assert report.ok, report.divergences
    assert report.summary["path"] == [x.to_state.value for x in test_runtime.store.transitions_of(run_id)]


@pytest.mark.parametrize("name", ["cancelled during a call", "swept from EXECUTING after a step"])
def test_an_altered_recording_of_a_closed_run_still_diverges(test_runtime: Runtime, clock: FakeClock,
                                                             call_log: Path, name: str) -> None:
    """Re-applying a cancel or a sweep hides nothing: an edited tool result of such a Run is still named as
    the first divergence."""
    run_id = SCENARIOS[name][0](test_runtime, clock)
    test_runtime.store.drain_all()
    tool = next(r.data() for r in test_runtime.store.trace_of(run_id) if r.kind == "tool" and r.data()["result_hash"])
    tamper(test_runtime, tool["result_hash"], {"forged": True})
    report = replayed(test_runtime, run_id, call_log)
    assert not report.ok and report.divergences[0].check == "recording"
    assert "altered" in report.divergences[0].detail


def test_a_cancel_the_replay_never_reaches_is_reported(test_runtime: Runtime, clock: FakeClock, call_log: Path,
                                                       tmp_path: Path) -> None:
    """A Run cancelled while it waited for approval, replayed under a policy that lets its call through at
    once, never waits: the recorded cancel finds nothing to cancel and the path diverges."""
    run_id = cancelled_waiting(test_runtime, clock)
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    lax = tmp_path / "lax.yaml"
    lax.write_text((fixtures / "skills" / "write_project.yaml").read_text().replace("access: write", "access: read"))
    skills = tmp_path / "lax-skills"
    skills.mkdir()
    for manifest in (fixtures / "skills").iterdir():
        (skills / manifest.name).write_text(manifest.read_text())
    (skills / "write_project.yaml").write_text(lax.read_text())
    settings = test_runtime.settings.model_copy(update={"skills_dirs": (skills,)})
    report = replay(run_id, test_runtime.store, settings)
    assert not report.ok
    assert {d.check for d in report.divergences} >= {"manifest", "path"}


def test_cli_replay_of_cancelled_and_swept_runs_exits_0(test_runtime: Runtime, clock: FakeClock, call_log: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`harness replay` of a cancelled Run and of a swept Run reports no divergence and exits 0."""
    settings = cli_settings(test_runtime, monkeypatch)
    runs = [cancelled_waiting(test_runtime, clock), swept_from(S.TRACING)(test_runtime, clock)]
    for run_id in runs:
        done = CliRunner().invoke(cli(), [run_id, "--db", settings.db or "", "--json"])
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout)["divergent"] is False


def test_replay_of_cancelled_and_swept_runs_on_every_backend(backend_url: str, tmp_path: Path, call_log: Path) -> None:
    """On SQLite, PostgreSQL and MariaDB a Run cancelled during a call and a Run swept from TRACING replay
    without divergence from the recording held there."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    clock = FakeClock(time.time())
    rt = build_runtime(Settings(db=backend_url, skills_dirs=(fixtures / "skills",),
                                policy_file=fixtures / "policy.yaml", llm_rules=fixtures / "llm_rules.yaml",
                                identities_file=fixtures / "identities.yaml", data_dir=tmp_path / "data"), clock=clock)
    try:
        for run_id in (cancelled_during_a_call(rt, clock), swept_from(S.TRACING)(rt, clock)):
            assert rt.store.state_of(run_id) in (S.CLOSED_CANCELLED, S.SUCCEEDED)
            rt.store.drain_all()
            assert BlobStore(rt.store.engine).available()
            report = replayed(rt, run_id, call_log)
            assert report.ok, report.divergences
    finally:
        rt.close()


@pytest.mark.parametrize("limit_s", [30.0, 1.0])
def test_a_parent_and_its_parked_child_both_replay(tmp_path: Path, clock: FakeClock, call_log: Path,
                                                   limit_s: float) -> None:
    """A parent that waited for its child's approval, and the child, each replay without divergence:
    approved in time (both succeed), or cut off by the parent's deadline (the parent times out, the
    child is cancelled by it while waiting)."""
    rt = build_runtime(agent_settings(tmp_path, limit_s), clock=clock)
    rt.runs.children.poll_s = 0.05
    try:
        submitted = rt.runs.submit({"task": "delegate purge cache", **TESS})[0]
        thread = threading.Thread(target=rt.runs.drive, args=(submitted.run_id,))
        thread.start()
        if limit_s > 1.0:
            deadline = time.monotonic() + 30
            while not rt.hitl.pending("t1"):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            rt.runs.decide(rt.hitl.pending("t1")[0].request_id, LEE, "approve")
        thread.join(30)
        (child,) = [r for r in rt.store.list_runs(tenant_id="t1") if r.parent_run_id == submitted.run_id]
        expected = ("SUCCEEDED", "SUCCEEDED") if limit_s > 1.0 else ("CLOSED_FAILED", "CLOSED_CANCELLED")
        assert (rt.store.state_of(submitted.run_id).value, rt.store.state_of(child.run_id).value) == expected
        for run_id in (submitted.run_id, child.run_id):
            report = replayed(rt, run_id, call_log)
            assert report.ok, (run_id, report.divergences)
    finally:
        rt.close()
