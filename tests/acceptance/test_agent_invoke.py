"""AgentInvoke (SPEC T4): an agent skill's call is a child Run created and driven through the same kernel,
linked both ways in the trace, due by the parent's remaining budget, while the parent stays EXECUTING."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app as cli_app
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.contracts import CallerIdentity, RunResult
from harness.domain.errors import InvalidRequestError
from harness.domain.records import RunRecord
from harness.drive.sweeper import ZombieSweeper
from harness.kernel.states import RunState
from harness.kernel.thresholds import Thresholds
from harness.settings import Settings
from tests.acceptance.agent_skills import TESTER, agent_settings
from tests.acceptance.api_helpers import make_client


def make_runtime(tmp_path: Path, clock: FakeClock, limit_s: float, **extra: Any) -> Runtime:
    runtime = build_runtime(agent_settings(tmp_path, limit_s, **extra), clock=clock)
    runtime.runs.children.poll_s = 0.05  # a waiting parent looks at its child often (tests only)
    return runtime


@pytest.fixture
def rt(tmp_path: Path, clock: FakeClock) -> Iterator[Runtime]:
    """A runtime with agent skills and a 30 s execution limit."""
    runtime = make_runtime(tmp_path, clock, 30.0)
    yield runtime
    runtime.close()


def records(rt: Runtime, run_id: str, kind: str) -> list[dict[str, Any]]:
    rt.store.drain_all()
    return [r.data() for r in rt.store.trace_of(run_id) if r.kind == kind]


def child_of(rt: Runtime, parent_id: str) -> str:
    (tool,) = records(rt, parent_id, "tool")
    assert tool["call_kind"] == "agent" and tool["child_run_id"]
    return str(tool["child_run_id"])


def test_a_child_run_answers_its_parent(rt: Runtime) -> None:
    """The child Run runs the whole pipeline and succeeds; its answer is the parent step's output."""
    parent = rt.runs.create_run({"task": "delegate hello", **TESTER})
    assert parent.state == "SUCCEEDED", parent.error
    assert parent.answer == "child said hello"
    child = rt.runs.result(child_of(rt, parent.run_id))
    assert child.state == "SUCCEEDED" and child.answer == "hello"
    assert parent.artifacts["a"]["run_id"] == child.run_id


def test_the_link_is_in_both_traces(rt: Runtime) -> None:
    """The parent's ToolTrace names the child; the child's Run row, request and trace name the parent."""
    parent = rt.runs.create_run({"task": "delegate hello", **TESTER})
    child_id = child_of(rt, parent.run_id)
    child = rt.store.get_run(child_id)
    assert child.parent_run_id == parent.run_id
    assert child.request["metadata"]["parent_run_id"] == parent.run_id
    (invoked,) = [a for a in records(rt, child_id, "audit") if a["event"] == "agent_invoked"]
    assert invoked["detail"]["parent_run_id"] == parent.run_id and invoked["detail"]["parent_step_id"] == "a"
    assert records(rt, child_id, "run")[0]["final_state"] == "SUCCEEDED"


def test_the_parent_stays_executing_while_the_child_runs(rt: Runtime) -> None:
    """Every state change of the child happens while the parent is in EXECUTING."""
    seen: list[tuple[str, str]] = []

    def watch(run_id: str, _source: RunState, target: RunState) -> None:
        parent_id = rt.store.get_run(run_id).parent_run_id
        if parent_id is not None:
            seen.append((target.value, rt.store.get_run(parent_id).state.value))

    rt.machine.subscribe(watch)
    parent = rt.runs.create_run({"task": "delegate hello", **TESTER})
    assert parent.state == "SUCCEEDED"
    assert [t for t, _ in seen] == ["PREPARING", "PLANNING", "POLICY_CHECK", "EXECUTING", "TRACING",
                                    "SUCCEEDED"]
    assert {p for _, p in seen} == {"EXECUTING"}


def test_the_childs_deadline_comes_from_the_parents_remaining_budget(rt: Runtime, clock: FakeClock) -> None:
    """A child of a Run with 30 s of execution is due within those 30 s, not its manifest's 600 s."""
    parent = rt.runs.create_run({"task": "delegate hello", **TESTER})
    child = rt.store.get_run(child_of(rt, parent.run_id))
    assert child.deadline_at is not None
    assert 25.0 < child.deadline_at - clock.now() <= 30.0


def test_a_failed_child_fails_the_parents_step(rt: Runtime) -> None:
    """When the child Run fails, the parent's step fails with child_run_failed and both are traced."""
    parent = rt.runs.create_run({"task": "delegate breakage", **TESTER})
    assert parent.state == "CLOSED_FAILED" and "child_run_failed" in (parent.error or "")
    child_id = child_of(rt, parent.run_id)
    assert rt.runs.result(child_id).state == "CLOSED_FAILED"
    (tool,) = records(rt, parent.run_id, "tool")
    assert tool["error_code"] == "child_run_failed"
    assert any(e["error_code"] == "child_run_failed" for e in records(rt, parent.run_id, "error"))


def test_a_child_cannot_outlive_its_parents_budget(tmp_path: Path, clock: FakeClock) -> None:
    """With 0.5 s left to the parent, the child's 2 s step stops at the child's deadline; both time out."""
    runtime = make_runtime(tmp_path, clock, 0.5)
    try:
        parent = runtime.runs.create_run({"task": "delegate a nap", **TESTER})
        assert list(parent.path)[-3:] == ["TIMEOUT", "TRACING", "CLOSED_FAILED"]
        assert "child_run_timeout" in (parent.error or "")
        child = runtime.runs.result(child_of(runtime, parent.run_id))
        assert list(child.path)[-3:] == ["TIMEOUT", "TRACING", "CLOSED_FAILED"]
        assert "run_time_limit" in (child.error or "")
    finally:
        runtime.close()


def test_a_rerun_of_the_step_finds_the_same_child(rt: Runtime) -> None:
    """The child's idempotency key is the parent's (run, step): re-running the step starts no second child."""
    parent = rt.runs.create_run({"task": "delegate hello", **TESTER})
    child_id = child_of(rt, parent.run_id)
    skill = rt.registry.get("test.delegate")
    assert skill is not None
    caller = CallerIdentity(tenant_id="t1", user_id="tess", roles=("tester",))
    again = rt.tools.call(skill, {"text": "hello"}, run_id=parent.run_id, step_id="a", output_key="a",
                          caller=caller)
    assert again.trace.child_run_id == child_id and again.outcome.output["answer"] == "hello"
    assert len([r for r in rt.store.list_runs(tenant_id="t1") if r.parent_run_id == parent.run_id]) == 1


LEE = CallerIdentity(tenant_id="t1", user_id="lee", roles=("tester", "lead"))  # an L3 approver


def eventually(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Wait (polling) until `check()` holds; fail naming `what` if it never does."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def in_background(fn: Callable[[], RunResult]) -> tuple[threading.Thread, list[RunResult]]:
    """Run `fn` on a thread (a parent's drive, blocked while it waits); its result lands in the list."""
    out: list[RunResult] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def children(rt: Runtime, parent_id: str) -> list[RunRecord]:
    return [r for r in rt.store.list_runs(tenant_id="t1", limit=100) if r.parent_run_id == parent_id]


def parked_child(rt: Runtime, parent_id: str) -> RunRecord:
    """Wait until the parent's child parks for approval; its Run."""
    eventually(lambda: [c.state for c in children(rt, parent_id)] == [RunState.AWAITING_HITL], "the child parks")
    (child,) = children(rt, parent_id)
    return child


def purges(call_log: Path) -> int:
    return sum(json.loads(line)["skill"] == "test.purge" for line in call_log.read_text().splitlines())


def test_a_parked_child_leaves_its_parent_executing_until_approved(rt: Runtime, call_log: Path) -> None:
    """A child that needs L3 approval parks while its parent stays EXECUTING; the approval request names
    the parent; once approved the child runs and the parent succeeds with the child's answer."""
    submitted = rt.runs.submit({"task": "delegate purge cache", **TESTER})[0]
    thread, out = in_background(lambda: rt.runs.drive(submitted.run_id))
    child = parked_child(rt, submitted.run_id)
    assert rt.store.get_run(submitted.run_id).state == RunState.EXECUTING
    (request,) = rt.hitl.pending("t1")
    assert request.run_id == child.run_id and request.level == "L3"
    assert rt.hitl.parent_runs([request]) == {request.request_id: submitted.run_id}
    assert request.deadline_at <= (child.deadline_at or 0)  # useless once the parent stopped waiting
    assert purges(call_log) == 0
    verdict, child_result = rt.runs.decide(request.request_id, LEE, "approve")
    assert verdict.effect == "approved" and child_result.state == "SUCCEEDED"
    thread.join(30)
    (parent,) = out
    assert parent.state == "SUCCEEDED" and parent.answer == "child said purged cache", parent.error
    assert list(parent.path)[-3:] == ["EXECUTING", "TRACING", "SUCCEEDED"] and "AWAITING_HITL" not in parent.path
    assert purges(call_log) == 1 and len(children(rt, submitted.run_id)) == 1


def test_a_rejected_child_fails_the_parents_step(rt: Runtime, call_log: Path) -> None:
    """A reject of the child's approval closes the child CLOSED_REJECTED and fails the parent's step with
    child_run_rejected (a failure, not a timeout); nothing was purged."""
    submitted = rt.runs.submit({"task": "delegate purge cache", **TESTER})[0]
    thread, out = in_background(lambda: rt.runs.drive(submitted.run_id))
    child = parked_child(rt, submitted.run_id)
    (request,) = rt.hitl.pending("t1")
    rt.runs.decide(request.request_id, LEE, "reject", reason="not today")
    thread.join(30)
    (parent,) = out
    assert rt.runs.result(child.run_id).state == "CLOSED_REJECTED"
    assert parent.state == "CLOSED_FAILED" and "child_run_rejected" in (parent.error or "")
    assert "TIMEOUT" not in parent.path and list(parent.path)[-3:] == ["FAILED", "TRACING", "CLOSED_FAILED"]
    (tool,) = records(rt, submitted.run_id, "tool")
    assert tool["error_code"] == "child_run_rejected" and tool["child_run_id"] == child.run_id
    assert purges(call_log) == 0


def test_the_parents_deadline_cancels_a_waiting_child(tmp_path: Path, clock: FakeClock, call_log: Path) -> None:
    """With 1 s of execution left, a parent whose child waits for approval times out at its deadline and
    cancels the child, with the reason in the child's trail; the approval request is closed."""
    runtime = make_runtime(tmp_path, clock, 1.0)
    try:
        parent = runtime.runs.create_run({"task": "delegate purge cache", **TESTER})
        assert list(parent.path)[-4:] == ["EXECUTING", "TIMEOUT", "TRACING", "CLOSED_FAILED"], parent.path
        (child,) = children(runtime, parent.run_id)
        assert runtime.store.get_run(child.run_id).state == RunState.CLOSED_CANCELLED
        cancel = next(x for x in runtime.store.transitions_of(child.run_id) if x.to_state == RunState.CANCELLED)
        assert cancel.from_state == RunState.AWAITING_HITL and parent.run_id in cancel.reason
        assert [r.status for r in runtime.hitl.for_run(child.run_id)] == ["cancelled"]
        assert purges(call_log) == 0
    finally:
        runtime.close()


def test_cancelling_a_waiting_parent_cancels_its_child(rt: Runtime, call_log: Path) -> None:
    """A parent cancelled while it waits stops waiting and cancels its child: a child never outlives
    the parent that would take its result."""
    submitted = rt.runs.submit({"task": "delegate purge cache", **TESTER})[0]
    thread, _ = in_background(lambda: rt.runs.drive(submitted.run_id))
    child = parked_child(rt, submitted.run_id)
    rt.runs.cancel(submitted.run_id, by="t1/op")
    thread.join(30)
    assert rt.store.get_run(submitted.run_id).state == RunState.CLOSED_CANCELLED
    assert rt.store.get_run(child.run_id).state == RunState.CLOSED_CANCELLED
    assert [r.status for r in rt.hitl.for_run(child.run_id)] == ["cancelled"] and purges(call_log) == 0


class DriverDied(BaseException):
    """Stands in for the parent's process dying while it waits (nothing below it runs)."""


def test_an_approval_after_the_parent_is_gone_starts_nothing(rt: Runtime, clock: FakeClock, call_log: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """When the parent's driver dies while it waits and the sweeper closes the parent, a later approval of
    the child starts no step: the child is cancelled, naming its parent."""
    def die_while_waiting(parent_id: str, child_id: str, until: float) -> Any:
        drive = rt.runs.children.leased_drive
        assert drive is not None
        drive(child_id)  # the child runs until it parks; then the parent's process dies
        raise DriverDied

    monkeypatch.setattr(rt.runs, "await_child", die_while_waiting)
    submitted = rt.runs.submit({"task": "delegate purge cache", **TESTER})[0]
    with pytest.raises(DriverDied):
        rt.runs.drive(submitted.run_id)
    (child,) = children(rt, submitted.run_id)
    assert child.state == RunState.AWAITING_HITL
    assert rt.store.get_run(submitted.run_id).state == RunState.EXECUTING
    clock.advance(11)  # past this sweeper's EXECUTING threshold, within the child's approval deadline
    ZombieSweeper(rt.store, rt.machine, thresholds=Thresholds.build({"EXECUTING": 10.0})).sweep_once()
    assert rt.store.get_run(submitted.run_id).state == RunState.CLOSED_FAILED
    (request,) = [r for r in rt.hitl.for_run(child.run_id)]
    assert request.status == "pending"
    _, after = rt.runs.decide(request.request_id, LEE, "approve")
    assert after.state == "CLOSED_CANCELLED" and purges(call_log) == 0
    cancel = next(x for x in rt.store.transitions_of(child.run_id) if x.to_state == RunState.CANCELLED)
    assert cancel.from_state == RunState.EXECUTING and submitted.run_id in cancel.reason


def delegation_verdicts(rt: Runtime, run_id: str) -> list[dict[str, Any]]:
    return [v for p in records(rt, run_id, "policy") for v in p["verdicts"] if v["rule_id"] == "budget.delegation"]


def test_a_run_with_no_delegation_budget_is_refused_by_policy(rt: Runtime) -> None:
    """With chain_remaining 0 a plan that would start a child Run is rejected at POLICY_CHECK with a traced
    reason, before anything runs: no child Run exists."""
    result = rt.runs.create_run({"task": "delegate hello", "chain_remaining": 0, **TESTER})
    assert list(result.path) == ["CREATED", "PREPARING", "PLANNING", "POLICY_CHECK", "REJECTED", "TRACING",
                                 "CLOSED_REJECTED"]
    assert "budget.delegation" in (result.error or "")
    (verdict,) = delegation_verdicts(rt, result.run_id)
    assert verdict["decision"] == "reject" and "chain_remaining is 0" in verdict["reason"]
    assert children(rt, result.run_id) == [] and records(rt, result.run_id, "tool") == []


def test_a_child_gets_one_less_delegation_budget(rt: Runtime) -> None:
    """The caller's chain_remaining is stored with the Run and its child gets one less (and the same team);
    without one the deployment's default depth is stored."""
    parent = rt.runs.create_run({"task": "delegate hello", "chain_remaining": 3, "team_id": "ops", **TESTER})
    (child,) = children(rt, parent.run_id)
    assert rt.store.get_run(parent.run_id).request["chain_remaining"] == 3
    assert child.request["chain_remaining"] == 2
    assert child.request["team_id"] == "ops"  # a child works for its parent's team
    (verdict,) = delegation_verdicts(rt, parent.run_id)
    assert verdict["decision"] == "pass" and "2 level(s)" in verdict["reason"]
    plain = rt.runs.create_run({"task": "say hi", **TESTER})
    assert rt.store.get_run(plain.run_id).request["chain_remaining"] == rt.settings.chain_depth == 4


@pytest.mark.parametrize("depth", [1, 2])
def test_the_default_delegation_depth_is_a_setting(tmp_path: Path, clock: FakeClock,
                                                   monkeypatch: pytest.MonkeyPatch, depth: int) -> None:
    """HARNESS_CHAIN_DEPTH sets how deep Runs may delegate: a Run that delegates to itself makes exactly
    depth + 1 Runs, the deepest refused by policy (not failed at execution), the others failing upward."""
    monkeypatch.setenv("HARNESS_CHAIN_DEPTH", str(depth))
    assert Settings.from_env().chain_depth == depth
    runtime = build_runtime(agent_settings(tmp_path, chain_depth=Settings.from_env().chain_depth), clock=clock)
    try:
        root = runtime.runs.create_run({"task": "recurse", **TESTER})
        chain = [runtime.store.get_run(root.run_id)]
        while kids := children(runtime, chain[-1].run_id):
            chain.extend(kids)
        assert [r.request["chain_remaining"] for r in chain] == list(range(depth, -1, -1))
        deepest = runtime.runs.result(chain[-1].run_id)
        assert deepest.state == "CLOSED_REJECTED" and "EXECUTING" not in deepest.path
        assert delegation_verdicts(runtime, deepest.run_id)[0]["decision"] == "reject"
        assert [runtime.runs.result(r.run_id).state for r in chain[:-1]] == ["CLOSED_FAILED"] * depth
    finally:
        runtime.close()


def test_a_caller_cannot_ask_for_more_delegation_than_allowed(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain_remaining above the deployment's depth, or a depth setting that is not a count, is refused
    with an error naming it; nothing is created."""
    with pytest.raises(InvalidRequestError, match=r"chain_remaining: 5 .* allows \(4"):
        rt.runs.submit({"task": "delegate hello", "chain_remaining": 5, **TESTER})
    with pytest.raises(InvalidRequestError, match=r"chain_remaining"):
        rt.runs.submit({"task": "delegate hello", "chain_remaining": -1, **TESTER})
    assert rt.store.list_runs(limit=10) == []
    monkeypatch.setenv("HARNESS_CHAIN_DEPTH", "-2")
    with pytest.raises(InvalidRequestError, match="chain_depth"):
        Settings.from_env()


def test_the_api_and_console_show_which_parent_an_approval_serves(tmp_path: Path, call_log: Path) -> None:
    """Through the service: a child's approval request names its parent Run in the API's approval
    document and in the console inbox, and `harness approvals --json` says the same; a chain_remaining
    above the deployment's depth is a 422 naming the field."""
    identities = tmp_path / "identities.yaml"
    identities.write_text(yaml.safe_dump({"identities": {
        f"t1/{user}": {"roles": roles, "api_key_sha256": hashlib.sha256(f"key-{user}".encode()).hexdigest()}
        for user, roles in (("tess", ["tester"]), ("lee", ["tester", "lead"]))}}))
    runtime = build_runtime(agent_settings(tmp_path).model_copy(update={"identities_file": identities}))
    runtime.runs.children.poll_s = 0.05
    try:
        with make_client(runtime) as client:
            tess, lee = {"X-API-Key": "key-tess"}, {"X-API-Key": "key-lee"}
            too_deep = client.post("/api/v1/runs", json={"task": "delegate hello", "chain_remaining": 9},
                                   headers=tess)
            assert too_deep.status_code == 422 and "chain_remaining" in too_deep.json()["detail"]
            created = client.post("/api/v1/runs", json={"task": "delegate purge cache"}, headers=tess)
            parent_id = created.json()["run_id"]
            child = parked_child(runtime, parent_id)
            (doc,) = client.get("/api/v1/approvals", headers=lee).json()["pending"]
            assert doc["run_id"] == child.run_id and doc["parent_run_id"] == parent_id
            one = client.get(f"/api/v1/approvals/{doc['request_id']}", headers=lee).json()
            assert one["parent_run_id"] == parent_id
            signed_in = client.post("/ui/login", content="api_key=key-lee&next=/ui/approvals", follow_redirects=False,
                                    headers={"Content-Type": "application/x-www-form-urlencoded"})
            assert signed_in.status_code == 303
            inbox = client.get("/ui/approvals").text
            assert f'href="/ui/runs/{parent_id}"' in inbox and "parent Run" in inbox
            listed = CliRunner().invoke(cli_app, ["approvals", "--db", runtime.settings.db or "", "--json"])
            assert listed.exit_code == 0, listed.output
            assert json.loads(listed.stdout)["pending"][0]["parent_run_id"] == parent_id
            decided = client.post(f"/api/v1/approvals/{doc['request_id']}/decision", headers=lee,
                                  json={"decision": "approve"}, params={"wait": "true"})
            assert decided.status_code == 200 and decided.json()["run"]["state"] == "SUCCEEDED"
            eventually(lambda: runtime.store.get_run(parent_id).state == RunState.SUCCEEDED, "the parent succeeds")
        assert runtime.runs.result(parent_id).answer == "child said purged cache" and purges(call_log) == 1
    finally:
        runtime.close()


def test_a_run_holding_a_childs_key_is_never_taken_for_the_child(rt: Runtime) -> None:
    """A Run someone created in advance with the key of a parent's child (agent:<parent>:<step>) is not
    adopted as that child: the parent's step fails with agent_key_conflict and the impostor is untouched."""
    parent = rt.runs.submit({"task": "delegate hello", **TESTER})[0]
    impostor = rt.runs.submit({"task": "say forged", "idempotency_key": f"agent:{parent.run_id}:a", **TESTER})[0]
    result = rt.runs.drive(parent.run_id)
    assert result.state == "CLOSED_FAILED" and "agent_key_conflict" in (result.error or "")
    assert rt.store.get_run(impostor.run_id).state == RunState.CREATED and children(rt, parent.run_id) == []
