"""Which AuditLog events a state change writes (SPEC A1, K8). Pure."""

from __future__ import annotations

from harness.kernel.states import RunState

S = RunState

#: the audit event each final state writes; reconcile (K8) counts these against the runs table
FINAL_EVENT: dict[RunState, str] = {
    S.SUCCEEDED: "run_succeeded",
    S.CLOSED_REJECTED: "run_closed_rejected",
    S.CLOSED_FAILED: "run_closed_failed",
    S.CLOSED_CANCELLED: "run_closed_cancelled",
}

#: the audit event of a timeout, by the state the Run timed out in
TIMEOUT_EVENT: dict[RunState, str] = {S.AWAITING_HITL: "hitl_timeout", S.PLANNING: "planning_timeout"}
#: a tool call failed (its step's ToolTrace and ErrorTrace say how)
TOOL_CALL_FAILED = "tool_call_failed"
ILLEGAL_TRANSITION = "illegal_transition"
LOST_RACE = "transition_lost_race"
RUN_CREATED = "run_created"
#: a queued Run (CREATED, never started) handed back to a driver by the sweeper: waiting, not stuck
RUN_REQUEUED = "run_requeued"
#: a queued Run closed because its start deadline passed before any driver started it
RUN_NOT_STARTED = "run_not_started"
#: a driver took a Run's lease over from another whose lease had lapsed (dead, stopped or cut off): both named
LEASE_TAKEN_OVER = "lease_taken_over"


def audit_events_for(source: RunState | None, target: RunState) -> tuple[str, ...]:
    """The audit events a successful move source→target writes in its own transaction."""
    if source is None:
        return (RUN_CREATED,)
    if target in FINAL_EVENT:
        return (FINAL_EVENT[target],)
    if target == S.REJECTED:
        return ("policy_rejected",) if source == S.POLICY_CHECK else ("hitl_rejected",)
    if target == S.TIMEOUT:
        return (TIMEOUT_EVENT.get(source, "execution_timeout"),)
    if target == S.CANCELLED:
        return ("run_cancelled",)
    if target == S.FAILED:
        return ("run_failed",)
    if target == S.AWAITING_HITL:
        return ("hitl_requested",)
    if source == S.AWAITING_HITL and target == S.EXECUTING:
        return ("hitl_approved",)
    return ()
