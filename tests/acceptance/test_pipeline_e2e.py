"""End-to-end Runs through the public library API on the embedded default (issue 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.config import Runtime
from harness.domain.chain import content_hash
from harness.domain.errors import ContextError, InvalidRequestError
from harness.domain.traces import policy_verdicts

from .checks import assert_audit_clean, step_traces, trace_kinds

MAIN = ["CREATED", "PREPARING", "PLANNING", "POLICY_CHECK"]
TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


def calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_success_path_and_trace(support_runtime: Runtime) -> None:
    """A read-only request succeeds through every main state and leaves one StepTrace per step."""
    result = support_runtime.runs.create_run({"task": "Where is order A-1001?", "user_id": "alice"})
    assert list(result.path) == [*MAIN, "EXECUTING", "TRACING", "SUCCEEDED"]
    assert result.answer == "Order A-1001 is shipped (carrier: DHL)."
    assert result.artifacts["order"]["order_id"] == "A-1001"
    kinds = trace_kinds(support_runtime, result.run_id)
    assert kinds["transition"] == 7
    assert "step" not in kinds  # each StepTrace rides in the transition that ends its step
    steps = step_traces(support_runtime, result.run_id)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6, 8]  # no HITL step
    assert all(s["status"] == "ok" and len(s["input_hash"]) == len(s["output_hash"]) == 64 for s in steps)
    assert kinds["tool"] == 2 and kinds["run"] == 1 and kinds["cost"] == 1
    assert kinds["policy"] == 1  # one PolicyTrace carries every rule's verdict
    assert support_runtime.store.legacy_job(result.run_id) == ("done", "SUCCEEDED")
    assert_audit_clean(support_runtime)


def test_policy_rejection(support_runtime: Runtime, tmp_path: Path) -> None:
    """A refund over the guardrail cap is REJECTED before any side effect and closes CLOSED_REJECTED."""
    result = support_runtime.runs.create_run({"task": "Refund 900 EUR for order A-1002", "user_id": "alice"})
    assert list(result.path) == [*MAIN, "REJECTED", "TRACING", "CLOSED_REJECTED"]
    assert "guardrail.refund_cap" in (result.error or "")
    kinds = trace_kinds(support_runtime, result.run_id)
    assert kinds["tool"] == 0 and kinds["policy"] == 1
    (policy,) = [r.data() for r in support_runtime.store.trace_of(result.run_id) if r.kind == "policy"]
    assert policy["decision"] == "reject"
    verdicts = policy_verdicts(policy)
    assert all(v["rule_id"] and v["decision"] in ("pass", "reject", "await_hitl") and v["reason"] for v in verdicts)
    # the rules that passed (structural, permission, risk routing, budgets) are counted, not listed
    assert policy["passed"] >= 4 and len(policy["rules"]) == 64
    rejecting = [v for v in verdicts if v["decision"] == "reject"]
    assert [v["rule_id"] for v in rejecting] == ["guardrail.refund_cap"] and rejecting[0]["reason"]
    assert not (tmp_path / "ledger.jsonl").exists()
    assert support_runtime.store.legacy_job(result.run_id) == ("failed", "CLOSED_REJECTED")
    assert_audit_clean(support_runtime)


def test_invalid_plan_from_model_fails_cleanly(test_runtime: Runtime) -> None:
    """Prose, a malformed plan or an unknown skill from the model is FAILED with the reason traced."""
    for task, needle in (("prose", "not a JSON plan"), ("bad shape", "invalid at"),
                         ("unknown skill", "not a known skill")):
        result = test_runtime.runs.create_run({"task": task, **TESTER})
        assert list(result.path) == ["CREATED", "PREPARING", "PLANNING", "FAILED", "TRACING", "CLOSED_FAILED"]
        assert needle in (result.error or "")
        test_runtime.store.drain_all()
        errors = [r.data() for r in test_runtime.store.trace_of(result.run_id) if r.kind == "error"]
        assert errors and errors[0]["error_code"] == "invalid_plan"
    assert_audit_clean(test_runtime)


def test_skill_failure_stops_dependents(test_runtime: Runtime, call_log: Path) -> None:
    """A failing skill fails the Run with ToolTrace and ErrorTrace; the step after it never runs."""
    result = test_runtime.runs.create_run({"task": "fail", **TESTER})
    assert list(result.path) == [*MAIN, "EXECUTING", "FAILED", "TRACING", "CLOSED_FAILED"]
    assert "this skill always fails" in (result.error or "")
    assert [c["step"] for c in calls(call_log)] == ["a", "b"]
    kinds = trace_kinds(test_runtime, result.run_id)
    assert kinds["tool"] == 2 and kinds["error"] >= 2
    assert_audit_clean(test_runtime)


def test_over_budget_context_fails_in_preparing(test_runtime: Runtime) -> None:
    """A task that cannot fit the token budget fails in PREPARING, before any model call."""
    result = test_runtime.runs.create_run({"task": "echo " + "x" * 4000, "token_budget": 256, **TESTER})
    assert list(result.path) == ["CREATED", "PREPARING", "FAILED", "TRACING", "CLOSED_FAILED"]
    assert "budget" in (result.error or "")
    assert trace_kinds(test_runtime, result.run_id)["cost"] == 0
    assert_audit_clean(test_runtime)


def test_the_assembled_context_is_kept_by_hash_once_the_plan_is_made(support_runtime: Runtime) -> None:
    """After planning, the Run row no longer carries the assembled context; `assembled_context` reads it back,
    verified, from the recorded plan request, the same context the model was given."""
    result = support_runtime.runs.create_run({"task": "Where is order A-1001?", "user_id": "alice"})
    context = support_runtime.store.get_run(result.run_id).context or {}
    assert "context" not in context and context["plan_request_hash"]
    assembled = support_runtime.runs.assembled_context(result.run_id)
    assert assembled.user_input == "Where is order A-1001?" and assembled.tokens_used > 0
    support_runtime.store.drain_all()
    step = next(s for s in step_traces(support_runtime, result.run_id) if s["name"] == "assemble_context")
    assert step["output_hash"] == content_hash(assembled.model_dump(mode="json"))


def test_a_run_that_failed_assembling_has_no_assembled_context(test_runtime: Runtime) -> None:
    """A Run refused in PREPARING never had a context: asking for it is a clear error, not a crash."""
    result = test_runtime.runs.create_run({"task": "echo " + "x" * 4000, "token_budget": 256, **TESTER})
    with pytest.raises(ContextError, match="no recorded assembled context"):
        test_runtime.runs.assembled_context(result.run_id)


def test_independent_steps_run_concurrently(test_runtime: Runtime, call_log: Path) -> None:
    """Two steps with no dependency between them overlap in time; their dependent waits for both."""
    result = test_runtime.runs.create_run({"task": "parallel", **TESTER})
    assert result.state == "SUCCEEDED", result.error
    assert result.answer == "a+b"
    slow = {c["step"]: c for c in calls(call_log) if c["skill"] == "test.slow"}
    assert slow["a"]["start"] < slow["b"]["end"] and slow["b"]["start"] < slow["a"]["end"]
    assert_audit_clean(test_runtime)


def test_invalid_dag_falls_back_to_listed_order(test_runtime: Runtime, call_log: Path) -> None:
    """A cyclic plan is flattened to its listed order, and the fallback is traced and audited."""
    result = test_runtime.runs.create_run({"task": "cyclic", **TESTER})
    assert result.state == "SUCCEEDED", result.error
    assert [c["step"] for c in calls(call_log)] == ["a", "b"]
    test_runtime.store.drain_all()
    steps = step_traces(test_runtime, result.run_id)
    assert any("flattened" in s["detail"] and "cycle" in s["detail"] for s in steps)
    assert [e.event for e in test_runtime.store.audit_events(run_id=result.run_id, event="plan_flattened")]
    assert_audit_clean(test_runtime)


@pytest.mark.parametrize("bad", [
    {},
    {"task": ""},
    {"task": "   "},
    {"task": "x", "tenant_id": "bad tenant!"},
    {"task": "x", "token_budget": -1},
    {"task": "x", "unexpected": 1},
    {"task": 42},
])
def test_malformed_requests_are_refused_with_the_field_named(test_runtime: Runtime, bad: dict[str, object]) -> None:
    """A malformed request raises InvalidRequestError naming the field, and creates no Run."""
    with pytest.raises(InvalidRequestError, match="invalid run request"):
        test_runtime.runs.create_run(bad)
    assert test_runtime.store.list_runs() == []


def test_idempotent_submit_returns_the_same_run(test_runtime: Runtime, call_log: Path) -> None:
    """A repeated submit with the same idempotency key returns the existing Run and runs nothing twice."""
    first = test_runtime.runs.create_run({"task": "echo hi", "idempotency_key": "k-1", **TESTER})
    again = test_runtime.runs.create_run({"task": "echo hi", "idempotency_key": "k-1", **TESTER})
    assert again.run_id == first.run_id and again.state == "SUCCEEDED"
    assert len(calls(call_log)) == 1


def test_llm_errors_are_classified(test_runtime: Runtime) -> None:
    """A retryable provider error is retried and then fails the Run; an auth error fails at once."""
    down = test_runtime.runs.create_run({"task": "llm down", **TESTER})
    auth = test_runtime.runs.create_run({"task": "llm auth", **TESTER})
    for result, code in ((down, "llm_server_error"), (auth, "llm_auth")):
        assert list(result.path) == ["CREATED", "PREPARING", "PLANNING", "FAILED", "TRACING", "CLOSED_FAILED"]
        assert code in (result.error or "")
    assert_audit_clean(test_runtime)


def test_permission_denied_by_cedar(test_runtime: Runtime, call_log: Path) -> None:
    """A skill outside the caller's Cedar permissions is rejected by name, and never called."""
    result = test_runtime.runs.create_run({"task": "deploy", **TESTER})
    assert list(result.path) == [*MAIN, "REJECTED", "TRACING", "CLOSED_REJECTED"]
    assert "permission.cedar" in (result.error or "")
    assert calls(call_log) == []
