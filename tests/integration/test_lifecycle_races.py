"""Approvals, cancels and drivers raced from several OS processes on one database (SPEC G4, G5, K4, K5b, T6).

Each race starts real processes that build their own runtime on the same database (SQLite, PostgreSQL,
MariaDB) and are released together by a barrier. What must hold afterwards is read back from the
database and the skills' call log: one person counted once, a reject that is final, a cancel that took
effect or said it did not, and no side effect run by two drivers.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.audit.reconcile import reconcile
from harness.config import Runtime, build_runtime
from harness.domain.contracts import CallerIdentity
from harness.domain.errors import CancelRefusedError
from harness.drive.worker import RunWorker
from harness.settings import Settings

from ..conftest import FIXTURES

pytestmark = pytest.mark.slow

DEPLOYER = {"tenant_id": "t1", "user_id": "dan", "roles": ["tester", "deployer"]}
TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
PAT = CallerIdentity(tenant_id="t1", user_id="pat", roles=("prod_approver",))
QUINN = CallerIdentity(tenant_id="t1", user_id="quinn", roles=("prod_approver", "break_glass"))
MO = CallerIdentity(tenant_id="t1", user_id="mo", roles=("prod_approver",))
#: processes per race: enough to collide on every backend, few enough for two cores
RACERS = 4


def settings(db: str, tmp: Path, **extra: Any) -> Settings:
    """The test skills, rules, policy and identities on the database under test."""
    return Settings(db=db, skills_dirs=(FIXTURES / "skills",), policy_file=FIXTURES / "policy.yaml",
                    llm_rules=FIXTURES / "llm_rules.yaml", identities_file=FIXTURES / "identities.yaml",
                    data_dir=tmp / "data", **extra)


def calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _racer(db: str, tmp: str, log: str, action: str, args: list[Any], start: Any, out: str) -> None:
    """One process: build a runtime, wait at the barrier, do `action` on each target, write what came back."""
    os.environ["HARNESS_TEST_CALL_LOG"] = log
    rt = build_runtime(settings(db, Path(tmp)))
    answers: list[dict[str, Any]] = []
    start.wait()
    for arg in args:
        try:
            if action == "decide":
                request_id, who, decision = arg
                verdict, result = rt.runs.decide(request_id, CallerIdentity(**who), decision, reason="race")
                answers.append({"accepted": verdict.accepted, "effect": verdict.effect, "refusal": verdict.refusal,
                                "state": result.state})
            elif action == "cancel":
                result = rt.runs.cancel(arg, by="t1/op")
                answers.append({"cancelled": True, "state": result.state, "run_id": arg,
                                "effects": [e["step_id"] for e in result.effects]})
            elif action == "orphan_sweep":  # what Celery beat's orphan sweep and a worker do, for `arg` seconds
                import time

                deadline = time.monotonic() + float(arg)
                while time.monotonic() < deadline:
                    for run_id in rt.store.unowned_runs(grace_s=0.3):
                        RunWorker(rt, owner="celery-like").execute(run_id)
                    time.sleep(0.05)
            elif action == "run":
                answers.append({"state": rt.runs.create_run({"task": arg, **TESS}).state})
        except CancelRefusedError as exc:
            answers.append({"cancelled": False, "state": exc.state, "run_id": arg})
        except Exception:
            answers.append({"error": traceback.format_exc()})
    rt.close()
    Path(out).write_text(json.dumps(answers))


def race(rt: Runtime, tmp: Path, log: Path, jobs: list[tuple[str, list[Any]]]) -> list[list[dict[str, Any]]]:
    """Run each (action, targets) job in its own forked process, all released at once."""
    ctx = mp.get_context("fork")
    start = ctx.Barrier(len(jobs))
    outs = [tmp / f"racer-{i}.json" for i in range(len(jobs))]
    procs = [ctx.Process(target=_racer, args=(str(rt.settings.db), str(tmp), str(log), action, args, start, str(out)))
             for (action, args), out in zip(jobs, outs, strict=True)]
    rt.store.engine.dispose()  # no pooled connection may cross the fork
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(180)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    answers = [json.loads(out.read_text()) for out in outs]
    errors = [a["error"] for per in answers for a in per if "error" in a]
    assert not errors, errors[0]
    return answers


@pytest.fixture
def rt(backend_url: str, tmp_path: Path, call_log: Path) -> Any:
    """A runtime over the test fixtures on the backend under test."""
    runtime = build_runtime(settings(backend_url, tmp_path))
    yield runtime
    runtime.close()


def _who(identity: CallerIdentity) -> dict[str, Any]:
    return {"tenant_id": identity.tenant_id, "user_id": identity.user_id, "roles": list(identity.roles)}


def test_one_person_counts_once_across_processes(rt: Runtime, tmp_path: Path, call_log: Path) -> None:
    """The same approver, approving one L4 request from four processes at once, counts once: one approval
    accepted, the others refused, the Run still waits; then the same person racing a second approver
    completes it exactly once and the L4 action runs exactly once."""
    parked = rt.runs.create_run({"task": "ship prod", **DEPLOYER})
    request_id = parked.approval_request_id or ""
    answers = race(rt, tmp_path, call_log, [("decide", [[request_id, _who(PAT), "approve"]])] * RACERS)
    flat = [a for per in answers for a in per]
    assert Counter(a["accepted"] for a in flat) == Counter({True: 1, False: RACERS - 1}), flat
    assert all("once" in (a["refusal"] or "") for a in flat if not a["accepted"])
    assert rt.store.get_run(parked.run_id).state.value == "AWAITING_HITL"
    assert rt.hitl.approvals(request_id) == ["t1/pat"]
    answers = race(rt, tmp_path, call_log, [("decide", [[request_id, _who(PAT), "approve"]]),
                                            ("decide", [[request_id, _who(PAT), "approve"]]),
                                            ("decide", [[request_id, _who(QUINN), "approve"]])])
    flat = [a for per in answers for a in per]
    assert [a["effect"] for a in flat if a["accepted"]] == ["approved"], flat
    assert rt.store.get_run(parked.run_id).state.value == "SUCCEEDED"
    assert [c["step"] for c in calls(call_log) if c["skill"] == "test.echo"] == ["a"]  # the deploy, once
    with rt.store.engine.connect() as conn:
        accepted = conn.execute(sa.select(t.hitl_decisions.c.approver).where(
            t.hitl_decisions.c.request_id == request_id, t.hitl_decisions.c.outcome == "accepted")).scalars().all()
    assert sorted(accepted) == ["t1/pat", "t1/quinn"]


def test_a_reject_racing_approvals_is_final(rt: Runtime, tmp_path: Path, call_log: Path) -> None:
    """On L4 requests, two approvers and a rejecter at once: a request ends approved (and its action ran once)
    or rejected (and nothing ran), and no decision is accepted after the accepted reject."""
    parked = [rt.runs.create_run({"task": "ship prod", **DEPLOYER, "user_id": f"dan{i}"}) for i in range(6)]
    targets = [p.approval_request_id or "" for p in parked]
    race(rt, tmp_path, call_log, [("decide", [[r, _who(PAT), "approve"] for r in targets]),
                                  ("decide", [[r, _who(QUINN), "approve"] for r in targets]),
                                  ("decide", [[r, _who(MO), "reject"] for r in targets])])
    ran = Counter(c["key"].split(":")[0] for c in calls(call_log))
    with rt.store.engine.connect() as conn:
        for run, request_id in zip(parked, targets, strict=True):
            state = rt.store.get_run(run.run_id).state.value
            status = rt.hitl.get(request_id).status
            decisions = conn.execute(sa.select(t.hitl_decisions.c.decision, t.hitl_decisions.c.outcome).where(
                t.hitl_decisions.c.request_id == request_id).order_by(t.hitl_decisions.c.id)).all()
            accepted = [d for d, outcome in decisions if outcome == "accepted"]
            if status == "rejected":
                assert state == "CLOSED_REJECTED" and ran[run.run_id] == 0
                assert accepted[-1] == "reject", decisions  # nothing counted after the final reject
            else:
                assert status == "approved" and state == "SUCCEEDED" and ran[run.run_id] == 1, (status, state)
                assert "reject" not in accepted and accepted.count("approve") == 2


def test_a_cancel_racing_an_approval_takes_effect_or_says_it_lost(rt: Runtime, tmp_path: Path,
                                                                  call_log: Path) -> None:
    """A cancel racing the approval (and the drive it starts) of parked Runs either ends the Run
    CLOSED_CANCELLED or is refused naming the state it lost to; a refused cancel's Run ran its step once,
    a Run cancelled while it still waited ran nothing, and a cancel's answer lists exactly the calls with
    side effects that had started before it took effect."""
    users = [{**TESS, "user_id": f"tess{i}"} for i in range(8)]  # at most 3 waiting requests per requester
    parked = [rt.runs.create_run({"task": f"update T-{i}", **user}) for i, user in enumerate(users)]
    answers = race(rt, tmp_path, call_log, [
        ("decide", [[p.approval_request_id, user, "approve"] for p, user in zip(parked, users, strict=True)]),
        ("cancel", [p.run_id for p in parked]),
    ])
    ran = Counter(c["key"].split(":")[0] for c in calls(call_log))
    for answer in answers[1]:
        final = rt.store.get_run(answer["run_id"]).state.value
        if answer["cancelled"]:
            assert answer["state"] == final == "CLOSED_CANCELLED"
            assert ran[answer["run_id"]] <= 1  # a call in flight when the cancel committed finished, no more
            assert answer["effects"] == ["a"] * ran[answer["run_id"]], answer  # and the answer says so
        else:
            assert final != "CLOSED_CANCELLED" and answer["state"] in ("TRACING", "SUCCEEDED"), answer
            assert final == "SUCCEEDED" and ran[answer["run_id"]] == 1
    assert rt.store.drain_all() >= 0 and reconcile(SqlReconcileReads(rt.store)).ok


def test_one_driver_per_run_while_the_orphan_sweep_runs(rt: Runtime, tmp_path: Path, call_log: Path) -> None:
    """A Run driven by `harness run` (the library's create_run) through a slow read-only step outlasting the
    orphan grace, while another process keeps re-queueing and driving unowned Runs: the non-idempotent step
    after it runs once, with one ToolTrace, and reconcile finds no repeated call."""
    race(rt, tmp_path, call_log, [("run", ["slow then write 1.5"]), ("orphan_sweep", [3.0])])
    writes = [c for c in calls(call_log) if c["skill"] == "test.hang" and c.get("phase") == "start"]
    assert len(writes) == 1, writes
    rt.store.drain_all()
    tools = [r.data() for r in rt.store.iter_trace() if r.kind == "tool" and r.data()["step_id"] == "b"]
    assert len(tools) == 1 and tools[0]["idempotent"] is False
    assert reconcile(SqlReconcileReads(rt.store)).ok


def test_reconcile_names_a_non_idempotent_step_called_twice(rt: Runtime) -> None:
    """Two executed ToolTraces for one step of a non-idempotent skill are a mismatch naming the Run and step;
    a refused attempt and an idempotent skill's re-run are not."""
    from harness.domain.records import TraceRecordIn

    def tool(run_id: str, step: str, idempotent: bool, status: str = "ok") -> TraceRecordIn:
        return TraceRecordIn("tool", {"step_id": step, "skill_id": "notes.add", "skill_version": "1",
                                      "manifest_hash": "-", "idempotency_key": f"{run_id}:{step}",
                                      "arguments_hash": "-", "result_hash": None, "attempts": 1,
                                      "duration_ms": 1.0, "status": status, "idempotent": idempotent}, run_id)

    rt.store.record([tool("r1", "b", False), tool("r1", "b", False), tool("r2", "b", False),
                     tool("r2", "b", False, "refused"), tool("r3", "b", True), tool("r3", "b", True)])
    report = reconcile(SqlReconcileReads(rt.store))
    assert report.counts["repeated_non_idempotent_call"] == 1
    [mismatch] = [m for m in report.mismatches if m.check == "repeated_non_idempotent_call"]
    assert mismatch.run_id == "r1" and "step b called 2 times" in mismatch.detail


# ---------------------------------------------------------------------------------------- kill windows


def _decide_and_die(db: str, tmp: str, log: str, request_id: str, who: dict[str, Any], window: str) -> None:
    """A process that dies by SIGKILL in `window` of a decision: inside its transaction, before the commit
    (the Run's move has been written but not committed), or just after the commit, before the drive."""
    os.environ["HARNESS_TEST_CALL_LOG"] = log
    rt = build_runtime(settings(db, Path(tmp)))

    def die(*_: Any, **__: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)

    if window == "before_commit":
        move = rt.machine.transition_in

        def move_then_die(*args: Any, **kwargs: Any) -> Any:
            move(*args, **kwargs)
            die()

        rt.machine.transition_in = move_then_die  # type: ignore[method-assign]
    else:
        rt.runs.drive = die  # type: ignore[method-assign]
    rt.runs.decide(request_id, CallerIdentity(**who), "approve")


def _killed(rt: Runtime, target: Any, *args: Any) -> None:
    proc = mp.get_context("fork").Process(target=target, args=args)
    rt.store.engine.dispose()
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL


@pytest.mark.parametrize("window", ["before_commit", "after_commit"])
def test_a_decision_is_never_stranded_by_a_kill(rt: Runtime, tmp_path: Path, call_log: Path, window: str) -> None:
    """Killed inside the decision's transaction, nothing of the decision remains and it can be sent again;
    killed after its commit, the approval and the Run's move to EXECUTING are both there, and the embedded
    worker's pick-up of Runs nobody drives executes it. Either way the approved step runs exactly once."""
    parked = rt.runs.create_run({"task": "update T-1", **TESS})
    request_id = parked.approval_request_id or ""
    _killed(rt, _decide_and_die, str(rt.settings.db), str(tmp_path), str(call_log), request_id, TESS, window)
    request, run = rt.hitl.get(request_id), rt.store.get_run(parked.run_id)
    if window == "before_commit":
        assert (request.status, run.state.value) == ("pending", "AWAITING_HITL")
        assert rt.hitl.approvals(request_id) == []
        verdict, result = rt.runs.decide(request_id, CallerIdentity(**TESS), "approve")
        assert verdict.accepted and result.state == "SUCCEEDED"
    else:
        assert (request.status, run.state.value) == ("approved", "EXECUTING")
        assert rt.store.unowned_runs(grace_s=0) == [parked.run_id]
        from harness.service.worker import EmbeddedWorker

        worker = EmbeddedWorker(rt)
        worker.start()  # a (re)started service picks up what nobody drives
        try:
            deadline = time.monotonic() + 60
            while rt.store.get_run(parked.run_id).state.value != "SUCCEEDED" and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            worker.stop()
        assert rt.store.get_run(parked.run_id).state.value == "SUCCEEDED"
    assert [c["step"] for c in calls(call_log)] == ["a"]


def _expire_and_die(db: str, tmp: str) -> None:
    """Apply an L3 timeout that escalates, dying after the L4 request is written, before the commit."""
    rt = build_runtime(settings(db, Path(tmp)))
    escalate = rt.hitl.open_escalation

    def escalate_then_die(*args: Any, **kwargs: Any) -> Any:
        escalate(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    rt.hitl.open_escalation = escalate_then_die  # type: ignore[method-assign]
    rt.store.clock = _Later(3601)
    rt.runs.expire_approvals()


class _Later:
    """The system clock, `ahead` seconds in the future (the killed process sees the deadline passed)."""

    def __init__(self, ahead: float) -> None:
        self.ahead = ahead

    def now(self) -> float:
        return time.time() + self.ahead


def test_an_escalation_killed_midway_leaves_the_l3_request_waiting(rt: Runtime, tmp_path: Path) -> None:
    """Killed between closing an L3 request and opening its L4 escalation, neither happened: the L3 request is
    still pending, and the next expiry escalates it whole."""
    parked = rt.runs.create_run({"task": "purge cache", **TESS})
    _killed(rt, _expire_and_die, str(rt.settings.db), str(tmp_path))
    assert [(r.level, r.status) for r in rt.hitl.for_run(parked.run_id)] == [("L3", "pending")]
    rt.store.clock = _Later(3601)
    assert rt.runs.expire_approvals() == [parked.approval_request_id]
    assert [(r.level, r.status) for r in rt.hitl.for_run(parked.run_id)] == [("L3", "escalated"), ("L4", "pending")]
