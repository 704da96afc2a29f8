"""The tool controller (SPEC T3, T4, T5): per-skill circuit breakers on a fake clock, traced fallbacks,
step and Run time limits, and the LLM as a tool — through real skills, a real store and real Runs."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.adapters.sandbox import select_sandbox
from harness.adapters.sandbox.workdirs import Workdirs
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.contracts import CallerIdentity
from harness.pipeline.resilience import BreakerRegistry, BreakerState
from harness.pipeline.tool_controller import CallResult, ToolController
from harness.settings import Settings
from harness.skills.manifests import SkillRegistry

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
CALLER = CallerIdentity(tenant_id="t1", user_id="tess", roles=("tester",))
TIMED_OUT = ["TIMEOUT", "TRACING", "CLOSED_FAILED"]

SKILLS = '''
import time
from pathlib import Path

def _log(args, name):
    with open(args["log"], "a") as fh:
        fh.write(name + "\\n")

def flaky(args, ctx):
    _log(args, "flaky")
    if Path(args["state"]).read_text() == "down":
        raise ConnectionError("upstream unreachable")
    return {"from": "primary"}

def picky(args, ctx):
    _log(args, "picky")
    raise ValueError("order does not exist")

def backup(args, ctx):
    _log(args, "backup")
    return {"from": "backup"}

def sleepy(args, ctx):
    time.sleep(args["seconds"])
    return {"slept": args["seconds"]}

def unreachable(args, ctx):
    raise ConnectionError("still down")
'''

MANIFESTS: dict[str, dict[str, Any]] = {
    "test.flaky": {"entrypoint": "tc.py:flaky", "retry": {"max_attempts": 2, "backoff_s": 0},
                   "fallback": "test.backup", "breaker": {"failure_threshold": 3, "reset_timeout_s": 30}},
    "test.picky": {"entrypoint": "tc.py:picky", "fallback": "test.backup"},
    "test.backup": {"entrypoint": "tc.py:backup"},
    "test.sleepy": {"entrypoint": "tc.py:sleepy", "timeout_s": 0.2},
    "test.patient": {"entrypoint": "tc.py:sleepy", "timeout_s": 5},
    "test.unreachable": {"entrypoint": "tc.py:unreachable",
                         "retry": {"max_attempts": 10, "backoff_s": 0.1, "max_backoff_s": 0.1}},
    "test.summarise": {"kind": "llm", "prompt": "Summarise: {text}"},
    "test.classify": {"kind": "llm", "prompt": "Classify: {text}", "output": "json"},
}


def write_skills(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tc.py").write_text(SKILLS)
    for skill_id, extra in MANIFESTS.items():
        manifest = {"id": skill_id, "version": "1.0.0", "input_schema": {"type": "object"},
                    "risk": {"access": "read"}, "timeout_s": 5, **extra}
        (folder / f"{skill_id.split('.')[1]}.yaml").write_text(yaml.safe_dump(manifest))


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    """The skills of this module in a folder of their own."""
    write_skills(tmp_path / "skills")
    return tmp_path / "skills"


@pytest.fixture
def controller(skills_dir: Path, tmp_path: Path, clock: FakeClock) -> Iterator[ToolController]:
    """A controller whose breakers run on the fake clock."""
    tools = ToolController(SkillRegistry.from_dirs(skills_dir), workdirs=Workdirs(tmp_path / "runs"),
                           choose_sandbox=select_sandbox, breakers=BreakerRegistry(clock))
    yield tools
    tools.close()


class Upstream:
    """The primary skill's dependency: up or down, and a log of which skills ran."""

    def __init__(self, folder: Path) -> None:
        self.state = folder / "state"
        self.log = folder / "calls.log"
        self.state.write_text("down")
        self.log.touch()

    def set(self, value: str) -> None:
        self.state.write_text(value)

    def calls(self) -> list[str]:
        return self.log.read_text().split()

    @property
    def args(self) -> dict[str, str]:
        return {"state": str(self.state), "log": str(self.log)}


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    """Starts down."""
    return Upstream(tmp_path)


def call(tools: ToolController, skill_id: str, args: dict[str, Any], step: str = "a") -> CallResult:
    skill = tools.registry.get(skill_id)
    assert skill is not None
    return tools.call(skill, args, run_id="run-1", step_id=step, output_key=step, caller=CALLER)


def summary(result: CallResult) -> list[tuple[str, str, str | None, str | None, int]]:
    return [(t.skill_id, t.status, t.error_code, t.fallback_from, t.attempts) for t in result.traces]


def test_breaker_opens_and_the_fallback_takes_over(controller: ToolController, upstream: Upstream) -> None:
    """Transient failures open the skill's breaker; while open the primary is not called, the fallback is,
    and each switch is traced with fallback_from."""
    first = call(controller, "test.flaky", upstream.args)
    assert first.outcome.status == "ok" and first.outcome.output == {"from": "backup"}
    assert summary(first) == [("test.flaky", "error", "ConnectionError", None, 2),
                              ("test.backup", "ok", None, "test.flaky", 1)]
    second = call(controller, "test.flaky", upstream.args, "b")
    assert summary(second)[0] == ("test.flaky", "error", "circuit_open", None, 1)
    assert controller.breakers.get("skill:test.flaky").state is BreakerState.OPEN
    third = call(controller, "test.flaky", upstream.args, "c")
    assert summary(third) == [("test.flaky", "refused", "circuit_open", None, 0),
                              ("test.backup", "ok", None, "test.flaky", 1)]
    assert upstream.calls() == ["flaky", "flaky", "backup", "flaky", "backup", "backup"]


def test_half_open_trial_success_closes_the_breaker(controller: ToolController, upstream: Upstream,
                                                    clock: FakeClock) -> None:
    """After reset_timeout on the clock one trial call goes through; its success closes the breaker."""
    call(controller, "test.flaky", upstream.args)
    call(controller, "test.flaky", upstream.args, "b")
    clock.advance(29.9)
    assert summary(call(controller, "test.flaky", upstream.args, "c"))[0][2] == "circuit_open"
    clock.advance(0.2)
    upstream.set("up")
    recovered = call(controller, "test.flaky", upstream.args, "d")
    assert recovered.outcome.output == {"from": "primary"} and len(recovered.traces) == 1
    assert controller.breakers.get("skill:test.flaky").state is BreakerState.CLOSED


def test_half_open_trial_failure_reopens(controller: ToolController, upstream: Upstream,
                                         clock: FakeClock) -> None:
    """A failing trial reopens the breaker at once for another reset_timeout, and the fallback answers."""
    call(controller, "test.flaky", upstream.args)
    call(controller, "test.flaky", upstream.args, "b")
    clock.advance(30)
    trial = call(controller, "test.flaky", upstream.args, "c")
    assert summary(trial)[0] == ("test.flaky", "error", "circuit_open", None, 1)
    assert trial.outcome.output == {"from": "backup"}
    assert controller.breakers.get("skill:test.flaky").state is BreakerState.OPEN


def test_definite_failures_neither_fall_back_nor_trip(controller: ToolController, upstream: Upstream) -> None:
    """A business error is an answer, not a sick dependency: no fallback, and the breaker stays closed."""
    for step in "abcdef":
        result = call(controller, "test.picky", upstream.args, step)
        assert result.outcome.status == "error" and summary(result) == [
            ("test.picky", "error", "ValueError", None, 1)]
    assert controller.breakers.get("skill:test.picky").state is BreakerState.CLOSED
    assert "backup" not in upstream.calls()


def test_fallback_the_run_may_not_use_is_not_used(controller: ToolController, upstream: Upstream) -> None:
    """When the Run did not pin the fallback (not visible to its caller), the primary's failure stands."""
    skill = controller.registry.get("test.flaky")
    assert skill is not None
    result = controller.call(skill, upstream.args, run_id="run-1", step_id="a", output_key="a", caller=CALLER,
                             may_fall_back=lambda s: False)
    assert result.outcome.status == "error" and len(result.traces) == 1
    assert "backup" not in upstream.calls()


def write_rules(path: Path, tasks: dict[str, tuple[str, dict[str, Any]]],
                extra: list[dict[str, Any]]) -> None:
    rules = [{"name": name, "when": f"^{re.escape(name)}$", "plan": {"steps": [
        {"id": "a", "tool_call": {"skill": skill, "arguments": args}, "output_key": "a"}]}}
        for name, (skill, args) in tasks.items()]
    path.write_text(yaml.safe_dump({"rules": rules + extra}))


def runtime(tmp_path: Path, clock: FakeClock, upstream: Upstream, limit_s: float = 600.0) -> Runtime:
    write_rules(tmp_path / "rules.yaml", {
        "flaky": ("test.flaky", upstream.args),
        "sleepy": ("test.sleepy", {"seconds": 0.5}),
        "patient": ("test.patient", {"seconds": 0.5}),
        "unreachable": ("test.unreachable", {}),
        "summarise": ("test.summarise", {"text": "a long complaint about a late parcel"}),
        "classify": ("test.classify", {"text": "where is my parcel"}),
    }, [
        {"name": "summary", "when": "^Summarise: ", "purpose": "tool", "reply": "late parcel"},
        {"name": "label", "when": "^Classify: ", "purpose": "tool", "reply": "not json at all"},
    ])
    return build_runtime(Settings(
        db=str(tmp_path / "rt.db"), skills_dirs=(tmp_path / "skills",), policy_file=FIXTURES / "policy.yaml",
        llm_rules=tmp_path / "rules.yaml", identities_file=FIXTURES / "identities.yaml",
        data_dir=tmp_path / "data", execution_limit_s=limit_s), clock=clock)


def tool_traces(rt: Runtime, run_id: str, kind: str = "tool") -> list[dict[str, Any]]:
    rt.store.drain_all()
    return [r.data() for r in rt.store.trace_of(run_id) if r.kind == kind]


def test_a_run_succeeds_through_the_fallback(skills_dir: Path, tmp_path: Path, clock: FakeClock,
                                             upstream: Upstream) -> None:
    """End to end, a broken primary is replaced by its fallback and the Run's trace shows both calls."""
    rt = runtime(tmp_path, clock, upstream)
    try:
        result = rt.runs.create_run({"task": "flaky", **TESTER})
        assert result.state == "SUCCEEDED" and result.artifacts["a"] == {"from": "backup"}
        traces = tool_traces(rt, result.run_id)
        assert [(t["skill_id"], t["status"], t.get("fallback_from")) for t in traces] == [
            ("test.flaky", "error", None), ("test.backup", "ok", "test.flaky")]
    finally:
        rt.close()


def test_step_timeout_times_the_run_out(skills_dir: Path, tmp_path: Path, clock: FakeClock,
                                        upstream: Upstream) -> None:
    """A call past its manifest's timeout_s fails with "timeout": TIMEOUT -> CLOSED_FAILED."""
    rt = runtime(tmp_path, clock, upstream)
    try:
        started = time.monotonic()
        result = rt.runs.create_run({"task": "sleepy", **TESTER})
        assert time.monotonic() - started < 0.5
        assert list(result.path)[-3:] == TIMED_OUT and "timeout" in (result.error or "")
        assert tool_traces(rt, result.run_id)[0]["error_code"] == "timeout"
    finally:
        rt.close()


def test_the_runs_limit_caps_a_running_step(skills_dir: Path, tmp_path: Path, clock: FakeClock,
                                            upstream: Upstream) -> None:
    """With 0.2 s of execution allowed, a 0.5 s call under a 5 s timeout is stopped at the Run's limit."""
    rt = runtime(tmp_path, clock, upstream, limit_s=0.2)
    try:
        result = rt.runs.create_run({"task": "patient", **TESTER})
        assert list(result.path)[-3:] == TIMED_OUT and "run_time_limit" in (result.error or "")
        trace = tool_traces(rt, result.run_id)[0]
        assert trace["error_code"] == "run_time_limit" and trace["duration_ms"] < 450
        errors = tool_traces(rt, result.run_id, "error")
        assert {e["error_code"] for e in errors} == {"run_time_limit"}
    finally:
        rt.close()


def test_retries_stop_at_the_runs_limit(skills_dir: Path, tmp_path: Path, clock: FakeClock,
                                        upstream: Upstream) -> None:
    """A retry quota of 10 does not outlive the Run's execution limit."""
    rt = runtime(tmp_path, clock, upstream, limit_s=0.3)
    try:
        started = time.monotonic()
        result = rt.runs.create_run({"task": "unreachable", **TESTER})
        assert time.monotonic() - started < 1.0
        assert result.state == "CLOSED_FAILED"
        assert 1 <= tool_traces(rt, result.run_id)[0]["attempts"] < 10
    finally:
        rt.close()


def test_llm_as_a_tool_is_traced_and_costed(skills_dir: Path, tmp_path: Path, clock: FakeClock,
                                            upstream: Upstream) -> None:
    """An llm skill sends its filled-in prompt to the Runtime's provider; ToolTrace says "llm" and a
    CostTrace records the tokens against the Run."""
    rt = runtime(tmp_path, clock, upstream)
    try:
        result = rt.runs.create_run({"task": "summarise", **TESTER})
        assert result.state == "SUCCEEDED", result.error
        assert result.artifacts["a"] == {"text": "late parcel", "model": "scripted:summary"}
        trace = tool_traces(rt, result.run_id)[0]
        assert trace["call_kind"] == "llm" and trace["status"] == "ok"
        costs = [c for c in tool_traces(rt, result.run_id, "cost")
                 if c["source"] == "llm:scripted:tool:test.summarise"]
        assert len(costs) == 1 and costs[0]["input_tokens"] > 0 and costs[0]["output_tokens"] > 0
    finally:
        rt.close()


def test_llm_output_that_is_not_the_declared_json_fails_the_step(skills_dir: Path, tmp_path: Path,
                                                                clock: FakeClock, upstream: Upstream) -> None:
    """An llm skill declaring `output: json` fails with invalid_llm_output on prose."""
    rt = runtime(tmp_path, clock, upstream)
    try:
        result = rt.runs.create_run({"task": "classify", **TESTER})
        assert result.state == "CLOSED_FAILED" and "invalid_llm_output" in (result.error or "")
    finally:
        rt.close()


def test_local_calls_are_traced_as_local(controller: ToolController, upstream: Upstream) -> None:
    """A plain python skill runs in process: call_kind "local", no isolation, the idempotency key."""
    upstream.set("up")
    trace = call(controller, "test.flaky", upstream.args).trace
    assert (trace.call_kind, trace.isolation, trace.idempotency_key) == ("local", None, "run-1:a")
