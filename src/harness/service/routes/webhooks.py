"""Webhook deliveries: what was pushed where, the dead letters, and redelivering them (SPEC P4 / N1)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Security

from harness.domain.webhooks import DEAD, Delivery
from harness.ports.webhooks import WebhookDeliveries
from harness.service import views
from harness.service.auth import Principal, operator, principal
from harness.service.core import Service
from harness.service.errors import ApiError, not_found
from harness.service.routes.common import ServiceDep, errors
from harness.service.schemas import DeliveryDoc, DeliveryList

router = APIRouter(prefix="/api/v1/webhooks", tags=["webhooks"])
Caller = Annotated[Principal, Security(principal)]
Operator = Annotated[Principal, Security(operator)]


def delivery_document(d: Delivery) -> DeliveryDoc:
    """A delivery as the API and the console show it."""
    return DeliveryDoc(
        delivery_id=d.delivery_id, event_id=d.event_id, event_type=d.event_type, run_id=d.run_id,
        endpoint=d.endpoint, url=d.url, status=d.status,
        attempts=d.attempts, next_attempt_at=views.when(d.next_attempt_at) if d.status == "pending" else None,
        last_status=d.last_status, last_error=d.last_error, created_at=views.when(d.created_at),
        delivered_at=views.when(d.delivered_at) if d.delivered_at else None, payload=d.data(),
    )


def _outbox(svc: Service) -> WebhookDeliveries:
    outbox = svc.ops.webhook_outbox
    if outbox is None:
        raise ApiError(503, "unavailable", "this runtime has no webhook outbox")
    return outbox


@router.get("/deliveries", response_model=DeliveryList, responses=errors(503), summary="List webhook deliveries")
def list_deliveries(
    caller: Caller,
    svc: Service = ServiceDep,
    status: Annotated[Literal["pending", "delivered", "dead"] | None, Query(
        description="Only deliveries in this status; `dead` lists the dead letters.")] = None,
    run_id: Annotated[str | None, Query(max_length=64, description="Only this Run's deliveries.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> DeliveryList:
    """The pushes of the caller's tenant, newest first: each event for each endpoint, with its attempts,
    last error and status. A delivery is dead once its attempts are spent; an operator can redeliver it."""
    outbox = _outbox(svc)
    rows = outbox.list(tenant_id=caller.tenant_id, status=status, run_id=run_id, limit=limit)
    return DeliveryList(deliveries=[delivery_document(d) for d in rows], counts=outbox.counts(caller.tenant_id))


@router.post(
    "/deliveries/{delivery_id}/redeliver",
    response_model=DeliveryDoc,
    responses=errors(403, 404, 409, 503),
    summary="Redeliver a dead webhook",
)
def redeliver(delivery_id: str, caller: Operator, svc: Service = ServiceDep) -> DeliveryDoc:
    """Queue a dead delivery again with a fresh attempt count and the same webhook-id and event id (the
    receiver never accepted it). Needs the operator or auditor role; the action is audited."""
    outbox = _outbox(svc)
    found = outbox.get(delivery_id, caller.tenant_id)
    if found is None:
        raise not_found("webhook delivery", delivery_id)
    if found.status != DEAD:
        raise ApiError(409, "conflict", f"the delivery is {found.status}; only a dead delivery is redelivered")
    again = outbox.redeliver(delivery_id, tenant_id=caller.tenant_id, actor=caller.name)
    if again is None:
        raise ApiError(409, "conflict", "the delivery changed concurrently; it is no longer dead")
    return delivery_document(again)
