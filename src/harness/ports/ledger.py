"""The cost ledger as the application sees it: what has been spent, for the budget checks (SPEC G5), and
where costs are booked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
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


class CostBook(Protocol):
    """Books costs with their CostTrace, which goes with the cost's transaction; a cost that names no parent
    Run gets its Run's parent (child Runs' costs count in their parent's total)."""

    def record(self, cost: CostTrace) -> None:
        """Book one cost in its own transaction."""
        ...

    def record_in(self, tx: Tx, cost: CostTrace) -> None:
        """Book one cost within `tx` (it commits, or not, with what else `tx` writes)."""
        ...
