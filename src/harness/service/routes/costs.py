"""The cost view (seed 004 §3.6 "cost dashboard by User / Workspace / Skill", SPEC G1, A1)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Security

from harness.domain.costs import CostGroup
from harness.service.auth import Principal, principal
from harness.service.core import Service
from harness.service.errors import ApiError
from harness.service.routes.common import ServiceDep, errors
from harness.service.schemas import CostGroupDoc, CostView

router = APIRouter(prefix="/api/v1", tags=["costs"])
Caller = Annotated[Principal, Security(principal)]
When = Annotated[str | None, Query(description="ISO 8601 date or date-time (UTC unless it says otherwise).")]


def parse_when(value: str | None, name: str) -> dt.datetime | None:
    """An ISO date or date-time as an aware datetime; 422 naming the parameter otherwise."""
    if value is None or value == "":
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ApiError(422, "invalid_request", f"{name}: {value!r} is not an ISO 8601 date or date-time") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def cost_view(svc: Service, tenant_id: str, group_by: Literal["tenant", "user", "skill", "day"],
              since: dt.datetime | None, until: dt.datetime | None) -> CostView:
    """The tenant's spend grouped, within [since, until): one document for the API and the console."""
    if since is not None and until is not None and until <= since:
        raise ApiError(422, "invalid_request", "to: must be after from")
    groups = svc.ops.ledger.by_group(group_by, tenant_id=tenant_id, since=since.timestamp() if since else None,
                                     until=until.timestamp() if until else None)
    return CostView.model_validate({
        "group_by": group_by, "from": since, "to": until, "total_usd": round(sum(g.usd for g in groups), 8),
        "groups": [group_doc(g) for g in groups]})


def group_doc(g: CostGroup) -> CostGroupDoc:
    """One group as the API shows it."""
    return CostGroupDoc(**g.to_dict())


@router.get("/costs", response_model=CostView, response_model_by_alias=True, responses=errors(),
            summary="Spend by tenant, user, skill or day")
def costs(
    caller: Caller,
    svc: Service = ServiceDep,
    group_by: Annotated[Literal["tenant", "user", "skill", "day"], Query(
        description="Group by tenant, user, skill (planning calls as (planning)) or UTC day.")] = "user",
    from_: Annotated[str | None, Query(alias="from", description="Only costs at or after this ISO 8601 time.")] = None,
    to: Annotated[str | None, Query(description="Only costs before this ISO 8601 time.")] = None,
) -> CostView:
    """Recorded spend of the caller's tenant — USD, tokens, API calls, sandbox seconds, how many costs and
    Runs, and how many calls were of an unpriced model — grouped as asked, largest first (days oldest
    first)."""
    return cost_view(svc, caller.tenant_id, group_by, parse_when(from_, "from"), parse_when(to, "to"))
