"""Approval values (SPEC G2-G6): a request as stored, and the collision of two approvals by one person."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from harness.domain.errors import StoreError

#: the approval levels a request can be at (harness.policy.config.Level)
Level = Literal["L1", "L2", "L3", "L4"]


@dataclass(frozen=True)
class HitlRequest:
    """An approval request as stored."""

    request_id: str
    run_id: str
    tenant_id: str
    requester: str
    level: Level
    required_approvals: int
    approver_roles: tuple[str, ...]
    actions: list[dict[str, Any]]
    actions_hash: str
    status: str
    created_at: float
    deadline_at: float


class ApprovalConflictError(StoreError):
    """A write of a decision's transaction collided with a stored row (the same person's approval, written
    by a decider that skipped the row locks); the transaction changed nothing."""
