"""The Run manager's collaborators each do their job alone, built from real ports (a SQLite store, the
state machine, the approval desk, the skills of the tests) without a Run manager: the preparer, the
executor and the decider."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest

from harness.adapters.llm.scripted import ScriptedProvider
from harness.adapters.sandbox.workdirs import Workdirs
from harness.adapters.sql.approvals import SqlApprovals
from harness.adapters.sql.ledger import CostLedger
from harness.adapters.sql.run_writes import SqlRunWrites
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.context.secrets import SecretFilter
from harness.domain.contracts import CallerIdentity, RunRequest
from harness.domain.records import NewRun, RunRecord
from harness.domain.traces import step_entries
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState
from harness.pipeline.context_assembler import ContextAssembler
from harness.pipeline.gatekeeper import PolicyEngine
from harness.pipeline.plan_orchestrator import PlanOrchestrator
from harness.pipeline.run_core import RunCore
from harness.pipeline.run_decider import RunDecider
from harness.pipeline.run_executor import RunExecutor
from harness.pipeline.run_preparer import RunPreparer
from harness.pipeline.tool_controller import ToolController
from harness.policy.hitl import HitlDesk
from harness.skills.manifests import SkillRegistry

S = RunState
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CALLER = CallerIdentity(tenant_id="t1", user_id="tess", roles=("tester",))


@dataclasses.dataclass
class Ports:
    """The real ports a collaborator is built from, over one SQLite store."""

    store: SqlStore
    machine: StateMachine
    registry: SkillRegistry
    policy: PolicyEngine
    hitl: HitlDesk
    tools: ToolController
    assembler: ContextAssembler
    core: RunCore


@pytest.fixture
def ports(store: SqlStore, machine: StateMachine, tmp_path: Path, call_log: Path) -> Ports:
    """The ports, wired as the composition root wires them, with nothing of the Run manager."""
    registry = SkillRegistry.from_dirs(FIXTURES / "skills")
    ledger = CostLedger(store)
    policy = PolicyEngine.from_file(FIXTURES / "policy.yaml", registry, ledger)
    hitl = HitlDesk(SqlApprovals(store), policy.policy.hitl)
    tools = ToolController(registry, workdirs=Workdirs(tmp_path / "runs"), clock=store.clock)
    assembler = ContextAssembler(secret_filter=SecretFilter())
    core = RunCore(store=store, writes=SqlRunWrites(store, ledger), units=store, machine=machine, hitl=hitl,
                   assembler=assembler)
    return Ports(store, machine, registry, policy, hitl, tools, assembler, core)


def _new_run(store: SqlStore, task: str) -> tuple[RunRecord, RunRequest]:
    request = RunRequest(tenant_id=CALLER.tenant_id, user_id=CALLER.user_id, roles=CALLER.roles, task=task)
    run, created = store.create_run(NewRun(tenant_id=request.tenant_id, user_id=request.user_id,
                                           session_id=request.session_id, request=request.model_dump(mode="json")))
    assert created
    return run, request


def _move(machine: StateMachine, run_id: str, *path: RunState, **kwargs: Any) -> None:
    """Move the Run along `path` through the state machine, the last move with `kwargs`."""
    for source, target in itertools.pairwise(path):
        last = target == path[-1]
        outcome = machine.transition(run_id, source, target, actor="test", reason="set up by the test",
                                     **(kwargs if last else {}))
        assert outcome.applied


def test_the_preparer_alone_takes_an_accepted_run_to_policy_check_and_through_it(ports: Ports) -> None:
    """The preparer, given only the core and its own ports, assembles the context (PREPARING → PLANNING),
    plans with the model (→ POLICY_CHECK) and checks the plan (→ EXECUTING), each step traced."""
    preparer = RunPreparer(ports.core, tools=ports.tools, policy=ports.policy, assembler=ports.assembler,
                           orchestrator=PlanOrchestrator(ScriptedProvider.from_file(FIXTURES / "llm_rules.yaml"),
                                                         ports.registry),
                           chain_depth=4, max_rounds=4)
    run, request = _new_run(ports.store, "echo hello")
    _move(ports.machine, run.run_id, S.CREATED, S.PREPARING)
    run = ports.store.get_run(run.run_id)

    run = preparer.prepare(run, request)
    assert run.state == S.PLANNING and "test.echo" in (run.context or {})["visible_skills"]
    run = preparer.plan(run, request)
    assert run.state == S.POLICY_CHECK
    assert [s["tool_call"]["skill"] for s in (run.context or {})["plan"]["steps"]] == ["test.echo"]
    run = preparer.check_policy(run, request)

    assert ports.store.state_of(run.run_id) == run.state == S.EXECUTING
    assert ports.core.assembled_context(run.run_id).system_prompt  # recorded with the plan's request
    ports.store.drain_all()
    steps = [e["step"] for r in ports.store.trace_of(run.run_id) for e in step_entries(r.kind, r.data())]
    assert steps == [2, 3, 4, 5]


def test_the_executor_alone_runs_an_approved_plan_to_its_answer(ports: Ports, call_log: Path) -> None:
    """The executor, given only the core and its own ports, runs the plan of a Run in EXECUTING, records the
    step's result and moves the Run on to its close with the answer."""
    executor = RunExecutor(ports.core, tools=ports.tools, policy=ports.policy,
                           orchestrator=PlanOrchestrator(ScriptedProvider.from_file(FIXTURES / "llm_rules.yaml"),
                                                         ports.registry),
                           execution_limit_s=60.0)
    run, request = _new_run(ports.store, "echo hello")
    echo = ports.registry.get("test.echo")
    assert echo is not None
    context = {
        "caller": CALLER.model_dump(mode="json"), "visible_skills": ["test.echo"], "steps": {},
        "manifests": {"test.echo": {"version": echo.manifest.version, "hash": echo.manifest_hash}},
        "plan": {"steps": [{"id": "a", "tool_call": {"skill": "test.echo", "arguments": {"text": "hello"}},
                            "output_key": "a"}], "answer_template": "{a.text}"},
    }
    _move(ports.machine, run.run_id, S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING,
          context=context)

    executor.execute(ports.store.get_run(run.run_id), request)

    result = ports.core.result(run.run_id)
    assert (result.state, result.answer) == (S.SUCCEEDED.value, "hello")
    assert (ports.store.get_run(run.run_id).context or {})["steps"]["a"]["status"] == "ok"
    assert '"skill": "test.echo"' in call_log.read_text()  # the skill ran, once
    assert len(call_log.read_text().splitlines()) == 1


def test_the_decider_alone_expires_a_due_approval_request(ports: Ports, clock: FakeClock) -> None:
    """The decider, given only the store, the state machine, the approval desk and the skills, applies an
    approval's timeout once its deadline passed: the request times out and its Run closes, denied."""
    decider = RunDecider(store=ports.store, writes=ports.core.writes, machine=ports.machine, hitl=ports.hitl,
                         registry=ports.registry)
    run, _ = _new_run(ports.store, "echo hello")
    actions = [{"step_id": "a", "skill": "test.echo", "arguments": {"text": "hello"}}]
    request = ports.hitl.new_request(run.run_id, CALLER.tenant_id, CALLER.user_id, "L2", actions)
    _move(ports.machine, run.run_id, S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL,
          also=lambda conn: ports.hitl.insert(conn, request))
    assert decider.expire_approvals() == []  # not due yet

    clock.advance(ports.hitl.settings.timeout_s + 1)

    assert decider.expire_approvals() == [request.request_id]
    assert ports.hitl.get(request.request_id).status == "timed_out"
    assert ports.core.result(run.run_id).path[-3:] == ("TIMEOUT", "TRACING", "CLOSED_REJECTED")
    assert decider.expire_approvals() == []  # applied once
