"""The HTTP API's response bodies: what the service answers, as the OpenAPI document's schemas give it
(SPEC U2). What a client sends is in harness.service.bodies.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.domain.retention import ArchivedRun


class ErrorDoc(BaseModel):
    """Every failure's body."""

    error: str
    detail: str


class BacklogFullDoc(ErrorDoc):
    """429 `backlog_full`: too many accepted Runs wait to start; nothing was created. Retry after
    `retry_after_s` seconds (also the Retry-After header)."""

    backlog: int
    bound: int
    retry_after_s: int


class TransitionDoc(BaseModel):
    """One state change in a Run's timeline."""

    seq: int
    from_state: str | None
    to_state: str
    at: dt.datetime
    duration_s: float | None = Field(description="Time spent in to_state; None while the Run is still in it.")
    actor: str
    reason: str
    forced_by: str | None


class CostDoc(BaseModel):
    """What the Run has spent: the sums of its recorded costs, its child Runs' included."""

    input_tokens: int = 0
    output_tokens: int = 0
    usd: float = 0.0
    api_calls: int = 0
    sandbox_s: float = 0.0
    costs: int = Field(default=0, description="How many recorded costs the sums cover.")
    children: int = Field(default=0, description="How many child Runs' costs are included.")
    unpriced: int = Field(default=0, description="Calls of a model without a price (counted at 0 USD).")


class RunLinks(BaseModel):
    """Where to go next."""

    self: str
    trace: str
    events: str
    job: str


class RunDoc(BaseModel):
    """A Run: its live state, the path it took, its result."""

    run_id: str
    task: str
    state: str
    phase: str
    legacy_status: Literal["pending", "running", "done", "failed"]
    close_reason: str | None
    tenant_id: str
    user_id: str
    session_id: str
    team_id: str | None = Field(default=None, description="The team the Run works for, when it names one.")
    retry_of: str | None
    created_at: dt.datetime
    last_state_change_at: dt.datetime
    path: list[str]
    transitions: list[TransitionDoc]
    answer: str | None
    error: str | None
    artifacts: dict[str, Any]
    files: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The files the Run's sandboxed skills wrote and that were kept, each `{step_id, name, size, "
                    "media_type, sha256, content_hash, filtered}`; download one at `files/{sha256}` under the "
                    "Run's URL (see `GET /api/v1/runs/{run_id}/files`).")
    streams: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="What each sandboxed step printed, by step id: `stdout` and `stderr`, filtered for secrets "
                    "and bounded by HARNESS_SANDBOX_STREAM_BYTES (a longer stream keeps its start and end).")
    approval_request_id: str | None
    effects: list[dict[str, str]] = Field(
        default_factory=list,
        description="The calls with side effects the Run started, each `{step_id, skill, status}` with status "
                    "`completed`, `failed` or `in_flight`. After a cancel: what had started before it took "
                    "effect (a call in flight is let finish; nothing starts after the cancel).")
    cost: CostDoc
    links: RunLinks


class FileDoc(BaseModel):
    """A file a Run's sandboxed skill wrote in its working directory, kept by content hash."""

    step_id: str = Field(description="The step whose call wrote it.")
    name: str = Field(description="Its path in the Run's working directory.")
    size: int = Field(description="Bytes.")
    media_type: str = Field(description="What its name says it is (application/octet-stream when nothing).")
    sha256: str = Field(description="The SHA-256 of its bytes: a download is checked against it.")
    content_hash: str = Field(description="The hash its stored content is filed under (the trace names it).")
    filtered: bool = Field(default=False, description="Secrets were removed from it (a text file) before it was "
                                                      "kept: bytes, size and SHA-256 are the filtered file's.")
    url: str = Field(description="Where to download it.")


class SkippedFileDoc(BaseModel):
    """A file a skill wrote that was not kept, and why."""

    step_id: str
    name: str
    size: int
    reason: str


class FileList(BaseModel):
    """The files a Run's sandboxed skills wrote: those kept, and those not kept with the reason."""

    files: list[FileDoc]
    skipped: list[SkippedFileDoc] = Field(default_factory=list)


class ArchivedDoc(BaseModel):
    """Where an archived Run is: the segment that holds it and the checkpoint it is proven against."""

    run_id: str
    segment_id: str
    tenant_id: str
    state: str
    created_at: dt.datetime = Field(description="ISO 8601, UTC.")
    closed_at: dt.datetime = Field(description="ISO 8601, UTC: the Run's last state change.")
    archived_at: dt.datetime = Field(description="ISO 8601, UTC: when the Run was pruned from the database.")
    location: str = Field(description="The segment's URL (file:// or s3://).")
    checkpoint: str = Field(description="The signed checkpoint the segment is proven against.")


def archived_json(archived: ArchivedRun) -> dict[str, Any]:
    """Where an archived Run is, as an error body carries it (times in ISO 8601, UTC)."""
    return ArchivedDoc(**archived.to_dict()).model_dump(mode="json")


class ArchivedErrorDoc(ErrorDoc):
    """The 410 body for a Run that was archived and pruned: where it is."""

    archived: ArchivedDoc


class ArchivedTransitionDoc(BaseModel):
    """One state change of an archived Run, as its segment holds it."""

    seq: int
    from_state: str | None
    to_state: str
    at: dt.datetime
    actor: str
    reason: str
    forced_by: str | None


class ArchivedRunDoc(BaseModel):
    """An archived Run read back from its segment (`from_archive=true`), after the segment was checked
    against its signed checkpoint and the Run's rows against its proven records."""

    run_id: str
    state: str
    close_reason: str | None
    tenant_id: str
    user_id: str | None
    session_id: str | None
    retry_of: str | None
    created_at: dt.datetime
    last_state_change_at: dt.datetime
    path: list[str]
    transitions: list[ArchivedTransitionDoc]
    result: Any = Field(description="The Run's result as it was stored when the Run closed.")
    records: int = Field(description="How many trace records of the Run the segment holds (all proven).")
    verified: Literal[True] = Field(description="Always true: an archive that does not verify is an error.")
    archived: ArchivedDoc


class RunSummary(BaseModel):
    """A Run as a list shows it."""

    run_id: str
    task: str
    state: str
    legacy_status: Literal["pending", "running", "done", "failed"]
    user_id: str
    created_at: dt.datetime
    last_state_change_at: dt.datetime


class RunList(BaseModel):
    """A page of Runs, newest first; pass `next_before` as `before` for the next page."""

    runs: list[RunSummary]
    next_before: float | None


class TraceRecordDoc(BaseModel):
    """One chained trace record."""

    seq: int
    kind: str
    hash: str
    prev_hash: str
    data: dict[str, Any]


class TraceStepDoc(BaseModel):
    """The records of one pipeline step, and its StepTrace (status, duration, input and output hashes)."""

    step: int
    name: str
    records: list[TraceRecordDoc]
    summary: dict[str, Any] | None = None


class TraceDoc(BaseModel):
    """A Run's trace, as chained, and grouped by pipeline step."""

    run_id: str
    state: str
    records: list[TraceRecordDoc]
    steps: list[TraceStepDoc]


class ActionDoc(BaseModel):
    """One action an approval covers."""

    step_id: str
    skill: str
    arguments: dict[str, Any]


class DecisionRecordDoc(BaseModel):
    """A decision submitted on a request, accepted or refused."""

    approver: str
    decision: str
    break_glass: bool
    reason: str
    outcome: str
    refusal: str | None
    at: dt.datetime


class ApprovalDoc(BaseModel):
    """An approval request: what it would allow, who may decide, by when."""

    request_id: str
    run_id: str
    task: str
    level: str
    status: str
    requester: str
    required_approvals: int
    approvals: int
    approver_roles: list[str]
    actions: list[ActionDoc]
    actions_hash: str
    created_at: dt.datetime
    deadline_at: dt.datetime
    decisions: list[DecisionRecordDoc]
    parent_run_id: str | None = Field(
        default=None, description="For a child Run's request: the parent Run waiting for it.")


class ApprovalList(BaseModel):
    """Approval requests waiting in the caller's tenant, soonest deadline first."""

    pending: list[ApprovalDoc]


class DecisionDoc(BaseModel):
    """What a decision did."""

    request_id: str
    decision: str
    accepted: bool
    effect: str
    refusal: str | None
    approvals: int
    required_approvals: int
    run: RunDoc


class JobDoc(BaseModel):
    """The legacy job view (seed 000 §5): four statuses, and the live state as a snapshot."""

    job_id: str
    status: Literal["pending", "running", "done", "failed"]
    run_state_snapshot: str
    updated_at: dt.datetime


class WorkerDoc(BaseModel):
    """The embedded worker's load."""

    threads: int
    in_flight: int
    queue_limit: int


class HealthDoc(BaseModel):
    """Whether the service can do its job."""

    status: Literal["ok", "degraded"]
    database: str
    trace_backlog: int
    worker: WorkerDoc


class MeDoc(BaseModel):
    """Who the credential says you are."""

    tenant_id: str
    user_id: str
    roles: list[str]


class CheckDoc(BaseModel):
    """The outcome of an audit check (verify or reconcile)."""

    ok: bool
    report: dict[str, Any]


class DeliveryDoc(BaseModel):
    """One webhook delivery: an event for one endpoint, its attempts and where it stands."""

    delivery_id: str = Field(description="The webhook-id header: the same on every attempt.")
    event_id: str = Field(description="The event's id: the same for every endpoint the event goes to.")
    event_type: str
    run_id: str | None
    endpoint: str
    url: str
    status: Literal["pending", "delivered", "dead"]
    attempts: int
    next_attempt_at: dt.datetime | None
    last_status: int | None
    last_error: str | None
    created_at: dt.datetime
    delivered_at: dt.datetime | None
    payload: dict[str, Any]


class DeliveryList(BaseModel):
    """Webhook deliveries of the caller's tenant, newest first, and how many are in each status."""

    deliveries: list[DeliveryDoc]
    counts: dict[str, int]


class CostGroupDoc(BaseModel):
    """The spend of one group: a tenant, a user, a skill ("(planning)" for planning calls) or a UTC day."""

    key: str
    usd: float
    input_tokens: int
    output_tokens: int
    api_calls: int
    sandbox_s: float
    costs: int
    runs: int
    unpriced: int


class CostView(BaseModel):
    """Recorded spend of the caller's tenant, grouped, within [from, to)."""

    group_by: Literal["tenant", "user", "skill", "day"]
    from_: dt.datetime | None = Field(alias="from", serialization_alias="from")
    to: dt.datetime | None
    total_usd: float
    groups: list[CostGroupDoc]

    model_config = ConfigDict(populate_by_name=True)
