"""The pure RunState kernel: states, the transition table and closing rules. No I/O."""

from harness.kernel.events import FINAL_EVENT, audit_events_for
from harness.kernel.projection import JobStatus, job_status
from harness.kernel.states import FINAL, NON_FINAL, NOTHING_TO_DRIVE, TRANSIENT, CloseReason, Phase, RunState, is_final
from harness.kernel.transitions import (
    LEGAL,
    TABLE,
    Edge,
    automatic_next,
    close_reason_on_entry,
    exit_reasons,
    final_state_for,
    is_legal,
    keeps_close_reason,
    targets_from,
)

__all__ = [
    "FINAL",
    "FINAL_EVENT",
    "LEGAL",
    "NON_FINAL",
    "NOTHING_TO_DRIVE",
    "TABLE",
    "TRANSIENT",
    "CloseReason",
    "Edge",
    "JobStatus",
    "Phase",
    "RunState",
    "audit_events_for",
    "automatic_next",
    "close_reason_on_entry",
    "exit_reasons",
    "final_state_for",
    "is_final",
    "is_legal",
    "job_status",
    "keeps_close_reason",
    "targets_from",
]
