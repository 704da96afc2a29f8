"""Operations: the legacy job view, audit checks, health, metrics and `me` (SPEC K6, K8, A3, U2)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Response, Security

from harness.service import views
from harness.service.auth import Principal, operator, principal
from harness.service.core import Service
from harness.service.errors import DATABASE_RETRY_AFTER_S, not_found
from harness.service.metrics import CONTENT_TYPE
from harness.service.routes.common import ServiceDep, errors
from harness.service.schemas import CheckDoc, HealthDoc, JobDoc, MeDoc, WorkerDoc
from harness.stores import DatabaseError

router = APIRouter(tags=["operations"])
Caller = Annotated[Principal, Security(principal)]
Operator = Annotated[Principal, Security(operator)]


@router.get("/jobs/{job_id}", response_model=JobDoc, responses=errors(404), summary="Legacy job status")
def get_job(job_id: str, caller: Caller, svc: Service = ServiceDep) -> JobDoc:
    """The legacy view of a Run: one of four statuses (pending, running, done, failed), and the live
    state as `run_state_snapshot`. Written only by the projector inside each state change."""
    svc.owned_run(caller, job_id)
    row = svc.ops.reads.job(job_id)
    if row is None:
        raise not_found("job", job_id)
    return JobDoc(
        job_id=row["job_id"],
        status=row["status"],
        run_state_snapshot=row["run_state_snapshot"],
        updated_at=views.when(row["updated_at"]),
    )


def _report(value: Any) -> dict[str, Any]:
    """A check's report as JSON-able data, whatever shape the audit module returns."""
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dict(dump(mode="json"))
    return dict(vars(value))


def _check(result: Any) -> CheckDoc:
    return CheckDoc(ok=bool(result.ok), report=_report(result))


@router.get(
    "/api/v1/audit/verify",
    response_model=CheckDoc,
    responses=errors(403, 503),
    summary="Verify the audit hash chain",
)
def audit_verify(_caller: Operator, svc: Service = ServiceDep) -> CheckDoc:
    """Walk the whole hash chain; `ok` is false and the report names the first bad record on any edit,
    deletion, insertion or reordering. Needs the operator or auditor role."""
    return _check(svc.ops.verify())


@router.get(
    "/api/v1/audit/reconcile",
    response_model=CheckDoc,
    responses=errors(403, 503),
    summary="Reconcile final states with audit events",
)
def audit_reconcile(_caller: Operator, svc: Service = ServiceDep) -> CheckDoc:
    """Count Runs in each final state against the matching audit events (run_succeeded, …); any mismatch is listed."""
    return _check(svc.ops.reconcile())


@router.get("/health", response_model=HealthDoc, responses=errors(503), summary="Health")
def health(_caller: Caller, response: Response, svc: Service = ServiceDep) -> HealthDoc:
    """Whether the database answers reads and takes writes (a row inserted in a transaction that is
    rolled back), and how loaded the embedded worker is. 503 with Retry-After when either fails."""
    backlog, database = 0, "ok"
    try:
        backlog = svc.ops.trace_backlog()
    except DatabaseError as exc:
        database = f"error: cannot read: {type(exc).__name__}"
    if database == "ok":
        try:
            svc.ops.probe_write()
        except DatabaseError as exc:
            database = f"error: cannot write: {type(exc).__name__}"
    if database != "ok":
        response.status_code = 503
        response.headers["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
    worker = WorkerDoc(
        threads=svc.worker.threads, in_flight=svc.worker.in_flight, queue_limit=svc.worker.queue_limit
    )
    return HealthDoc(
        status="ok" if database == "ok" else "degraded",
        database=database,
        trace_backlog=backlog,
        worker=worker,
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}}, **errors(403)},
    summary="Prometheus metrics",
)
def metrics(_caller: Operator, svc: Service = ServiceDep) -> Response:
    """Runs by state, zombies, trace backlog, pending approvals and their wait, transitions, cancel ratio."""
    return Response(svc.metrics.render(), media_type=CONTENT_TYPE)


@router.get("/api/v1/me", response_model=MeDoc, responses=errors(), summary="Who am I")
def me(caller: Caller) -> MeDoc:
    """The identity your credential maps to."""
    return MeDoc(
        tenant_id=caller.identity.tenant_id,
        user_id=caller.identity.user_id,
        roles=list(caller.identity.roles),
    )
