"""One compact PolicyTrace per plan evaluation, and one reader for it and for the older shapes (every verdict
listed; one verdict per record)."""

from __future__ import annotations

import io

from rich.console import Console

from harness.cli.runs import trace_tree
from harness.config import Runtime
from harness.domain.contracts import CallerIdentity
from harness.domain.plans import Plan, PlanStep, ToolCall
from harness.domain.traces import PolicyVerdict, policy_passed, policy_trace, policy_verdicts, simply_passes
from harness.pipeline.gatekeeper import PolicyEngine
from harness.policy.cedar import CedarPermissions

CEDAR = 'permit(principal, action == Action::"call", resource);'
TESS = CallerIdentity(tenant_id="t1", user_id="tess", roles=("tester",))
#: a policy record as databases written before one-trace-per-evaluation hold it
OLD_RECORD = {"run_id": "r1", "rule_id": "guardrail.no_forbidden_words", "family": "guardrail",
              "decision": "reject", "reason": "text contains DROP TABLE", "step_id": "a", "level": None,
              "duration_us": 12.5}


def echo_plan(*texts: str) -> Plan:
    """A plan of test.echo calls, one step per text."""
    return Plan(steps=tuple(PlanStep(id=f"s{i}", tool_call=ToolCall(skill="test.echo", arguments={"text": text}),
                                     output_key=f"o{i}") for i, text in enumerate(texts)))


def verdicts_of_an_l2_plan() -> tuple[PolicyVerdict, ...]:
    return (PolicyVerdict(rule_id="structural.arguments", family="structural", decision="pass", reason="fits",
                          step_id="a"),
            PolicyVerdict(rule_id="budget.per_run", family="budget", decision="pass", reason="within cap"),
            PolicyVerdict(rule_id="risk.routing", family="risk", decision="await_hitl", reason="project write",
                          step_id="a", level="L2"))


def test_a_policy_trace_lists_what_did_not_simply_pass_and_counts_the_rest() -> None:
    """The compact PolicyTrace (trace format 2): the rule set by hash, the verdict that asks for approval
    listed with every field it has, the two passes counted."""
    trace = policy_trace("r1", "await_hitl", "L2", verdicts_of_an_l2_plan(), "ab" * 32, duration_us=40.0)
    payload = trace.to_record().payload
    assert payload == {"v": 2, "decision": "await_hitl", "level": "L2", "rules": "ab" * 32, "passed": 2,
                       "duration_us": 40.0, "run_id": "r1",
                       "verdicts": [{"rule_id": "risk.routing", "family": "risk", "decision": "await_hitl",
                                     "reason": "project write", "step_id": "a", "level": "L2"}]}
    assert policy_verdicts(payload) == [trace.verdicts[0].model_dump()]
    assert policy_passed(payload) == 2


def test_a_pass_at_a_higher_level_or_a_reject_is_listed() -> None:
    """Only a pass that asks for no approval is counted: a pass routed above L1 is listed, as is a reject."""
    assert simply_passes("permission.cedar", "pass", None) and simply_passes("risk.routing", "pass", "L1")
    assert not simply_passes("risk.routing", "pass", "L3") and not simply_passes("budget.per_run", "reject", None)
    assert not simply_passes("risk.routing", "await_hitl", "L2")


def test_a_situational_rule_is_listed_even_when_it_passes() -> None:
    """A model with no price allowed with a warning, a child Run within its delegation budget, a direct
    answer: each is listed although it passed, so the trace still says it happened."""
    for rule in ("budget.unpriced_model", "budget.delegation", "structural.direct_answer", "budget.rounds"):
        assert not simply_passes(rule, "pass", None), rule
    warned = PolicyVerdict(rule_id="budget.unpriced_model", family="budget", decision="pass",
                           reason="no price for m: allowed with a warning by policy")
    trace = policy_trace("r1", "pass", "L1", (warned, *verdicts_of_an_l2_plan()[:2]), "ef" * 32)
    assert trace.verdicts == (warned,) and trace.passed == 2


def test_policy_verdicts_reads_a_format_1_trace_with_every_verdict() -> None:
    """A PolicyTrace written before format 2 listed every verdict and counted none: all come back, with
    every field (None where left out), and no pass count."""
    payload = {"decision": "await_hitl", "level": "L2", "duration_us": 40.0,
               "verdicts": [{k: v for k, v in verdict.model_dump().items() if v is not None}
                            for verdict in verdicts_of_an_l2_plan()]}
    assert policy_verdicts(payload) == [v.model_dump() for v in verdicts_of_an_l2_plan()]
    assert policy_passed(payload) is None


def test_policy_verdicts_reads_the_old_one_verdict_per_record_shape() -> None:
    """A policy record of an older database is one verdict, with its run id and timing left out."""
    assert policy_verdicts(OLD_RECORD) == [{"rule_id": "guardrail.no_forbidden_words", "family": "guardrail",
                                            "decision": "reject", "reason": "text contains DROP TABLE",
                                            "step_id": "a", "level": None}]


def test_a_rejected_plan_has_one_trace_naming_the_rejecting_rule(test_runtime: Runtime) -> None:
    """An evaluation yields exactly one PolicyTrace: decision reject, the guardrail's reject listed, every
    verdict of the decision either listed or counted, under the engine's rule set."""
    evaluation = test_runtime.policy.evaluate(echo_plan("hello", "DROP TABLE users"), TESS, "run-1")
    (trace,) = evaluation.traces
    assert trace.run_id == "run-1" and trace.decision == "reject" == evaluation.decision.decision
    assert trace.level == evaluation.decision.level and trace.duration_us > 0
    assert trace.rules == test_runtime.policy.rules_hash
    flagged = [v.model_dump() for v in evaluation.decision.verdicts
               if not simply_passes(v.rule_id, v.decision, v.level)]
    assert [v.model_dump() for v in trace.verdicts] == flagged
    assert trace.passed == len(evaluation.decision.verdicts) - len(flagged) > 0
    rejecting = [(v.rule_id, v.step_id) for v in trace.verdicts if v.decision == "reject"]
    assert rejecting == [("guardrail.no_forbidden_words", "s1")]
    assert {v.rule_id for v in evaluation.decision.verdicts} >= {
        "structural.arguments", "permission.cedar", "risk.routing", "guardrail.no_forbidden_words", "budget.per_run"}


def test_a_passing_plan_has_one_trace_too(test_runtime: Runtime) -> None:
    """A plan that passes is one PolicyTrace as well, listing nothing: the decision still holds a verdict of
    every rule for every step, and the trace counts them all."""
    evaluation = test_runtime.policy.evaluate(echo_plan("hello", "world"), TESS, "run-2")
    (trace,) = evaluation.traces
    assert trace.decision == "pass" and trace.level == "L1" and trace.verdicts == ()
    per_step = {(v.step_id, v.rule_id) for v in evaluation.decision.verdicts if v.step_id}
    for step in ("s0", "s1"):
        assert {(step, rule) for rule in ("structural.arguments", "permission.cedar",
                                          "guardrail.no_forbidden_words", "risk.routing")} <= per_step
    assert trace.passed == len(evaluation.decision.verdicts)


def test_the_rule_set_hash_names_the_cedar_policies(test_runtime: Runtime) -> None:
    """Two engines over the same policy file and Cedar text name the same rule set; other Cedar text, another."""
    engine = test_runtime.policy
    same = PolicyEngine(engine.policy, CedarPermissions(CEDAR), engine.registry)
    again = PolicyEngine(engine.policy, CedarPermissions(CEDAR), engine.registry)
    other = PolicyEngine(engine.policy, CedarPermissions(CEDAR + "\nforbid(principal, action, resource);"),
                         engine.registry)
    assert same.rules_hash == again.rules_hash != other.rules_hash
    assert len(same.rules_hash) == 64


def test_the_argument_schema_is_compiled_once_per_manifest(test_runtime: Runtime) -> None:
    """Evaluating many steps of one skill compiles its argument schema once."""
    engine = test_runtime.policy
    for _ in range(3):
        engine.evaluate(echo_plan("a", "b", "c"), TESS, "run-3")
    skill = test_runtime.registry.get("test.echo")
    assert skill is not None and list(engine._validators) == [(skill.id, skill.manifest_hash)]
    assert engine._validator(skill) is engine._validator(skill)


def test_trace_tree_prints_one_line_per_verdict_of_every_shape() -> None:
    """`harness trace` prints every verdict a PolicyTrace lists and the count of the passes it does not,
    every verdict of a format-1 trace, and the verdict of an old one-verdict record."""
    new = policy_trace("r1", "reject", "L1", (
        PolicyVerdict(rule_id="permission.cedar", family="permission", decision="pass", reason="may call"),
        PolicyVerdict(rule_id="budget.per_run", family="budget", decision="reject", reason="over cap"),
    ), "cd" * 32).to_record().payload
    format_1 = {"decision": "pass", "level": "L1", "verdicts": [
        {"rule_id": "structural.arguments", "family": "structural", "decision": "pass", "reason": "fits"}]}
    records = [{"seq": 1, "kind": "policy", "hash": "h1", **new},
               {"seq": 2, "kind": "policy", "hash": "h2", **format_1},
               {"seq": 3, "kind": "policy", "hash": "h3", **OLD_RECORD}]
    out = io.StringIO()
    Console(file=out, width=200).print(trace_tree("r1", "CLOSED_REJECTED", records))
    lines = [line for line in out.getvalue().splitlines() if "policy" in line and "Policy" not in line]
    assert len(lines) == 4, lines
    assert "policy budget.per_run: reject — over cap" in lines[0]
    assert "policy: 1 more rule verdict passed" in lines[1]
    assert "policy structural.arguments: pass — fits" in lines[2]
    assert "policy guardrail.no_forbidden_words: reject — text contains DROP TABLE" in lines[3]
