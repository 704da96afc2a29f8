"""Console pages: the cost view, the webhook deliveries, the sandboxes in use (SPEC U3; seed 004 §3.6).

The cost page draws spend over time as server-rendered SVG (no script, no CDN) and tables by user and by
skill; the webhooks page lists deliveries with their attempts and errors, dead letters first to find, and
lets an operator redeliver one (through the JSON API, like every console action); the sandboxes page shows
the tenant's live instances and how full this host's caps and port pool are.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Query, Request

from harness.domain.authority import OPERATOR_ROLES
from harness.domain.costs import CostGroup
from harness.domain.webhooks import STATUSES
from harness.service.auth import session_principal
from harness.service.console_format import axis_ticks
from harness.service.core import service_of
from harness.service.routes.console import Page, _login_redirect, _page
from harness.service.routes.webhooks import delivery_document

router = APIRouter(prefix="/ui", include_in_schema=False)
DAY = dt.timedelta(days=1)
CHART_W, CHART_H, PAD_L, PAD_B, PAD_T = 760, 220, 56, 28, 12


@dataclass(frozen=True)
class Bar:
    """One day's bar in the spend chart, in SVG coordinates."""

    x: float
    y: float
    width: float
    height: float
    day: str
    usd: float
    label: str


@dataclass(frozen=True)
class Chart:
    """The spend-over-time chart: bars, the y axis's ticks and the x axis's labels."""

    bars: list[Bar]
    ticks: list[tuple[float, str]]
    width: int = CHART_W
    height: int = CHART_H
    left: int = PAD_L
    bottom: int = CHART_H - PAD_B


def spend_chart(days: list[CostGroup], first: dt.date, last: dt.date) -> Chart:
    """One bar per UTC day from `first` to `last` (days without spend get none), scaled to the largest."""
    by_day = {g.key: g.usd for g in days}
    count = (last - first).days + 1
    axis = axis_ticks(max(by_day.values(), default=0.0))
    top = axis[-1][0]
    plot_w, plot_h = CHART_W - PAD_L - 8, CHART_H - PAD_B - PAD_T
    slot = plot_w / count
    bars = []
    for i in range(count):
        day = (first + dt.timedelta(days=i)).isoformat()
        usd = by_day.get(day, 0.0)
        height = plot_h * usd / top
        label = day[5:] if count <= 14 or i % max(count // 10, 1) == 0 else ""
        bars.append(Bar(x=PAD_L + i * slot + slot * 0.15, y=PAD_T + plot_h - height, width=max(slot * 0.7, 1.0),
                        height=height, day=day, usd=usd, label=label))
    ticks = [(PAD_T + plot_h * (1 - value / top), label) for value, label in axis]
    return Chart(bars=bars, ticks=ticks)


@router.get("/costs", response_model=None)
def costs_page(request: Request, days: Annotated[int, Query(ge=1, le=366)] = 30) -> Page:
    """Spend over the last `days` days: a chart by day, tables by user and by skill."""
    svc = service_of(request)
    caller = session_principal(request)
    if caller is None:
        return _login_redirect(request)
    now = dt.datetime.fromtimestamp(svc.ops.clock.now(), dt.UTC)
    last = now.date()
    first = last - dt.timedelta(days=days - 1)
    since = dt.datetime.combine(first, dt.time(), dt.UTC).timestamp()
    ledger, tenant = svc.ops.ledger, caller.tenant_id
    per_day = ledger.by_group("day", tenant_id=tenant, since=since)
    by_user = ledger.by_group("user", tenant_id=tenant, since=since)
    by_skill = ledger.by_group("skill", tenant_id=tenant, since=since)
    return _page(request, svc, caller, "costs.html", chart=spend_chart(per_day, first, last), by_user=by_user,
                 by_skill=by_skill, total=sum(g.usd for g in by_user), days=days, first=first.isoformat(),
                 last=last.isoformat(), unpriced=sum(g.unpriced for g in by_user))


@router.get("/webhooks", response_model=None)
def webhooks_page(request: Request, status: str | None = None) -> Page:
    """The tenant's webhook deliveries, newest first, filtered by status; operators may redeliver dead ones."""
    svc = service_of(request)
    caller = session_principal(request)
    if caller is None:
        return _login_redirect(request)
    outbox = svc.ops.webhook_outbox
    chosen = status if status in STATUSES else None
    rows = outbox.list(tenant_id=caller.tenant_id, status=chosen, limit=200) if outbox else []
    counts = outbox.counts(caller.tenant_id) if outbox else {s: 0 for s in STATUSES}
    return _page(request, svc, caller, "webhooks.html", deliveries=[delivery_document(d) for d in rows],
                 counts=counts, status_filter=chosen, statuses=STATUSES,
                 can_redeliver=caller.has_any(OPERATOR_ROLES))


@router.get("/sandboxes", response_model=None)
def sandboxes_page(request: Request) -> Page:
    """The tenant's live sandbox instances, and the use of this host's caps and port pool."""
    svc = service_of(request)
    caller = session_principal(request)
    if caller is None:
        return _login_redirect(request)
    table, pool = svc.ops.sandbox_instances(), svc.ops.settings.pool_settings()
    use = table.use()
    low, high = pool.port_range or (1, 0)
    now = svc.ops.clock.now()
    rows = [{"run_id": r.run_id, "skill_id": r.skill_id, "host": r.host, "ports": ", ".join(map(str, r.ports)),
             "generation": r.generation, "calls": r.calls, "isolation": r.isolation, "persistent": r.persistent,
             "created_at": r.created_at, "held_s": round(r.held_until(now), 1)}
            for r in table.live(tenant_id=caller.tenant_id)]
    return _page(request, svc, caller, "sandboxes.html", instances=rows, host=pool.host,
                 host_live=use.live_by_host.get(pool.host, 0), host_cap=pool.host_cap,
                 tenant_live=use.live_by_tenant.get(caller.tenant_id, 0), tenant_cap=pool.tenant_cap,
                 ports_leased=use.ports_by_host.get(pool.host, 0), ports_total=high - low + 1,
                 port_range=f"{low}-{high}" if pool.port_range else "none")
