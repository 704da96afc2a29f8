"""What the cost ledger answers: the spend of a group in the cost view, and a Run's total."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

#: the shape of CostTrace payloads this version writes. 1 (before it): source, input/output tokens, usd,
#: tenant and user. 2: also API calls, sandbox seconds, the unit price applied (and whether the model was
#: priced), the model, the skill and the parent Run. Chained records keep the shape they were written in
#: (their hashes cover those bytes); `cost_fields` reads both. Defined here, beside the totals that carry it,
#: so that reading a Run's cost (`runs show`) does not load the trace models.
COST_TRACE_VERSION: Final = 2

GroupBy = Literal["tenant", "user", "skill", "day"]
GROUPS: tuple[GroupBy, ...] = ("tenant", "user", "skill", "day")
#: the skill a cost of no skill (a planning call) is grouped under
PLANNING = "(planning)"


@dataclass(frozen=True, slots=True)
class CostGroup:
    """The spend of one group in the cost view."""

    key: str
    usd: float
    input_tokens: int
    output_tokens: int
    api_calls: int
    sandbox_s: float
    costs: int
    runs: int
    unpriced: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Spend:
    """What a budget check reads: the USD spent by the Run, its user and its tenant, and the models the
    Run called that have no price (their calls count 0 USD)."""

    run_usd: float
    user_usd: float
    tenant_usd: float
    unpriced_models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RunTotal:
    """The sums a RunTrace's total_cost carries (shape version 2), its child Runs' costs included."""

    input_tokens: int = 0
    output_tokens: int = 0
    api_calls: int = 0
    sandbox_s: float = 0.0
    usd: float = 0.0
    costs: int = 0
    unpriced: int = 0
    children: int = 0

    def merged(self, others: Iterable[RunTotal], *, children: int) -> RunTotal:
        """This total plus others' (child Runs'), counting `children` Runs."""
        out = self
        for o in others:
            out = RunTotal(out.input_tokens + o.input_tokens, out.output_tokens + o.output_tokens,
                           out.api_calls + o.api_calls, out.sandbox_s + o.sandbox_s, out.usd + o.usd,
                           out.costs + o.costs, out.unpriced + o.unpriced)
        return RunTotal(out.input_tokens, out.output_tokens, out.api_calls, round(out.sandbox_s, 6),
                        round(out.usd, 8), out.costs, out.unpriced, children)

    def to_dict(self) -> dict[str, Any]:
        """The RunTrace's total_cost."""
        return {"v": COST_TRACE_VERSION, **asdict(self)}
