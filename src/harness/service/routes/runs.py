"""Runs: create, list, get, cancel, trace, and live state changes (SPEC U2)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response, Security
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from harness.domain.authority import check_may_cancel
from harness.domain.contracts import RunRequest
from harness.kernel.states import RunState
from harness.service import views
from harness.service.auth import Principal, principal
from harness.service.bodies import CancelBody, CreateRunBody
from harness.service.core import Service
from harness.service.errors import ApiError
from harness.service.routes.common import ServiceDep, errors
from harness.service.schemas import (
    ArchivedErrorDoc,
    ArchivedRunDoc,
    BacklogFullDoc,
    ErrorDoc,
    RunDoc,
    RunList,
    TraceDoc,
)
from harness.service.sse import change_stream, guarded, wait_settled

router = APIRouter(prefix="/api/v1", tags=["runs"])
Caller = Annotated[Principal, Security(principal)]
Wait = Annotated[bool, Query(description="Wait until the Run is final or waits for a human.")]
Timeout = Annotated[
    float, Query(gt=0, le=300, description="With wait: give up waiting after this many seconds.")
]
FromArchive = Annotated[bool, Query(
    description="For an archived Run: read it back from its archive segment, checked against its signed "
                "checkpoint first (otherwise an archived Run answers 410 with where it is).")]
LastEventId = Annotated[str | None, Header(description="Resume a stream after this event id.")]
#: event ids are 64-bit database integers: a cursor past the largest is malformed, not an overflow
MAX_CURSOR = 2**63 - 1
After = Annotated[int | None, Query(ge=0, le=MAX_CURSOR, description="Start after this event id.")]
SSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "Server-sent events: `state` per change."}
}


def _submit(svc: Service, caller: Principal, body: CreateRunBody) -> tuple[str, bool]:
    if body.retry_of is not None and svc.ops.reads.tenant_of(body.retry_of) != caller.tenant_id:
        raise ApiError(422, "invalid_request", f"retry_of: no run with id {body.retry_of!r}")
    if not body.task.strip():
        raise ApiError(422, "invalid_request", "task: must not be blank")
    identity = caller.identity
    if body.team_id is not None and body.team_id not in svc.ops.identities.teams_of(identity.tenant_id,
                                                                                           identity.user_id):
        raise ApiError(403, "forbidden", f"team_id: you are not a member of team {body.team_id!r}")
    request = RunRequest(
        task=body.task,
        tenant_id=caller.identity.tenant_id,
        user_id=caller.identity.user_id,
        roles=caller.identity.roles,
        session_id=body.session_id,
        team_id=body.team_id,
        history=tuple(body.history),
        token_budget=body.token_budget,
        idempotency_key=body.idempotency_key,
        retry_of=body.retry_of,
        metadata=body.metadata,
        chain_remaining=body.chain_remaining,
        callback=body.callback,
        start_by=body.start_by,
    )
    with svc.worker.admit() as admission:
        run, created = svc.ops.submit(request)
        if created:
            svc.worker.drive(run.run_id, admission)
    return run.run_id, created


BACKLOG_FULL: dict[int | str, dict[str, Any]] = {
    429: {"model": BacklogFullDoc, "description": "Too many accepted Runs wait to start (HARNESS_MAX_BACKLOG); "
                                                  "nothing was created. Retry after the Retry-After header's seconds."}
}
REPLAYED: dict[int | str, dict[str, Any]] = {
    200: {"model": RunDoc, "description": "The existing Run: this idempotency key was used before."}
}


@router.post(
    "/runs", status_code=202, response_model=RunDoc,
    responses=REPLAYED | BACKLOG_FULL | errors(403, 409, 413, 503),
    summary="Create a Run",
)
async def create_run(
    body: CreateRunBody,
    caller: Caller,
    request: Request,
    response: Response,
    *,
    wait: Wait = False,
    timeout: Timeout = 30.0,
) -> RunDoc:
    """Accept a task; the Run is durable (CREATED committed) before its id is returned, then the embedded
    worker drives it. A repeated idempotency key returns the existing Run with 200. When too many accepted
    Runs wait to start, 429 `backlog_full` with Retry-After, and nothing is created."""
    svc: Service = request.app.state.service
    run_id, created = await run_in_threadpool(_submit, svc, caller, body)
    if not created:
        response.status_code = 200
    if wait:
        await wait_settled(
            svc.hub,
            svc.ops.reads,
            run_id,
            min(timeout, svc.settings.max_wait_s),
            svc.settings.poll_interval_s,
        )
    response.headers["Location"] = f"{views.API}/runs/{run_id}"
    return await run_in_threadpool(lambda: views.run_document(svc.ops, svc.ops.run(run_id)))


@router.get("/runs", response_model=RunList, responses=errors(), summary="List Runs")
def list_runs(
    caller: Caller,
    svc: Service = ServiceDep,
    state: Annotated[RunState | None, Query(description="Only Runs in this state.")] = None,
    before: Annotated[
        float | None, Query(allow_inf_nan=False, description="Only Runs created before this epoch time.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> RunList:
    """The caller's tenant's Runs, newest first."""
    rows = svc.ops.reads.list_runs(caller.tenant_id, state=state.value if state else None, before=before,
                                       limit=limit)
    return RunList(
        runs=[views.run_summary(r) for r in rows],
        next_before=rows[-1].created_at if len(rows) == limit else None,
    )


@router.get(
    "/runs/{run_id}",
    response_model=RunDoc | ArchivedRunDoc,
    responses={
        **errors(404, 410),
        200: {"description": "The Run (RunDoc); with from_archive=true, an archived Run read back (ArchivedRunDoc)."},
        409: {"model": ErrorDoc, "description": "from_archive: the Run's segment does not verify against its "
              "checkpoint (`archive_unverified`); nothing of it is shown."},
        410: {"model": ArchivedErrorDoc, "description": "The Run was archived and pruned: the body's `archived` "
              "says in which segment and where (read it back with from_archive=true)."},
        503: {"model": ErrorDoc, "description": "from_archive: the segment cannot be read now, or there is no "
              "checkpoint to check it against (`archive_unavailable`)."},
    },
    summary="Get a Run",
)
async def get_run(
    run_id: str, caller: Caller, request: Request, wait: Wait = False, timeout: Timeout = 30.0,
    from_archive: FromArchive = False,
) -> RunDoc | ArchivedRunDoc:
    """A Run's state, path (with the time spent in each state), result, cost and pending approval; an
    archived Run answers 410 with where it is, or with from_archive=true is read back from its segment."""
    svc: Service = request.app.state.service
    if from_archive:
        archived = await run_in_threadpool(svc.owned_archived, caller, run_id)
        if archived is not None:
            return await run_in_threadpool(views.archived_run_document, svc.ops, archived)
    run = await run_in_threadpool(svc.owned_run, caller, run_id)
    if wait:
        await wait_settled(
            svc.hub,
            svc.ops.reads,
            run_id,
            min(timeout, svc.settings.max_wait_s),
            svc.settings.poll_interval_s,
        )
        run = await run_in_threadpool(svc.ops.run, run_id)
    return await run_in_threadpool(views.run_document, svc.ops, run)


@router.post(
    "/runs/{run_id}/cancel", response_model=RunDoc, responses=errors(403, 404, 409), summary="Cancel a Run"
)
def cancel_run(
    run_id: str, caller: Caller, body: CancelBody | None = None, svc: Service = ServiceDep
) -> RunDoc:
    """Cancel a Run that has not finished: the answer is the Run CLOSED_CANCELLED. Its requester or an
    operator may. A Run that already closed, or began to close first (its cancel lost the race), is a 409
    whose `state` says where the Run is: the cancel took no effect."""
    check_may_cancel(caller.identity, svc.owned_run(caller, run_id).user_id)
    reason = body.reason if body else "cancelled by the user"
    svc.ops.cancel(run_id, by=caller.name, reason=reason)
    return views.run_document(svc.ops, svc.ops.run(run_id))


@router.get(
    "/runs/{run_id}/trace", response_model=TraceDoc, responses=errors(404), summary="Get a Run's trace"
)
def get_trace(run_id: str, caller: Caller, svc: Service = ServiceDep) -> TraceDoc:
    """The Run's hash-chained trace records, and the same records grouped by pipeline step."""
    return views.trace_document(svc.ops, svc.owned_run(caller, run_id))


def _cursor(last_event_id: str | None, query_after: int | None) -> int | None:
    raw = query_after if query_after is not None else last_event_id
    if raw is None:
        return None
    try:
        cursor = int(raw)
    except ValueError:
        raise ApiError(422, "invalid_request", "Last-Event-ID must be an integer event id") from None
    if cursor > MAX_CURSOR:
        raise ApiError(422, "invalid_request", f"Last-Event-ID: {cursor} is larger than any event id ({MAX_CURSOR})")
    return max(cursor, 0)


def _stream(svc: Service, tenant_id: str, run_id: str | None, cursor: int) -> StreamingResponse:
    frames = change_stream(
        svc.hub,
        svc.ops.reads,
        tenant_id,
        run_id=run_id,
        cursor=cursor,
        lifetime_s=svc.settings.stream_lifetime_s,
        poll_s=svc.settings.poll_interval_s,
        stop=lambda: svc.stopping,
    )
    return StreamingResponse(
        guarded(frames),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get(
    "/runs/{run_id}/events",
    responses={**SSE, **errors(404)},
    response_class=StreamingResponse,
    summary="Follow a Run's state changes",
)
def run_events(
    run_id: str,
    caller: Caller,
    svc: Service = ServiceDep,
    last_event_id: LastEventId = None,
    after: After = None,
) -> StreamingResponse:
    """Server-sent events, one `state` event per committed change (from any process), from the start of
    the Run unless resumed; ends with an `end` event once the Run is final."""
    svc.owned_run(caller, run_id)
    return _stream(svc, caller.tenant_id, run_id, _cursor(last_event_id, after) or 0)


@router.get(
    "/events",
    responses=SSE | errors(),
    response_class=StreamingResponse,
    summary="Follow every state change in your tenant",
)
def tenant_events(
    caller: Caller,
    svc: Service = ServiceDep,
    last_event_id: LastEventId = None,
    after: After = None,
) -> StreamingResponse:
    """Server-sent events for every Run of the caller's tenant, from now on unless resumed."""
    cursor = _cursor(last_event_id, after)
    return _stream(
        svc, caller.tenant_id, None, svc.ops.reads.latest_cursor() if cursor is None else cursor
    )
