"""The cost ledger as policy reads it: what has been spent, for the budget checks (SPEC G5)."""

from __future__ import annotations

from typing import Protocol


class SpendReads(Protocol):
    """Spend recorded so far, read outside any transaction."""

    def spent_by_scope(self, *, tenant_id: str, user_id: str, run_id: str) -> tuple[float, float, float]:
        """(run, user, tenant) spend in USD."""
        ...

    def unpriced_calls(self, run_id: str) -> list[str]:
        """The models of the Run's calls recorded without a price."""
        ...
