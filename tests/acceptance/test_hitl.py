"""Human approval through the library API: levels, timeouts, binding, break-glass, rate limits (issue 4)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.clock import FakeClock
from harness.config import Runtime
from harness.domain.contracts import CallerIdentity, RunResult

from .checks import assert_audit_clean

PARK = ["CREATED", "PREPARING", "PLANNING", "POLICY_CHECK", "AWAITING_HITL"]
DONE = [*PARK, "EXECUTING", "TRACING", "SUCCEEDED"]
TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
DEPLOYER = {"tenant_id": "t1", "user_id": "dan", "roles": ["tester", "deployer"]}


def who(user: str, *roles: str, tenant: str = "t1") -> CallerIdentity:
    return CallerIdentity(tenant_id=tenant, user_id=user, roles=roles)


def park(rt: Runtime, task: str, caller: Mapping[str, object] = TESS) -> RunResult:
    result = rt.runs.create_run({"task": task, **caller})
    assert list(result.path) == PARK, result.error
    assert result.approval_request_id
    return result


def hitl_traces(rt: Runtime, run_id: str) -> list[dict[str, object]]:
    rt.store.drain_all()
    return [r.data() for r in rt.store.trace_of(run_id) if r.kind == "hitl"]


def calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_level_1_passes_without_a_human(test_runtime: Runtime) -> None:
    """A personal low-impact write is L1 and executes without an approval request."""
    result = test_runtime.runs.create_run({"task": "echo hello", **TESS})
    assert result.state == "SUCCEEDED" and result.approval_request_id is None
    assert test_runtime.hitl.for_run(result.run_id) == []


def test_level_2_is_confirmed_by_the_requester(test_runtime: Runtime, call_log: Path) -> None:
    """An L2 request is confirmed by the requester; nothing runs before the confirmation."""
    parked = park(test_runtime, "update T-7")
    assert test_runtime.hitl.get(parked.approval_request_id or "").level == "L2"
    assert calls(call_log) == []
    verdict, result = test_runtime.runs.decide(parked.approval_request_id or "", who("tess", "tester"), "approve")
    assert verdict.accepted and list(result.path) == DONE
    assert [c["step"] for c in calls(call_log)] == ["a"]
    assert_audit_clean(test_runtime)


def test_level_3_needs_a_named_approver_not_the_requester(test_runtime: Runtime) -> None:
    """An L3 request refuses its own requester and roles without the approver role, and takes a lead."""
    parked = park(test_runtime, "purge cache")
    request_id = parked.approval_request_id or ""
    assert test_runtime.hitl.get(request_id).level == "L3"
    own, _ = test_runtime.runs.decide(request_id, who("tess", "tester", "lead"), "approve")
    assert not own.accepted and "own" in (own.refusal or "")
    no_role, _ = test_runtime.runs.decide(request_id, who("pat", "prod_approver"), "approve")
    assert not no_role.accepted and "roles" in (no_role.refusal or "")
    lead, result = test_runtime.runs.decide(request_id, who("lee", "tester", "lead"), "approve")
    assert lead.accepted and result.state == "SUCCEEDED"
    assert_audit_clean(test_runtime)


def test_level_4_needs_two_distinct_approvers(test_runtime: Runtime) -> None:
    """L4 counts one person once; the second distinct approver completes it."""
    parked = park(test_runtime, "ship prod", DEPLOYER)
    request_id = parked.approval_request_id or ""
    assert test_runtime.hitl.get(request_id).required_approvals == 2
    first, state = test_runtime.runs.decide(request_id, who("pat", "prod_approver"), "approve")
    assert first.accepted and first.effect == "recorded" and state.state == "AWAITING_HITL"
    twice, state = test_runtime.runs.decide(request_id, who("pat", "prod_approver"), "approve")
    assert not twice.accepted and "once" in (twice.refusal or "") and state.state == "AWAITING_HITL"
    second, result = test_runtime.runs.decide(request_id, who("quinn", "prod_approver"), "approve")
    assert second.accepted and result.state == "SUCCEEDED"
    assert_audit_clean(test_runtime)


def test_any_reject_is_final(test_runtime: Runtime, call_log: Path) -> None:
    """After one L4 approval, a reject closes the Run CLOSED_REJECTED and later approvals are refused."""
    parked = park(test_runtime, "ship prod", DEPLOYER)
    request_id = parked.approval_request_id or ""
    test_runtime.runs.decide(request_id, who("pat", "prod_approver"), "approve")
    rejected, result = test_runtime.runs.decide(request_id, who("quinn", "prod_approver"), "reject", reason="no")
    assert rejected.accepted and list(result.path) == [*PARK, "REJECTED", "TRACING", "CLOSED_REJECTED"]
    late, _ = test_runtime.runs.decide(request_id, who("mo", "prod_approver"), "approve")
    assert not late.accepted and "already rejected" in (late.refusal or "")
    assert calls(call_log) == []


@pytest.mark.parametrize("task,caller", [("update T-1", TESS), ("ship prod", DEPLOYER)])
def test_timeouts_are_default_deny(test_runtime: Runtime, clock: FakeClock, task: str,
                                   caller: dict[str, object]) -> None:
    """An L2 or L4 request that nobody decides closes CLOSED_REJECTED through TIMEOUT."""
    parked = park(test_runtime, task, caller)
    assert test_runtime.runs.expire_approvals() == []
    clock.advance(3601)
    assert test_runtime.runs.expire_approvals() == [parked.approval_request_id]
    result = test_runtime.runs.result(parked.run_id)
    assert list(result.path) == [*PARK, "TIMEOUT", "TRACING", "CLOSED_REJECTED"]
    assert any(t["event"] == "timeout" for t in hitl_traces(test_runtime, parked.run_id))
    assert [e.event for e in test_runtime.store.audit_events(run_id=parked.run_id, event="hitl_timeout")]
    assert_audit_clean(test_runtime)


def test_level_3_timeout_escalates_to_level_4(test_runtime: Runtime, clock: FakeClock) -> None:
    """With l3_timeout_action=escalate, an undecided L3 request becomes an L4 request on the same Run."""
    parked = park(test_runtime, "purge cache")
    clock.advance(3601)
    test_runtime.runs.expire_approvals()
    requests = test_runtime.hitl.for_run(parked.run_id)
    assert [(r.level, r.status) for r in requests] == [("L3", "escalated"), ("L4", "pending")]
    assert test_runtime.runs.result(parked.run_id).approval_request_id == requests[1].request_id
    clock.advance(3601)
    test_runtime.runs.expire_approvals()
    assert test_runtime.runs.result(parked.run_id).state == "CLOSED_REJECTED"


def test_an_escalated_request_executes_once_two_approvers_approve(test_runtime: Runtime, clock: FakeClock,
                                                                   call_log: Path) -> None:
    """An L3 request escalated to L4 on timeout, approved by two distinct approvers, executes the approved
    action once and the Run SUCCEEDS (the escalation binds the same actions as the request it replaced)."""
    parked = park(test_runtime, "purge cache")
    clock.advance(3601)
    test_runtime.runs.expire_approvals()
    escalated = test_runtime.hitl.for_run(parked.run_id)[-1]
    assert escalated.level == "L4" and escalated.status == "pending"
    first, state = test_runtime.runs.decide(escalated.request_id, who("pat", "prod_approver"), "approve")
    assert first.effect == "recorded" and state.state == "AWAITING_HITL"
    second, result = test_runtime.runs.decide(escalated.request_id, who("quinn", "prod_approver"), "approve")
    assert second.effect == "approved" and result.state == "SUCCEEDED", result.error
    assert [c["step"] for c in calls(call_log)] == ["a"]
    assert_audit_clean(test_runtime)


@pytest.mark.parametrize("status,expected", [("approved", "SUCCEEDED"), ("rejected", "CLOSED_REJECTED"),
                                             ("timed_out", "CLOSED_REJECTED"), ("escalated", "AWAITING_HITL")])
def test_a_decision_whose_run_did_not_move_is_carried_out_by_the_sweeper(
        test_runtime: Runtime, clock: FakeClock, call_log: Path, status: str, expected: str) -> None:
    """A request decided while its Run stayed in AWAITING_HITL (what an older version's crash between the two
    commits left) is counted as stuck once it has waited past the decided-approval threshold, and the sweep
    carries the decision out: approved Runs execute, rejected and timed-out ones close, an escalated one
    gets its L4 request."""
    from harness.drive.sweeper import ZombieSweeper
    from harness.stores import read_model

    parked = park(test_runtime, "purge cache" if status == "escalated" else "update T-1")
    with test_runtime.store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE hitl_requests SET status = :s, decided_at = :at WHERE request_id = :r"),
                     {"s": status, "at": clock.now(), "r": parked.approval_request_id})
    thresholds = test_runtime.settings.thresholds()
    resumed: list[str] = []
    sweeper = ZombieSweeper(test_runtime.store, test_runtime.machine, thresholds=thresholds, resume=resumed.append,
                            resume_decisions=test_runtime.runs.resume_decisions)
    assert read_model(test_runtime.store).zombie_counts(clock.now(), thresholds)["AWAITING_HITL"] == 0
    assert sweeper.sweep_once().decisions_resumed == []
    clock.advance(thresholds.decided_s + 1)
    assert read_model(test_runtime.store).zombie_counts(clock.now(), thresholds)["AWAITING_HITL"] == 1
    report = sweeper.sweep_once()
    if status == "approved":
        assert report.decisions_resumed == resumed == [parked.run_id]
        assert test_runtime.runs.drive(parked.run_id).state == expected
        assert [c["step"] for c in calls(call_log)] == ["a"]
    else:
        assert test_runtime.runs.result(parked.run_id).state == expected and calls(call_log) == []
    if status == "escalated":
        assert [r.level for r in test_runtime.hitl.for_run(parked.run_id)] == ["L3", "L4"]
    assert read_model(test_runtime.store).zombie_counts(clock.now(), thresholds)["AWAITING_HITL"] == 0
    assert test_runtime.store.audit_events(run_id=parked.run_id, event="hitl_decision_resumed")


def test_approval_after_the_timeout_is_refused_and_audited(test_runtime: Runtime, clock: FakeClock) -> None:
    """A decision that arrives after the deadline never approves and is recorded as refused."""
    parked = park(test_runtime, "update T-2")
    clock.advance(3601)
    late, result = test_runtime.runs.decide(parked.approval_request_id or "", who("tess", "tester"), "approve")
    assert not late.accepted and "deadline" in (late.refusal or "")
    assert result.state == "AWAITING_HITL"
    test_runtime.runs.expire_approvals()
    assert test_runtime.runs.result(parked.run_id).state == "CLOSED_REJECTED"
    assert test_runtime.store.audit_events(run_id=parked.run_id, event="hitl_decision_refused")


def test_break_glass_is_traced_and_still_needs_a_permitted_identity(test_runtime: Runtime, call_log: Path) -> None:
    """Break-glass needs the role and a reason, is traced, and never stands in for L4's second person."""
    parked = park(test_runtime, "ship prod", DEPLOYER)
    request_id = parked.approval_request_id or ""
    no_role, _ = test_runtime.runs.decide(request_id, who("pat", "prod_approver"), "approve", break_glass=True,
                                          reason="incident")
    assert not no_role.accepted and "break_glass" in (no_role.refusal or "")
    no_reason, _ = test_runtime.runs.decide(request_id, who("quinn", "prod_approver", "break_glass"), "approve",
                                            break_glass=True)
    assert not no_reason.accepted and "reason" in (no_reason.refusal or "")
    ok, result = test_runtime.runs.decide(request_id, who("quinn", "prod_approver", "break_glass"), "approve",
                                          break_glass=True, reason="INC-42 outage")
    assert ok.accepted and ok.effect == "recorded" and ok.approvals == 1
    assert result.state == "AWAITING_HITL" and calls(call_log) == []  # one person, however privileged
    again, _ = test_runtime.runs.decide(request_id, who("quinn", "prod_approver", "break_glass"), "approve",
                                        break_glass=True, reason="INC-42 still down")
    assert not again.accepted and "once" in (again.refusal or "")
    second, result = test_runtime.runs.decide(request_id, who("pat", "prod_approver"), "approve")
    assert second.accepted and result.state == "SUCCEEDED"
    approve = [t for t in hitl_traces(test_runtime, parked.run_id) if t["event"] == "approve"]
    assert approve[0]["break_glass"] is True and approve[0]["reason"] == "INC-42 outage"
    assert approve[1]["break_glass"] is False


def test_approval_bound_to_other_actions_is_refused(test_runtime: Runtime) -> None:
    """An approval carrying another request's actions hash (a replay for other arguments) is refused."""
    first = park(test_runtime, "update T-1")
    second = park(test_runtime, "update T-2")
    other_hash = test_runtime.hitl.get(first.approval_request_id or "").actions_hash
    replay, result = test_runtime.runs.decide(second.approval_request_id or "", who("tess", "tester"), "approve",
                                              approved_hash=other_hash)
    assert not replay.accepted and "actions hash" in (replay.refusal or "")
    assert result.state == "AWAITING_HITL"


def test_approval_claimed_in_model_output_counts_for_nothing(test_runtime: Runtime, call_log: Path) -> None:
    """A plan that says it is already approved (requires_authorization false, 'APPROVED' text) still waits."""
    parked = park(test_runtime, "sneaky")
    assert calls(call_log) == []
    assert test_runtime.hitl.get(parked.approval_request_id or "").status == "pending"


def test_other_tenant_cannot_decide(test_runtime: Runtime) -> None:
    """An identity of another tenant is refused even with every role."""
    parked = park(test_runtime, "purge cache")
    verdict, result = test_runtime.runs.decide(parked.approval_request_id or "",
                                               who("mallory", "tester", "lead", tenant="t2"), "approve")
    assert not verdict.accepted and "tenant" in (verdict.refusal or "") and result.state == "AWAITING_HITL"


def test_call_outside_the_approved_plan_is_refused(test_runtime: Runtime, call_log: Path) -> None:
    """If the persisted plan changes after approval, the changed call is refused at execution (G7)."""
    parked = park(test_runtime, "update T-3")
    store = test_runtime.store
    run = store.get_run(parked.run_id)
    context = dict(run.context or {})
    context["plan"]["steps"][0]["tool_call"]["arguments"]["ticket"] = "T-999"
    store.save_context(parked.run_id, context)
    verdict, result = test_runtime.runs.decide(parked.approval_request_id or "", who("tess", "tester"), "approve")
    assert verdict.accepted
    assert list(result.path) == [*PARK, "EXECUTING", "FAILED", "TRACING", "CLOSED_FAILED"]
    assert "not in the approved plan" in (result.error or "")
    assert calls(call_log) == []


def test_cancel_during_the_wait(test_runtime: Runtime) -> None:
    """Cancelling a parked Run closes it CLOSED_CANCELLED and closes its request; approving later is refused."""
    parked = park(test_runtime, "update T-4")
    result = test_runtime.runs.cancel(parked.run_id, by="t1/tess")
    assert list(result.path) == [*PARK, "CANCELLED", "TRACING", "CLOSED_CANCELLED"]
    assert test_runtime.hitl.get(parked.approval_request_id or "").status == "cancelled"
    late, _ = test_runtime.runs.decide(parked.approval_request_id or "", who("tess", "tester"), "approve")
    assert not late.accepted


def test_approval_requests_are_rate_limited_per_requester(test_runtime: Runtime) -> None:
    """A requester with the maximum of waiting requests gets the next Run rejected, naming the limit."""
    for i in range(3):
        park(test_runtime, f"update T-{i}")
    result = test_runtime.runs.create_run({"task": "update T-9", **TESS})
    assert result.state == "CLOSED_REJECTED" and "hitl.rate_limit" in (result.error or "")
    other = test_runtime.runs.create_run({"task": "update T-9", **{**TESS, "user_id": "tom"}})
    assert other.state == "AWAITING_HITL"


def test_budget_exhaustion_across_runs_of_one_user(test_runtime: Runtime) -> None:
    """Recorded cost accumulates per user until the user's cap stops further Runs — before the model call
    whose worst case would take the user past it, so the cap is never overshot; other users go on."""
    states = [test_runtime.runs.create_run({"task": "chatty", **{**TESS, "user_id": "spender"}}).state
              for _ in range(40)]
    assert "SUCCEEDED" in states and states[-1] == "CLOSED_FAILED"
    first_stop = states.index("CLOSED_FAILED")
    assert all(s == "CLOSED_FAILED" for s in states[first_stop:])
    rejected = test_runtime.runs.create_run({"task": "chatty", **{**TESS, "user_id": "spender"}})
    assert "budget.per_user" in (rejected.error or "") and "the call was not made" in (rejected.error or "")
    spent = test_runtime.runs.ledger.spent(tenant_id="t1", user_id="spender")
    assert 0.05 * 0.5 < spent <= 0.05  # stopped with less left than a call's worst case, never past the cap
    assert test_runtime.runs.create_run({"task": "chatty", **{**TESS, "user_id": "saver"}}).state == "SUCCEEDED"


def test_decision_is_persisted_before_it_drives_the_run(test_runtime: Runtime) -> None:
    """An accepted approval is stored even when the Run could not be resumed in this process."""
    parked = park(test_runtime, "update T-5")
    verdict, result = test_runtime.runs.decide(parked.approval_request_id or "", who("tess", "tester"), "approve",
                                               resume=False)
    assert verdict.accepted and result.state == "EXECUTING"
    with test_runtime.store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT outcome FROM hitl_decisions WHERE request_id = :r"),
                            {"r": parked.approval_request_id}).scalars().all()
    assert rows == ["accepted"]
    resumed = test_runtime.runs.drive(parked.run_id)
    assert resumed.state == "SUCCEEDED"
