"""One PolicyTrace per plan evaluation, and one reader for it and for the older one-verdict-per-record shape."""

from __future__ import annotations

import io

from rich.console import Console

from harness.cli.runs import trace_tree
from harness.config import Runtime
from harness.domain.contracts import CallerIdentity, Plan, PlanStep, ToolCall
from harness.domain.traces import PolicyTrace, PolicyVerdict, policy_verdicts

TESS = CallerIdentity(tenant_id="t1", user_id="tess", roles=("tester",))
#: a policy record as databases written before one-trace-per-evaluation hold it
OLD_RECORD = {"run_id": "r1", "rule_id": "guardrail.no_forbidden_words", "family": "guardrail",
              "decision": "reject", "reason": "text contains DROP TABLE", "step_id": "a", "level": None,
              "duration_us": 12.5}


def echo_plan(*texts: str) -> Plan:
    """A plan of test.echo calls, one step per text."""
    return Plan(steps=tuple(PlanStep(id=f"s{i}", tool_call=ToolCall(skill="test.echo", arguments={"text": text}),
                                     output_key=f"o{i}") for i, text in enumerate(texts)))


def test_policy_verdicts_reads_the_one_record_shape() -> None:
    """Every verdict of a PolicyTrace payload comes back with all six fields, None where left out."""
    trace = PolicyTrace(run_id="r1", decision="await_hitl", level="L2", duration_us=40.0, verdicts=(
        PolicyVerdict(rule_id="structural.arguments", family="structural", decision="pass", reason="fits",
                      step_id="a"),
        PolicyVerdict(rule_id="budget.per_run", family="budget", decision="pass", reason="within cap"),
        PolicyVerdict(rule_id="risk.routing", family="risk", decision="await_hitl", reason="project write",
                      step_id="a", level="L2"),
    ))
    payload = trace.to_record().payload
    assert payload["decision"] == "await_hitl" and payload["level"] == "L2" and len(payload["verdicts"]) == 3
    assert payload["verdicts"][1] == {"rule_id": "budget.per_run", "family": "budget", "decision": "pass",
                                      "reason": "within cap"}, "a verdict carries no run id and no None field"
    assert policy_verdicts(payload) == [v.model_dump() for v in trace.verdicts]


def test_policy_verdicts_reads_the_old_one_verdict_per_record_shape() -> None:
    """A policy record of an older database is one verdict, with its run id and timing left out."""
    assert policy_verdicts(OLD_RECORD) == [{"rule_id": "guardrail.no_forbidden_words", "family": "guardrail",
                                            "decision": "reject", "reason": "text contains DROP TABLE",
                                            "step_id": "a", "level": None}]


def test_a_rejected_plan_has_one_trace_naming_the_rejecting_rule(test_runtime: Runtime) -> None:
    """An evaluation yields exactly one PolicyTrace: decision reject, and the guardrail's reject among all the
    verdicts the decision was made of."""
    evaluation = test_runtime.policy.evaluate(echo_plan("hello", "DROP TABLE users"), TESS, "run-1")
    (trace,) = evaluation.traces
    assert trace.run_id == "run-1" and trace.decision == "reject" == evaluation.decision.decision
    assert trace.level == evaluation.decision.level and trace.duration_us > 0
    assert [v.model_dump() for v in trace.verdicts] == [v.model_dump() for v in evaluation.decision.verdicts]
    rejecting = [(v.rule_id, v.step_id) for v in trace.verdicts if v.decision == "reject"]
    assert rejecting == [("guardrail.no_forbidden_words", "s1")]
    assert {v.rule_id for v in trace.verdicts} >= {"structural.arguments", "permission.cedar", "risk.routing",
                                                   "guardrail.no_forbidden_words", "budget.per_run"}


def test_a_passing_plan_has_one_trace_too(test_runtime: Runtime) -> None:
    """A plan that passes is one PolicyTrace as well, with a verdict of every rule for every step."""
    evaluation = test_runtime.policy.evaluate(echo_plan("hello", "world"), TESS, "run-2")
    (trace,) = evaluation.traces
    assert trace.decision == "pass" and trace.level == "L1"
    per_step = {(v.step_id, v.rule_id) for v in trace.verdicts if v.step_id}
    for step in ("s0", "s1"):
        assert {(step, rule) for rule in ("structural.arguments", "permission.cedar",
                                          "guardrail.no_forbidden_words", "risk.routing")} <= per_step


def test_the_argument_schema_is_compiled_once_per_manifest(test_runtime: Runtime) -> None:
    """Evaluating many steps of one skill compiles its argument schema once."""
    engine = test_runtime.policy
    for _ in range(3):
        engine.evaluate(echo_plan("a", "b", "c"), TESS, "run-3")
    skill = test_runtime.registry.get("test.echo")
    assert skill is not None and list(engine._validators) == [(skill.id, skill.manifest_hash)]
    assert engine._validator(skill) is engine._validator(skill)


def test_trace_tree_prints_one_line_per_verdict_of_either_shape() -> None:
    """`harness trace` prints every verdict of a PolicyTrace, and the verdict of an old policy record."""
    new = PolicyTrace(run_id="r1", decision="reject", level="L1", verdicts=(
        PolicyVerdict(rule_id="permission.cedar", family="permission", decision="pass", reason="may call"),
        PolicyVerdict(rule_id="budget.per_run", family="budget", decision="reject", reason="over cap"),
    )).to_record().payload
    records = [{"seq": 1, "kind": "policy", "hash": "h1", **new}, {"seq": 2, "kind": "policy", "hash": "h2",
                                                                   **OLD_RECORD}]
    out = io.StringIO()
    Console(file=out, width=200).print(trace_tree("r1", "CLOSED_REJECTED", records))
    lines = [line for line in out.getvalue().splitlines() if "policy " in line]
    assert len(lines) == 3
    assert "policy permission.cedar: pass — may call" in lines[0]
    assert "policy budget.per_run: reject — over cap" in lines[1]
    assert "policy guardrail.no_forbidden_words: reject — text contains DROP TABLE" in lines[2]
