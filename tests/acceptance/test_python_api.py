"""The Python API (Harness, AsyncHarness), agents in code and files, and @skill skills (issue 18)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import BaseModel

from harness import Agent, AsyncHarness, Harness, SkillContext, support_agent
from harness.clock import FakeClock
from harness.domain.errors import BadInputError, CancelRefusedError, ManifestError, UnknownRunError
from harness.pipeline.context_assembler import PLAN_FORMAT

if TYPE_CHECKING:  # `harness` resolves its names lazily (a module __getattr__): name the decorator's module
    from harness.skills.decorated import skill
else:
    from harness import skill

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class Ticket(BaseModel):
    ticket: str
    status: str


@skill("tickets.lookup", risk="read", idempotent=True, timeout_s=5)
def lookup_ticket(ticket: str) -> Ticket:
    """Look a ticket up."""
    return Ticket(ticket=ticket, status="open")


@skill("tickets.broken", risk="read", idempotent=True)
def broken_ticket(ticket: str) -> Ticket:
    """Returns something that is not a Ticket."""
    return {"ticket": ticket}  # type: ignore[return-value]  # the contract is broken on purpose


@skill("tickets.close", risk="write", space="project", impact="medium")
def close_ticket(ticket: str, reason: str = "resolved", *, ctx: SkillContext) -> Ticket:
    """Close a ticket (the requester confirms)."""
    return Ticket(ticket=f"{ticket}:{ctx.step_id}", status=f"closed: {reason}")


RULES = """
rules:
  - name: look
    when: '^look (?P<t>T-\\d+)$'
    plan:
      steps: [{id: look, tool_call: {skill: tickets.lookup, arguments: {ticket: "{t}"}}, output_key: t}]
      answer_template: "{t.ticket} is {t.status}"
  - name: broken
    when: '^broken$'
    plan:
      steps: [{id: b, tool_call: {skill: tickets.broken, arguments: {ticket: T-1}}, output_key: b}]
  - name: close
    when: '^close (?P<t>T-\\d+)$'
    plan:
      steps: [{id: close, tool_call: {skill: tickets.close, arguments: {ticket: "{t}"}}, output_key: c}]
      answer_template: "{c.ticket} {c.status}"
"""
CEDAR = 'permit (principal in Role::"agent", action == Action::"call", resource in SkillGroup::"tickets");\n'
POLICY = "version: 1\npermissions: {cedar: p.cedar}\nhitl: {approvers: {L3: [lead]}}\n"
IDENTITIES = "identities:\n  default/ana: {roles: [agent]}\n  default/ops: {roles: [agent, lead]}\n"


@pytest.fixture
def desk(tmp_path: Path) -> Agent:
    for name, text in (("rules.yaml", RULES), ("p.cedar", CEDAR), ("policy.yaml", POLICY), ("ids.yaml", IDENTITIES)):
        (tmp_path / name).write_text(text)
    return Agent(name="desk", instructions="You are the ticket desk.",
                 skills=[lookup_ticket, broken_ticket, close_ticket], policy=tmp_path / "policy.yaml",
                 identities=tmp_path / "ids.yaml", llm_rules=tmp_path / "rules.yaml")


@pytest.fixture
def h(desk: Agent, tmp_path: Path, clock: FakeClock) -> Any:
    with Harness(desk, db=str(tmp_path / "api.db"), data_dir=tmp_path / "data", clock=clock) as harness:
        yield harness


def test_a_code_skill_runs_with_its_schemas_and_the_agent_instructions_lead_the_prompt(h: Harness) -> None:
    """An agent in code: its @skill runs with validated arguments, its instructions open the system prompt."""
    done = h.run("look T-7", user="ana")
    assert done.state == "SUCCEEDED" and done.answer == "T-7 is open"
    prompt = h.runtime.runs.assembled_context(done.run_id).system_prompt
    assert prompt.startswith("You are the ticket desk.") and prompt.endswith(PLAN_FORMAT)
    manifest = lookup_ticket.manifest
    assert manifest.input_schema["required"] == ["ticket"]
    assert manifest.output_schema is not None and set(manifest.output_schema["required"]) == {"ticket", "status"}
    assert lookup_ticket("T-1") == Ticket(ticket="T-1", status="open")  # still the function as written


def test_an_output_that_breaks_the_output_schema_fails_the_step_clearly(h: Harness) -> None:
    """A skill whose result misses a required field fails its step, the error naming the field."""
    done = h.run("broken", user="ana")
    assert done.state == "CLOSED_FAILED"
    assert "invalid_output" in (done.error or "") and "'status' is a required property" in (done.error or "")


def test_a_yaml_skill_with_an_output_schema_is_checked_too(tmp_path: Path, clock: FakeClock, call_log: Path) -> None:
    """YAML manifests keep working, and their output_schema is enforced as well."""
    skills = tmp_path / "skills"
    skills.mkdir()
    for source in (FIXTURES / "skills").glob("*"):
        (skills / source.name).write_bytes(source.read_bytes())
    echo = (skills / "echo.yaml").read_text()
    (skills / "echo.yaml").write_text(echo + "output_schema: {type: object, required: [text, said]}\n")
    with Harness(db=str(tmp_path / "y.db"), skills_dirs=[skills], policy_file=FIXTURES / "policy.yaml",
                 llm_rules=FIXTURES / "llm_rules.yaml", identities_file=FIXTURES / "identities.yaml",
                 data_dir=tmp_path / "data", clock=clock) as h:
        done = h.run("echo hi", user="tess", tenant="t1")
        assert done.state == "CLOSED_FAILED"
        assert "test.echo returned an output that does not fit its output_schema" in (done.error or "")
        assert "'said' is a required property" in (done.error or "")


def test_events_follow_a_run_and_approve_reject_cancel_and_trace_are_typed(h: Harness) -> None:
    """create → events → approve/reject/cancel → trace, through typed results; errors are named."""
    parked = h.run("close T-3", user="ana")
    assert parked.state == "AWAITING_HITL"
    (request,) = h.approvals(parked.run_id)
    assert request.level == "L2" and request.actions[0]["skill"] == "tickets.close"
    decided = h.approve(parked.approval_request_id, as_="ana")  # L2: the requester confirms
    assert decided.accepted and decided.run.answer == "T-3:close closed: resolved"
    events = list(h.events(parked.run_id))
    assert [e.target for e in events][-3:] == ["EXECUTING", "TRACING", "SUCCEEDED"] and events[-1].final
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    trace = h.trace(parked.run_id)
    assert {"policy", "hitl", "tool", "run"} <= {t.kind for t in trace}
    assert [t.seq for t in trace] == sorted(t.seq for t in trace)

    assert h.replay(parked.run_id).ok  # a Run of an agent defined in code replays with that agent
    other = h.run("close T-4", user="ana")
    rejected = h.reject(other.approval_request_id, as_="ana", reason="not yet")
    assert rejected.accepted and rejected.run.state == "CLOSED_REJECTED"

    waiting = h.create("look T-5", user="ana")
    assert waiting.state == "CREATED"
    assert h.cancel(waiting.run_id, by="ops").state == "CLOSED_CANCELLED"
    with pytest.raises(CancelRefusedError):
        h.cancel(waiting.run_id, by="ops")
    with pytest.raises(UnknownRunError):
        h.trace("no-such-run")


def test_wait_drives_a_created_run_and_events_without_follow_stop(h: Harness) -> None:
    """wait() drives an accepted Run to its end; events(follow=False) stops at the last recorded change."""
    run = h.create("look T-9", user="ana")
    assert list(h.events(run.run_id, follow=False)) == []  # accepted, not moved yet
    assert h.wait(run.run_id).answer == "T-9 is open"


def test_async_harness_runs_streams_and_approves(desk: Agent, tmp_path: Path, clock: FakeClock) -> None:
    """AsyncHarness: the same operations awaited, and events as an async iterator."""
    async def main() -> tuple[str, list[str], str | None]:
        async with AsyncHarness(desk, db=str(tmp_path / "a.db"), data_dir=tmp_path / "d", clock=clock) as h:
            parked = await h.run("close T-1", user="ana")
            decided = await h.approve(parked.approval_request_id, as_="ana")
            targets = [e.target async for e in h.events(parked.run_id)]
            assert h.operations.run(parked.run_id).state.value == "SUCCEEDED"  # the operator API beside it
            return decided.run.state, targets, (await h.get(parked.run_id)).answer
    state, targets, answer = asyncio.run(main())
    assert state == "SUCCEEDED" and targets[-1] == "SUCCEEDED" and answer == "T-1:close closed: resolved"


def test_agent_files_and_bad_declarations_are_named(tmp_path: Path) -> None:
    """The support example is an agent file; a broken agent file or @skill names what is wrong."""
    support = support_agent()
    assert support.name == "support" and support.policy is not None and support.policy.is_file()
    (tmp_path / "agent.yaml").write_text("name: x\n")
    with pytest.raises(BadInputError, match="instructions"):
        Agent.from_file(tmp_path / "agent.yaml")
    with pytest.raises(ManifestError, match="needs a type hint"):
        skill("a.b")(lambda x: x)
    with pytest.raises(ManifestError, match="must be an object"):
        @skill("a.c")
        def count(n: int) -> int:
            return n
    json.dumps(lookup_ticket.manifest.model_dump(mode="json"))  # the manifest is plain data


def test_the_manifest_hash_covers_schema_and_code(tmp_path: Path) -> None:
    """Two code skills that differ only in a schema, or only in their code, have different hashes."""
    def declare(body: str, hint: str) -> str:
        path = tmp_path / f"m{abs(hash((body, hint)))}.py"
        path.write_text(f"from harness import skill\n\n@skill('x.y')\ndef f(a: {hint}) -> dict:\n    {body}\n")
        namespace: dict[str, Any] = {}
        exec(compile(path.read_text(), str(path), "exec"), namespace)
        return str(namespace["f"].skill.manifest_hash)
    base = declare("return {'a': a}", "str")
    assert declare("return {'a': a}", "int") != base  # the schema
    assert declare("return {'a': a, 'b': 1}", "str") != base  # the code
    assert declare("return {'a': a}", "str") == base


def test_the_operator_api_submits_the_full_request_decides_and_checks_the_audit(h: Harness) -> None:
    """`Harness.operations` is what the CLI and the service call: a submit with roles and an idempotency key
    returns the same Run (created False) the second time, a decision comes back with its verdict, and the
    chain verifies."""
    ops = h.operations
    request = {"task": "close T-9", "tenant_id": "default", "user_id": "ana", "roles": ["agent"],
               "idempotency_key": "op-1"}
    run, created = ops.submit(request)
    again, created_again = ops.submit(request)
    assert created and not created_again and again.run_id == run.run_id
    assert ops.run(run.run_id).state.value == "CREATED"
    parked = h.drive(run.run_id)
    assert parked.state == "AWAITING_HITL" and parked.approval_request_id is not None
    assert parked.approval_request_id in {r.request_id for r in ops.hitl.pending("default")}
    verdict, result = ops.decide(parked.approval_request_id, ops.identities.resolve("ana"), "approve",
                                 reason="confirmed")
    assert verdict.accepted and verdict.effect == "approved" and result.state == "SUCCEEDED"
    assert [t.to_state.value for t in ops.transitions(run.run_id)][-1] == "SUCCEEDED"
    assert ops.ledger.run_total(run.run_id).to_dict()["usd"] >= 0
    assert ops.verify().ok and ops.reconcile().ok and ops.trace_backlog() == 0
