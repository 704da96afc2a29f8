"""Approval values (SPEC G2-G6): a request as stored, and the collision of two approvals by one person."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def parent_runs_of(requests: Sequence[HitlRequest],
                   parents_of_runs: Callable[[list[str]], dict[str, str]]) -> dict[str, str]:
    """For the requests of child Runs (AgentInvoke): the parent Run each one serves, by request id, from
    `parents_of_runs` (run ids to their parent's, for those that have one). The link is stored once, on the
    child's Run; approval documents show it from there."""
    parents = parents_of_runs(sorted({r.run_id for r in requests}))
    return {r.request_id: parents[r.run_id] for r in requests if r.run_id in parents}
