"""AgentInvoke (SPEC T4): an agent skill's call is a child Run created and driven through the same kernel,
linked both ways in the trace, due by the parent's remaining budget, while the parent stays EXECUTING."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.clock import FakeClock
from harness.config import Runtime, Settings, build_runtime
from harness.kernel import RunState
from harness.pipeline.contracts import CallerIdentity

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}

SKILLS = '''
import time

def echo(args, ctx):
    return dict(args)

def fail(args, ctx):
    raise RuntimeError("the child's tool broke")

def nap(args, ctx):
    time.sleep(args["seconds"])
    return {"slept": args["seconds"]}
'''

MANIFESTS: dict[str, dict[str, Any]] = {
    "test.say": {"entrypoint": "agents.py:echo"},
    "test.broken": {"entrypoint": "agents.py:fail"},
    "test.nap": {"entrypoint": "agents.py:nap"},
    "test.delegate": {"kind": "agent", "prompt": "say {text}", "timeout_s": 600},
    "test.delegate_broken": {"kind": "agent", "prompt": "break"},
    "test.delegate_nap": {"kind": "agent", "prompt": "nap"},
}


def one_step(name: str, when: str, skill: str, arguments: dict[str, Any], answer: str = "") -> dict[str, Any]:
    return {"name": name, "when": when, "plan": {"answer_template": answer, "steps": [
        {"id": "a", "tool_call": {"skill": skill, "arguments": arguments}, "output_key": "a"}]}}


RULES = [
    one_step("say", "^say (?P<text>.+)$", "test.say", {"text": "{text}"}, "{a.text}"),
    one_step("break", "^break$", "test.broken", {}),
    one_step("nap", "^nap$", "test.nap", {"seconds": 2}),
    one_step("delegate", "^delegate (?P<text>.+)$", "test.delegate", {"text": "{text}"},
             "child said {a.answer}"),
    one_step("delegate_broken", "^delegate breakage$", "test.delegate_broken", {}),
    one_step("delegate_nap", "^delegate a nap$", "test.delegate_nap", {}),
]


def make_runtime(tmp_path: Path, clock: FakeClock, limit_s: float) -> Runtime:
    skills = tmp_path / "skills"
    skills.mkdir()
    (skills / "agents.py").write_text(SKILLS)
    for skill_id, extra in MANIFESTS.items():
        manifest = {"id": skill_id, "version": "1.0.0", "input_schema": {"type": "object"},
                    "risk": {"access": "read"}, "timeout_s": 5, **extra}
        (skills / f"{skill_id.split('.')[1]}.yaml").write_text(yaml.safe_dump(manifest))
    # "delegate breakage" must reach its own rule before the generic "delegate <text>" one
    ordered = [r for r in RULES if r["name"] != "delegate"] + [r for r in RULES if r["name"] == "delegate"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"rules": ordered}))
    return build_runtime(Settings(
        db=str(tmp_path / "rt.db"), skills_dirs=(skills,), policy_file=FIXTURES / "policy.yaml",
        llm_rules=tmp_path / "rules.yaml", identities_file=FIXTURES / "identities.yaml",
        data_dir=tmp_path / "data", execution_limit_s=limit_s), clock=clock)


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
