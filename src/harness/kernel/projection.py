"""The one-way legacy Job.status projection (SPEC K6, seed 000 §5). Nothing reads it back."""

from __future__ import annotations

from enum import StrEnum

from harness.kernel.states import RunState

S = RunState


class JobStatus(StrEnum):
    """The four legacy values; never extended."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


PROJECTION: dict[RunState, JobStatus] = {
    S.CREATED: JobStatus.PENDING,
    S.PREPARING: JobStatus.PENDING,
    S.PLANNING: JobStatus.PENDING,
    S.POLICY_CHECK: JobStatus.PENDING,
    S.EXECUTING: JobStatus.RUNNING,
    S.AWAITING_HITL: JobStatus.RUNNING,
    S.TRACING: JobStatus.RUNNING,
    S.REJECTED: JobStatus.RUNNING,
    S.FAILED: JobStatus.RUNNING,
    S.TIMEOUT: JobStatus.RUNNING,
    S.CANCELLED: JobStatus.RUNNING,
    S.SUCCEEDED: JobStatus.DONE,
    S.CLOSED_REJECTED: JobStatus.FAILED,
    S.CLOSED_FAILED: JobStatus.FAILED,
    S.CLOSED_CANCELLED: JobStatus.FAILED,
}


def job_status(state: RunState) -> JobStatus:
    """The legacy status a Run in `state` shows to old consumers."""
    return PROJECTION[state]
