"""What the change feed and the run lists carry: committed state changes and listed Runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Change:
    """One committed state change, with its position in the change feed (transitions.id)."""

    cursor: int
    run_id: str
    seq: int
    from_state: str | None
    to_state: str
    actor: str
    reason: str
    at: float


@dataclass(frozen=True)
class RunRow:
    """What a run list shows."""

    run_id: str
    tenant_id: str
    user_id: str
    state: str
    task: str
    created_at: float
    last_state_change_at: float
    legacy_status: str
