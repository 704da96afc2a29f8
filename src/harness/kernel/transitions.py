"""The transition table (SPEC K2) and the closing rule (SPEC K3), as data and pure functions."""

from __future__ import annotations

from dataclasses import dataclass

from harness.kernel.states import TRANSIENT, CloseReason, RunState

S = RunState


@dataclass(frozen=True, slots=True)
class Edge:
    """One legal transition, with the component that triggers it and its guard (seed 000 §3.1)."""

    source: RunState
    target: RunState
    trigger: str
    guard: str


TABLE: tuple[Edge, ...] = (
    Edge(S.CREATED, S.PREPARING, "run_manager", "RunRequest complete"),
    Edge(S.PREPARING, S.PLANNING, "context_assembler", "recall ok, skills loaded, within token budget"),
    Edge(S.PREPARING, S.FAILED, "context_assembler", "recall error, over budget, cross-tenant blocked"),
    Edge(S.PLANNING, S.POLICY_CHECK, "plan_orchestrator", "LLM returned a valid plan"),
    Edge(S.PLANNING, S.FAILED, "plan_orchestrator", "LLM retries exhausted or plan invalid"),
    Edge(S.PLANNING, S.TIMEOUT, "plan_orchestrator", "LLM call exceeded the step timeout"),
    Edge(S.POLICY_CHECK, S.EXECUTING, "gatekeeper", "every call passes automatically"),
    Edge(S.POLICY_CHECK, S.AWAITING_HITL, "gatekeeper", "a call needs a human; request issued"),
    Edge(S.POLICY_CHECK, S.REJECTED, "gatekeeper", "blocked, over budget, or not permitted"),
    Edge(S.AWAITING_HITL, S.EXECUTING, "gatekeeper", "approved"),
    Edge(S.AWAITING_HITL, S.REJECTED, "gatekeeper", "rejected by an approver"),
    Edge(S.AWAITING_HITL, S.TIMEOUT, "gatekeeper", "no decision before the deadline (default-deny)"),
    Edge(S.AWAITING_HITL, S.CANCELLED, "caller", "cancelled by the user"),
    Edge(S.EXECUTING, S.TRACING, "tool_controller", "every step succeeded"),
    Edge(S.EXECUTING, S.FAILED, "tool_controller", "tool or LLM error, retries exhausted"),
    Edge(S.EXECUTING, S.TIMEOUT, "tool_controller", "step or total execution limit exceeded"),
    Edge(S.EXECUTING, S.CANCELLED, "caller", "cancelled by the user"),
    Edge(S.REJECTED, S.TRACING, "kernel", "forced funnel"),
    Edge(S.FAILED, S.TRACING, "kernel", "forced funnel"),
    Edge(S.TIMEOUT, S.TRACING, "kernel", "forced funnel"),
    Edge(S.CANCELLED, S.TRACING, "kernel", "forced funnel"),
    Edge(S.TRACING, S.SUCCEEDED, "trace_recorder", "entered from EXECUTING success"),
    Edge(S.TRACING, S.CLOSED_REJECTED, "trace_recorder", "entered from REJECTED or HITL TIMEOUT"),
    Edge(S.TRACING, S.CLOSED_FAILED, "trace_recorder", "entered from FAILED or execution TIMEOUT"),
    Edge(S.TRACING, S.CLOSED_CANCELLED, "trace_recorder", "entered from CANCELLED"),
    # documented extensions (SPEC K2): sweeper-forced
    # a Run in CREATED has not started: it is queued, not stuck, and only its start deadline closes it (by
    # the driver that finds it late, or the sweeper). Runs an older sweeper closed here keep their record.
    Edge(S.CREATED, S.FAILED, "start_deadline", "not started by its start deadline"),
    Edge(S.POLICY_CHECK, S.FAILED, "zombie_sweeper", "stuck in POLICY_CHECK past its threshold"),
    Edge(S.TRACING, S.FAILED, "zombie_sweeper", "trace write stuck past its threshold"),
    # documented extensions (SPEC K2): user cancel before execution
    Edge(S.PREPARING, S.CANCELLED, "caller", "cancelled by the user"),
    Edge(S.PLANNING, S.CANCELLED, "caller", "cancelled by the user"),
    Edge(S.POLICY_CHECK, S.CANCELLED, "caller", "cancelled by the user"),
    # documented extension (SPEC K2, rounds): the model sees a round's results and plans the next one
    Edge(S.EXECUTING, S.PLANNING, "run_manager", "a round succeeded and its plan asks for another round"),
)

LEGAL: frozenset[tuple[RunState, RunState]] = frozenset((e.source, e.target) for e in TABLE)


def is_legal(source: RunState, target: RunState) -> bool:
    """True when (source, target) is in the whitelist."""
    return (source, target) in LEGAL


def targets_from(source: RunState) -> frozenset[RunState]:
    """Every state a Run in `source` may move to."""
    return frozenset(t for s, t in LEGAL if s == source)


def close_reason_on_entry(
    source: RunState, target: RunState, prior: CloseReason | None
) -> CloseReason | None:
    """The close reason a Run carries after moving source→target.

    It is set when the Run leaves the main path and never changed afterwards, except that
    TRACING→FAILED (sweeper: the trace write itself got stuck) turns it into FAILED.
    """
    if target == S.TIMEOUT:
        return CloseReason.HITL_TIMEOUT if source == S.AWAITING_HITL else CloseReason.EXECUTION_TIMEOUT
    reason_for_transient = {
        S.REJECTED: CloseReason.REJECTED,
        S.FAILED: CloseReason.FAILED,
        S.CANCELLED: CloseReason.CANCELLED,
    }
    if target in reason_for_transient:
        return reason_for_transient[target]
    if source == S.EXECUTING and target == S.TRACING:
        return CloseReason.SUCCESS
    return prior


def keeps_close_reason(source: RunState, target: RunState) -> bool:
    """Whether moving source→target leaves the Run's close reason as it was (whatever it was)."""
    return source != S.TRACING and close_reason_on_entry(source, target, None) is None


_FINAL_FOR: dict[CloseReason, RunState] = {
    CloseReason.SUCCESS: S.SUCCEEDED,
    CloseReason.REJECTED: S.CLOSED_REJECTED,
    CloseReason.HITL_TIMEOUT: S.CLOSED_REJECTED,
    CloseReason.EXECUTION_TIMEOUT: S.CLOSED_FAILED,
    CloseReason.FAILED: S.CLOSED_FAILED,
    CloseReason.CANCELLED: S.CLOSED_CANCELLED,
}


def final_state_for(reason: CloseReason) -> RunState:
    """TRACING's exit, decided by the close reason alone (SPEC K3)."""
    return _FINAL_FOR[reason]


def exit_reasons(target: RunState) -> tuple[CloseReason, ...]:
    """The close reasons under which TRACING may exit to the final state `target` (SPEC K3), in a fixed
    order; TRACING→FAILED (the sweeper's way out of a stuck close) takes any."""
    return tuple(reason for reason, final in _FINAL_FOR.items() if final == target)


def automatic_next(state: RunState, reason: CloseReason | None) -> RunState | None:
    """The state the kernel moves to on its own from `state`, or None when it waits for a component.

    Transient states funnel into TRACING; TRACING exits to the final state its close reason names.
    """
    if state in TRANSIENT:
        return S.TRACING
    if state == S.TRACING:
        if reason is None:
            raise ValueError("a Run in TRACING must carry a close reason")
        return final_state_for(reason)
    return None


