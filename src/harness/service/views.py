"""Documents built from the store for the API and the console (one place, so both show the same)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from harness.audit.places import checkpoint_dir
from harness.domain.approvals import HitlRequest
from harness.domain.contracts import effects_of
from harness.domain.errors import UnknownRunError
from harness.domain.feed import RunRow
from harness.domain.records import RunRecord, StoredTraceRecord
from harness.domain.retention import ArchivedRun
from harness.kernel.projection import job_status
from harness.kernel.states import FINAL, PHASE_OF, RunState
from harness.operations import Operations
from harness.pipeline import trace_groups
from harness.pipeline.artifacts import files_of, streams_of
from harness.retention import readback
from harness.service import schemas
from harness.service.errors import ApiError
from harness.wiring.retention import segment_locator

API = "/api/v1"


def when(seconds: float) -> dt.datetime:
    """An epoch time as an aware UTC datetime."""
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def task_of(run: RunRecord) -> str:
    """The task text the Run was created with."""
    return str(run.request.get("task", ""))


def transitions(ops: Operations, run: RunRecord) -> list[schemas.TransitionDoc]:
    """The Run's timeline, each state with how long the Run stayed in it."""
    rows = ops.transitions(run.run_id)
    docs = []
    for i, row in enumerate(rows):
        if i + 1 < len(rows):
            duration: float | None = rows[i + 1].at - row.at
        else:
            duration = 0.0 if row.to_state in FINAL else None
        docs.append(
            schemas.TransitionDoc(
                seq=row.seq,
                from_state=row.from_state.value if row.from_state else None,
                to_state=row.to_state.value,
                at=when(row.at),
                duration_s=round(duration, 6) if duration is not None else None,
                actor=row.actor,
                reason=row.reason,
                forced_by=row.forced_by,
            )
        )
    return docs


def run_document(ops: Operations, run: RunRecord) -> schemas.RunDoc:
    """Everything the API says about one Run."""
    result = run.result or {}
    cost = ops.ledger.run_total(run.run_id).to_dict()
    pending = [r for r in ops.hitl.for_run(run.run_id) if r.status == "pending"]
    timeline = transitions(ops, run)
    base = f"{API}/runs/{run.run_id}"
    return schemas.RunDoc(
        run_id=run.run_id,
        task=task_of(run),
        state=run.state.value,
        phase=PHASE_OF[run.state].value,
        legacy_status=job_status(run.state).value,
        close_reason=run.close_reason.value if run.close_reason else None,
        tenant_id=run.tenant_id,
        user_id=run.user_id,
        session_id=run.session_id,
        team_id=(run.request or {}).get("team_id"),
        retry_of=run.retry_of,
        created_at=when(run.created_at),
        last_state_change_at=when(run.last_state_change_at),
        path=[t.to_state for t in timeline],
        transitions=timeline,
        answer=result.get("answer"),
        error=result.get("error"),
        artifacts=result.get("artifacts") or {},
        files=[f.model_dump(mode="json") for f in files_of(run.context)],
        streams=streams_of(run.context),
        effects=list(effects_of(run.context)),
        approval_request_id=pending[-1].request_id
        if pending and run.state == RunState.AWAITING_HITL
        else None,
        cost=schemas.CostDoc(**{k: v for k, v in cost.items() if k != "v"}),
        links=schemas.RunLinks(
            self=base, trace=f"{base}/trace", events=f"{base}/events", job=f"/jobs/{run.run_id}"
        ),
    )


def archived_run_document(ops: Operations, archived: ArchivedRun) -> schemas.ArchivedRunDoc:
    """An archived Run read back from its segment, checked first: 409 `archive_unverified` when the
    segment (or the Run's rows in it) does not verify, 503 `archive_unavailable` when it cannot be read."""
    try:
        line = readback.read_back(archived, checkpoint_dir(ops.settings.checkpoint_dir, ops.database_id()),
                                  segment_locator())
    except readback.SegmentUnverifiedError as exc:
        raise ApiError(409, "archive_unverified", f"run {archived.run_id!r} cannot be read back: {exc}",
                       extra={"archived": schemas.archived_json(archived)}) from None
    except readback.SegmentUnavailableError as exc:
        raise ApiError(503, "archive_unavailable", f"run {archived.run_id!r} cannot be read back now: {exc}",
                       extra={"archived": schemas.archived_json(archived)}) from None
    back = readback.summary(line)
    return schemas.ArchivedRunDoc(
        run_id=archived.run_id,
        state=archived.state,
        close_reason=back["close_reason"],
        tenant_id=archived.tenant_id,
        user_id=back["user_id"],
        session_id=back["session_id"],
        retry_of=back["retry_of"],
        created_at=when(archived.created_at),
        last_state_change_at=when(archived.closed_at),
        path=back["path"],
        transitions=[schemas.ArchivedTransitionDoc(**{**t, "at": when(t["at"])}) for t in back["transitions"]],
        result=back["result"],
        records=back["records"],
        verified=True,
        archived=schemas.ArchivedDoc(**archived.to_dict()),
    )


def run_summary(row: RunRow) -> schemas.RunSummary:
    """A Run as a list shows it."""
    return schemas.RunSummary(
        run_id=row.run_id,
        task=row.task,
        state=row.state,
        legacy_status=row.legacy_status,
        user_id=row.user_id,
        created_at=when(row.created_at),
        last_state_change_at=when(row.last_state_change_at),
    )


def _record(r: StoredTraceRecord) -> schemas.TraceRecordDoc:
    return schemas.TraceRecordDoc(seq=r.seq, kind=r.kind, hash=r.hash, prev_hash=r.prev_hash, data=r.data())


def step_of(kind: str, data: dict[str, Any]) -> int | None:
    """The pipeline step a trace record belongs to; None for transitions and audit events."""
    return trace_groups.step_of(kind, data)


def trace_document(ops: Operations, run: RunRecord) -> schemas.TraceDoc:
    """The Run's chained records, and the same records grouped under the eight pipeline steps."""
    records = [_record(r) for r in ops.trace(run.run_id)]
    # the groups people read (trace_groups), in step-number order, each with its StepTrace
    groups = trace_groups.group_records(records, lambda r: (r.kind, r.data))
    steps = [schemas.TraceStepDoc(step=g.step, name=g.name, records=g.records, summary=g.summary)
             for g in sorted((g for g in groups if g.step is not None), key=lambda g: g.step or 0)]
    return schemas.TraceDoc(run_id=run.run_id, state=run.state.value, records=records, steps=steps)


def approval_document(ops: Operations, request: HitlRequest) -> schemas.ApprovalDoc:
    """An approval request with its Run's task and every decision submitted so far."""
    parent_run_id = None
    try:
        run = ops.run(request.run_id)
        task, parent_run_id = task_of(run), run.parent_run_id
    except UnknownRunError:  # a request whose Run vanished still shows; the task is just unknown
        task = ""
    decisions = [
        schemas.DecisionRecordDoc(**{**d, "at": when(d["at"])})
        for d in ops.reads.decisions_of(request.request_id)
    ]
    return schemas.ApprovalDoc(
        request_id=request.request_id,
        run_id=request.run_id,
        task=task,
        level=request.level,
        status=request.status,
        requester=request.requester,
        required_approvals=request.required_approvals,
        approvals=len(ops.hitl.approvals(request.request_id)),
        approver_roles=list(request.approver_roles),
        actions=[schemas.ActionDoc(**a) for a in request.actions],
        actions_hash=request.actions_hash,
        created_at=when(request.created_at),
        deadline_at=when(request.deadline_at),
        decisions=decisions,
        parent_run_id=parent_run_id,
    )
