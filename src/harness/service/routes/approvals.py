"""Approvals: the inbox and decisions (SPEC G4, G5, U2). The approver is always the caller's identity."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Security
from starlette.concurrency import run_in_threadpool

from harness.policy.hitl import Decision
from harness.service import views
from harness.service.auth import Principal, principal
from harness.service.bodies import DecisionBody
from harness.service.core import Service
from harness.service.errors import ApiError
from harness.service.routes.common import ServiceDep, errors
from harness.service.schemas import ApprovalDoc, ApprovalList, DecisionDoc
from harness.service.sse import wait_settled

router = APIRouter(prefix="/api/v1", tags=["approvals"])
Caller = Annotated[Principal, Security(principal)]


@router.get("/approvals", response_model=ApprovalList, responses=errors(), summary="List pending approvals")
def list_approvals(
    caller: Caller, svc: Service = ServiceDep, limit: Annotated[int, Query(ge=1, le=500)] = 200
) -> ApprovalList:
    """Approval requests waiting in the caller's tenant, soonest deadline first (due timeouts applied)."""
    svc.ops.expire_approvals()
    pending = svc.ops.hitl.pending(caller.tenant_id, limit=limit)
    return ApprovalList(pending=[views.approval_document(svc.ops, r) for r in pending])


@router.get(
    "/approvals/{request_id}",
    response_model=ApprovalDoc,
    responses=errors(404),
    summary="Get an approval request",
)
def get_approval(request_id: str, caller: Caller, svc: Service = ServiceDep) -> ApprovalDoc:
    """One request: the exact actions, who may decide, the deadline and every decision so far."""
    return views.approval_document(svc.ops, svc.owned_request(caller, request_id))


def _decide(svc: Service, caller: Principal, request_id: str, body: DecisionBody) -> Decision:
    request = svc.owned_request(caller, request_id)
    if request.status != "pending":
        raise ApiError(409, "conflict", f"the approval request is already {request.status}")
    verdict, _ = svc.ops.decide(
        request_id,
        caller.identity,
        body.decision,
        approved_hash=body.actions_hash,
        break_glass=body.break_glass,
        reason=body.reason,
        resume=False,  # this process's worker drives it, below: it must have the skills the steps call
        driven_here=True,
    )
    if verdict.effect in ("approved", "rejected"):
        waited = verdict.trace.waited_s
        svc.metrics.hitl_wait.labels(verdict.effect).observe(waited)
    if verdict.effect == "approved":
        svc.worker.drive(request.run_id)
    return verdict


@router.post(
    "/approvals/{request_id}/decision",
    response_model=DecisionDoc,
    responses=errors(403, 404, 409),
    summary="Approve or reject",
)
async def decide(
    request_id: str,
    body: DecisionBody,
    caller: Caller,
    request: Request,
    *,
    wait: Annotated[bool, Query(description="Wait until the Run is final or waits again.")] = False,
    timeout: Annotated[float, Query(gt=0, le=300)] = 30.0,
) -> DecisionDoc:
    """Record a decision as the caller (persisted before it drives the Run). A refused decision — wrong
    role, own L3/L4 request, same approver twice, changed actions, break-glass without the role or a
    reason — is a 403 whose body says why; it is recorded in the audit trail either way. An approval this
    service cannot carry out (it lacks skills the approved steps call, as the Run pinned them: another
    agent) is a 409 naming them, recorded nowhere: the Run stays parked."""
    svc: Service = request.app.state.service
    verdict = await run_in_threadpool(_decide, svc, caller, request_id, body)
    if not verdict.accepted:
        raise ApiError(403, "decision_refused", verdict.refusal or "the decision was refused")
    run_id = verdict.request.run_id
    if wait:
        await wait_settled(
            svc.hub,
            svc.ops.reads,
            run_id,
            min(timeout, svc.settings.max_wait_s),
            svc.settings.poll_interval_s,
        )
    run_doc = await run_in_threadpool(
        lambda: views.run_document(svc.ops, svc.ops.run(run_id))
    )
    return DecisionDoc(
        request_id=request_id,
        decision=body.decision,
        accepted=True,
        effect=verdict.effect,
        refusal=None,
        approvals=verdict.approvals,
        required_approvals=verdict.request.required_approvals,
        run=run_doc,
    )
