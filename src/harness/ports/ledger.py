"""The cost ledger as the application sees it: what has been spent, for the budget checks (SPEC G5), and
where costs are booked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from harness.domain.costs import CostGroup, GroupBy, RunTotal, Spend
    from harness.domain.traces import CostTrace
    from harness.ports import Tx


class SpendReads(Protocol):
    """Spend recorded so far, read outside any transaction."""

    def spent_by_scope(self, *, tenant_id: str, user_id: str, run_id: str) -> tuple[float, float, float]:
        """(run, user, tenant) spend in USD."""
        ...

    def unpriced_calls(self, run_id: str) -> list[str]:
        """The models of the Run's calls recorded without a price."""
        ...

    def spend(self, *, tenant_id: str, user_id: str, run_id: str) -> Spend:
        """`spent_by_scope` and `unpriced_calls` together: what a budget check reads, in one go."""
        ...


class CostBook(Protocol):
    """Books costs with their CostTrace, which goes with the cost's transaction; a cost that names no parent
    Run gets its Run's parent (child Runs' costs count in their parent's total)."""

    def record(self, cost: CostTrace) -> None:
        """Book one cost in its own transaction."""
        ...

    def record_in(self, tx: Tx, cost: CostTrace) -> None:
        """Book one cost within `tx` (it commits, or not, with what else `tx` writes)."""
        ...


class CostLedger(SpendReads, CostBook, Protocol):
    """The whole ledger as the Run manager holds it for its callers: the reads behind the costs views,
    the budget checks and the metrics, and where costs are booked."""

    def spent(self, *, tenant_id: str, user_id: str | None = None, run_id: str | None = None) -> float:
        """What the tenant (or one user, or one Run) has spent, in USD."""
        ...

    def run_total(self, run_id: str, *, until: float | None = None) -> RunTotal:
        """A Run's costs summed, its child Runs' included."""
        ...

    def by_group(self, group_by: GroupBy, *, tenant_id: str | None, since: float | None = None,
                 until: float | None = None, limit: int = 1000) -> list[CostGroup]:
        """Spend grouped by tenant, user, skill or UTC day."""
        ...

    def by_tenant_and_skill(self) -> list[tuple[str, str, CostGroup]]:
        """(tenant, skill, sums) of every recorded cost."""
        ...
