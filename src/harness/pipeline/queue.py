"""The queue of accepted Runs that have not started: admission, start deadlines, and the close of a Run that
waited past its deadline.

A Run in CREATED has not started: nothing has left the process for it (its first model call comes after
PREPARING and PLANNING). It waits in a queue — the runs table itself, so the queue survives restarts and is
shared by every replica on the database — and however long it waits it is queued, not stuck: the sweeper
hands it back to a driver and never fails it. Only an explicit deadline closes it: the request's
`start_by`, or the deployment's `queue_max_wait_s` after acceptance. The Run is then closed CLOSED_FAILED
with a result error starting `not_started:`, by whichever comes first: a driver about to start it (it
refuses to run it late) or the sweeper.

Admission control keeps the queue from growing past what the workers can start: at `max_backlog` Runs in
CREATED, counted in the database (all replicas together), a new Run is refused before anything is written
(BacklogFullError: HTTP 429 with Retry-After, CLI exit 1). Child Runs a running parent starts are not
counted against it: refusing them would fail work already under way.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.domain.errors import BacklogFullError, InvalidRequestError
from harness.drive.state_machine import StateMachine
from harness.kernel.events import RUN_NOT_STARTED
from harness.kernel.states import RunState
from harness.ports.runs import RunStore
from harness.timefmt import iso

if TYPE_CHECKING:
    from harness.domain.contracts import RunRequest

S = RunState
#: who closes a Run that was not started by its deadline (the transition's actor)
START_DEADLINE = "start_deadline"
#: the prefix of such a Run's result error, what callers and dashboards match on
NOT_STARTED = "not_started"


class BacklogGauge:
    """The backlog, counted in the database at most every `fresh_s` seconds while it is far below the bound,
    and at every admission near it (from 90% of the bound: exact where it matters). Between counts it
    assumes every Run admitted here since the last count is still waiting, so it errs towards refusing."""

    def __init__(self, fresh_s: float = 1.0, near: float = 0.9) -> None:
        self.fresh_s = fresh_s
        self.near = near
        self._lock = threading.Lock()
        self._counted_at = -math.inf
        self._count = 0

    def backlog(self, store: RunStore, bound: int) -> int:
        """The Runs waiting to start, as far as admission needs to know (at most `bound`)."""
        now = time.monotonic()
        with self._lock:
            if now - self._counted_at < self.fresh_s and self._count < bound * self.near:
                self._count += 1  # this admission, until the next count says otherwise
                return self._count - 1
        count = store.backlog(bound)
        with self._lock:
            self._counted_at, self._count = now, count + 1
        return count


@dataclass(frozen=True)
class QueueLimits:
    """How many Runs may wait to start, and how long each may wait by default."""

    #: at this many Runs in CREATED a new Run is refused (HARNESS_MAX_BACKLOG)
    max_backlog: int = 10_000
    #: what a refused caller is told to wait before retrying, in seconds (HARNESS_BACKLOG_RETRY_AFTER_S)
    retry_after_s: int = 5
    #: the start deadline of a Run whose request names none, in seconds after its acceptance
    #: (HARNESS_QUEUE_MAX_WAIT_S); None: it waits as long as it takes
    max_wait_s: float | None = None

    #: the backlog as this process last counted it (a count per Run would cost every Run a transaction)
    gauge: BacklogGauge = field(default_factory=BacklogGauge, compare=False, repr=False)

    def admit(self, store: RunStore) -> None:
        """Refuse a new Run when the queue is full (BacklogFullError); nothing is written either way."""
        waiting = self.gauge.backlog(store, self.max_backlog)
        if waiting >= self.max_backlog:
            raise BacklogFullError(waiting, self.max_backlog, self.retry_after_s)


    def start_by(self, request: RunRequest, accepted_at: float) -> float | None:
        """The Run's start deadline on the store's clock: the request's own, else the deployment's default.
        InvalidRequestError when the request's has already passed (nothing could start in time)."""
        if request.start_by is None:
            return None if self.max_wait_s is None else accepted_at + self.max_wait_s
        deadline = request.start_by.timestamp()
        if deadline <= accepted_at:
            raise InvalidRequestError(f"invalid run request: start_by: {iso(deadline)} has already passed "
                                      f"(it is {iso(accepted_at)})")
        return deadline


def start_deadline(request: RunRequest) -> float | None:
    """The start deadline a stored request carries (the deployment's default is written into it when the
    Run is accepted), on the store's clock."""
    return None if request.start_by is None else request.start_by.timestamp()


def with_start_by(request: RunRequest, deadline: float | None) -> RunRequest:
    """The request as stored: its start deadline settled (the default filled in), so a later change of the
    setting does not move the deadline of a Run already waiting."""
    if deadline is None or request.start_by is not None:
        return request
    return request.model_copy(update={"start_by": dt.datetime.fromtimestamp(deadline, dt.UTC)})


def is_late(deadline: float | None, now: float) -> bool:
    """True when a Run with this start deadline may no longer start at `now`."""
    return deadline is not None and now > deadline


def not_started_error(deadline: float, created_at: float, now: float) -> str:
    """The result error of a Run closed because it was not started by its deadline."""
    return (f"{NOT_STARTED}: waited in the queue past its start deadline {iso(deadline)} "
            f"({now - created_at:.0f}s after it was accepted) and never started")


def close_not_started(store: RunStore, machine: StateMachine, run_id: str, *, version: int, deadline: float,
                      created_at: float, noticed_by: str, lease_epoch: int | None = None) -> bool:
    """Close a Run still in CREATED (at `version`) whose start deadline passed: CREATED → FAILED → TRACING →
    CLOSED_FAILED through the compare-and-set, then the `run_not_started` audit event. False when the Run
    moved first (a driver started it, a cancel, another closer): it is then not this close's to make."""
    now = store.clock.now()
    error = not_started_error(deadline, created_at, now)
    outcome = machine.transition(run_id, S.CREATED, S.FAILED, actor=START_DEADLINE, reason=error,
                                 expected_version=version, lease_epoch=lease_epoch,
                                 result={"error": error, "code": NOT_STARTED})
    if outcome.applied:
        store.audit(run_id, RUN_NOT_STARTED, START_DEADLINE, {
            "start_by": iso(deadline), "waited_s": round(now - created_at, 3),
            "late_by_s": round(now - deadline, 3), "noticed_by": noticed_by})
    return outcome.applied
