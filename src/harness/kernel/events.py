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

ILLEGAL_TRANSITION = "illegal_transition"
LOST_RACE = "transition_lost_race"
RUN_CREATED = "run_created"


def audit_events_for(source: RunState | None, target: RunState) -> tuple[str, ...]:
    """The audit events a successful move source→target writes in its own transaction."""
    if source is None:
        return (RUN_CREATED,)
    if target in FINAL_EVENT:
        return (FINAL_EVENT[target],)
    if target == S.REJECTED:
        return ("policy_rejected",) if source == S.POLICY_CHECK else ("hitl_rejected",)
    if target == S.TIMEOUT:
        return ("hitl_timeout",) if source == S.AWAITING_HITL else ("execution_timeout",)
    if target == S.CANCELLED:
        return ("run_cancelled",)
    if target == S.FAILED:
        return ("run_failed",)
    if target == S.AWAITING_HITL:
        return ("hitl_requested",)
    if source == S.AWAITING_HITL and target == S.EXECUTING:
        return ("hitl_approved",)
    return ()
