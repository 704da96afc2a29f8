"""The read model the service shows (SPEC U2): tenant-scoped listings, the change feed, counts for metrics.

Every method that returns Runs or their changes takes the caller's tenant and filters by it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from harness.domain.feed import Change, RunRow
    from harness.domain.records import AuditEvent, RunRecord, TransitionRow
    from harness.kernel.thresholds import Thresholds


class RunHistory(Protocol):
    """A Run's recorded transitions and audit events."""

    def transitions_of(self, run_id: str) -> list[TransitionRow]:
        """The Run's transitions, oldest first."""
        ...

    def audit_events(self, *, run_id: str | None = None, event: str | None = None) -> list[AuditEvent]:
        """Audit events, oldest first, of one Run and/or one kind."""
        ...


class ReadModel(Protocol):
    """Read-only queries over the Runs of one database."""

    def get_run(self, run_id: str) -> RunRecord:
        """The Run; UnknownRunError when there is none."""
        ...

    def list_runs(self, tenant_id: str, *, state: str | None = None, before: float | None = None,
                  limit: int = 50) -> list[RunRow]:
        """The tenant's Runs, newest first, optionally in one state and created before a cursor."""
        ...

    def tenant_of(self, run_id: str) -> str | None:
        """The tenant that owns a Run, or None when no Run has this id."""
        ...

    def changes_after(self, tenant_id: str, cursor: int, *, run_id: str | None = None, limit: int = 500,
                      through: int | None = None) -> list[Change]:
        """State changes committed after `cursor` (and up to `through`), oldest first."""
        ...

    def change_ids_after(self, cursor: int, limit: int = 500) -> list[int]:
        """The ids of every committed change after `cursor`, any tenant's, oldest first."""
        ...

    def latest_cursor(self) -> int:
        """The id of the latest committed change (0 when none)."""
        ...

    def runs_by_state(self) -> dict[str, int]:
        """How many Runs are in each state."""
        ...

    def zombie_counts(self, now: float, thresholds: Thresholds = ...) -> dict[str, int]:
        """How many Runs per state the sweeper would act on now."""
        ...

    def pending_approvals(self) -> tuple[int, float | None]:
        """(how many approval requests wait, when the oldest was opened)."""
        ...

    def decisions_of(self, request_id: str) -> list[dict[str, Any]]:
        """Every decision submitted on an approval request, oldest first."""
        ...

    def job(self, job_id: str) -> dict[str, Any] | None:
        """The legacy job row of a Run (job_id, status, run_state_snapshot, updated_at), or None."""
        ...
