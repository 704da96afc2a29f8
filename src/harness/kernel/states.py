"""The fifteen Run states, their phases, and why a Run closes (SPEC K1, K3).

Pure data: nothing here performs I/O.
"""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    """Every state a Run can be in. A Run is in exactly one at every moment."""

    # main path
    CREATED = "CREATED"
    PREPARING = "PREPARING"
    PLANNING = "PLANNING"
    POLICY_CHECK = "POLICY_CHECK"
    AWAITING_HITL = "AWAITING_HITL"
    EXECUTING = "EXECUTING"
    # funnel
    TRACING = "TRACING"
    # transient: carry the reason for closing into TRACING
    REJECTED = "REJECTED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    # final: irreversible
    SUCCEEDED = "SUCCEEDED"
    CLOSED_REJECTED = "CLOSED_REJECTED"
    CLOSED_FAILED = "CLOSED_FAILED"
    CLOSED_CANCELLED = "CLOSED_CANCELLED"


class Phase(StrEnum):
    """The four phases of seed 000 §1.1."""

    MAIN = "main"
    FUNNEL = "funnel"
    TRANSIENT = "transient"
    FINAL = "final"


MAIN_PATH: tuple[RunState, ...] = (
    RunState.CREATED,
    RunState.PREPARING,
    RunState.PLANNING,
    RunState.POLICY_CHECK,
    RunState.AWAITING_HITL,
    RunState.EXECUTING,
)
TRANSIENT: frozenset[RunState] = frozenset(
    {RunState.REJECTED, RunState.FAILED, RunState.TIMEOUT, RunState.CANCELLED}
)
FINAL: frozenset[RunState] = frozenset(
    {RunState.SUCCEEDED, RunState.CLOSED_REJECTED, RunState.CLOSED_FAILED, RunState.CLOSED_CANCELLED}
)
NON_FINAL: frozenset[RunState] = frozenset(RunState) - FINAL
#: states with nothing for a worker to drive: final, or waiting for a human's decision
NOTHING_TO_DRIVE: frozenset[RunState] = FINAL | {RunState.AWAITING_HITL}

PHASE_OF: dict[RunState, Phase] = {
    **{s: Phase.MAIN for s in MAIN_PATH},
    RunState.TRACING: Phase.FUNNEL,
    **{s: Phase.TRANSIENT for s in TRANSIENT},
    **{s: Phase.FINAL for s in FINAL},
}


def is_final(state: RunState) -> bool:
    """True for the four irreversible states."""
    return state in FINAL


class CloseReason(StrEnum):
    """How a Run entered its closing path; decides TRACING's exit (SPEC K3)."""

    SUCCESS = "success"
    REJECTED = "rejected"
    HITL_TIMEOUT = "hitl_timeout"
    EXECUTION_TIMEOUT = "execution_timeout"
    FAILED = "failed"
    CANCELLED = "cancelled"
