"""What a replay re-applies from outside the Run's own pipeline (SPEC A5), where the recording says it came.

A Run's path is not only its pipeline's doing: a user cancels it, the zombie sweeper forces it on, its
start deadline passes while it waits in the queue, a worker that keeps dying gets it failed as poison
input, a worker dies during a call whose outcome is then unknown. Like the human decisions a replay
re-submits, these are inputs from outside, read from the recording (the transition rows, the sweeper's
`zombie_detected` observation, the steps marked started) and re-applied through the same code paths —
`RunManager.cancel`, `ZombieSweeper.force`, the queue's close of a Run not started by its deadline (at
the recorded moment), the worker's poison close, a drive that stops mid-call and a new drive — at the
point of the pipeline where they landed:

- entering the state the Run was in (before the funnel, for TRACING and the transient states);
- in PLANNING, before the model call, when the recording has no planning answer (the answer of a call
  whose transition lost died with it);
- in EXECUTING, once the replay has made as many tool calls as the recording has: a cancel or sweep lets
  in-flight calls finish and no new step start;
- in AWAITING_HITL, at its recorded moment among the human decisions (see replay._replay_humans).

An event the replay never reaches the moment for is not applied, so a divergent replay shows in the path.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from harness.clock import FakeClock
from harness.domain.contracts import RunRequest
from harness.drive.sweeper import SWEEPER, ZombieSweeper
from harness.kernel.states import FINAL, RunState
from harness.pipeline.queue import START_DEADLINE, close_not_started, start_deadline
from harness.ports.queries import RunHistory

if TYPE_CHECKING:
    from harness.config import Runtime

S = RunState
#: the reason the worker writes when it fails a Run whose workers kept dying (leased_drive.LeasedDrive._poisoned)
STALLED = "worker_stalled"


class ReplayStopped(BaseException):
    """The replayed drive goes no further: the recorded Run was closed from outside at this point, and
    what its drive did afterwards left no record (a model answer that died with a lost transition).
    A BaseException, like a process that stops: no handler in the pipeline turns it into a failure."""


class WorkerDied(BaseException):
    """The recorded Run's worker died during this call; the replay drives the Run again, as a new worker did."""


@dataclass(frozen=True)
class OutsideEvent:
    """One recorded change of the Run that came from outside its pipeline."""

    kind: Literal["cancel", "sweep", "stalled", "not_started"]
    state: RunState
    at: float
    actor: str
    reason: str
    stuck_for_s: float = 0.0
    threshold_s: float = 0.0


def outside_events(source: RunHistory, run_id: str) -> list[OutsideEvent]:
    """The Run's outside events, in order, from its transitions and the sweeper's observations."""
    detected = source.audit_events(run_id=run_id, event="zombie_detected")
    events = []
    for x in source.transitions_of(run_id):
        if x.from_state is None:
            continue
        if x.actor == SWEEPER and x.forced_by == SWEEPER:
            seen = [e for e in detected if e.detail.get("state") == x.from_state.value and e.at <= x.at]
            if seen:
                found = seen[-1].detail
                events.append(OutsideEvent("sweep", x.from_state, x.at, x.actor, x.reason,
                                           float(found["stuck_for_s"]), float(found["threshold_s"])))
        elif x.to_state == S.CANCELLED:
            events.append(OutsideEvent("cancel", x.from_state, x.at, x.actor, x.reason))
        elif x.actor == START_DEADLINE:
            events.append(OutsideEvent("not_started", x.from_state, x.at, x.actor, x.reason))
        elif x.to_state == S.FAILED and x.reason.startswith(f"{STALLED}:"):
            events.append(OutsideEvent("stalled", x.from_state, x.at, x.actor, x.reason))
    return events


def move_to(clock: FakeClock, at: float) -> None:
    """Move the fake clock forward to `at` (never back)."""
    if at > clock.now():
        clock.advance(at - clock.now())


class OutsideEvents:
    """Re-applies a recording's outside events to its replay (see the module docstring)."""

    def __init__(self, events: list[OutsideEvent], *, plan_answers: int, tool_steps: int,
                 crashed_steps: set[str]) -> None:
        self._queue = deque(events)
        self._plan_answers = plan_answers
        self._tool_steps = tool_steps
        self._crashes = set(crashed_steps)
        self._calls = 0
        self._lock = threading.RLock()
        self._rt: Runtime | None = None
        self._clock: FakeClock | None = None
        self.replay_id: str | None = None
        #: an outside event closed the replayed Run: the drive's further work has no record to meet
        self.closed = False

    def begin(self, rt: Runtime, clock: FakeClock, replay_id: str) -> None:
        """Follow the replayed Run from its creation; a Run closed while still CREATED is closed now."""
        self._rt, self._clock, self.replay_id = rt, clock, replay_id
        rt.machine.subscribe(self._on_transition, at_commit=False)
        self._entered(S.CREATED)

    def _on_transition(self, run_id: str, _source: RunState, target: RunState) -> None:
        if run_id == self.replay_id:
            self._entered(target)

    def _entered(self, state: RunState) -> None:
        with self._lock:
            if self._queue and self._queue[0].state == state and self._ready(state):
                self._apply(self._queue.popleft())

    def _ready(self, state: RunState) -> bool:
        if state == S.PLANNING:
            return self._plan_answers == 0
        if state == S.EXECUTING:
            return self._calls >= self._tool_steps
        return state != S.AWAITING_HITL  # those are placed among the human decisions

    # ------------------------------------------------------------------ hooks for the replay's model and tools

    def model_call_unrecorded(self) -> None:
        """The replay asks the model something the recording has no answer for: after an outside close,
        that call's answer died with it (the source's drive lost its transition), so the drive stops."""
        if self.closed:
            raise ReplayStopped

    def before_tool_call(self, step_id: str) -> None:
        """The worker of the recording died during this call (its outcome is unknown): so does this drive."""
        with self._lock:
            if step_id in self._crashes:
                self._crashes.discard(step_id)
                raise WorkerDied

    def after_tool_call(self) -> None:
        """One more call made: an event that came once the recorded calls were made lands now."""
        with self._lock:
            self._calls += 1
            self._entered(S.EXECUTING)

    # ------------------------------------------------------------------ waiting for a human

    def while_waiting(self) -> list[OutsideEvent]:
        """The queued events from AWAITING_HITL, for the replay to place among the human decisions."""
        with self._lock:
            return [e for e in self._queue if e.state == S.AWAITING_HITL]

    def apply_waiting(self, event: OutsideEvent) -> None:
        """Apply an AWAITING_HITL event now, if it is the next one and the replayed Run waits too."""
        with self._lock:
            if self._queue and self._queue[0] is event:
                self._queue.popleft()
                rt = self._runtime()
                if rt.store.state_of(self._replayed()) == S.AWAITING_HITL:
                    self._apply(event)

    # ------------------------------------------------------------------ applying

    def _apply(self, event: OutsideEvent) -> None:
        rt, run_id = self._runtime(), self._replayed()
        assert self._clock is not None
        move_to(self._clock, event.at)
        if event.kind == "cancel":
            rt.runs.cancel(run_id, by=event.actor, reason=event.reason)
        elif event.kind == "sweep":
            ZombieSweeper(rt.store, rt.machine).force(run_id, event.state, event.stuck_for_s, event.threshold_s)
        elif event.kind == "not_started":
            run = rt.store.get_run(run_id)
            deadline = start_deadline(RunRequest.model_validate(run.request))
            if deadline is not None:
                close_not_started(rt.store, rt.machine, run_id, version=run.version, deadline=deadline,
                                  created_at=run.created_at, noticed_by="replay")
        else:  # the worker's poison close (leased_drive.LeasedDrive._poisoned)
            rt.machine.transition(run_id, event.state, S.FAILED, actor=event.actor, reason=event.reason,
                                  result={"error": event.reason})
        self.closed = self.closed or rt.store.state_of(run_id) in FINAL

    def _runtime(self) -> Runtime:
        assert self._rt is not None, "begin() first"
        return self._rt

    def _replayed(self) -> str:
        assert self.replay_id is not None, "begin() first"
        return self.replay_id
