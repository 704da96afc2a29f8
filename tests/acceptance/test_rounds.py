"""Runs that plan in rounds, answers written from results, and direct answers (issue 18)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.adapters.llm.scripted import ScriptedProvider
from harness.adapters.sql.blobs import BlobStore
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.contracts import CallerIdentity
from harness.domain.llm import LLMRequest, LLMResponse
from harness.domain.traces import policy_verdicts
from harness.kernel.states import RunState
from harness.replay.runner import replay
from harness.settings import Settings

from .checks import assert_audit_clean, trace_kinds

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
LEAD = CallerIdentity(tenant_id="default", user_id="carol", roles=("support_agent", "support_lead"))
TWO_ROUNDS = ["CREATED", "PREPARING", "PLANNING", "POLICY_CHECK", "EXECUTING", "PLANNING", "POLICY_CHECK"]
SECRET = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"


class Recording:
    """The scripted provider, keeping every request it was sent (what the model saw)."""

    def __init__(self, inner: ScriptedProvider, crash_on_plan: int | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.requests: list[LLMRequest] = []
        self.crash_on_plan = crash_on_plan

    def complete(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        plans = sum(1 for r in self.requests if r.purpose == "plan")
        if request.purpose == "plan" and plans == self.crash_on_plan:
            raise _WorkerDied("the worker died while the model planned")
        return self.inner.complete(request)


class _WorkerDied(BaseException):
    """Stands for the process dying: nothing in the pipeline catches it."""


def _settings(tmp_path: Path, **extra: object) -> Settings:
    return Settings(db=str(tmp_path / "rounds.db"), skills_dirs=(FIXTURES / "skills",),
                    policy_file=FIXTURES / "policy.yaml", llm_rules=FIXTURES / "llm_rules.yaml",
                    identities_file=FIXTURES / "identities.yaml", data_dir=tmp_path / "data", **extra)


def _runtime(tmp_path: Path, clock: FakeClock, provider: Recording | None = None, **extra: object) -> Runtime:
    return build_runtime(_settings(tmp_path, **extra), clock=clock, provider=provider)


def _calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture
def recording() -> Recording:
    return Recording(ScriptedProvider.from_file(FIXTURES / "llm_rules.yaml"))


@pytest.fixture
def rounds_runtime(tmp_path: Path, clock: FakeClock, call_log: Path, recording: Recording) -> Iterator[Runtime]:
    rt = _runtime(tmp_path, clock, recording)
    yield rt
    rt.close()


def test_the_support_agent_looks_up_decides_parks_and_answers_from_the_results(support_runtime: Runtime,
                                                                              tmp_path: Path) -> None:
    """Round 1 looks the order up; round 2, decided from that result, needs a lead's approval and parks;
    once approved the refund runs once and the model writes the answer from both rounds' results."""
    rt = support_runtime
    parked = rt.runs.create_run({"task": "Refund order A-1003 if it was delivered", "user_id": "alice"})
    assert list(parked.path) == [*TWO_ROUNDS, "AWAITING_HITL"]
    assert not (tmp_path / "ledger.jsonl").exists()  # nothing of round 2 ran before the approval
    (request,) = [r for r in rt.hitl.for_run(parked.run_id) if r.status == "pending"]
    assert request.request_id == parked.approval_request_id and request.level == "L3"
    assert request.actions == [{"step_id": "issue", "skill": "refunds.issue",
                                "arguments": {"order_id": "A-1003", "amount": 180.0}}]  # the total round 1 found
    # the approval comes to another runtime on the same database (a restart): it resumes at round 2
    again = build_runtime(Settings(db=rt.settings.db, data_dir=rt.settings.data_dir))
    try:
        _, done = again.runs.decide(request.request_id, LEAD, "approve")
    finally:
        again.close()
    assert done.state == "SUCCEEDED"
    assert list(done.path) == [*TWO_ROUNDS, "AWAITING_HITL", "EXECUTING", "TRACING", "SUCCEEDED"]
    refund = done.artifacts["issued"]["refund_id"]
    assert done.answer == (f"Order A-1003 was delivered, so I refunded its total: refund {refund} of 180.0 EUR "
                           "is issued.")
    ledger = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in ledger] == ["refund"]
    kinds = trace_kinds(rt, done.run_id)
    # round 1's lookup ran once, round 2's refund once; two plans and the answer were priced
    assert kinds["policy"] == 2 and kinds["tool"] == 2 and kinds["cost"] == 3
    tools = [r.data()["step_id"] for r in rt.store.trace_of(done.run_id) if r.kind == "tool"]
    assert tools == ["lookup", "issue"]
    llm = [r.data() for r in rt.store.trace_of(done.run_id) if r.kind == "llm"]
    assert [r["purpose"] for r in llm] == ["plan", "plan", "answer"]
    costs = [r.data()["source"] for r in rt.store.trace_of(done.run_id) if r.kind == "cost"]
    assert costs == ["llm:scripted:plan", "llm:scripted:plan", "llm:scripted:answer"]
    assert_audit_clean(rt)
    report = replay(done.run_id, rt.store, rt.settings)  # both rounds, the approval and the answer
    assert report.ok, report.to_dict()


def test_an_order_not_delivered_gets_a_direct_answer_in_round_two(support_runtime: Runtime) -> None:
    """What round 1 found decides round 2: an order still in processing gets an answer and no refund."""
    done = support_runtime.runs.create_run({"task": "Refund order A-1004 if it was delivered", "user_id": "alice"})
    assert list(done.path) == [*TWO_ROUNDS, "EXECUTING", "TRACING", "SUCCEEDED"]
    assert done.answer == "Order A-1004 is processing, not delivered yet, so I did not refund it."


def test_a_chat_turn_with_no_steps_succeeds(support_runtime: Runtime) -> None:
    """A plan with no steps is a direct answer: the chat turn SUCCEEDS, through policy, calling nothing."""
    done = support_runtime.runs.create_run({"task": "Hi, what can you do?", "user_id": "alice"})
    assert done.state == "SUCCEEDED" and done.answer and "look up orders" in done.answer
    assert list(done.path) == ["CREATED", "PREPARING", "PLANNING", "POLICY_CHECK", "EXECUTING", "TRACING",
                               "SUCCEEDED"]
    kinds = trace_kinds(support_runtime, done.run_id)
    assert kinds["tool"] == 0 and kinds["policy"] == 1
    (policy,) = [r.data() for r in support_runtime.store.trace_of(done.run_id) if r.kind == "policy"]
    assert "structural.direct_answer" in {v["rule_id"] for v in policy_verdicts(policy)}
    assert_audit_clean(support_runtime)


def test_a_plan_with_no_steps_and_no_answer_fails_naming_it(rounds_runtime: Runtime) -> None:
    """An empty plan that answers nothing is an invalid plan, and the error says what is missing."""
    done = rounds_runtime.runs.create_run({"task": "nothing", **TESTER})
    assert done.state == "CLOSED_FAILED" and "direct answer" in (done.error or "")


def test_the_model_sees_filtered_results_and_later_rounds_read_earlier_outputs(
        rounds_runtime: Runtime, recording: Recording, call_log: Path) -> None:
    """Round 2's plan comes from round 1's results, which reach the model (and the Run's result) with the
    secret a skill returned filtered out; a later step reads an earlier round's output; the answer call is
    secret-filtered too."""
    done = rounds_runtime.runs.create_run({"task": "rounds hello", **TESTER})
    assert done.state == "SUCCEEDED", done.error
    assert done.answer == "round 1 said hello; round 2 saw hello and hello"
    assert [(c["step"], c["key"]) for c in _calls(call_log)] == [
        ("first", f"{done.run_id}:first"), ("second", f"{done.run_id}:second")]
    second_plan, answer = [r for r in recording.requests if r.purpose != "plan" or
                           any("Results of round" in m.content for m in r.messages)]
    for request in (second_plan, answer):
        seen = request.system + "".join(m.content for m in request.messages)
        assert "hello" in seen and SECRET not in seen and "[REDACTED" in seen
    assert done.artifacts["a"]["token"] == "[REDACTED:github_token]"  # filtered before it was recorded
    # what the model was sent is recorded (by hash, for replay) without the secret either
    rounds_runtime.store.drain_all()
    llm = [r.data() for r in rounds_runtime.store.trace_of(done.run_id) if r.kind == "llm"]
    texts = BlobStore(rounds_runtime.store.engine).raw([r["request_hash"] for r in llm])
    assert len(texts) == 3 and all(SECRET not in t for t in texts.values())
    assert_audit_clean(rounds_runtime)


def test_max_rounds_refuses_another_round_before_it_runs(tmp_path: Path, clock: FakeClock, call_log: Path) -> None:
    """A plan asking for a round past max_rounds is rejected by a traced policy verdict: its steps never run."""
    rt = _runtime(tmp_path, clock, max_rounds=2)
    try:
        done = rt.runs.create_run({"task": "endless", **TESTER})
        assert list(done.path) == [*TWO_ROUNDS, "REJECTED", "TRACING", "CLOSED_REJECTED"]
        assert "budget.rounds" in (done.error or "")
        assert [c["step"] for c in _calls(call_log)] == ["one"]
        assert_audit_clean(rt)
    finally:
        rt.close()


def test_each_round_is_held_to_the_budget_with_what_earlier_rounds_spent(rounds_runtime: Runtime,
                                                                         call_log: Path) -> None:
    """Round 2's plan is checked against the budget with everything the Run spent so far: over it, the
    round is rejected before its step runs."""
    done = rounds_runtime.runs.create_run({"task": "pricey", **TESTER})
    assert list(done.path) == [*TWO_ROUNDS, "REJECTED", "TRACING", "CLOSED_REJECTED"]
    assert "budget.per_user" in (done.error or "")
    assert [c["step"] for c in _calls(call_log)] == ["cheap"]
    policies = [r.data() for r in rounds_runtime.store.trace_of(done.run_id) if r.kind == "policy"]
    assert [p["decision"] for p in policies] == ["pass", "reject"]


def test_the_max_rounds_setting_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """HARNESS_MAX_ROUNDS sets the bound; a value that is not a positive number is refused by name."""
    monkeypatch.setenv("HARNESS_MAX_ROUNDS", "7")
    assert Settings.from_env().max_rounds == 7
    monkeypatch.setenv("HARNESS_MAX_ROUNDS", "0")
    with pytest.raises(Exception, match="max_rounds"):
        Settings.from_env()


def test_a_later_round_may_not_reuse_a_step_id(rounds_runtime: Runtime, call_log: Path) -> None:
    """Every step of a Run keeps its own id (and idempotency key): a round reusing one fails, saying why."""
    done = rounds_runtime.runs.create_run({"task": "reuse", **TESTER})
    assert done.state == "CLOSED_FAILED" and "used in an earlier round" in (done.error or "")
    assert [c["step"] for c in _calls(call_log)] == ["one"]


def test_a_completed_round_is_not_repeated_after_a_crash(tmp_path: Path, clock: FakeClock, call_log: Path) -> None:
    """A worker that dies while the model plans round 2 leaves round 1 recorded: the Run resumed in a new
    runtime plans round 2 again but never re-runs round 1's (non-idempotent) step."""
    crashing = Recording(ScriptedProvider.from_file(FIXTURES / "llm_rules.yaml"), crash_on_plan=2)
    rt = _runtime(tmp_path, clock, crashing)
    run, _ = rt.runs.submit({"task": "rounds again", **TESTER})
    with pytest.raises(_WorkerDied):
        rt.runs.drive(run.run_id)
    assert rt.store.state_of(run.run_id) == RunState.PLANNING
    rt.close()
    clock.advance(120)  # the dead driver's lease expires
    again = _runtime(tmp_path, clock)
    try:
        done = again.runs.drive(run.run_id)
        assert done.state == "SUCCEEDED", done.error
        assert [c["step"] for c in _calls(call_log)] == ["first", "second"]
        assert done.answer == "round 1 said again; round 2 saw again and again"
        assert_audit_clean(again)
    finally:
        again.close()
