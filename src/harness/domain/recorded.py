"""What a replay reads back of a recorded Run's humans: the decisions they submitted."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RecordedDecision:
    """One decision submitted on one of the Run's approval requests (accepted or refused)."""

    approver: str
    decision: str
    break_glass: bool
    reason: str
    at: float
