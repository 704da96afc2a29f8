"""The port of the approval desk (SPEC G2-G6): approval requests, decisions and approvals, as stored.

The desk (harness.policy.hitl) judges; this port only reads and writes rows. Each write also chains the
row as it now stands (a `hitl_request` or `hitl_decision` record, harness.audit.mirror_records) in the
same transaction. A decision's, timeout's or cancel's transaction locks the Run's row first, then the
request's, so the desk judges against what it locked.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from harness.domain.approvals import HitlRequest
    from harness.domain.records import TraceRecordIn
    from harness.kernel.states import RunState
    from harness.ports import Clock, Tx


class ApprovalRows(Protocol):
    """Approval requests, approvals and decisions in the Run store."""

    @property
    def clock(self) -> Clock:
        """The store's clock (creation times, deadlines, decision times)."""
        ...

    # ------------------------------------------------------------------ reads, each in its own snapshot

    def get(self, request_id: str, tenant_id: str | None = None) -> HitlRequest | None:
        """The request with this id (in this tenant, when given); None when there is none."""
        ...

    def for_run(self, run_id: str) -> list[HitlRequest]:
        """A Run's requests, oldest first."""
        ...

    def pending(self, tenant_id: str | None, limit: int) -> list[HitlRequest]:
        """Requests still waiting (of one tenant, when given), oldest deadline first."""
        ...

    def due(self, now: float, limit: int) -> list[HitlRequest]:
        """Pending requests whose deadline is at or before `now`, oldest deadline first."""
        ...

    def pending_count(self, tenant_id: str, requester: str) -> int:
        """How many requests of this requester still wait."""
        ...

    def parent_runs(self, run_ids: Sequence[str]) -> dict[str, str]:
        """The parent Run of each of these Runs that is a child Run, by run id."""
        ...

    def stranded(self, decided_before: float, limit: int) -> list[HitlRequest]:
        """The newest request of each Run in AWAITING_HITL with no pending request, closed before
        `decided_before`, oldest decision first."""
        ...

    def approvals(self, request_id: str, tx: Tx | None = None) -> list[str]:
        """Approvers whose approval of this request was accepted (as `tx` sees them, when given)."""
        ...

    # ------------------------------------------------------------------ writes, inside a transaction

    def transaction(self) -> AbstractContextManager[Tx]:
        """A transaction of its own, committed when the block ends (ApprovalConflictError when a write
        collided with a stored row; nothing is committed then)."""
        ...

    def lock_run(self, tx: Tx, run_id: str) -> RunState:
        """Lock the Run's row until `tx` ends and return its state."""
        ...

    def lock_request(self, tx: Tx, request_id: str) -> HitlRequest | None:
        """Lock the request's row until `tx` ends (the Run's row is locked first) and return it."""
        ...

    def insert(self, tx: Tx, request: HitlRequest, escalated_from: str | None) -> None:
        """Store a new pending request within `tx`, and chain it."""
        ...

    def add_approval(self, tx: Tx, request_id: str, approver: str, decision_id: str, at: float) -> None:
        """Count one person's accepted approval of the request (unique per request and person)."""
        ...

    def add_decision(self, tx: Tx, decision: dict[str, Any]) -> None:
        """Store a submitted decision (accepted or refused, with the hitl_decisions columns), and chain it."""
        ...

    def close(self, tx: Tx, request_id: str, status: str, now: float) -> bool:
        """Close a pending request with `status` and chain it as it now stands; False when it was not
        pending (nothing changed)."""
        ...

    def pending_of_run(self, tx: Tx, run_id: str) -> list[str]:
        """Ids of the Run's pending requests, as `tx` sees them."""
        ...

    def trace(self, tx: Tx, records: Sequence[TraceRecordIn], now: float) -> None:
        """Queue trace records for the chain within `tx`."""
        ...

    def audit(self, tx: Tx, run_id: str, event: str, actor: str, detail: dict[str, Any]) -> None:
        """Write an audit event within `tx`."""
        ...
