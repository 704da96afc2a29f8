"""What the Run store takes and gives back: Runs, transitions, audit events and trace records as stored."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from harness.domain.ids import ordered_id
from harness.kernel.states import CloseReason, RunState

#: "not given" for a transition's context and result (None means: clear it)
UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class TraceRecordIn:
    """A record to append to the trace: written to the outbox, chained when drained."""

    kind: str
    payload: dict[str, Any]
    run_id: str | None = None
    #: assigned when the record is enqueued, unless given (a RunTrace names its closing transaction's)
    record_id: str | None = None


#: the kind of a Run's RunTrace record (SPEC A1)
RUN_TRACE = "run"


@dataclass(frozen=True, slots=True)
class NewRun:
    """What the store needs to create a Run."""

    tenant_id: str
    user_id: str
    session_id: str
    request: dict[str, Any]
    idempotency_key: str | None = None
    retry_of: str | None = None
    parent_run_id: str | None = None
    deadline_at: float | None = None
    run_id: str = field(default_factory=ordered_id)
    #: digest of the request body, bound to the idempotency key (harness.pipeline.intake.body_hash)
    request_hash: str | None = None
    #: the latest moment (the store's clock) the Run may start; None: no start deadline
    start_by: float | None = None


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A Run as stored."""

    run_id: str
    tenant_id: str
    user_id: str
    session_id: str
    state: RunState
    close_reason: CloseReason | None
    version: int
    retry_of: str | None
    parent_run_id: str | None
    idempotency_key: str | None
    created_at: float
    last_state_change_at: float
    deadline_at: float | None
    lease_owner: str | None
    lease_epoch: int
    stall_count: int
    request: dict[str, Any]
    context: dict[str, Any] | None
    result: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class TransitionResult:
    """What a call to transition() did. `applied` is False when another writer got there first."""

    run_id: str
    source: RunState
    target: RunState
    applied: bool
    actual: RunState
    seq: int | None = None
    fenced: bool = False
    close_reason: CloseReason | None = None

    @property
    def lost_race(self) -> bool:
        """True when the compare-and-set found the Run no longer in `source` (or under another lease)."""
        return not self.applied


@dataclass(frozen=True, slots=True)
class TransitionRow:
    """One stored state change."""

    seq: int
    from_state: RunState | None
    to_state: RunState
    actor: str
    reason: str
    forced_by: str | None
    at: float


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One AuditLog event."""

    event_id: str
    run_id: str | None
    event: str
    actor: str
    detail: dict[str, Any]
    at: float


@dataclass(frozen=True, slots=True)
class StoredTraceRecord:
    """One chained trace record, exactly as stored."""

    seq: int
    record_id: str
    run_id: str | None
    kind: str
    payload: str
    prev_hash: str
    hash: str

    def data(self) -> dict[str, Any]:
        """The payload, parsed, with the record's run_id (stored once, in its own column: see `enqueue`)."""
        parsed: dict[str, Any] = json.loads(self.payload)
        if self.run_id is not None:
            parsed.setdefault("run_id", self.run_id)
        return parsed


@dataclass(frozen=True, slots=True)
class PendingRecord:
    """A trace record waiting to be chained: an outbox row, or its copy in a trace buffer."""

    record_id: str
    run_id: str | None
    kind: str
    payload: str


@dataclass(frozen=True, slots=True)
class StuckRun:
    """A Run that has stayed in one state past a threshold: what the sweeper decides on."""

    run_id: str
    version: int
    last_state_change_at: float
    lease_expires_at: float | None
    stall_count: int
    close_reason: str | None


@dataclass(frozen=True, slots=True)
class QueuedRun:
    """An accepted Run that has not started (CREATED) and whose start deadline has passed."""

    run_id: str
    version: int
    created_at: float
    start_by: float
